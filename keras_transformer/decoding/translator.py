"""Batched text-to-text translation with a trained model or an exported SavedModel.

Both translators take a list of sentences of any size, translate it in batches of
`batch_size` sentences grouped by length (so little padding is decoded), and return the
translations in the input order. A `Translator` traces its search function once
(`decoding.make_search_fn`, input signature `[None, None]`) and reuses it for every batch.
"""

import numpy as np
import tensorflow as tf
from absl import logging

from keras_transformer.data.tokenizer import PAD_ID
from keras_transformer.decoding.searcher import best_hypotheses, make_search_fn
from keras_transformer.decoding.text import decode_text, encode_source, valid_utf8
from keras_transformer.layers.checks import check_positive_int
from keras_transformer.model_root import resolve_saved_model


def translate_in_batches(translate_batch, texts, batch_size=64, lengths=None, progress=None):
    """Translate `texts` in length-sorted batches, returning results in input order.

    Args:
        translate_batch: a function of a list of strings returning
            `(translations, scores)`, two sequences as long as its input.
        texts: the sentences to translate.
        batch_size: sentences per call of `translate_batch`.
        lengths: a sort key per sentence (default: its number of characters). Sentences
            are translated longest first, so that a batch that does not fit in memory
            fails at once.
        progress: optional `progress(done, total)`, called after every batch with the
            number of sentences translated so far and `len(texts)`.

    Returns:
        `(translations: list[str], scores: list[float])`, aligned with `texts`.
    """
    check_positive_int("batch_size", batch_size)
    texts = list(texts)
    if lengths is None:
        lengths = [len(text) for text in texts]
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    translations = [None] * len(texts)
    scores = [None] * len(texts)
    for start in range(0, len(texts), batch_size):
        indices = order[start : start + batch_size]
        batch_translations, batch_scores = translate_batch([texts[i] for i in indices])
        if len(batch_translations) != len(indices) or len(batch_scores) != len(indices):
            raise ValueError(
                f"translate_batch returned {len(batch_translations)} translations and {len(batch_scores)} scores "
                f"for {len(indices)} sentences"
            )
        for i, translation, score in zip(indices, batch_translations, batch_scores):
            translations[i] = translation
            scores[i] = float(score)
        if progress is not None:
            progress(start + len(indices), len(texts))
    return translations, scores


def decode_lines(data):
    """The lines of `data` (bytes), decoded as the exported SavedModel decodes text.

    Invalid UTF-8 sequences become U+FFFD (`decoding.text.valid_utf8`, the op the
    SavedModel runs), so reading never fails. Lines end at "\n" only (a "\r" before it is
    dropped); a final line without "\n" counts.

    Returns:
        `(lines: list[str], replaced: list[int])`: the lines, and the 0-based indices of
        the lines that held invalid UTF-8.
    """
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    raw = [line[:-1] if line.endswith(b"\r") else line for line in raw]
    if not raw:
        return [], []
    lines = [line.decode("utf-8") for line in valid_utf8(tf.constant(raw, tf.string)).numpy()]
    replaced = [
        index for index, (line, text) in enumerate(zip(raw, lines)) if line != text.encode("utf-8")
    ]
    return lines, replaced


def translate_lines(translate, lines):
    """Translate text lines, keeping blank lines blank (they are not decoded).

    Args:
        translate: a function of a list of strings returning `(translations, scores)`.
        lines: the input lines (without line ends).

    Returns:
        `(translations, scores)` aligned with `lines`; blank lines get "" and score 0.0
        (as the exported SavedModel answers an empty text).
    """
    lines = list(lines)
    indices = [i for i, line in enumerate(lines) if line.strip()]
    translations, scores = [""] * len(lines), [0.0] * len(lines)
    if indices:
        outputs, output_scores = translate([lines[i] for i in indices])
        for i, output, score in zip(indices, outputs, output_scores):
            translations[i], scores[i] = output, score
    return translations, scores


def _as_strings(tensor):
    return [value.decode("utf-8") for value in np.asarray(tensor).reshape(-1)]


