"""Greedy and beam search in `keras.ops`: the searches of every Keras backend.

Shape letters: B batch, K beam size, N = B * K rows, S source length, L output buffer
length, V vocabulary size, R = num_return.

`greedy_search` and `beam_search` (`greedy.py`, `beam.py`) run these when Keras runs on
JAX or PyTorch; on TensorFlow they run their own `tf.while_loop`s, which add what needs
TensorFlow's loop (caches that grow with the output, finished sentences leaving the
batch) and exports. Both kinds follow the same algorithm and length conventions
(`lengths.py`, `beam.py`'s docstring) and give the same outputs on the same weights: one
`ops.while_loop` over `model.decode_step` with a preallocated cache of `L` slots (static
shapes, so on JAX the loop body is compiled by XLA as `lax.while_loop`), `selection.top_k`
for the beam, `ops.take_along_axis` for the parents.

A model needs `encode`, `init_cache(encoder_outputs, L)` and `decode_step` with the
signatures of `keras_transformer.Transformer`. Word positions (parsing) and the tree
constraint stay on TensorFlow.
"""

import math

from keras import ops

from keras_transformer.backends import require_tensorflow
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.decoding import lengths as lengths_lib
from keras_transformer.decoding import selection
from keras_transformer.decoding.options import SearchOptions
from keras_transformer.decoding.steps import map_cache, shares_cross_cache

_NEG_INF = -math.inf


def _start(model, source_ids, max_length, max_output_offset, num_copies):
    """Encode once: `(buffer_size, limits, cache, source_mask)`; the self-attention cache has
    `num_copies` rows per sentence, the encoder-decoder one and the mask one or `num_copies`."""
    if getattr(model, "uses_word_positions", False):
        require_tensorflow("Searching a word-position model (config.word_positions)")
    buffer_size = lengths_lib.buffer_length(model, source_ids, max_length, max_output_offset)  # a Python int
    limits = lengths_lib.output_limits(source_ids, buffer_size, max_output_offset)  # (B,)
    encoder_outputs, source_mask = model.encode(source_ids)  # (B, S, D), (B, S)

    def copies(tensor):  # row b * K + k is copy k of sentence b
        return ops.repeat(tensor, num_copies, axis=0)

    # A model that shares the encoder-decoder keys/values between copies
    # (`steps.shares_cross_cache`) computes them once per sentence; only its
    # self-attention buffers get a row per copy.
    shared = num_copies > 1 and shares_cross_cache(model)
    if num_copies > 1 and not shared:
        encoder_outputs, source_mask = copies(encoder_outputs), copies(source_mask)
    cache = model.init_cache(encoder_outputs, buffer_size)
    if shared:
        cache = map_cache(cache, copies, cross=False)
    return buffer_size, limits, cache, source_mask


def _next_log_probs(model, target_ids, index, cache, source_mask):
    """`(log_probs (N, V) float32 with BANNED_IDS at -inf, cache)` for decoder slot `index`."""
    rows = ops.shape(target_ids)[0]
    tokens = ops.slice(target_ids, (0, index), (rows, 1))  # (N, 1)
    logits, cache = model.decode_step(tokens, cache, index, source_mask)  # (N, 1, V)
    log_probs = ops.log_softmax(ops.cast(logits[:, 0, :], "float32"), axis=-1)
    return lengths_lib.mask_banned(log_probs), cache


