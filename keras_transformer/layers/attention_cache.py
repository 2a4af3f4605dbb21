"""The key/value cache of `MultiHeadAttention`, for decoding one position after another.

Three kinds, all dicts of `(B, H, length, width)` tensors (see the layer's docstring):

* preallocated self-attention buffer (`empty_cache(B, L, ...)`): `{"key", "value"}` with
  `L` slots; each step writes its new positions in place (`write_step`).
* growing self-attention cache (`empty_cache(B, None, ...)`): `{"past_key", "past_value"}`
  holding exactly the positions decoded so far; each step appends (`write_step`).
* ring of `r` slots for restricted self-attention (`attention_window=r`): position `p`
  lives in slot `p mod r` (`ring_step`).

The encoder-decoder cache (`MultiHeadAttention.compute_cache`) is computed once; queries
that are copies of its rows (beam search) attend per row (`group_queries`).

Shape letters: B batch, H heads, Q query length, L cache length, S ring slots,
Dk key/query width per head, Dv value width per head.
"""

import numbers

import keras
from keras import ops

from keras_transformer.layers.tracing import in_xla_context, needs_static_shapes
from keras_transformer.layers.windowed_attention import in_band

# A growing self-attention cache (`MultiHeadAttention.init_cache(B, None)`): these keys
# hold `(B, H, t, D)` tensors, the `t` positions decoded so far, along CACHE_LENGTH_AXIS.
GROWING_CACHE_KEYS = ("past_key", "past_value")
CACHE_LENGTH_AXIS = 2


def is_growing(cache):
    """Whether a self-attention `cache` is a growing one (`GROWING_CACHE_KEYS`)."""
    return GROWING_CACHE_KEYS[0] in cache


def buffers(cache):
    """The `(key, value)` tensors of a self-attention `cache`, growing or not."""
    names = GROWING_CACHE_KEYS if is_growing(cache) else ("key", "value")
    return tuple(cache[name] for name in names)


def empty_cache(batch_size, max_length, num_heads, key_dim, value_dim, attention_window, dtype):
    """An empty self-attention cache (`MultiHeadAttention.init_cache`).

    Zeros `{"key": (B, H, L, Dk), "value": (B, H, L, Dv)}`; with `attention_window=r` a
    ring of `min(r, max_length)` slots (`r` when `max_length` is a tensor or `None`).
    `max_length=None` without a window: a growing cache, `{"past_key": (B, H, 0, Dk),
    "past_value": (B, H, 0, Dv)}`.
    """
    if max_length is None and not attention_window:
        key_name, value_name = GROWING_CACHE_KEYS
        return {
            key_name: ops.zeros((batch_size, num_heads, 0, key_dim), dtype=dtype),
            value_name: ops.zeros((batch_size, num_heads, 0, value_dim), dtype=dtype),
        }
    slots = max_length
    if attention_window:
        slots = (
            min(attention_window, max_length)
            if isinstance(max_length, numbers.Integral)
            else attention_window
        )
    return {
        "key": ops.zeros((batch_size, num_heads, slots, key_dim), dtype=dtype),
        "value": ops.zeros((batch_size, num_heads, slots, value_dim), dtype=dtype),
    }


