"""Marian (OPUS-MT) tokenizers: their files, and their ids in ours.

A Marian tokenizer, as `transformers.MarianTokenizer` saves it, is a directory with

    source.spm          the SentencePiece model of the source language
    target.spm          the SentencePiece model of the target language
    vocab.json          piece -> Marian id, shared by both sides (or the source side's)
    target_vocab.json   piece -> Marian id of the target side, when the vocabularies are separate

SentencePiece splits text into pieces; the vocabulary, not the SentencePiece model, gives each
piece its id (a piece missing from it is `<unk>`). The vocabulary holds three specials:
`</s>` (end of sequence), `<unk>` and `<pad>`; Marian has no beginning-of-sequence piece and
starts decoding from `<pad>`.

Our ids (`data.tokenizer`: PAD 0, UNK 1, BOS 2, EOS 3, pieces from 4) follow from Marian's by one
mapping, `marian_id_map`:

==================  ========================================================
Marian id           our id
==================  ========================================================
`<pad>`             `PAD_ID` (0)
`<unk>`             `UNK_ID` (1)
`</s>`              `EOS_ID` (3)
any other id m      4 + the rank of m among Marian's other ids, ascending
==================  ========================================================

Our `BOS_ID` (2) is the decoder's start token. It has no Marian id of its own: Marian starts
from `<pad>`, so a converted model's row for `BOS_ID` (embedding, final-logits bias) is a copy
of Marian's `<pad>` row, and on the way back Marian's `<pad>` row is our `BOS_ID` row
(`marian_row_map`). Our vocabulary is therefore Marian's plus one.
"""

import dataclasses
import hashlib
import json

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow.python.trackable import resource
from tensorflow_text.python.ops import sentencepiece_tokenizer as sentencepiece_ops

from keras_transformer import fs
from keras_transformer.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    WORD_START,
    check_sampling_alpha,
)

SOURCE_SPM = "source.spm"
TARGET_SPM = "target.spm"
VOCAB_FILE = "vocab.json"
TARGET_VOCAB_FILE = "target_vocab.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # optional: names other special pieces
MARIAN_FILES = (SOURCE_SPM, TARGET_SPM, VOCAB_FILE)
"""The files every Marian tokenizer directory has (`TARGET_VOCAB_FILE` only when separate)."""

# The special pieces `transformers.MarianTokenizer` uses unless its tokenizer_config.json says
# otherwise.
_SPECIAL_PIECES = {"eos": "</s>", "unk": "<unk>", "pad": "<pad>"}
_NUM_OURS = 4  # our reserved ids PAD, UNK, BOS, EOS; Marian's other ids follow them


class MarianFilesError(ValueError):
    """A Marian tokenizer directory lacks a file, or one of its files is not what it should be."""


@dataclasses.dataclass(frozen=True)
class MarianVocabulary:
    """One side's Marian vocabulary: its pieces by Marian id and its special ids.

    Attributes:
        pieces: the piece of each Marian id, `pieces[m]`.
        pad_id, unk_id, eos_id: Marian ids of `<pad>`, `<unk>` and `</s>`.
        path: the file it was read from.
    """

    pieces: tuple
    pad_id: int
    unk_id: int
    eos_id: int
    path: str

    @property
    def size(self):
        """Number of Marian ids."""
        return len(self.pieces)

    def id_map(self):
        """`marian_id_map` of this vocabulary: our id of each Marian id."""
        return marian_id_map(self.size, self.pad_id, self.unk_id, self.eos_id)


