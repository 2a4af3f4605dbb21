"""One hypothesis per sentence: greedy search and (top-k / nucleus) sampling.

Shape letters: B batch, S source length, L output buffer length, V vocabulary size.

Both run one loop over a step function (see `steps.py`), written in `keras.ops`: on
TensorFlow a `tf.while_loop` (static shapes under XLA), so they work eagerly, under
`tf.function`, under `tf.function(jit_compile=True)` and inside an exported SavedModel;
greedy search runs the same code on JAX (`lax.while_loop`, compiled by `jax.jit`) and
PyTorch. The loop ends when every sentence has emitted EOS or reached its length limit
(see `lengths.py`).
"""

import math

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.backends import require_tensorflow
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.decoding import lengths as lengths_lib
from keras_transformer.decoding import selection
from keras_transformer.decoding.steps import make_step, search_loop

# 2^-24: turns 24 random bits into a float32 in (0, 1) exactly.
_UNIT = 1.0 / (1 << 24)


def check_backend(search, use_cache=True):
    """On a backend other than TensorFlow, a search without the cache (TensorFlow's
    `RecomputeStep`) raises one line naming the backend."""
    if not use_cache and keras.backend.backend() != "tensorflow":
        require_tensorflow(f"{search} without the cache (use_cache=False)")


def _decode_loop(step_fn, source_ids, max_length, max_output_offset, choose, constraint=None):
    """The shared loop. `choose(logits (B, V), log_probs (B, V), index) -> tokens (B,)`;
    `constraint` (e.g. a `TreeConstraint`) masks the ids a hypothesis may not take next."""
    source_ids = lengths_lib.as_source_ids(source_ids)
    buffer_size = lengths_lib.buffer_length(
        getattr(step_fn, "model", None), source_ids, max_length, max_output_offset
    )
    limits = lengths_lib.output_limits(source_ids, buffer_size, max_output_offset)  # (B,)
    batch_size = ops.shape(source_ids)[0]
    state = step_fn.initialize(source_ids, buffer_size, num_copies=1)
    target_ids = ops.concatenate(
        [ops.full((batch_size, 1), BOS_ID, "int32"), ops.zeros((batch_size, buffer_size), "int32")],
        axis=1,
    )  # (B, L + 1): BOS then the outputs
    slots = ops.arange(ops.shape(target_ids)[1], dtype="int32")  # (L + 1,)
    words = constraint.source_words(source_ids) if constraint is not None else None  # (B,)

    def cond(index, target_ids, scores, finished, state):
        return ops.logical_and(index < buffer_size, ops.logical_not(ops.all(finished)))

    def body(index, target_ids, scores, finished, state):
        logits, state = step_fn.step(state, target_ids, index)  # (B, V)
        log_probs = lengths_lib.mask_banned(
            ops.log_softmax(logits, axis=-1)
        )  # (B, V), not renormalized
        logits = lengths_lib.mask_banned(logits)
        if constraint is not None:
            log_probs = constraint.apply(log_probs, target_ids, index, words, limits)
            logits = constraint.apply(logits, target_ids, index, words, limits)
        tokens = ops.cast(choose(logits, log_probs, index), "int32")  # (B,)
        token_log_probs = selection.take_per_row(log_probs, tokens[:, None])[:, 0]  # (B,)
        tokens = ops.where(finished, PAD_ID, tokens)
        scores = scores + ops.where(finished, 0.0, token_log_probs)
        target_ids = ops.where(ops.equal(slots, index + 1)[None, :], tokens[:, None], target_ids)
        finished = finished | ops.equal(tokens, EOS_ID) | (index + 1 >= limits)
        return index + 1, target_ids, scores, finished, state

    loop_vars = (
        ops.convert_to_tensor(0, "int32"),
        target_ids,
        ops.zeros((batch_size,), "float32"),
        ops.less_equal(limits, 0),
        state,
    )
    _, target_ids, scores, _, _ = search_loop(cond, body, loop_vars)
    return target_ids[:, 1:], scores


