"""Text in, text out: in-graph tokenization around the search functions.

The same functions run eagerly, in `tf.function`s, and inside exported SavedModels, so a
translation made in Python and one made by the exported model go through identical ops.

Shape letters: B batch, S source length, L output length, R hypotheses per sentence.
"""

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.data.tokenizer import EOS_ID, PAD_ID

REPLACEMENT_CHARACTER = 0xFFFD


def valid_utf8(text):
    """tf.string `text` with invalid UTF-8 sequences replaced by U+FFFD (same shape).

    The one rule for input text, in Python (`evaluation.decode_lines`) and in the exported
    SavedModel (`export.TranslationModule`): decoding never fails.
    """
    return tf.strings.unicode_transcode(
        text,
        input_encoding="UTF-8",
        output_encoding="UTF-8",
        errors="replace",
        replacement_char=REPLACEMENT_CHARACTER,
    )


def encode_source(tokenizer, texts, max_length):
    """Source ids for `texts`: pieces, cut to `max_length - 1`, then EOS, right-padded with 0.

    Inputs longer than the model's maximum source length are truncated (documented
    behaviour, also of the exported model).

    Args:
        tokenizer: a `data.Tokenizer`.
        texts: tf.string `(B,)` (or a list of str).
        max_length: the longest source sequence, EOS included.

    Returns:
        int32 `(B, S)` with `S <= max_length`.
    """
    texts = tf.convert_to_tensor(texts, tf.string)
    pieces = tokenizer.tokenize(texts)[:, : max_length - 1]  # ragged (B, None)
    eos = tf.fill([pieces.nrows(), 1], tf.constant(EOS_ID, pieces.dtype))
    ids = tf.concat([pieces, eos], axis=1).to_tensor(default_value=PAD_ID)
    return tf.cast(ids, tf.int32)


def decode_text(tokenizer, token_ids):
    """UTF-8 text of output ids `(B, L)` (or `(B, R, L)` -> `(B, R)`), cut at the first EOS."""
    token_ids = tf.convert_to_tensor(token_ids)
    if token_ids.shape.rank == 3:
        shape = tf.shape(token_ids)
        flat = tokenizer.detokenize(tf.reshape(token_ids, [-1, shape[2]]))
        return tf.reshape(flat, shape[:2])
    return tokenizer.detokenize(token_ids)


def translate(model, tokenizer, texts, method="beam", max_source_length=None, **search_options):
    """Translate a list of strings with a trained model (eager convenience wrapper).

    On TensorFlow the search runs as a `tf.function` (`make_search_fn`); on JAX and PyTorch
    greedy and beam search run as they are (sampling needs TensorFlow).

    Args:
        model: a `Transformer`.
        tokenizer: the run's `data.Tokenizer`.
        texts: list of source strings.
        method: "greedy", "beam" or "sample".
        max_source_length: truncate sources (default: the model config's `max_length`).
        **search_options: passed to the search function (`beam_size`, `length_penalty`,
            `max_output_offset`, `max_length`, ...).

    Returns:
        `(translations: list[str], scores: list[float])` (the best hypothesis for beam).
    """
    from keras_transformer.decoding.options import check_method
    from keras_transformer.decoding.searcher import METHODS, best_hypotheses, make_search_fn

    source_ids = encode_source(tokenizer, list(texts), max_source_length or model.config.max_length)
    if keras.backend.backend() == "tensorflow":
        outputs = make_search_fn(model, method, **search_options)(source_ids)
    else:  # the same searches, called directly (sampling raises, naming the backend)
        check_method(method)
        found = METHODS[method](model, source_ids.numpy(), **search_options)
        outputs = dict(
            zip(("token_ids", "scores"), (keras.ops.convert_to_numpy(value) for value in found))
        )
    token_ids, scores = best_hypotheses(outputs["token_ids"], outputs["scores"])
    texts = [text.decode("utf-8") for text in decode_text(tokenizer, token_ids).numpy()]
    return texts, [float(score) for score in np.asarray(scores)]