@dataclasses.dataclass(frozen=True)
class MarianFiles:
    """The content of a Marian tokenizer directory (`read_marian_files`).

    Attributes:
        source_spm, target_spm: the serialized SentencePiece models.
        source_vocabulary: the vocabulary of source text (vocab.json).
        target_vocabulary: the vocabulary of target text: target_vocab.json when the directory
            has one, else vocab.json again.
        directory: where it was read from.
    """

    source_spm: bytes
    target_spm: bytes
    source_vocabulary: MarianVocabulary
    target_vocabulary: MarianVocabulary
    directory: str

    @property
    def separate_vocabularies(self):
        """Whether the target side has its own vocabulary (target_vocab.json)."""
        return self.source_vocabulary.path != self.target_vocabulary.path

    def contents(self):
        """File name -> bytes of a Marian tokenizer directory equal to this one.

        The SentencePiece models as read; the vocabularies written again (piece -> id, in id
        order), and `tokenizer_config.json` naming the special pieces and whether the
        vocabularies are separate, so that `transformers.MarianTokenizer.from_pretrained`
        reads the directory as this one.
        """
        contents = {
            SOURCE_SPM: self.source_spm,
            TARGET_SPM: self.target_spm,
            VOCAB_FILE: _vocabulary_json(self.source_vocabulary),
        }
        if self.separate_vocabularies:
            contents[TARGET_VOCAB_FILE] = _vocabulary_json(self.target_vocabulary)
        vocabulary = self.source_vocabulary
        config = {
            "eos_token": vocabulary.pieces[vocabulary.eos_id],
            "unk_token": vocabulary.pieces[vocabulary.unk_id],
            "pad_token": vocabulary.pieces[vocabulary.pad_id],
            "separate_vocabs": self.separate_vocabularies,
        }
        contents[TOKENIZER_CONFIG_FILE] = (json.dumps(config, indent=2) + "\n").encode()
        return contents


def _vocabulary_json(vocabulary):
    pieces = {piece: marian_id for marian_id, piece in enumerate(vocabulary.pieces)}
    return (json.dumps(pieces, ensure_ascii=False, indent=2) + "\n").encode()


def is_marian_directory(directory):
    """Whether `directory` holds a Marian tokenizer: any of `MARIAN_FILES` (by name only; a
    missing one is then named by `read_marian_files`)."""
    return any(fs.isfile(fs.join(directory, name)) for name in MARIAN_FILES)


def marian_id_map(vocabulary_size, pad_id, unk_id, eos_id):
    """Our id of every Marian id: `ours = marian_id_map(...)[marian]`.

    Args:
        vocabulary_size: number of Marian ids.
        pad_id, unk_id, eos_id: Marian ids of `<pad>`, `<unk>` and `</s>`, distinct.

    Returns:
        An `int64` array of shape `(vocabulary_size,)`: Marian's `<pad>`, `<unk>` and `</s>`
        go to `PAD_ID`, `UNK_ID` and `EOS_ID`; every other Marian id, in ascending order, to
        4, 5, ... . Our vocabulary has `vocabulary_size + 1` ids: `BOS_ID` has no Marian id.

    Raises:
        ValueError: if the special ids are not distinct ids of the vocabulary.

    Example:
        >>> marian_id_map(6, pad_id=5, unk_id=1, eos_id=0)
        array([3, 1, 4, 5, 6, 0])
    """
    specials = {"pad_id": pad_id, "unk_id": unk_id, "eos_id": eos_id}
    if len(set(specials.values())) != 3 or any(
        not 0 <= value < vocabulary_size for value in specials.values()
    ):
        raise ValueError(
            f"Marian's special ids must be three distinct ids below vocabulary_size="
            f"{vocabulary_size}. Received: {specials}"
        )
    ours = np.empty(vocabulary_size, dtype=np.int64)
    ours[pad_id], ours[unk_id], ours[eos_id] = PAD_ID, UNK_ID, EOS_ID
    others = np.setdiff1d(np.arange(vocabulary_size), list(specials.values()))
    ours[others] = _NUM_OURS + np.arange(len(others))
    return ours


def marian_id_inverse(id_map):
    """The Marian id of every one of our ids, the inverse of `marian_id_map`.

    Our `BOS_ID` has no Marian id of its own; it maps to Marian's `<pad>` (the id Marian
    starts decoding from), so that `marian_weights[inverse]` gives a converted model's rows,
    the start row included.

    Args:
        id_map: an array from `marian_id_map`.

    Returns:
        An `int64` array of shape `(len(id_map) + 1,)`, `inverse[id_map[m]] == m` for every
        Marian id m, and `inverse[BOS_ID]` is Marian's `<pad>`.
    """
    id_map = np.asarray(id_map)
    inverse = np.empty(len(id_map) + 1, dtype=np.int64)
    inverse[id_map] = np.arange(len(id_map))
    inverse[BOS_ID] = inverse[PAD_ID]
    return inverse