def greedy_search(
    model, source_ids, max_length=None, max_output_offset=50, use_cache=True, constraint=None
):
    """Greedy decoding: the most probable next token at every step.

    Args:
        model: a `Transformer` (or any object with its `encode` / `init_cache` /
            `decode_step` / `decode` interface), or a step object from `steps.py`.
        source_ids: int `(B, S)`, sources ending with EOS, right-padded with 0; sources of
            different lengths may share a batch.
        max_length: the output buffer length `L`. An int makes every output shape static
            (`(B, L)` whatever the input). `None`: `L = S + max_output_offset` for the
            padded width `S` (capped at `model.config.max_length` with learned positions).
        max_output_offset: sentence `b` stops after at most
            `min(source_length_b + max_output_offset, L)` tokens, `source_length_b` being
            its number of non-PAD source tokens.
        use_cache: decode with the key/value cache (`CachedStep`); False re-runs the full
            decoder over the prefix every step (`RecomputeStep`).
        constraint: None, or an object whose `apply` masks the ids a hypothesis may not
            take next (`TreeConstraint`: every output a tree over the source's words).

    Returns:
        `(token_ids int32 (B, L), scores float32 (B,))`: outputs without BOS, with EOS when
        one was produced, PAD (0) after it; scores are sums of the model's token
        log-probabilities (natural log). PAD and BOS are never produced.

    Example:

    >>> from keras_transformer import Transformer, get_preset
    >>> from keras_transformer.decoding import greedy_search
    >>> model = Transformer(get_preset("tiny", vocabulary_size=32, num_encoder_layers=1,
    ...                                num_decoder_layers=1, hidden_dim=32, num_heads=2))
    >>> token_ids, scores = greedy_search(model, [[5, 6, 7, 3]], max_length=8)
    >>> tuple(token_ids.shape), tuple(scores.shape)
    ((1, 8), (1,))

    The same code runs on every Keras backend (`keras.ops`; on JAX, `jax.jit` compiles it),
    the constraint included; `use_cache=False` needs TensorFlow.
    """
    check_backend("greedy search", use_cache)

    def choose(logits, log_probs, index):
        return ops.argmax(log_probs, axis=-1)

    return _decode_loop(
        make_step(model, use_cache), source_ids, max_length, max_output_offset, choose, constraint
    )


def recompute_greedy_search(model, source_ids, max_length=None, max_output_offset=50):
    """`greedy_search` without the cache: the full decoder re-runs over the prefix every step."""
    return greedy_search(
        model,
        source_ids,
        max_length=max_length,
        max_output_offset=max_output_offset,
        use_cache=False,
    )


def _seed_pair(seed):
    """A seed as an int32 tensor of shape (2,), as the stateless random ops want."""
    if seed is None:
        return tf.random.uniform([2], 0, 2**31 - 1, dtype=tf.int32)  # fresh each call
    if isinstance(seed, bool):
        raise ValueError(
            f"seed must be an integer, a (2,) integer tensor or None. Received: seed={seed!r}"
        )
    if isinstance(seed, int):
        return tf.constant([seed % (2**31), 0], tf.int32)
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int32)
    if seed.shape.rank == 0:
        return tf.stack([seed, tf.zeros_like(seed)])
    if seed.shape.rank == 1 and seed.shape[0] == 2:
        return seed
    raise ValueError(
        f"seed must be an integer, a (2,) integer tensor or None. Received: seed={seed!r}"
    )


def uniform_noise(shape, seed):
    """Uniform floats in (0, 1) from a stateless seed, identical with and without XLA.

    `tf.random.stateless_uniform` for floats is not bit-identical between XLA and the TF
    kernels; its raw 32-bit output is, so the float is made here from 24 of those bits.
    """
    bits = tf.random.stateless_uniform(
        shape, seed=seed, minval=None, maxval=None, dtype=tf.uint32, alg="philox"
    )
    bits = tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32))
    return (tf.cast(bits, tf.float32) + 0.5) * _UNIT