def write_step(cache, new_keys, new_values, start, query_length, attention_mask=None, causal=False):
    """Cached self-attention: the `Q` new positions written into the cache at `start`.

    A preallocated buffer gets them at slots `start .. start + Q - 1` (`write_positions`),
    and the keys/values to attend over are the written prefix (under XLA, which needs
    static shapes, and when JAX traces `start`, the whole buffer; the causal mask with
    offset `start` hides the rest).
    A growing cache gets them appended: it then holds exactly `start + Q` positions.

    Args:
        cache: a preallocated or growing cache (`empty_cache`).
        new_keys: `(B, H, Q, Dk)`, in the cache's dtype.
        new_values: `(B, H, Q, Dv)`, in the cache's dtype.
        start: int scalar, the position of the first new query.
        query_length: `Q`.
        attention_mask: optional `(B|1, Q, L)` over absolute positions.
        causal: whether the queries are to be masked causally.

    Returns:
        `(keys, values, cache, attention_mask, causal)`: the keys/values to attend over,
        the new cache, the mask cut to the keys attended over, and whether a causal mask
        is still needed: not for one new query (`Q = 1`, static) attending over exactly
        the written prefix, which it may see whole (the search's every step).
    """
    written = start + query_length
    growing = is_growing(cache)
    static = needs_static_shapes(start)
    key_buffer, value_buffer = buffers(cache)
    if growing:  # exactly the positions decoded so far, then the new ones
        keys = ops.concatenate([key_buffer, new_keys], axis=CACHE_LENGTH_AXIS)  # (B, H, t + Q, Dk)
        values = ops.concatenate(
            [value_buffer, new_values], axis=CACHE_LENGTH_AXIS
        )  # (B, H, t + Q, Dv)
        cache = dict(zip(GROWING_CACHE_KEYS, (keys, values)))
    else:
        keys = write_positions(key_buffer, new_keys, start)
        values = write_positions(value_buffer, new_values, start)
        cache = {"key": keys, "value": values}
        if not static:  # attend over the written prefix only
            keys, values = keys[:, :, :written], values[:, :, :written]
    prefix_only = growing or not static
    if attention_mask is not None and prefix_only:
        attention_mask = attention_mask[:, :, :written]
    if prefix_only and isinstance(query_length, int) and query_length == 1:
        causal = False
    return keys, values, cache, attention_mask, causal


def ring_step(cache, new_keys, new_values, start, query_length, attention_mask, window, causal):
    """Cached windowed self-attention over a ring buffer of `S` slots (`empty_cache`).

    Position `p` lives in slot `p mod S`. One new position (`Q = 1`, static) is written
    into its slot first and the query attends over the `S` slots. Several new positions
    attend over the ring as it was plus the new keys (`S + Q`); the ring then keeps the
    last `S` positions. Slots not written yet and positions outside the band of `window`
    are masked; an `attention_mask` `(B|1, Q, L)` over absolute positions is gathered at
    the positions the keys hold.

    Returns:
        `(keys, values, cache, mask)`: the keys/values to attend over, the new cache and
        a bool `(B|1, Q, K)` mask (band and causality included).

    Raises:
        ValueError: for a growing cache.
    """
    if is_growing(cache):
        raise ValueError(
            "A layer with attention_window keeps a ring of r slots (init_cache(B, max_length)), "
            "not a growing cache. Received: a cache with past_key"
        )
    slots = ops.shape(cache["key"])[2]
    start = ops.cast(start, "int32")
    query_positions = start + ops.arange(query_length, dtype="int32")  # (Q,)
    if new_keys.shape[2] == 1:
        slot = ops.mod(start, slots)
        keys = write_positions(cache["key"], new_keys, slot)  # (B, H, S, Dk)
        values = write_positions(cache["value"], new_values, slot)  # (B, H, S, Dv)
        new_cache = {"key": keys, "value": values}
        key_positions = _ring_positions(slots, start)  # (S,)
    else:
        keys = ops.concatenate([cache["key"], new_keys], axis=2)  # (B, H, S + Q, Dk)
        values = ops.concatenate([cache["value"], new_values], axis=2)  # (B, H, S + Q, Dv)
        key_positions = ops.concatenate(
            [_ring_positions(slots, start - 1), query_positions]
        )  # (S + Q,)
        kept = _ring_positions(slots, start + query_length - 1)  # (S,) positions after the write
        taken = ops.where(
            kept >= start, slots + kept - start, ops.arange(slots, dtype="int32")
        )  # into keys
        new_cache = {"key": ops.take(keys, taken, axis=2), "value": ops.take(values, taken, axis=2)}
    mask = in_band(query_positions[:, None], key_positions[None, :], window, causal)  # (Q, K)
    mask = ops.logical_and(mask, key_positions[None, :] >= 0)[
        None, :, :
    ]  # (1, Q, K): written slots only
    if attention_mask is not None:
        absolute = ops.take(
            ops.cast(attention_mask, "bool"), ops.maximum(key_positions, 0), axis=2
        )  # (B|1, Q, K)
        mask = ops.logical_and(mask, absolute)
    return keys, values, new_cache, mask