def marian_row_map(id_map):
    """For each Marian id, the row of ours that holds its weights, for converting back.

    As `marian_id_map`, except that Marian's `<pad>` takes our `BOS_ID` row: Marian starts
    decoding from `<pad>`, so its `<pad>` embedding is our start embedding (which fine-tuning
    trains); our `PAD_ID` row is dropped. `our_weights[marian_row_map(id_map)]` gives Marian's.

    Args:
        id_map: an array from `marian_id_map`.

    Returns:
        An `int64` array of the shape of `id_map`.
    """
    rows = np.array(id_map, dtype=np.int64)
    rows[rows == PAD_ID] = BOS_ID
    return rows


def _one_line_json(path, what):
    try:
        return json.loads(fs.read_text(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MarianFilesError(f"{path} is not a JSON {what}: {err}") from None


def _tokenizer_config(directory):
    """`(special pieces, separate)` from tokenizer_config.json: the special pieces' names (the
    defaults where it names none) and its `separate_vocabs` (None when it has none)."""
    pieces = dict(_SPECIAL_PIECES)
    path = fs.join(directory, TOKENIZER_CONFIG_FILE)
    if not fs.isfile(path):
        return pieces, None
    config = _one_line_json(path, "object")
    if not isinstance(config, dict):
        raise MarianFilesError(f"{path} is not a JSON object")
    for name in pieces:
        token = config.get(f"{name}_token")
        if isinstance(token, dict):  # an AddedToken, as transformers writes it
            token = token.get("content")
        if isinstance(token, str):
            pieces[name] = token
    separate = config.get("separate_vocabs")
    return pieces, None if separate is None else bool(separate)


def read_marian_vocabulary(path, special_pieces=None):
    """Read a Marian vocab.json (piece -> id) into a `MarianVocabulary`.

    Raises:
        MarianFilesError: one line naming the file, if it is missing, not a JSON object of
            piece -> int, its ids are not exactly 0..n-1, or it lacks a special piece.
    """
    special_pieces = special_pieces or _SPECIAL_PIECES
    if not fs.isfile(path):
        raise MarianFilesError(f"Missing Marian vocabulary file: {path}")
    vocabulary = _one_line_json(path, "object of piece -> id")
    if not isinstance(vocabulary, dict) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in vocabulary.values()
    ):
        raise MarianFilesError(f"{path} is not a JSON object of piece -> integer id")
    if sorted(vocabulary.values()) != list(range(len(vocabulary))):
        raise MarianFilesError(
            f"{path} does not give each of the ids 0..{len(vocabulary) - 1} exactly once"
        )
    missing = [piece for piece in special_pieces.values() if piece not in vocabulary]
    if missing:
        raise MarianFilesError(f"{path} lacks the special piece(s) {', '.join(missing)}")
    pieces = [""] * len(vocabulary)
    for piece, marian_id in vocabulary.items():
        pieces[marian_id] = piece
    ids = {name: vocabulary[piece] for name, piece in special_pieces.items()}
    return MarianVocabulary(
        pieces=tuple(pieces),
        pad_id=ids["pad"],
        unk_id=ids["unk"],
        eos_id=ids["eos"],
        path=str(path),
    )


def _read_spm(path):
    import sentencepiece as spm

    if not fs.isfile(path):
        raise MarianFilesError(f"Missing Marian SentencePiece model: {path}")
    proto = fs.read_bytes(path)
    try:
        spm.SentencePieceProcessor().LoadFromSerializedProto(proto)
    except (RuntimeError, OSError) as err:
        raise MarianFilesError(f"{path} is not a SentencePiece model ({err})") from None
    return proto


def read_marian_files(directory):
    """Read a Marian tokenizer directory (`MARIAN_FILES`, and `TARGET_VOCAB_FILE` if there).

    Raises:
        MarianFilesError: one line naming the missing or bad file.
    """
    if not fs.isdir(directory):
        raise MarianFilesError(f"No such Marian tokenizer directory: {directory}")
    special_pieces, separate = _tokenizer_config(directory)
    source_vocabulary = read_marian_vocabulary(fs.join(directory, VOCAB_FILE), special_pieces)
    target_path = fs.join(directory, TARGET_VOCAB_FILE)
    if separate is None:
        separate = fs.isfile(target_path)
    target_vocabulary = (
        read_marian_vocabulary(target_path, special_pieces) if separate else source_vocabulary
    )
    return MarianFiles(
        source_spm=_read_spm(fs.join(directory, SOURCE_SPM)),
        target_spm=_read_spm(fs.join(directory, TARGET_SPM)),
        source_vocabulary=source_vocabulary,
        target_vocabulary=target_vocabulary,
        directory=str(directory),
    )


class MarianTokenizer(tf.Module):
    """A Marian tokenizer pair in our ids, usable eagerly, in `tf.data` and in graphs.

    The interface of `data.Tokenizer`, with the source and target sides apart: `tokenize`
    splits source text with `source.spm`, `tokenize_target` target text with `target.spm`;
    the pieces become Marian ids through the vocabulary (a piece outside it is `<unk>`) and
    then ours (`marian_id_map`). `detokenize` turns our target ids back into Marian's pieces
    and joins them with `target.spm`. Everything runs as graph ops (the SentencePiece ops of
    TensorFlow Text, a constant piece -> id hash table, a constant id -> piece gather), so a
    SavedModel holding the tokenizer loads in the stock TF Serving runtime.

    As `transformers.MarianTokenizer`: a text that starts with a language code such as
    `>>fr<<` gives that code's id first (unknown codes are `<unk>`), then the pieces of the
    rest; decoding drops the special pieces (`<pad>`, `<unk>`, `</s>` and our `<s>`), turns
    `▁` into spaces and strips the ends. Unlike it, `tokenize` does not append `</s>`
    (callers append `EOS_ID`, as for `data.Tokenizer`), and special pieces written in the
    input text (`"</s>"`) are text, not specials.

    Args:
        files: a directory (`read_marian_files`), or `MarianFiles`.
        name: module name.

    Raises:
        MarianFilesError: one line naming a missing or bad file.

    Example:
        A pair made of one SentencePiece model, in Marian's layout:

        >>> import json, os, shutil
        >>> from keras_transformer.data import Tokenizer
        >>> tokenizer = Tokenizer("runs/builtin_tiny/spm.model")
        >>> pieces = [tokenizer.id_to_piece(i) for i in range(4, tokenizer.vocabulary_size)]
        >>> vocabulary = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
        >>> vocabulary["<pad>"] = len(vocabulary)
        >>> os.makedirs("pair")
        >>> for name in ("source.spm", "target.spm"):
        ...     _ = shutil.copy("runs/builtin_tiny/spm.model", f"pair/{name}")
        >>> with open("pair/vocab.json", "w") as file:
        ...     json.dump(vocabulary, file)
        >>> pair = MarianTokenizer("pair")
        >>> pair.vocabulary_size == len(vocabulary) + 1
        True
        >>> ids = pair.tokenize_target(["einundzwanzig"])
        >>> pair.detokenize(ids).numpy()
        array([b'einundzwanzig'], dtype=object)
    """

    def __init__(self, files, name="marian_tokenizer"):
        super().__init__(name=name)
        if not isinstance(files, MarianFiles):
            files = read_marian_files(files)
        self._files = files
        self._source_map = files.source_vocabulary.id_map()
        self._target_map = files.target_vocabulary.id_map()
        self._source_inverse = marian_id_inverse(self._source_map)
        self._target_inverse = marian_id_inverse(self._target_map)
        self._source_spm = _sentencepiece(files.source_spm)
        self._target_spm = _sentencepiece(files.target_spm)
        self._source_ids = _piece_table(files.source_vocabulary, self._source_map)
        self._target_ids = _piece_table(files.target_vocabulary, self._target_map)
        # Our target id -> the piece detokenize joins; "" for the ids it drops.
        pieces = [""] * (len(self._target_map) + 1)
        for marian_id, ours in enumerate(self._target_map):
            pieces[ours] = files.target_vocabulary.pieces[marian_id]
        for special in (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            pieces[special] = ""
        self._target_pieces = tf.constant(pieces, tf.string)

    @property
    def files(self):
        """The `MarianFiles` it was built from."""
        return self._files

    @property
    def vocabulary_size(self):
        """Number of our source ids: Marian's source vocabulary plus our `BOS_ID`."""
        return len(self._source_map) + 1

    @property
    def target_vocabulary_size(self):
        """Number of our target ids (`vocabulary_size` unless the vocabularies are separate)."""
        return len(self._target_map) + 1

    pad_id = property(lambda self: PAD_ID, doc="Id of `<pad>` (0).")
    unk_id = property(lambda self: UNK_ID, doc="Id of `<unk>` (1).")
    bos_id = property(lambda self: BOS_ID, doc="Id of the decoder's start token (2).")
    eos_id = property(lambda self: EOS_ID, doc="Id of `</s>` (3).")

    def id_to_piece(self, piece_id, target=False):
        """The Marian piece of one of our ids (source side, or `target`); `<s>` for `BOS_ID`.

        Raises:
            ValueError: if `piece_id` is not one of our ids.
        """
        id_map = self._target_map if target else self._source_map
        vocabulary = self._files.target_vocabulary if target else self._files.source_vocabulary
        if not 0 <= int(piece_id) <= len(id_map):
            raise ValueError(
                f"Piece id {piece_id} is out of range; the vocabulary has {len(id_map) + 1} ids"
            )
        if int(piece_id) == BOS_ID:
            return "<s>"
        inverse = self._target_inverse if target else self._source_inverse
        return vocabulary.pieces[int(inverse[int(piece_id)])]

    def tokenize(self, strings):
        """Source text -> our source ids (`source.spm`, vocab.json), without `</s>`.

        Args:
            strings: a string, a list of strings, or a `tf.string` tensor.

        Returns:
            for a batch (rank 1), an `int32` `tf.RaggedTensor` `(batch, None)`; for one
            string, an `int32` 1-D `tf.Tensor`.
        """
        return _encode(self._source_spm.tokenize, self._source_ids, strings)

    def tokenize_target(self, strings):
        """Target text -> our target ids (`target.spm`, the target vocabulary), as `tokenize`."""
        return _encode(self._target_spm.tokenize, self._target_ids, strings)

    def sampler(self, alpha, target=False):
        """A tokenize function of the source side (or `target`) that samples segmentations.

        As `data.Tokenizer.sampler` (`alpha` in `(0, 1]`), with the side's SentencePiece
        model and vocabulary.
        """
        check_sampling_alpha(alpha)
        sampling = _sentencepiece(
            self._files.target_spm if target else self._files.source_spm,
            nbest_size=-1,
            alpha=float(alpha),
        )
        table = self._target_ids if target else self._source_ids
        return lambda strings: _encode(sampling.tokenize, table, strings)

    def detokenize(self, ids):
        """Our target ids -> text, with `target.spm`; each row cut at its first `</s>`.

        `<pad>`, `<s>` and `<unk>` are dropped, `▁` becomes a space and the ends are
        stripped, as `transformers.MarianTokenizer.decode(..., skip_special_tokens=True)`.

        Args:
            ids: integer ids, dense (padded) or ragged, `(batch, length)` or `(length,)`.

        Returns:
            A `tf.string` tensor `(batch,)`, or a scalar for 1-D input.

        Raises:
            ValueError: if `ids` is not of rank 1 or 2.
        """
        ids = _dense_ids(ids)
        if ids.shape.rank == 1:
            return self.detokenize(ids[tf.newaxis])[0]
        before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=1), 0)
        in_range = (ids >= 0) & (ids < self.target_vocabulary_size)
        pieces = tf.gather(self._target_pieces, tf.where(in_range, ids, PAD_ID))  # (B, L)
        keep = before_eos & tf.not_equal(pieces, "")
        text = self._target_spm.detokenize(tf.ragged.boolean_mask(pieces, keep))
        return tf.strings.strip(tf.strings.regex_replace(text, WORD_START, " "))

    def __repr__(self):
        return (
            f"MarianTokenizer(vocabulary_size={self.vocabulary_size}, "
            f"target_vocabulary_size={self.target_vocabulary_size})"
        )