def greedy_search(model, source_ids, max_length=None, max_output_offset=50):
    """Greedy search on any backend; arguments and results as `decoding.greedy_search`.

    Example:

    >>> from keras_transformer import Transformer, get_preset
    >>> from keras_transformer.decoding import portable
    >>> model = Transformer(get_preset("tiny", vocabulary_size=32, num_encoder_layers=1,
    ...                                num_decoder_layers=1, hidden_dim=32, num_heads=2))
    >>> token_ids, scores = portable.greedy_search(model, [[5, 6, 7, 3]], max_length=8)
    >>> tuple(token_ids.shape), tuple(scores.shape)
    ((1, 8), (1,))
    """
    source_ids = lengths_lib.as_source_ids(source_ids)
    batch_size = source_ids.shape[0]
    buffer_size, limits, cache, source_mask = _start(model, source_ids, max_length, max_output_offset, 1)
    target_ids = ops.concatenate(
        [ops.full((batch_size, 1), BOS_ID, "int32"), ops.zeros((batch_size, buffer_size), "int32")], axis=1
    )  # (B, L + 1): BOS then the outputs
    slots = ops.arange(buffer_size + 1, dtype="int32")

    def cond(index, target_ids, scores, finished, cache):
        return ops.logical_and(index < buffer_size, ops.logical_not(ops.all(finished)))

    def body(index, target_ids, scores, finished, cache):
        log_probs, cache = _next_log_probs(model, target_ids, index, cache, source_mask)  # (B, V)
        tokens = ops.cast(ops.argmax(log_probs, axis=-1), "int32")  # (B,)
        token_log_probs = ops.take_along_axis(log_probs, tokens[:, None], axis=1)[:, 0]
        tokens = ops.where(finished, PAD_ID, tokens)
        scores = scores + ops.where(finished, 0.0, token_log_probs)
        target_ids = ops.where(ops.equal(slots, index + 1)[None, :], tokens[:, None], target_ids)
        finished = finished | ops.equal(tokens, EOS_ID) | (index + 1 >= limits)
        return index + 1, target_ids, scores, finished, cache

    loop_vars = (
        ops.convert_to_tensor(0, "int32"),
        target_ids,
        ops.zeros((batch_size,), "float32"),
        ops.less_equal(limits, 0),
        cache,
    )
    _, target_ids, scores, _, _ = ops.while_loop(cond, body, loop_vars)
    return target_ids[:, 1:], scores


def _gather_beams(tensor, indices):
    """`tensor (A, K, ...)` rows picked per sentence by `indices (A, M)` -> `(A, M, ...)`."""
    shape = ops.shape(indices) + ops.shape(tensor)[2:]
    indices = ops.reshape(indices, ops.shape(indices) + (1,) * (len(tensor.shape) - 2))
    return ops.take_along_axis(tensor, ops.broadcast_to(indices, shape), axis=1)