def write_positions(buffer, updates, start):
    """`buffer` `(B, H, L, D)` with `updates` `(B, H, Q, D)` written at positions `start .. start + Q - 1`.

    * JAX and PyTorch: `ops.slice_update` (`lax.dynamic_update_slice`, which XLA updates
      in place when the buffer is donated; an indexed copy with PyTorch).
    * TensorFlow, not `ops.slice_update`: that lowers to `XlaDynamicUpdateSlice`, which
      outside `jit_compile` runs only through on-demand XLA compilation; TF Serving's
      model server disables that on CPU, so it could not serve a SavedModel that decodes
      with the cache. Instead, core ops that touch only the written slots: outside XLA
      `TensorStridedSliceUpdate` (`buffer[:, :, start:start + Q] = updates`), which
      updates the buffer in place when nothing else holds it (as in a decoding loop)
      instead of copying all `L` slots; under XLA a scatter of the `B * H * Q` rows of
      width `D` (`TensorScatterUpdate`, which XLA compiles to an in-place update).
    """
    if keras.backend.backend() != "tensorflow":
        return ops.slice_update(buffer, (0, 0, ops.cast(start, "int32"), 0), updates)
    if not in_xla_context():
        import tensorflow as tf

        start = tf.cast(start, tf.int32)
        return tf.raw_ops.TensorStridedSliceUpdate(
            input=buffer,
            begin=tf.stack([0, 0, start, 0]),
            end=tf.stack([0, 0, start + tf.shape(updates)[2], 0]),
            strides=tf.ones([4], tf.int32),
            value=updates,
            begin_mask=0b1011,  # all of axes 0, 1 and 3
            end_mask=0b1011,
        )
    shape = ops.shape(updates)
    grid = ops.meshgrid(
        ops.arange(shape[0], dtype="int32"),
        ops.arange(shape[1], dtype="int32"),
        ops.arange(shape[2], dtype="int32") + ops.cast(start, "int32"),
        indexing="ij",
    )  # 3 x (B, H, Q)
    indices = ops.reshape(ops.stack(grid, axis=-1), (-1, 3))  # (B * H * Q, 3)
    return ops.scatter_update(
        buffer, indices, ops.reshape(updates, (-1, shape[3]))
    )  # rows (B * H * Q, D)


def _ring_positions(slots, last):
    """The position each slot of a ring buffer holds once positions `0 .. last` are written.

    Position `p` lives in slot `p mod slots`, so slot `s` holds the latest `p <= last` with
    `p mod slots == s`; a negative position marks a slot not written yet.

    Returns:
        int32 `(slots,)`.
    """
    last = ops.cast(last, "int32")
    slot = ops.arange(slots, dtype="int32")
    return last - ops.mod(last - slot + slots, slots)  # the argument stays >= 0 for last >= -1


def group_queries(queries, memory_rows):
    """`(N, H, Q, Dk)` -> `(B, H, C * Q, Dk)` for a memory of `B = N / C` rows.

    Row `b * C + c` of the queries is copy `c` of memory row `b` (the beam layout), so
    the `C` copies attend over one untiled copy of the memory keys/values.
    """
    shape = ops.shape(queries)
    copies = shape[0] // memory_rows
    grouped = ops.reshape(
        queries, (memory_rows, copies, shape[1], shape[2], shape[3])
    )  # (B, C, H, Q, Dk)
    grouped = ops.transpose(grouped, (0, 2, 1, 3, 4))  # (B, H, C, Q, Dk)
    return ops.reshape(grouped, (memory_rows, shape[1], copies * shape[2], shape[3]))


def ungroup_outputs(outputs, rows, query_length):
    """Inverse of `group_queries`: `(B, H, C * Q, Dv)` -> `(N, H, Q, Dv)`."""
    shape = ops.shape(outputs)
    copies = rows // shape[0]
    outputs = ops.reshape(
        outputs, (shape[0], shape[1], copies, query_length, shape[3])
    )  # (B, H, C, Q, Dv)
    outputs = ops.transpose(outputs, (0, 2, 1, 3, 4))  # (B, C, H, Q, Dv)
    return ops.reshape(outputs, (rows, shape[1], query_length, shape[3]))