class _NamedSentencepieceModel(resource.TrackableResource):
    """TensorFlow Text's SentencePiece model resource, under a name of the model's digest.

    The resource belongs to its op's kernel. TensorFlow Text creates it under the default (empty)
    shared name, so two different models in one SavedModel become one once it is loaded: every
    loaded function asks for the resource of that one name and gets the first model's. Named by
    their content, the source and target models stay apart (and equal models are one).
    """

    def __init__(self, model):
        super().__init__()
        self._model = model
        self._shared_name = "sentencepiece_" + hashlib.sha256(model).hexdigest()[:32]
        _ = self.resource_handle  # creates the resource

    def _create_resource(self):
        return sentencepiece_ops.gen_sentencepiece_tokenizer.sentencepiece_op(
            model=self._model, shared_name=self._shared_name
        )


def _sentencepiece(model, **options):
    """A `tf_text.SentencepieceTokenizer` of pieces (strings) over `_NamedSentencepieceModel`."""
    tokenizer = tf_text.SentencepieceTokenizer(model=model, out_type=tf.string, **options)
    tokenizer._model_resource = _NamedSentencepieceModel(model)
    return tokenizer


def _piece_table(vocabulary, id_map):
    """A constant hash table: piece -> our id, `UNK_ID` for a piece outside the vocabulary."""
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(list(vocabulary.pieces), tf.string),
            tf.constant(id_map, tf.int32),
        ),
        default_value=UNK_ID,
    )


