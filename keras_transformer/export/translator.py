"""`TranslationModule`: the in-graph text-in, text-out translation module that is exported.

Shape letters: B batch, S source length (padded), T target length, L output buffer length,
V vocabulary size.

The same `tf.function`s run when Python code calls a `TranslationModule` and when TF Serving
answers a request to the exported SavedModel, so both give identical results:

* `translate(text)`: tf.string `(B,)` -> `{"translation": tf.string (B,), "score": float32 (B,)}`.
* `translate_ids(source_ids)`: int32 `(B, S)` -> `{"token_ids": int32 (B, L), "scores": float32 (B,)}`,
  L = S + `max_output_offset` (capped), or the static `max_output_length` when one is given.
* `translate_nbest(text)`: tf.string `(B,)` -> `{"translations": tf.string (B, K), "scores": float32 (B, K)}`,
  the K = `beam_size` best hypotheses of each sentence, best first.
* `score(source, target)`: tf.string `(B,)` twice -> `{"log_probability": float32 (B,)}`.

Input handling, identical in Python and in the SavedModel (see docs/serving.md):

* Text is decoded as UTF-8 with invalid bytes replaced by U+FFFD (tokenizing never fails),
  and the translations are valid UTF-8.
* A source is cut to `max_source_length - 1` pieces, then EOS is appended
  (`decoding.text.encode_source`); `max_source_length` defaults to the model's `max_length`.
* A source without pieces (empty or whitespace-only text, or ids that are only EOS/PAD)
  is not decoded: its translation is empty, its token ids all PAD and its score 0.0
  (every one of its K hypotheses, for `translate_nbest`).
* `translate_ids` maps ids outside `[0, V)` to UNK, and cuts rows longer than
  `max_source_length` (their last kept token becomes EOS).
* `score` cuts targets to `max_output_length - 1` pieces (+ EOS), the longest output
  `translate` can produce.
"""

import tensorflow as tf

from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.options import SearchOptions
from keras_transformer.decoding.shortlist import ShortlistStep
from keras_transformer.decoding.steps import model_source_inputs
from keras_transformer.decoding.text import decode_text, encode_source, valid_utf8
from keras_transformer.layers.checks import check_positive_int
from keras_transformer.runs import load_run

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
SOURCE_IDS_SPEC = tf.TensorSpec([None, None], tf.int32, name="source_ids")
SOURCE_SPEC = tf.TensorSpec([None], tf.string, name="source")
TARGET_SPEC = tf.TensorSpec([None], tf.string, name="target")

# Signature name -> the TranslationModule method it serves. `serving_default` is `translate`.
SIGNATURES = {
    "serving_default": "translate",
    "translate": "translate",
    "translate_ids": "translate_ids",
    "translate_nbest": "translate_nbest",
    "score": "score",
}


def _check_shape(tensor, spec):
    """`tensor`, checked at run time to have the rank of `spec`.

    A signature of a loaded SavedModel (and TF Serving) does not check the shapes it is
    fed; an `EnsureShape` op does, and its error names the expected shape (`[?]` for a
    batch of texts, `[?,?]` for token ids), e.g. "Shape of tensor text [1,2] is not
    compatible with expected shape [?]."
    """
    return tf.ensure_shape(tensor, spec.shape, name=f"check_{spec.name}_shape")


