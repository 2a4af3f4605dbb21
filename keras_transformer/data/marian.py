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
import json

import numpy as np

from keras_transformer import fs
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

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


def is_marian_directory(directory):
    """Whether `directory` holds a Marian tokenizer (its `SOURCE_SPM`, checked by name only)."""
    return fs.isfile(fs.join(directory, SOURCE_SPM))


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


def _special_pieces(directory):
    """The special pieces' names: the defaults, or those tokenizer_config.json gives."""
    pieces = dict(_SPECIAL_PIECES)
    path = fs.join(directory, TOKENIZER_CONFIG_FILE)
    if fs.isfile(path):
        config = _one_line_json(path, "object")
        for name in pieces:
            token = config.get(f"{name}_token") if isinstance(config, dict) else None
            if isinstance(token, dict):  # an AddedToken, as transformers writes it
                token = token.get("content")
            if isinstance(token, str):
                pieces[name] = token
    return pieces


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
    special_pieces = _special_pieces(directory)
    source_vocabulary = read_marian_vocabulary(fs.join(directory, VOCAB_FILE), special_pieces)
    target_path = fs.join(directory, TARGET_VOCAB_FILE)
    target_vocabulary = (
        read_marian_vocabulary(target_path, special_pieces)
        if fs.isfile(target_path)
        else source_vocabulary
    )
    return MarianFiles(
        source_spm=_read_spm(fs.join(directory, SOURCE_SPM)),
        target_spm=_read_spm(fs.join(directory, TARGET_SPM)),
        source_vocabulary=source_vocabulary,
        target_vocabulary=target_vocabulary,
        directory=str(directory),
    )
