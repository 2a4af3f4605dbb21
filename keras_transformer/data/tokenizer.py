"""SentencePiece subword tokenization: training a joint model and in-graph use.

The `Tokenizer` runs SentencePiece through `tensorflow_text` ops, so
one object tokenizes eagerly, inside `tf.data` pipelines and inside
`tf.function` graphs, and can be saved in a SavedModel as part of a text-in,
text-out serving signature.

Every model trained by `train_sentencepiece` reserves the same four ids,
which the rest of the toolkit relies on:

=====  ==========  ==============================================
id     piece       role
=====  ==========  ==============================================
0      `<pad>`   padding (`PAD_ID`); masked out of attention
1      `<unk>`   unknown character (`UNK_ID`)
2      `<s>`     beginning of sequence (`BOS_ID`)
3      `</s>`    end of sequence (`EOS_ID`)
=====  ==========  ==============================================
"""

import io
import random
import re

import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer import fs
from keras_transformer.layers.checks import check_positive_int

PAD_ID = 0
"""Id of the padding piece `<pad>`."""
UNK_ID = 1
"""Id of the unknown piece `<unk>`."""
BOS_ID = 2
"""Id of the beginning-of-sequence piece `<s>`."""
EOS_ID = 3
"""Id of the end-of-sequence piece `</s>`."""

WORD_START = "\u2581"
"""SentencePiece's word-start mark `▁`: a piece that begins with it begins a word."""

_NUM_RESERVED = 4
_MODEL_TYPES = ("unigram", "bpe", "char", "word")


def _sample_sentences(sentences, max_sentences, seed):
    """Keep non-empty sentences; reservoir-sample `max_sentences` of them."""
    if max_sentences is None:
        return [s for s in sentences if s]
    rng = random.Random(seed)
    reservoir: list[str] = []
    seen = 0
    for sentence in sentences:
        if not sentence:
            continue
        if seen < max_sentences:
            reservoir.append(sentence)
        else:
            j = int(rng.random() * (seen + 1))
            if j < max_sentences:
                reservoir[j] = sentence
        seen += 1
    return reservoir


def _training_error(err, vocabulary_size):
    """Turn a SentencePiece training failure into a ValueError that says why."""
    message = str(err)
    too_high = re.search(r"Vocabulary size too high .*?<= (\d+)", message)
    if too_high:
        return ValueError(
            f"vocabulary_size={vocabulary_size} is too large for this data: SentencePiece "
            f"reports a maximum of {too_high.group(1)}; train on more text or ask for "
            f"at most {too_high.group(1)} pieces"
        )
    too_low = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if too_low:
        return ValueError(
            f"vocabulary_size={vocabulary_size} is too small for this data: it needs at least "
            f"{too_low.group(2)} pieces ({_NUM_RESERVED} reserved plus the characters "
            f"kept by character_coverage)"
        )
    return ValueError(
        f"SentencePiece training failed for vocabulary_size={vocabulary_size}: {message}"
    )


def train_sentencepiece(
    sentences,
    output_path,
    vocabulary_size,
    model_type="unigram",
    character_coverage=1.0,
    seed=0,
    max_sentences=None,
    num_threads=1,
    whole_words=(),
):
    """Train a SentencePiece model on in-memory sentences and write it to disk.

    For a joint source/target vocabulary, pass the sentences of both
    languages. The model reserves `<pad>`=0, `<unk>`=1, `<s>`=2 and
    `</s>`=3 and has exactly `vocabulary_size` pieces. Text is normalized with
    SentencePiece's default `nmt_nfkc` rule (NFKC, whitespace runs collapsed).

    Training is deterministic: the same sentences and arguments give the same
    model bytes on every run (input order is kept, no internal sampling; the
    result does depend on `num_threads`).

    Args:
        sentences: training text, one sentence per item; empty items are
            skipped.
        output_path: where to write the model (e.g. `run_dir / "spm.model"`, or a URL such as `gs://...`);
            written through a temporary file and a rename, parent directories
            created.
        vocabulary_size: exact number of pieces, the 4 reserved ones included.
        model_type: `unigram` (default), `bpe`, `char` or `word`.
        character_coverage: fraction of characters covered by the model; rarer
            characters map to `<unk>`. 1.0 suits languages with small
            alphabets.
        seed: seed of the sample drawn when `max_sentences` is exceeded.
        max_sentences: if set and there are more non-empty sentences, train on
            a seeded uniform sample of this many.
        num_threads: SentencePiece trainer threads.
        whole_words: words that are always exactly one piece, `"▁" + word`
            (SentencePiece user-defined symbols), wherever they stand as a whole
            word; e.g. the bracket, label and tag symbols of linearized trees
            (`data.trees.tree_symbols`). They count in `vocabulary_size`.

    Returns:
        `output_path` as a `pathlib.Path` (a URL as given).

    Raises:
        ValueError: on an invalid argument, no non-empty sentence, or a
            `vocabulary_size` the data cannot support (the message gives the
            requested size and the limit SentencePiece reported).

    Example:
        >>> path = train_sentencepiece(["a small example", "ein kleines Beispiel"] * 50,
        ...                            "spm.model", vocabulary_size=20)
        >>> path, Tokenizer(path).vocabulary_size
        (PosixPath('spm.model'), 20)
    """
    if (
        isinstance(vocabulary_size, bool)
        or not isinstance(vocabulary_size, int)
        or vocabulary_size <= _NUM_RESERVED
    ):
        raise ValueError(
            f"vocabulary_size must be an int > {_NUM_RESERVED} (the reserved ids). "
            f"Received: vocabulary_size={vocabulary_size!r}"
        )
    if model_type not in _MODEL_TYPES:
        raise ValueError(f"Unknown model_type {model_type!r}; valid: {', '.join(_MODEL_TYPES)}")
    if not 0.0 < character_coverage <= 1.0:
        raise ValueError(
            f"character_coverage must be in (0, 1]. Received: character_coverage={character_coverage!r}"
        )
    if max_sentences is not None:
        check_positive_int("max_sentences", max_sentences)
    check_positive_int("num_threads", num_threads)
    if isinstance(whole_words, str) or any(
        not word or word.split() != [word] for word in whole_words
    ):
        raise ValueError(
            f"whole_words must be a sequence of words without spaces. Received: {whole_words!r}"
        )
    if isinstance(sentences, str):
        raise ValueError("sentences must be an iterable of strings, not a single string")
    corpus = _sample_sentences(sentences, max_sentences, seed)
    if not corpus:
        raise ValueError("No non-empty sentence to train SentencePiece on")

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(corpus),
            model_writer=model,
            vocab_size=vocabulary_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_piece="<pad>",
            unk_piece="<unk>",
            bos_piece="<s>",
            eos_piece="</s>",
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=num_threads,
            user_defined_symbols=[WORD_START + word for word in whole_words],
            minloglevel=2,
        )
    except RuntimeError as err:
        raise _training_error(err, vocabulary_size) from err
    return fs.write_bytes(output_path, model.getvalue())