def filter_logits(logits, top_k=0, top_p=1.0):
    """Keep the `top_k` largest logits and the smallest set of tokens whose probability
    reaches `top_p` (nucleus); the others become -inf. `(B, V)` -> `(B, V)`.

    Tokens tied with the last kept logit are kept too.
    """
    neg_inf = tf.constant(-math.inf, logits.dtype)
    if top_k:
        vocabulary_size = logits.shape[-1]
        if vocabulary_size is not None:
            top_k = min(top_k, vocabulary_size)
        else:
            top_k = tf.minimum(top_k, tf.shape(logits)[-1])
        kth = tf.math.top_k(logits, k=top_k).values[:, -1:]  # (B, 1)
        logits = tf.where(logits < kth, neg_inf, logits)
    if top_p < 1.0:
        sorted_logits = tf.sort(logits, axis=-1, direction="DESCENDING")  # (B, V)
        probs = tf.nn.softmax(sorted_logits, axis=-1)
        before = tf.cumsum(
            probs, axis=-1, exclusive=True
        )  # probability mass ranked above each token
        keep = tf.reduce_sum(
            tf.cast(before < top_p, tf.int32), axis=-1, keepdims=True
        )  # (B, 1), >= 1
        threshold = tf.gather(sorted_logits, keep - 1, batch_dims=1)  # (B, 1): smallest kept logit
        logits = tf.where(logits < threshold, neg_inf, logits)
    return logits


def sample(
    model,
    source_ids,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    seed=None,
    max_length=None,
    max_output_offset=50,
    use_cache=True,
    constraint=None,
):
    """Ancestral sampling, optionally restricted to the top-k tokens and/or the nucleus top-p.

    Every step draws the next token from softmax(logits / temperature) after the top-k
    and top-p filters (Gumbel-max trick with stateless random bits: step `t` uses the seed
    folded with `t`). The same seed gives the same samples eagerly, in graph mode, under
    XLA and in an exported SavedModel; a sentence's noise depends on its row in the batch.

    Args:
        model: as in `greedy_search`.
        source_ids: int `(B, S)`, 0 = padding.
        temperature: > 0; lower is closer to greedy.
        top_k: sample among the `top_k` most probable tokens (0 = all). `top_k=1` is greedy.
        top_p: sample among the most probable tokens whose total probability reaches
            `top_p` (1.0 = all).
        seed: an int, an int tensor of shape `()` or `(2,)`, or None for a fresh random
            seed on every call.
        max_length, max_output_offset, use_cache, constraint: as in `greedy_search`.

    Returns:
        `(token_ids int32 (B, L), scores float32 (B,))` as in `greedy_search`; scores are
        the sampled tokens' log-probabilities under the model itself (temperature 1,
        unfiltered).

    Sampling runs on TensorFlow only: its noise comes from TensorFlow's stateless Philox
    bits, the same eagerly, under XLA and in a SavedModel.
    """
    require_tensorflow("Sampling (decoding.sample)")
    if (
        not isinstance(temperature, (int, float))
        or isinstance(temperature, bool)
        or not temperature > 0
    ):
        raise ValueError(f"temperature must be a number > 0. Received: temperature={temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = no limit). Received: top_k={top_k!r}")
    if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1]. Received: top_p={top_p!r}")
    seed = _seed_pair(seed)

    def choose(logits, log_probs, index):
        logits = filter_logits(logits / temperature, top_k=top_k, top_p=top_p)
        step_seed = tf.random.experimental.stateless_fold_in(seed, index, alg="philox")
        noise = uniform_noise(tf.shape(logits), step_seed)
        gumbel = -tf.math.log(-tf.math.log(noise))  # (B, V)
        return tf.argmax(logits + gumbel, axis=-1, output_type=tf.int32)

    return _decode_loop(
        make_step(model, use_cache), source_ids, max_length, max_output_offset, choose, constraint
    )