def _encode(split, table, strings):
    """Our ids of `strings`: a leading language code (`>>xx<<`) looked up whole, the rest split."""
    strings = tf.convert_to_tensor(strings, dtype=tf.string)
    if strings.shape.rank == 0:
        return _encode(split, table, strings[tf.newaxis])[0]
    has_code = tf.strings.regex_full_match(strings, _CODE_PATTERN + "(?s:.*)")  # (B,)
    codes = tf.strings.regex_replace(strings, "^" + _CODE_PATTERN + "(?s:.*)$", r"\1")
    rest = tf.where(has_code, tf.strings.regex_replace(strings, "^" + _CODE_PATTERN, ""), strings)
    code_ids = tf.RaggedTensor.from_row_lengths(
        table.lookup(tf.boolean_mask(codes, has_code)), tf.cast(has_code, tf.int64)
    )  # (B, 0 or 1)
    return tf.concat([code_ids, table.lookup(split(rest))], axis=1)


# A language code at the start of a text, as `transformers.MarianTokenizer` finds it: ">>"
# up to the first "<<" after it.
_CODE_PATTERN = "((?s:>>.*?<<))"


def _dense_ids(ids):
    """`ids` as a dense `int32` tensor of rank 1 or 2 (ragged rows padded with `PAD_ID`)."""
    if not isinstance(ids, tf.RaggedTensor):
        try:
            ids = tf.convert_to_tensor(ids)
        except (ValueError, TypeError):
            ids = tf.ragged.constant(ids)
    if ids.shape.rank not in (1, 2):
        raise ValueError(f"detokenize expects ids of rank 1 or 2. Received: ids.shape={ids.shape}")
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.to_tensor(default_value=PAD_ID)
    return tf.cast(ids, tf.int32)
