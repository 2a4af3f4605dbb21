"""Scaled dot-product attention (paper eq. 1) and multi-head attention (section 3.2.2).

Shape letters: B batch, Q query length, K key length, L cache length, D model width,
H heads, Dk key/query width per head, Dv value width per head.
"""

import math
import numbers

import keras
from keras import ops

from keras_transformer.layers import masks as masks_lib
from keras_transformer.layers.checks import check_positive_int, check_rate
from keras_transformer.layers.dropout import ReplicaDropout
from keras_transformer.layers.tracing import in_xla_context

# Added to masked scores before the softmax. The softmax runs in float32 (also under
# mixed precision), where -1e9 underflows exp() to exactly 0.
MASK_VALUE = -1e9

# A growing self-attention cache (`MultiHeadAttention.init_cache(B, None)`): these keys
# hold `(B, H, t, D)` tensors, the `t` positions decoded so far, along CACHE_LENGTH_AXIS.
GROWING_CACHE_KEYS = ("past_key", "past_value")
CACHE_LENGTH_AXIS = 2


def _write_positions(buffer, updates, start):
    """`buffer` `(B, H, L, D)` with `updates` `(B, H, Q, D)` written at positions `start .. start + Q - 1`.

    Not `ops.slice_update`: the TensorFlow backend lowers that to `XlaDynamicUpdateSlice`,
    which outside `jit_compile` runs only through on-demand XLA compilation; TF Serving's
    model server disables that on CPU, so it could not serve a SavedModel that decodes
    with the cache. Instead, core ops that touch only the written slots:

    * TensorFlow outside XLA: `TensorStridedSliceUpdate` (`buffer[:, :, start:start + Q] =
      updates`), which updates the buffer in place when nothing else holds it (as in a
      decoding loop) instead of copying all `L` slots.
    * under XLA and with other backends: a scatter of the `B * H * Q` rows of width `D`
      (`TensorScatterUpdate` with TensorFlow; XLA compiles it to an in-place update).
    """
    if keras.backend.backend() == "tensorflow" and not in_xla_context():
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
    return ops.scatter_update(buffer, indices, ops.reshape(updates, (-1, shape[3])))  # rows (B * H * Q, D)


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


def _group_queries(queries, memory_rows):
    """`(N, H, Q, Dk)` -> `(B, H, C * Q, Dk)` for a memory of `B = N / C` rows.

    Row `b * C + c` of the queries is copy `c` of memory row `b` (the beam layout), so
    the `C` copies attend over one untiled copy of the memory keys/values.
    """
    shape = ops.shape(queries)
    copies = shape[0] // memory_rows
    grouped = ops.reshape(queries, (memory_rows, copies, shape[1], shape[2], shape[3]))  # (B, C, H, Q, Dk)
    grouped = ops.transpose(grouped, (0, 2, 1, 3, 4))  # (B, H, C, Q, Dk)
    return ops.reshape(grouped, (memory_rows, shape[1], copies * shape[2], shape[3]))


def _ungroup_outputs(outputs, rows, query_length):
    """Inverse of `_group_queries`: `(B, H, C * Q, Dv)` -> `(N, H, Q, Dv)`."""
    shape = ops.shape(outputs)
    copies = rows // shape[0]
    outputs = ops.reshape(outputs, (shape[0], shape[1], copies, query_length, shape[3]))  # (B, H, C, Q, Dv)
    outputs = ops.transpose(outputs, (0, 2, 1, 3, 4))  # (B, C, H, Q, Dv)
    return ops.reshape(outputs, (rows, shape[1], query_length, shape[3]))