class Translator:
    """Translates sentences with a trained `Transformer` and its tokenizer.

    Args:
        model: a `Transformer` (e.g. from `training.load_run`).
        tokenizer: the run's `data.Tokenizer`.
        method: "greedy", "beam" or "sample".
        batch_size: sentences decoded together.
        max_source_length: truncate sources to this many pieces, EOS included (default:
            the model's `max_length`).
        use_cache: decode with the key/value cache (True) or recompute the prefix.
        jit_compile: compile the search with XLA.
        **options: keyword arguments of the search (`beam_size`, `length_penalty`,
            `max_output_offset`, `temperature`, `top_k`, `top_p`, `seed`, ...); see
            `SearchOptions.from_config` for the run config's settings.

    Call arguments:
        texts: a list of source sentences.
        progress: optional `progress(done, total)` called after every batch
            (`translate_in_batches`).

    Returns:
        `(translations: list[str], scores: list[float])` in input order; for beam search
        the best hypothesis and its length-normalized log-probability.

    Example:

    >>> from keras_transformer.runs import load_run
    >>> model, tokenizer, config = load_run("runs/builtin_tiny")
    >>> translator = Translator(model, tokenizer, "beam", beam_size=4)
    >>> translations, scores = translator(["twenty one", "four hundred"])
    >>> translations  # ['einundzwanzig', 'vierhundert'] once trained for longer
    ['...', '...']
    >>> all(score < 0 for score in scores)
    True
    """

    def __init__(
        self,
        model,
        tokenizer,
        method="beam",
        batch_size=64,
        max_source_length=None,
        use_cache=True,
        jit_compile=False,
        **options,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.method = method
        self.batch_size = batch_size
        self.max_source_length = max_source_length or model.config.max_length
        self.options = dict(options)
        self.search_fn = make_search_fn(
            model, method, use_cache=use_cache, jit_compile=jit_compile, **options
        )

    def source_ids(self, texts):
        """int32 `(B, S)` EOS-terminated, PAD-padded source ids of `texts`."""
        return encode_source(self.tokenizer, list(texts), self.max_source_length)

    def cut_sources(self, texts):
        """The texts that are cut to `max_source_length` (EOS included) before decoding.

        Returns:
            a list of `(index, pieces)`: the 0-based index of each such text and its
            number of SentencePiece pieces (more than `max_source_length - 1`).
        """
        texts = list(texts)
        if not texts:
            return []
        pieces = self.tokenizer.tokenize(tf.constant(texts, tf.string)).row_lengths().numpy()
        return [
            (index, int(count))
            for index, count in enumerate(pieces)
            if count > self.max_source_length - 1
        ]

    def search(self, texts):
        """The best hypotheses of one batch: `(token_ids (B, L) int32, scores (B,))` tensors.

        Outputs exclude BOS, include EOS when it was produced and hold PAD after it.
        """
        outputs = self.search_fn(self.source_ids(texts))
        return best_hypotheses(
            outputs["token_ids"], outputs["scores"]
        )  # beam: (B, R, L), best first

    def output_ids(self, texts):
        """The best output ids of each sentence (one batch), PAD removed: a list of int lists."""
        token_ids, _ = self.search(texts)
        return [[int(i) for i in row if i != PAD_ID] for row in token_ids.numpy()]

    def translate_batch(self, texts):
        """Translate one batch, in one call of the search function."""
        token_ids, scores = self.search(texts)
        return _as_strings(decode_text(self.tokenizer, token_ids)), scores.numpy().tolist()

    def nbest_batch(self, texts):
        """Every hypothesis the search returns for one batch (beam: `num_return`, else one),
        best first: `(translations, scores)`, a list of texts and one of floats per sentence."""
        outputs = self.search_fn(self.source_ids(texts))
        token_ids, scores = outputs["token_ids"], outputs["scores"]
        if len(scores.shape) == 1:  # greedy and sampling: one hypothesis
            token_ids, scores = token_ids[:, None], scores[:, None]
        per_text = int(scores.shape[1])
        flat = _as_strings(
            decode_text(self.tokenizer, tf.reshape(token_ids, [-1, tf.shape(token_ids)[2]]))
        )
        translations = [flat[i : i + per_text] for i in range(0, len(flat), per_text)]
        return translations, scores.numpy().tolist()

    def nbest(self, texts):
        """`nbest_batch` over any number of texts, in length-sorted batches, in input order."""
        texts = list(texts)
        if not texts:
            return [], []

        def batch(texts):  # the lists travel as the "translations" of `translate_in_batches`
            translations, scores = self.nbest_batch(texts)
            return list(zip(translations, scores)), [0.0] * len(texts)

        lengths = self.tokenizer.tokenize(tf.constant(texts, tf.string)).row_lengths().numpy()
        pairs, _ = translate_in_batches(batch, texts, self.batch_size, lengths)
        return [list(translations) for translations, _ in pairs], [
            list(scores) for _, scores in pairs
        ]

    def __call__(self, texts, progress=None):
        texts = list(texts)
        if not texts:
            return [], []
        lengths = self.tokenizer.tokenize(tf.constant(texts, tf.string)).row_lengths().numpy()
        return translate_in_batches(
            self.translate_batch, texts, self.batch_size, lengths, progress=progress
        )


def _not_the_unsaved_gradients_warning(record):
    return "with ops with unsaved custom gradients" not in record.getMessage()


def load_export(export_dir):
    """`tf.saved_model.load` of one of the toolkit's exports, without TensorFlow's warning for
    each of its functions that its custom gradients were not saved ("Will likely fail if a
    gradient is requested"): an export leaves them out on purpose (`export.serving`: inference
    only), and nothing that decodes asks for a gradient. Other warnings pass."""
    logging.get_absl_logger().addFilter(_not_the_unsaved_gradients_warning)
    try:
        return tf.saved_model.load(str(export_dir))
    finally:
        logging.get_absl_logger().removeFilter(_not_the_unsaved_gradients_warning)


class SavedModelTranslator:
    """Translates sentences with an exported text-in/text-out SavedModel.

    The SavedModel is loaded with `tf.saved_model.load`; its signature (default
    `serving_default`) takes a string batch under the input key `text` and returns
    `translation` (strings) and `score` (floats). An n-best output `(B, R)` is reduced to
    its first (best) column.

    Args:
        export_dir: the SavedModel directory (e.g. `saved_models/transformer/1`), or a
            model root (`saved_models/transformer`: its highest version).
        batch_size: sentences per signature call.
        signature: the signature to call.

    Call arguments:
        texts: a list of source sentences.
        progress: optional `progress(done, total)` called after every batch
            (`translate_in_batches`).

    Returns:
        `(translations: list[str], scores: list[float])` in input order.
    """

    def __init__(self, export_dir, batch_size=64, signature="serving_default"):
        self.export_dir = str(resolve_saved_model(export_dir))
        self.batch_size = batch_size
        self.loaded = load_export(self.export_dir)
        if signature not in self.loaded.signatures:
            raise ValueError(
                f"{self.export_dir} has no signature {signature!r}. "
                f"Its signatures: {', '.join(sorted(self.loaded.signatures)) or 'none'}"
            )
        self.signature = self.loaded.signatures[signature]
        missing = {"text"} - set(self.signature.structured_input_signature[1])
        if missing:
            raise ValueError(
                f"Signature {signature!r} of {self.export_dir} takes no input 'text'. "
                f"Its inputs: {sorted(self.signature.structured_input_signature[1])}"
            )

    def translate_batch(self, texts):
        outputs = self.signature(text=tf.constant(list(texts), tf.string))
        for key in ("translation", "score"):
            if key not in outputs:
                raise ValueError(
                    f"The SavedModel signature returned no {key!r}. Its outputs: {sorted(outputs)}"
                )
        translations, scores = best_hypotheses(
            outputs["translation"], outputs["score"]
        )  # n-best: (B, R)
        return _as_strings(translations), np.asarray(scores).reshape(-1).tolist()

    def __call__(self, texts, progress=None):
        texts = list(texts)
        if not texts:
            return [], []
        return translate_in_batches(self.translate_batch, texts, self.batch_size, progress=progress)