def beam_search(model, source_ids, beam_size=4, length_penalty=0.6, max_output_offset=50, max_length=None, num_return=1):
    """Beam search on any backend; arguments and results as `decoding.beam_search` (the
    algorithm is described there).

    Example:

    >>> from keras_transformer import Transformer, get_preset
    >>> from keras_transformer.decoding import portable
    >>> model = Transformer(get_preset("tiny", vocabulary_size=32, num_encoder_layers=1,
    ...                                num_decoder_layers=1, hidden_dim=32, num_heads=2))
    >>> token_ids, scores = portable.beam_search(model, [[5, 6, 7, 3], [8, 3, 0, 0]],
    ...                                          num_return=2, max_length=8)
    >>> tuple(token_ids.shape), tuple(scores.shape)
    ((2, 2, 8), (2, 2))
    """
    SearchOptions(beam_size=beam_size, length_penalty=length_penalty, num_return=num_return)  # raises naming the value
    alpha = float(length_penalty)
    k = beam_size
    source_ids = lengths_lib.as_source_ids(source_ids)
    batch_size = source_ids.shape[0]
    buffer_size, limits, cache, source_mask = _start(model, source_ids, max_length, max_output_offset, k)
    width = buffer_size + 1
    alive_ids = ops.concatenate(
        [ops.full((batch_size, k, 1), BOS_ID, "int32"), ops.zeros((batch_size, k, buffer_size), "int32")], axis=2
    )  # (B, K, L + 1)
    # Only beam 0 is alive at first, so the first step does not expand K copies of BOS.
    alive_log_probs = ops.tile(ops.array([[0.0] + [_NEG_INF] * (k - 1)], "float32"), (batch_size, 1))  # (B, K)
    best_possible_penalty = lengths_lib.length_penalty(limits, alpha)  # (B,) lp(limit)
    slots = ops.arange(width, dtype="int32")
    in_first_k = (ops.arange(2 * k) < k)[None, :]  # (1, 2K)
    sentence_rows = ops.arange(batch_size, dtype="int32")[:, None] * k  # (B, 1)

    def cond(index, alive_ids, alive_log_probs, finished_ids, finished_scores, done, cache):
        return ops.logical_and(index < buffer_size, ops.logical_not(ops.all(done)))

    def body(index, alive_ids, alive_log_probs, finished_ids, finished_scores, done, cache):
        flat_ids = ops.reshape(alive_ids, (batch_size * k, width))  # (N, L + 1)
        log_probs, cache = _next_log_probs(model, flat_ids, index, cache, source_mask)  # (N, V)
        vocabulary_size = log_probs.shape[-1]
        log_probs = ops.reshape(log_probs, (batch_size, k, vocabulary_size))

        # 1. the 2K best one-token extensions
        candidates = ops.reshape(alive_log_probs[:, :, None] + log_probs, (batch_size, k * vocabulary_size))
        top_log_probs, top_indices = selection.top_k(candidates, 2 * k)  # (B, 2K), as ops.top_k
        parents = top_indices // vocabulary_size
        tokens = top_indices % vocabulary_size
        top_ids = _gather_beams(alive_ids, parents)  # (B, 2K, L + 1)
        top_ids = ops.where(ops.equal(slots, index + 1)[None, None, :], tokens[:, :, None], top_ids)
        valid = (top_log_probs > _NEG_INF) & ops.logical_not(done)[:, None]
        ended = ops.equal(tokens, EOS_ID) | (index + 1 >= limits)[:, None]

        # 2. finished: merge the new ones (ranked in the first K) into the finished set
        normalized = top_log_probs / lengths_lib.length_penalty(index + 1, alpha)
        new_scores = ops.where(valid & ended & in_first_k, normalized, _NEG_INF)
        merged_scores = ops.concatenate([finished_scores, new_scores], axis=1)  # (B, 3K)
        merged_ids = ops.concatenate([finished_ids, top_ids], axis=1)  # (B, 3K, L + 1)
        finished_scores, picked = ops.top_k(merged_scores, k=k)  # (B, K), sorted
        finished_ids = _gather_beams(merged_ids, ops.cast(picked, "int32"))

        # 3. alive: the K best that did not end; the cache follows their parents
        continuing = ops.where(valid & ops.logical_not(ended), top_log_probs, _NEG_INF)
        alive_log_probs, picked = ops.top_k(continuing, k=k)  # (B, K)
        picked = ops.cast(picked, "int32")
        alive_ids = _gather_beams(top_ids, picked)
        parent_rows = ops.reshape(_gather_beams(parents, picked) + sentence_rows, (-1,))  # (N,)
        # The "cross" keys/values are identical for a sentence's copies: left as they are.
        cache = map_cache(cache, lambda tensor: ops.take(tensor, parent_rows, axis=0), cross=False)

        # 4. early stopping: can any alive hypothesis still beat the num_return-th finished?
        bound = ops.max(alive_log_probs, axis=1) / best_possible_penalty  # (B,)
        done = done | (finished_scores[:, num_return - 1] >= bound)
        alive_log_probs = ops.where(done[:, None], _NEG_INF, alive_log_probs)
        return index + 1, alive_ids, alive_log_probs, finished_ids, finished_scores, done, cache

    loop_vars = (
        ops.convert_to_tensor(0, "int32"),
        alive_ids,
        alive_log_probs,
        ops.zeros_like(alive_ids),
        ops.full((batch_size, k), _NEG_INF, "float32"),
        ops.less_equal(limits, 0),
        cache,
    )
    _, _, _, finished_ids, finished_scores, _, _ = ops.while_loop(cond, body, loop_vars)
    return finished_ids[:, :num_return, 1:], finished_scores[:, :num_return]