@keras.saving.register_keras_serializable(package="keras_transformer")
def scaled_dot_product_attention(query, key, value, mask=None):
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V  (paper eq. 1).

    Works on any leading (batch, head) axes. Masked positions get `MASK_VALUE` added
    before the softmax; the softmax itself is computed in float32 whatever the input
    dtype (mixed precision), and its result is cast back to the value dtype.

    Args:
        query: `(..., Q, Dk)`.
        key: `(..., K, Dk)`.
        value: `(..., K, Dv)`.
        mask: optional bool tensor broadcastable to `(..., Q, K)`; `True` = may attend.

    Returns:
        `(outputs, weights)`: outputs `(..., Q, Dv)` in the value dtype and attention
        weights `(..., Q, K)` in float32.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(2, 5, 8).astype("float32")
    >>> k = v = np.random.rand(2, 7, 8).astype("float32")
    >>> out, weights = scaled_dot_product_attention(q, k, v)
    >>> tuple(out.shape), tuple(weights.shape)
    ((2, 5, 8), (2, 5, 7))
    """
    weights = attention_weights(query, key, mask)  # (..., Q, K) float32
    outputs = ops.matmul(ops.cast(weights, value.dtype), value)  # (..., Q, Dv)
    return outputs, weights


def attention_weights(query, key, mask=None):
    """softmax(Q K^T / sqrt(d_k)) with masking, in float32: the weights of eq. 1.

    Args:
        query: `(..., Q, Dk)`.
        key: `(..., K, Dk)`.
        mask: optional bool tensor broadcastable to `(..., Q, K)`; `True` = may attend.

    Returns:
        float32 `(..., Q, K)`.
    """
    depth = query.shape[-1]
    if depth is None:
        depth = ops.shape(query)[-1]
    query = ops.multiply(query, ops.cast(1.0 / math.sqrt(depth), query.dtype))
    scores = ops.cast(ops.matmul(query, ops.swapaxes(key, -1, -2)), "float32")  # (..., Q, K)
    if mask is not None:
        scores = ops.where(ops.cast(mask, "bool"), scores, MASK_VALUE)
    if scores.shape[-1] == 1:  # one key (the first cached step): softmax is exactly 1
        return ops.ones_like(scores)
    return ops.softmax(scores, axis=-1)


def _in_band(query_positions, key_positions, window, causal):
    """Whether a query at `query_positions` sees a key at `key_positions` (broadcast int
    tensors) in a band of `window`: distance below `window`, and not ahead with `causal`."""
    distance = query_positions - key_positions
    inside = ops.logical_and(distance < window, distance > -window)
    if causal:
        inside = ops.logical_and(inside, distance >= 0)
    return inside


def band_mask(query_length, key_length, window, causal, offset=0):
    """The positions a restricted (windowed) self-attention sees, as an attention mask.

    Query `q` (at position `offset + q` among the keys) sees key `k` when their distance is
    below `window`: `q - window < k <= q` with `causal`, `|q - k| < window` without.

    Returns:
        bool `(1, Q, K)`.
    """
    query_positions = ops.arange(query_length, dtype="int32")[:, None] + ops.cast(offset, "int32")  # (Q, 1)
    key_positions = ops.arange(key_length, dtype="int32")[None, :]  # (1, K)
    return _in_band(query_positions, key_positions, window, causal)[None, :, :]  # (1, Q, K)


def _blocks_around(sequence, window, before, after):
    """`(B, H, N, D)` padded to blocks of `window`: each block with `before` and `after` neighbours.

    Returns `(B, H, nb, (before + 1 + after) * window, D)` where block `i` holds the
    positions `(i - before) * window .. (i + 1 + after) * window - 1` (zeros outside).
    """
    shape = ops.shape(sequence)
    blocks = -(-shape[2] // window)
    padded = ops.pad(sequence, [[0, 0], [0, 0], [before * window, (blocks + after) * window - shape[2]], [0, 0]])
    padded = ops.reshape(padded, (shape[0], shape[1], blocks + before + after, window, shape[3]))
    parts = [padded[:, :, offset : offset + blocks] for offset in range(before + 1 + after)]
    return ops.reshape(ops.concatenate(parts, axis=3), (shape[0], shape[1], blocks, -1, shape[3]))


def windowed_attention(query, key, value, window, causal=False, key_padding_mask=None, dropout=None):
    """Self-attention restricted to a neighbourhood of `window` positions (paper Table 1).

    Computes only the scores inside the band (see `band_mask`): the sequence is cut into
    blocks of `window` positions and each block attends to itself and its one (causal) or
    two neighbouring blocks, so work and memory grow as O(N * window) instead of O(N^2).
    Equals `scaled_dot_product_attention` with `band_mask` (and the padding mask).

    Args:
        query, key: `(B, H, N, Dk)` (the same positions: self-attention).
        value: `(B, H, N, Dv)`.
        window: r, a positive int.
        causal: see only the current and earlier positions.
        key_padding_mask: optional bool `(B, N)`, True at real tokens.
        dropout: optional function applied to the attention weights.

    Returns:
        `(B, H, N, Dv)` in the value dtype.
    """
    length = ops.shape(query)[2]
    after = 0 if causal else 1
    blocks = -(-length // window)
    queries = ops.pad(query, [[0, 0], [0, 0], [0, blocks * window - length], [0, 0]])
    queries = ops.reshape(queries, (ops.shape(query)[0], ops.shape(query)[1], blocks, window, ops.shape(query)[3]))
    keys = _blocks_around(key, window, 1, after)  # (B, H, nb, C, Dk), C = (2 + after) * window
    values = _blocks_around(value, window, 1, after)  # (B, H, nb, C, Dv)
    # Positions: query p = i * window + q; key j = (i - 1) * window + c.
    query_positions = ops.reshape(ops.arange(blocks * window, dtype="int32"), (blocks, window, 1))  # (nb, W, 1)
    key_positions = ops.arange((2 + after) * window, dtype="int32")[None, :] + (
        ops.arange(blocks, dtype="int32")[:, None] - 1) * window
    key_positions = key_positions[:, None, :]  # (nb, 1, C)
    mask = _in_band(query_positions, key_positions, window, causal)  # (nb, W, C)
    mask = ops.logical_and(mask, ops.logical_and(key_positions >= 0, key_positions < length))
    mask = mask[None, None]  # (1, 1, nb, W, C)
    if key_padding_mask is not None:
        padding = ops.cast(key_padding_mask, "bool")[:, None, :, None]  # (B, 1, N, 1)
        padding = _blocks_around(ops.cast(padding, "int32"), window, 1, after)[..., 0]  # (B, 1, nb, C)
        mask = ops.logical_and(mask, ops.cast(padding, "bool")[:, :, :, None, :])
    weights = attention_weights(queries, keys, mask)  # (B, H, nb, W, C) float32
    if dropout is not None:
        weights = dropout(weights)
    outputs = ops.matmul(ops.cast(weights, values.dtype), values)  # (B, H, nb, W, Dv)
    shape = ops.shape(outputs)
    outputs = ops.reshape(outputs, (shape[0], shape[1], blocks * window, shape[4]))
    return outputs[:, :, :length]


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention: Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The model width D is inferred from the query in `build`; by default
    `key_dim = value_dim = D / num_heads` as in the paper. The weights have the same
    shapes as `keras.layers.MultiHeadAttention` (`(D, H, Dk)` projections, `(H, Dv, D)`
    output), so weights can be copied between the two.

    **Key/value cache.** For incremental decoding, pass `cache` (a dict
    `{"key": (B, H, L, Dk), "value": (B, H, L, Dv)}`):

    * with `cache_index` (self-attention): the keys/values of the `Q` new query positions
      are written into the preallocated buffer at `cache_index`, and the queries attend
      over the written prefix `0 .. cache_index + Q - 1` (under XLA, which needs static
      shapes, over the whole buffer); `use_causal_mask=True` hides the slots after each
      query. With `attention_window=r` the buffer is a ring of `r` slots (see
      `init_cache`): position `p` is written to slot `p mod r` and a query sees the
      slots holding the last `r` positions, so the cache does not grow with the length.
    * with `cache_index` and a growing cache (`init_cache(B, None)`: `{"past_key": (B, H,
      t, Dk), "past_value": (B, H, t, Dv)}` holding exactly the `t = cache_index` positions
      decoded so far): the new keys/values are appended, and the queries attend over all
      `t + Q`. Each step then copies only the positions decoded so far, and so does a beam
      search reordering the cache, instead of a buffer sized for the longest output; it
      needs a `tf.while_loop` shape invariant with the length axis unknown
      (`decoding.loop_shape_invariants`) and is not for XLA, which needs static shapes.
    * without `cache_index` (encoder-decoder attention): the cache holds keys/values
      computed once by `compute_cache(encoder_outputs)` and is reused every step; the
      `value`/`key` arguments are ignored. The cache may have fewer rows than the query,
      `B` rows for `N = B * C` queries (beam search: row `b * C + c` is copy `c` of
      sentence `b`); the copies then share one copy of the keys/values, and `key_mask`
      and `attention_mask` have the cache's `B` rows.

    In cached mode the call always returns `(outputs, cache)`.

    Args:
        num_heads: number of heads H.
        key_dim: per-head query/key width Dk. Defaults to D / H.
        value_dim: per-head value width Dv. Defaults to `key_dim`.
        output_dim: width of the output. Defaults to the query width D.
        dropout: dropout rate on the attention weights (the paper uses 0).
        attention_window: restricted self-attention (paper Table 1): each query sees only
            the keys at distance < `attention_window` (with `use_causal_mask`: itself and
            the `attention_window - 1` positions before it); for self-attention only (the
            keys are the query positions). Without a cache, scores or an explicit
            `attention_mask` the layer computes only those scores, in blocks
            (`windowed_attention`: O(N * window) work and memory); otherwise the same band
            is applied as a mask. `None` (default): full attention.
        use_bias: whether the projections have biases.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the biases.

    Call arguments:
        query: `(B, Q, D)`.
        value: `(B, K, D)`; may be `None` with a static (cross-attention) cache.
        key: `(B, K, D)`; defaults to `value`.
        attention_mask: optional bool `(B, Q, K)`; True = may attend.
        query_mask, value_mask, key_mask: optional padding masks `(B, Q)`, `(B, K)`, usually
            filled in by Keras from implicit masks. Padded keys are not attended.
        use_causal_mask: add the look-ahead mask (decoder self-attention).
        return_attention_scores: also return the attention weights `(B, H, Q, K)`
            (not in cached mode).
        cache: optional key/value cache dict (see above).
        cache_index: int scalar; write position in the self-attention cache.
        training: whether dropout is active.

    Returns:
        `outputs (B, Q, output_dim)`; or `(outputs, scores)` with
        `return_attention_scores=True`; or `(outputs, cache)` in cached mode.

    Example:

    >>> import keras
    >>> from keras_transformer.layers import MultiHeadAttention
    >>> tokens = keras.Input(shape=(None, 64))
    >>> memory = keras.Input(shape=(None, 64))
    >>> outputs = MultiHeadAttention(num_heads=4)(tokens, memory)
    >>> model = keras.Model([tokens, memory], outputs)
    >>> model.output_shape
    (None, None, 64)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.2.
    """

    def __init__(
        self,
        num_heads,
        key_dim=None,
        value_dim=None,
        output_dim=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        attention_window=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        if attention_window is not None:
            check_positive_int("attention_window", attention_window)
        self.attention_window = attention_window
        for name, value in (("key_dim", key_dim), ("value_dim", value_dim), ("output_dim", output_dim)):
            if value is not None:
                check_positive_int(name, value)
        check_rate("dropout", dropout)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.output_dim = output_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True
        self._dropout_layer = ReplicaDropout(dropout, dtype=self.dtype_policy, name="attention_dropout")

    def build(self, query_shape, value_shape=None, key_shape=None):
        hidden_dim = query_shape[-1]
        value_width = hidden_dim if value_shape is None else value_shape[-1]
        key_width = value_width if key_shape is None else key_shape[-1]
        key_dim = self.key_dim
        if key_dim is None:
            if hidden_dim % self.num_heads:
                raise ValueError(
                    "num_heads must divide the model width when key_dim is not given. "
                    f"Received: num_heads={self.num_heads}, d_model={hidden_dim}"
                )
            key_dim = hidden_dim // self.num_heads
        value_dim = self.value_dim or key_dim
        output_dim = self.output_dim or hidden_dim
        self._key_dim, self._value_dim, self._output_dim = key_dim, value_dim, output_dim
        heads = self.num_heads
        self.query_kernel = self._kernel("query_kernel", (hidden_dim, heads, key_dim))
        self.key_kernel = self._kernel("key_kernel", (key_width, heads, key_dim))
        self.value_kernel = self._kernel("value_kernel", (value_width, heads, value_dim))
        self.output_kernel = self._kernel("output_kernel", (heads, value_dim, output_dim))
        if self.use_bias:
            self.query_bias = self._bias("query_bias", (heads, key_dim))
            self.key_bias = self._bias("key_bias", (heads, key_dim))
            self.value_bias = self._bias("value_bias", (heads, value_dim))
            self.output_bias = self._bias("output_bias", (output_dim,))
        self._dropout_layer.build(None)
        self.built = True

    def _kernel(self, name, shape):
        return self.add_weight(name=name, shape=shape, initializer=self.kernel_initializer)

    def _bias(self, name, shape):
        return self.add_weight(name=name, shape=shape, initializer=self.bias_initializer)

    def _project(self, inputs, kernel, bias):
        # Cast explicitly: `compute_cache` runs outside `__call__`, where Keras does not
        # autocast variables under mixed precision.
        dtype = self.compute_dtype
        projected = ops.einsum("btd,dhk->bhtk", ops.cast(inputs, dtype), ops.cast(kernel, dtype))  # (B, H, T, Dk)
        if self.use_bias:
            projected = projected + ops.expand_dims(ops.cast(bias, dtype), axis=1)  # bias (H, 1, Dk)
        return projected

    def compute_cache(self, key_value_sequence, key_sequence=None):
        """Keys/values of a memory, computed once (encoder-decoder attention).

        Args:
            key_value_sequence: `(B, K, D)` memory (the encoder output).
            key_sequence: optional separate key memory; defaults to `key_value_sequence`.

        Returns:
            `{"key": (B, H, K, Dk), "value": (B, H, K, Dv)}`.
        """
        if key_sequence is None:
            key_sequence = key_value_sequence
        return {
            "key": self._project(key_sequence, self.key_kernel, getattr(self, "key_bias", None)),
            "value": self._project(key_value_sequence, self.value_kernel, getattr(self, "value_bias", None)),
        }

    def init_cache(self, batch_size, max_length):
        """An empty self-attention cache: zeros `{"key": (B, H, L, Dk), "value": (B, H, L, Dv)}`.

        With `attention_window=r` the buffer is a ring of `min(r, max_length)` slots (`r`
        when `max_length` is a tensor or `None`), whatever the number of positions decoded.
        `max_length=None` without a window: a growing cache, `{"past_key": (B, H, 0, Dk),
        "past_value": (B, H, 0, Dv)}`, that each call appends to (see the class docstring).
        """
        dtype = self.compute_dtype
        if max_length is None and not self.attention_window:
            key_name, value_name = GROWING_CACHE_KEYS
            return {
                key_name: ops.zeros((batch_size, self.num_heads, 0, self._key_dim), dtype=dtype),
                value_name: ops.zeros((batch_size, self.num_heads, 0, self._value_dim), dtype=dtype),
            }
        slots = max_length
        if self.attention_window:
            slots = min(self.attention_window, max_length) if isinstance(max_length, numbers.Integral) else self.attention_window
        return {
            "key": ops.zeros((batch_size, self.num_heads, slots, self._key_dim), dtype=dtype),
            "value": ops.zeros((batch_size, self.num_heads, slots, self._value_dim), dtype=dtype),
        }

    def _ring_step(self, cache, new_keys, new_values, start, query_length, attention_mask, causal):
        """Cached windowed self-attention over a ring buffer of `S` slots (`init_cache`).

        Position `p` lives in slot `p mod S`. One new position (`Q = 1`, static) is written
        into its slot first and the query attends over the `S` slots. Several new positions
        attend over the ring as it was plus the new keys (`S + Q`); the ring then keeps the
        last `S` positions. Slots not written yet and positions outside the band are
        masked; an `attention_mask` `(B|1, Q, L)` over absolute positions is gathered at
        the positions the keys hold.

        Returns:
            `(keys, values, cache, mask)`: the keys/values to attend over, the new cache and
            a bool `(B|1, Q, K)` mask.
        """
        slots = ops.shape(cache["key"])[2]
        start = ops.cast(start, "int32")
        query_positions = start + ops.arange(query_length, dtype="int32")  # (Q,)
        if new_keys.shape[2] == 1:
            slot = ops.mod(start, slots)
            keys = _write_positions(cache["key"], new_keys, slot)  # (B, H, S, Dk)
            values = _write_positions(cache["value"], new_values, slot)  # (B, H, S, Dv)
            new_cache = {"key": keys, "value": values}
            key_positions = _ring_positions(slots, start)  # (S,)
        else:
            keys = ops.concatenate([cache["key"], new_keys], axis=2)  # (B, H, S + Q, Dk)
            values = ops.concatenate([cache["value"], new_values], axis=2)  # (B, H, S + Q, Dv)
            key_positions = ops.concatenate([_ring_positions(slots, start - 1), query_positions])  # (S + Q,)
            kept = _ring_positions(slots, start + query_length - 1)  # (S,) positions after the write
            taken = ops.where(kept >= start, slots + kept - start, ops.arange(slots, dtype="int32"))  # into keys
            new_cache = {"key": ops.take(keys, taken, axis=2), "value": ops.take(values, taken, axis=2)}
        mask = _in_band(query_positions[:, None], key_positions[None, :], self.attention_window, causal)  # (Q, K)
        mask = ops.logical_and(mask, key_positions[None, :] >= 0)[None, :, :]  # (1, Q, K): written slots only
        if attention_mask is not None:
            absolute = ops.take(ops.cast(attention_mask, "bool"), ops.maximum(key_positions, 0), axis=2)  # (B|1, Q, K)
            mask = ops.logical_and(mask, absolute)
        return keys, values, new_cache, mask

    def call(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        cache=None,
        cache_index=None,
        training=None,
    ):
        if cache is not None and return_attention_scores:
            raise ValueError(
                "return_attention_scores is not available in cached mode, which always "
                "returns (outputs, cache). Received: return_attention_scores=True with a cache."
            )
        query_length = ops.shape(query)[1]
        queries = self._project(query, self.query_kernel, getattr(self, "query_bias", None))  # (B, H, Q, Dk)
        causal_offset = 0
        grouped_rows = None
        ring = False
        if cache is None:
            if value is None:
                raise ValueError("MultiHeadAttention needs `value` unless a cache is given. Received: value=None")
            key = value if key is None else key
            key_mask = value_mask if key_mask is None else key_mask
            keys = self._project(key, self.key_kernel, getattr(self, "key_bias", None))  # (B, H, K, Dk)
            values = self._project(value, self.value_kernel, getattr(self, "value_bias", None))  # (B, H, K, Dv)
        elif cache_index is None:  # static memory: encoder-decoder attention
            keys, values = cache["key"], cache["value"]
            rows, memory_rows = ops.shape(queries)[0], ops.shape(keys)[0]
            if not (isinstance(rows, int) and isinstance(memory_rows, int) and rows == memory_rows):
                # the query rows may be copies of the memory rows: attend per memory row
                grouped_rows = rows
                queries = _group_queries(queries, memory_rows)  # (B, H, C * Q, Dk)
                if attention_mask is not None:  # (B|1, Q, K) -> (B|1, C * Q, K)
                    attention_mask = ops.tile(attention_mask, (1, rows // memory_rows, 1))
        else:  # self-attention: write the new positions into the buffer
            key = query if key is None else key
            value = query if value is None else value
            growing = GROWING_CACHE_KEYS[0] in cache
            buffers = tuple(cache[name] for name in (GROWING_CACHE_KEYS if growing else ("key", "value")))
            new_keys = ops.cast(self._project(key, self.key_kernel, getattr(self, "key_bias", None)), buffers[0].dtype)
            new_values = ops.cast(
                self._project(value, self.value_kernel, getattr(self, "value_bias", None)), buffers[1].dtype
            )
            key_mask = None  # unwritten slots are hidden by the causal (or ring) mask
            if growing and self.attention_window:
                raise ValueError(
                    "A layer with attention_window keeps a ring of r slots (init_cache(B, max_length)), "
                    "not a growing cache. Received: a cache with past_key"
                )
            if self.attention_window:  # a ring of r slots; the mask holds the band and the causality
                keys, values, cache, attention_mask = self._ring_step(
                    cache, new_keys, new_values, cache_index, query_length, attention_mask, use_causal_mask
                )
                ring, use_causal_mask = True, False
            else:  # keys at positions 0 .. cache_index + Q - 1 (under XLA: the whole buffer)
                written = cache_index + query_length
                if growing:  # exactly the positions decoded so far, then the new ones
                    keys = ops.concatenate([buffers[0], new_keys], axis=CACHE_LENGTH_AXIS)  # (B, H, t + Q, Dk)
                    values = ops.concatenate([buffers[1], new_values], axis=CACHE_LENGTH_AXIS)  # (B, H, t + Q, Dv)
                    cache = dict(zip(GROWING_CACHE_KEYS, (keys, values)))
                else:
                    keys = _write_positions(buffers[0], new_keys, cache_index)
                    values = _write_positions(buffers[1], new_values, cache_index)
                    cache = {"key": keys, "value": values}
                    if not in_xla_context():  # attend over the written prefix only
                        keys, values = keys[:, :, :written], values[:, :, :written]
                causal_offset = cache_index
                if attention_mask is not None and (growing or not in_xla_context()):
                    attention_mask = attention_mask[:, :, :written]
        window = self.attention_window
        if window and cache is None:
            query_length, key_length = query.shape[1], keys.shape[2]
            if query_length is not None and key_length is not None and query_length != key_length:
                raise ValueError(
                    "attention_window restricts self-attention: queries and keys must be the same positions. "
                    f"Received: query length {query_length}, key length {key_length}"
                )
        if window and cache is None and attention_mask is None and not return_attention_scores:
            dropout = (lambda weights: self._dropout_layer(weights, training=training)) if self.dropout else None
            outputs = windowed_attention(queries, keys, values, window, use_causal_mask, key_mask, dropout)
            return self._output(outputs)
        if window and not ring:  # the same band, as a mask over the full scores
            band = band_mask(ops.shape(queries)[2], ops.shape(keys)[2], window, use_causal_mask, causal_offset)
            attention_mask = band if attention_mask is None else ops.logical_and(ops.cast(attention_mask, "bool"), band)
        mask = masks_lib.merge_masks(
            ops.shape(queries)[2],
            ops.shape(keys)[2],
            query_padding_mask=query_mask,
            key_padding_mask=key_mask,
            attention_mask=attention_mask,
            causal=use_causal_mask,
            causal_offset=causal_offset,
        )
        if mask is not None:
            mask = mask[:, None, :, :]  # (B|1, 1, Q, K) broadcast over heads
        weights = attention_weights(queries, keys, mask)  # (B, H, Q, K) float32
        dropped = self._dropout_layer(weights, training=training) if self.dropout else weights
        outputs = ops.matmul(ops.cast(dropped, values.dtype), values)  # (B, H, Q, Dv)
        if grouped_rows is not None:
            outputs = _ungroup_outputs(outputs, grouped_rows, query_length)  # (N, H, Q, Dv)
        outputs = self._output(outputs)
        if cache is not None:
            return outputs, cache
        if return_attention_scores:
            return outputs, weights
        return outputs

    def _output(self, heads):
        outputs = ops.einsum("bhqv,hvd->bqd", heads, self.output_kernel)  # (B, Q, D)
        if self.use_bias:
            outputs = outputs + self.output_bias
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "attention_window": self.attention_window,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "output_dim": self.output_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def compute_output_spec(
        self, query, value=None, key=None, return_attention_scores=False, cache=None, cache_index=None, **kwargs
    ):
        # Symbolic calls return the same structure as eager ones: (outputs, cache) in
        # cached mode, (outputs, scores) with return_attention_scores.
        outputs = keras.KerasTensor(self.compute_output_shape(query.shape), dtype=self.compute_dtype)
        if cache is not None:
            return outputs, keras.tree.map_structure(lambda t: keras.KerasTensor(t.shape, dtype=t.dtype), cache)
        if return_attention_scores:
            key_length = (value if key is None else key).shape[1]
            scores_shape = (query.shape[0], self.num_heads, query.shape[1], key_length)
            return outputs, keras.KerasTensor(scores_shape, dtype="float32")
        return outputs