class TranslationModule(tf.Module):
    """Beam-search translation with in-graph SentencePiece, as a `tf.Module` to export.

    Holds the model (so its variables are tracked and saved) and the tokenizer (its
    SentencePiece model travels inside the graph). Decoding settings are fixed here, at
    construction; every method is a `tf.function` with an `input_signature`, traced once.

    Args:
        model: a trained `Transformer`.
        tokenizer: the run's `data.Tokenizer`. Create it after any
            `keras.utils.set_random_seed` / `tf.random.set_seed` call (seeding clears
            TensorFlow's kernel caches, which drops in-graph tokenizer resources).
        beam_size: K (default: `model.config.beam_size`, 4 in the paper).
        length_penalty: alpha of the GNMT length penalty (default: the config's, 0.6).
        max_output_offset: a sentence produces at most `source length + offset` tokens
            (default: the config's, 50).
        max_output_length: a static output buffer length L, the width of `token_ids`
            for every input. Default: no static buffer: each call's buffer is `S +
            max_output_offset` slots (S the batch's padded source width), at most
            `max_source_length + max_output_offset` (for learned positions at most
            `model.config.max_length`), so the offset alone limits the output and a batch
            of short sentences does not carry (and reorder, at every beam step) a buffer
            sized for the longest source the model accepts.
        max_source_length: sources are cut to this many tokens, EOS included (default and
            maximum: `model.config.max_length`).
        vocabulary_map: None (the exact search), or a `decoding.shortlist.VocabularyMap`:
            each batch's output projection covers only the tokens its sources map to (an
            approximation, CTranslate2's `use_vmap`; docs/decoding.md).
        name: module name.

    Example:

    >>> from keras_transformer.runs import load_run
    >>> model, tokenizer, config = load_run("runs/builtin_tiny")
    >>> translator = TranslationModule(model, tokenizer, beam_size=4)
    >>> translator.translate(["twenty one"])["translation"]  # b'einundzwanzig' once trained
    <tf.Tensor: shape=(1,), dtype=string, numpy=array([b'...'], dtype=object)>
    """

    def __init__(
        self,
        model,
        tokenizer,
        beam_size=None,
        length_penalty=None,
        max_output_offset=None,
        max_output_length=None,
        max_source_length=None,
        vocabulary_map=None,
        name="translator",
    ):
        super().__init__(name=name)
        config = model.config
        options = SearchOptions.from_config(
            config,
            "beam",
            beam_size=beam_size,
            length_penalty=length_penalty,
            max_output_offset=max_output_offset,
        )  # checks them
        beam_size, length_penalty, max_output_offset = (
            options.beam_size,
            options.length_penalty,
            options.max_output_offset,
        )
        if max_source_length is None:
            max_source_length = config.max_length
        check_positive_int("max_source_length", max_source_length)
        if max_source_length > config.max_length:
            raise ValueError(
                "max_source_length exceeds the model's max_length. "
                f"Received: max_source_length={max_source_length}, model.config.max_length={config.max_length}"
            )
        position_limit = config.max_length if config.positional == "learned" else None
        self.static_buffer = max_output_length is not None
        if max_output_length is None:  # the longest buffer a call can get
            max_output_length = max_source_length + max_output_offset
            if position_limit is not None:
                max_output_length = min(max_output_length, position_limit)
        check_positive_int("max_output_length", max_output_length)
        if position_limit is not None and max_output_length > position_limit:
            raise ValueError(
                "max_output_length exceeds the positions of the model's learned position embedding. "
                f"Received: max_output_length={max_output_length}, model.config.max_length={position_limit}"
            )
        if tokenizer.vocabulary_size != config.vocabulary_size:
            raise ValueError(
                "The tokenizer and the model have different vocabularies. "
                f"Received: tokenizer.vocabulary_size={tokenizer.vocabulary_size}, "
                f"model.config.vocabulary_size={config.vocabulary_size}"
            )
        target_size = config.decoder_vocabulary_size
        if tokenizer.target_vocabulary_size != target_size:
            raise ValueError(
                "The tokenizer and the model have different target vocabularies. "
                f"Received: tokenizer.target_vocabulary_size={tokenizer.target_vocabulary_size}, "
                f"the model's target vocabulary size={target_size}"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.beam_size = beam_size
        self.length_penalty = float(length_penalty)
        self.max_output_offset = max_output_offset
        self.max_output_length = max_output_length
        self.max_source_length = max_source_length
        self.vocabulary_size = config.vocabulary_size
        self.constraint = None  # a search constraint (export.parser.ParsingModule's TreeConstraint)
        self.vocabulary_map = vocabulary_map
        self.step = None if vocabulary_map is None else ShortlistStep(model, vocabulary_map)

    @classmethod
    def from_run(cls, model_dir, checkpoint=None, average_last=None, quantization=None, **settings):
        """A `TranslationModule` for a run directory written by `experiments/train.py`.

        Args:
            model_dir: the run directory (`config.json`, `spm.model`, `checkpoints/`).
            checkpoint: a checkpoint prefix (default: the latest).
            average_last: instead, average the last this many checkpoints.
            quantization: None, or "int8": the model's weights quantized (`runs.load_run`).
            **settings: the decoding settings of the constructor (`beam_size`, ...).
        """
        model, tokenizer, _ = load_run(
            model_dir, checkpoint=checkpoint, average_last=average_last, quantization=quantization
        )
        return cls(model, tokenizer, **settings)

    @property
    def settings(self):
        """The decoding settings fixed in the graph, as a dict."""
        return {
            "beam_size": self.beam_size,
            "length_penalty": self.length_penalty,
            "max_output_offset": self.max_output_offset,
            "max_output_length": self.max_output_length,
            "max_source_length": self.max_source_length,
            **(
                {}
                if self.vocabulary_map is None
                else {"vocabulary_map": self.vocabulary_map.description}
            ),
        }

    # --- the exported functions ---

    @tf.function(input_signature=[TEXT_SPEC])
    def translate(self, text):
        """Translate a batch of texts: tf.string `(B,)` -> `{"translation", "score"}`, both `(B,)`.

        `score` is the beam score log P(Y | X) / lp(|Y|) of the translation.
        """
        text = _check_shape(text, TEXT_SPEC)
        token_ids, scores = self._best(self.encode(text))  # (B, 1, L), (B, 1)
        return {"translation": self.decode(token_ids[:, 0]), "score": scores[:, 0]}

    @tf.function(input_signature=[TEXT_SPEC])
    def translate_nbest(self, text):
        """The K = `beam_size` best translations of each text: tf.string `(B,)` ->
        `{"translations": tf.string (B, K), "scores": float32 (B, K)}`, best first.

        The hypotheses of `beam_search(..., num_return=beam_size)`; row 0 is `translate`'s
        translation. A slot the search could not fill (only with a tiny vocabulary) is
        an empty text with score -inf.
        """
        text = _check_shape(text, TEXT_SPEC)
        token_ids, scores = self._search(
            self.encode(text), num_return=self.beam_size
        )  # (B, K, L), (B, K)
        return {"translations": self.decode_nbest(token_ids), "scores": scores}

    @tf.function(input_signature=[SOURCE_IDS_SPEC])
    def translate_ids(self, source_ids):
        """Translate token ids: int32 `(B, S)` (pieces, EOS, PAD=0) -> `{"token_ids" (B, L), "scores" (B,)}`."""
        source_ids = _check_shape(source_ids, SOURCE_IDS_SPEC)
        token_ids, scores = self._best(self._clean_ids(source_ids))  # (B, 1, L), (B, 1)
        return {"token_ids": token_ids[:, 0], "scores": scores[:, 0]}

    @tf.function(input_signature=[SOURCE_SPEC, TARGET_SPEC])
    def score(self, source, target):
        """Log-probability of each target given its source (forced decoding).

        The sum of the natural-log probabilities of the target's pieces and of EOS,
        teacher-forced through `model.decode`, without length penalty.

        Returns:
            `{"log_probability": float32 (B,)}`.
        """
        source = _check_shape(source, SOURCE_SPEC)
        target = _check_shape(target, TARGET_SPEC)
        tf.debugging.assert_equal(
            tf.shape(source)[0],
            tf.shape(target)[0],
            message="score: `source` and `target` must hold the same number of texts",
        )
        source_ids = self.encode(source)  # (B, S)
        pieces = self.tokenizer.tokenize_target(valid_utf8(target))[
            :, : self.max_output_length - 1
        ]  # ragged (B, None)
        pieces = tf.cast(pieces, tf.int32)
        batch_size = pieces.nrows()
        bos = tf.fill([batch_size, 1], BOS_ID)
        eos = tf.fill([batch_size, 1], EOS_ID)
        target_in = tf.concat([bos, pieces], axis=1).to_tensor(default_value=PAD_ID)  # (B, T)
        target_out = tf.concat([pieces, eos], axis=1).to_tensor(default_value=PAD_ID)  # (B, T)
        encoder_outputs, source_mask = self.model.encode(source_ids)  # (B, S, D), (B, S)
        # What else the model reads off the source (e.g. the parsing model's word positions).
        extra = model_source_inputs(self.model, source_ids)
        logits = self.model.decode(target_in, encoder_outputs, source_mask, **extra)  # (B, T, V)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        token_log_probs = tf.gather(log_probs, target_out, batch_dims=2)  # (B, T)
        weights = tf.cast(tf.not_equal(target_out, PAD_ID), tf.float32)
        return {"log_probability": tf.reduce_sum(token_log_probs * weights, axis=1)}

    @tf.function(input_signature=[SOURCE_IDS_SPEC])
    def _best(self, source_ids):
        """`_search` for the best hypothesis, one function that `translate` and `translate_ids` call:
        the SavedModel holds the search's graph once for both, and an export traces it once."""
        return self._search(source_ids)

    # --- building blocks, also usable eagerly ---

    def encode(self, text):
        """Source ids of texts: tf.string `(B,)` -> int32 `(B, S)`, S <= max_source_length."""
        return encode_source(self.tokenizer, valid_utf8(text), self.max_source_length)

    def decode(self, token_ids):
        """Valid UTF-8 text of output ids `(B, L)`, cut at the first EOS: tf.string `(B,)`."""
        return valid_utf8(decode_text(self.tokenizer, token_ids))

    def decode_nbest(self, token_ids):
        """Valid UTF-8 texts of n-best output ids `(B, K, L)`: tf.string `(B, K)`."""
        shape = tf.shape(token_ids)
        texts = self.decode(tf.reshape(token_ids, [-1, shape[2]]))  # (B * K,)
        return tf.reshape(texts, shape[:2])

    def _clean_ids(self, source_ids):
        """Ids outside the vocabulary -> UNK; rows longer than max_source_length cut, EOS last."""
        in_vocabulary = (source_ids >= 0) & (source_ids < self.vocabulary_size)
        source_ids = tf.where(in_vocabulary, source_ids, UNK_ID)
        limit = self.max_source_length
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), axis=1)  # (B,)
        source_ids = source_ids[:, :limit]  # (B, S <= limit)
        last = tf.equal(tf.range(tf.shape(source_ids)[1]), limit - 1)[None, :]  # (1, S)
        return tf.where(last & (lengths > limit)[:, None], EOS_ID, source_ids)

    def _search(self, source_ids, num_return=1):
        """Beam search over the rows that hold pieces; the others get PAD ids and score 0.

        Returns:
            `(token_ids int32 (B, R, L), scores float32 (B, R))`, R = `num_return`, best first.
        """
        has_pieces = tf.reduce_any(
            tf.not_equal(source_ids, PAD_ID) & tf.not_equal(source_ids, EOS_ID), axis=1
        )  # (B,)
        rows = tf.where(has_pieces)  # (N, 1) int64
        token_ids, scores = beam_search(
            self.step or self.model,
            tf.gather_nd(source_ids, rows),  # (N, S)
            beam_size=self.beam_size,
            length_penalty=self.length_penalty,
            max_output_offset=self.max_output_offset,
            max_length=self.max_output_length if self.static_buffer else None,  # None: S + offset
            num_return=num_return,
            constraint=self.constraint,
        )  # (N, R, L), (N, R)
        batch_size = tf.shape(source_ids, out_type=tf.int64)[0]
        width = tf.shape(token_ids, out_type=tf.int64)[2]
        token_ids = tf.scatter_nd(rows, token_ids, tf.stack([batch_size, num_return, width]))
        scores = tf.scatter_nd(rows, scores, tf.stack([batch_size, num_return]))
        return token_ids, scores
