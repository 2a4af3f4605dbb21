"""A compiled search function for a model and fixed settings, for translation and export.

Shape letters: B batch, S source length, L output buffer length, R hypotheses per sentence.
"""

import inspect

import tensorflow as tf

from keras_transformer.backends import require_tensorflow
from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.greedy import greedy_search, sample
from keras_transformer.decoding.options import check_method
from keras_transformer.decoding.steps import make_step

METHODS = {"greedy": greedy_search, "beam": beam_search, "sample": sample}

SOURCE_SPEC = tf.TensorSpec([None, None], tf.int32, name="source_ids")


def make_search_fn(model, method="beam", use_cache=True, jit_compile=False, **options):
    """A `tf.function` that decodes int32 `(B, S)` source ids with fixed settings.

    Its input signature is `tf.TensorSpec([None, None], tf.int32, name="source_ids")`, so
    it is traced once (any batch size and source length) and can be attached to a
    `tf.Module` and exported as a SavedModel signature. With `jit_compile=True` XLA
    compiles it; XLA specializes on input shapes, so pass `max_length=` (an int) to get
    one static output buffer, and pad sources to a few fixed widths to limit recompiles.

    Args:
        model: a `Transformer` (or an object with its interface), or a `decoding.Ensemble`.
        method: "greedy", "beam" or "sample".
        use_cache: the cached decoder step (True) or full recomputation every step (False).
        jit_compile: compile with XLA.
        **options: the keyword arguments of `greedy_search`, `beam_search` or `sample`
            (e.g. `beam_size`, `length_penalty`, `max_output_offset`, `max_length`,
            `num_return`, `temperature`, `top_k`, `top_p`, `seed`).

    Returns:
        a `tf.function` mapping `source_ids` to `{"token_ids": int32, "scores": float32}`:
        `(B, L)` and `(B,)` for greedy and sampling, `(B, R, L)` and `(B, R)` for beam.

    Example:

    >>> from keras_transformer import Transformer, get_preset
    >>> from keras_transformer.decoding import make_search_fn
    >>> model = Transformer(get_preset("tiny", vocabulary_size=32, num_encoder_layers=1,
    ...                                num_decoder_layers=1, hidden_dim=32, num_heads=2))
    >>> translate = make_search_fn(model, "beam", beam_size=4, max_length=8)
    >>> outputs = translate([[5, 6, 7, 3], [8, 3, 0, 0]])
    >>> tuple(outputs["token_ids"].shape), tuple(outputs["scores"].shape)
    ((2, 1, 8), (2, 1))
    """
    require_tensorflow("A compiled search (decoding.make_search_fn, a tf.function)")
    check_method(method)
    search = METHODS[method]
    try:  # unknown option names fail here, not at the first call
        inspect.signature(search).bind(model, None, **options)
    except TypeError as error:
        raise ValueError(
            f"Invalid options for method={method!r}: {error}. Received: {sorted(options)}"
        ) from None
    # Under XLA the recompute baseline decodes the whole buffer every step (static shapes).
    step = make_step(model, use_cache, prefix_only=not jit_compile)

    @tf.function(input_signature=[SOURCE_SPEC], jit_compile=jit_compile)
    def search_fn(source_ids):
        token_ids, scores = search(step, source_ids, **options)
        return {"token_ids": token_ids, "scores": scores}

    return search_fn


def best_hypotheses(outputs, scores):
    """The best (first) hypothesis of each sentence of an n-best result.

    Args:
        outputs: `(B, R, ...)` hypotheses (token ids `(B, R, L)` or texts `(B, R)`), or
            already one per sentence `(B, ...)`.
        scores: `(B, R)` scores, best first, or `(B,)`.

    Returns:
        `(outputs[:, 0], scores[:, 0])` for an n-best result, else the inputs unchanged.
    """
    if len(scores.shape) == 2:
        return outputs[:, 0], scores[:, 0]
    return outputs, scores