def check_sampling_alpha(alpha):
    """`alpha` if it is a valid subword-sampling exponent, a number in `(0, 1]`.

    Raises:
        ValueError: naming the value otherwise.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 1.0:
        raise ValueError(
            f"The subword sampling alpha must be a number in (0, 1]. Received: alpha={alpha!r}"
        )
    return float(alpha)


class Tokenizer(tf.Module):
    """A SentencePiece tokenizer usable eagerly, in `tf.data` and in graphs.

    Wraps a `tensorflow_text.SentencepieceTokenizer` built from the
    serialized model. Being a `tf.Module`, it is tracked when assigned
    as an attribute of a Keras model or `tf.Module`, so functions that use it
    can be saved with `tf.saved_model.save`.

    Args:
        model: path of a `.model` file, or the serialized model bytes.
        name: module name.

    Raises:
        FileNotFoundError: if `model` is a path that does not exist.
        ValueError: if the data is not a SentencePiece model, or the model
            does not reserve `<pad>`=0, `<unk>`=1, `<s>`=2, `</s>`=3.

    Example:
        >>> tokenizer = Tokenizer("runs/builtin_tiny/spm.model")
        >>> ids = tokenizer.tokenize(["twenty one", "einundzwanzig"])
        >>> tokenizer.detokenize(ids).numpy()
        array([b'twenty one', b'einundzwanzig'], dtype=object)
    """

    def __init__(self, model, name="tokenizer"):
        super().__init__(name=name)
        if isinstance(model, (bytes, bytearray, memoryview)):
            proto = bytes(model)
            source = "the given model bytes"
        else:
            if not fs.isfile(model):
                raise FileNotFoundError(f"No such SentencePiece model file: {model}")
            proto = fs.read_bytes(model)
            source = str(model)
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(proto)
        except (RuntimeError, OSError) as err:
            raise ValueError(f"Not a valid SentencePiece model: {source} ({err})") from err
        found = {
            "pad": processor.pad_id(),
            "unk": processor.unk_id(),
            "bos": processor.bos_id(),
            "eos": processor.eos_id(),
        }
        expected = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
        if found != expected:
            raise ValueError(
                f"SentencePiece model {source} has reserved ids {found}, expected {expected}; "
                f"train it with train_sentencepiece"
            )
        self._model_proto = proto
        self._processor = processor
        self._sentencepiece = tf_text.SentencepieceTokenizer(
            model=proto, out_type=tf.int32, add_bos=False, add_eos=False
        )

    @property
    def model_proto(self):
        """The serialized SentencePiece model."""
        return self._model_proto

    @property
    def vocabulary_size(self):
        """Number of pieces, reserved ones included."""
        return self._processor.get_piece_size()

    @property
    def target_vocabulary_size(self):
        """Number of target ids: `vocabulary_size`, the model being joint."""
        return self.vocabulary_size

    @property
    def pad_id(self):
        """Id of `<pad>` (0)."""
        return PAD_ID

    @property
    def unk_id(self):
        """Id of `<unk>` (1)."""
        return UNK_ID

    @property
    def bos_id(self):
        """Id of `<s>` (2)."""
        return BOS_ID

    @property
    def eos_id(self):
        """Id of `</s>` (3)."""
        return EOS_ID

    def id_to_piece(self, piece_id, target=False):
        """The piece string of an id, e.g. `"▁dog"` or `"</s>"` (`target`: of the target side,
        the same joint model here; `data.marian.MarianTokenizer` has one per side).

        Raises:
            ValueError: if `piece_id` is outside `[0, vocabulary_size)`.
        """
        if not 0 <= int(piece_id) < self.vocabulary_size:
            raise ValueError(
                f"Piece id {piece_id} is out of range; the vocabulary has "
                f"{self.vocabulary_size} pieces"
            )
        return self._processor.id_to_piece(int(piece_id))

    def tokenize(self, strings):
        """Split text into piece ids, without adding `<s>` or `</s>`.

        Args:
            strings: a string, a list of strings, or a `tf.string` tensor.

        Returns:
            for a batch (rank-1) of strings, an `int32` `tf.RaggedTensor`
            of shape `(batch, None)`; for a single string, an `int32`
            1-D `tf.Tensor`.
        """
        strings = tf.convert_to_tensor(strings, dtype=tf.string)
        return self._sentencepiece.tokenize(strings)

    def tokenize_target(self, strings):
        """Split target text into piece ids: `tokenize`, the model being joint.

        Code that tokenizes target text calls this, so that a tokenizer with a model per side
        (`data.marian.MarianTokenizer`) splits it with the target's.
        """
        return self.tokenize(strings)

    def sampler(self, alpha, target=False):
        """A tokenize function that samples a segmentation per call (subword regularization).

        Each call draws, for every string, one segmentation from all those the
        unigram model allows, with probability proportional to
        `P(segmentation) ** alpha` (Kudo, 2018): the smaller `alpha`, the
        more often a word is split differently from `tokenize`. The
        pieces still detokenize to the same text. The draws are not seeded.
        The returned function is not tracked by this module, so it never ends
        up in an exported model.

        Args:
            alpha: smoothing exponent, a number in `(0, 1]`; on Multi30k's
                8,000-piece model, 0.5 changes about 40 % of the sentences and
                lengthens them by 3 %, 0.3 changes 80 % and lengthens them by 12 %.
            target: for target text (the same joint model here; see `tokenize_target`).

        Returns:
            A function of a rank-1 `tf.string` tensor giving `int32` ragged
            ids, like `tokenize`.

        Raises:
            ValueError: if `alpha` is not in `(0, 1]`.
        """
        check_sampling_alpha(alpha)
        sampling = tf_text.SentencepieceTokenizer(
            model=self._model_proto,
            out_type=tf.int32,
            nbest_size=-1,
            alpha=float(alpha),
            add_bos=False,
            add_eos=False,
        )
        return sampling.tokenize

    def detokenize(self, ids):
        """Turn ids back into text, ignoring padding and special pieces.

        Each row is cut at its first `</s>`; `<pad>` and `<s>` are
        dropped. This makes the method suitable for padded batches and for
        decoder output that continues after `</s>`.

        Args:
            ids: integer ids, dense (padded) or ragged, of shape
                `(batch, length)` or `(length,)`; any integer dtype.

        Returns:
            A `tf.string` tensor of shape `(batch,)`, or a scalar for 1-D
            input.

        Raises:
            ValueError: if `ids` is not of rank 1 or 2.
        """
        if not isinstance(ids, tf.RaggedTensor):
            try:
                ids = tf.convert_to_tensor(ids)
            except (ValueError, TypeError):
                ids = tf.ragged.constant(ids)
        rank = ids.shape.rank
        if rank not in (1, 2):
            raise ValueError(
                f"detokenize expects ids of rank 1 or 2. Received: ids.shape={ids.shape}"
            )
        if rank == 1:
            return self.detokenize(ids[tf.newaxis])[0]
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=PAD_ID)
        ids = tf.cast(ids, tf.int32)
        before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=1), 0)
        keep = before_eos & tf.not_equal(ids, PAD_ID) & tf.not_equal(ids, BOS_ID)
        return self._sentencepiece.detokenize(tf.ragged.boolean_mask(ids, keep))

    def as_keras_hub(self):
        """An equivalent `keras_hub.tokenizers.SentencePieceTokenizer`.

        It gives the same ids as `tokenize`, for use with keras-hub
        preprocessing layers. Called eagerly, the keras-hub tokenizer runs the
        Python `sentencepiece` library and returns Python lists; inside a
        `tf.function` or `tf.data` map it runs `tensorflow_text` ops and
        returns a `tf.RaggedTensor`.

        Example:
            >>> tokenizer = Tokenizer("runs/builtin_tiny/spm.model")
            >>> hub_tokenizer = tokenizer.as_keras_hub()
            >>> hub_tokenizer(["twenty one"]) == tokenizer.tokenize(["twenty one"]).to_list()
            True
            >>> hub_tokenizer.detokenize(hub_tokenizer(["twenty one"]))
            ['twenty one']
        """
        import keras_hub

        return keras_hub.tokenizers.SentencePieceTokenizer(proto=self._model_proto)

    def __repr__(self):
        return f"Tokenizer(vocabulary_size={self.vocabulary_size})"
