"""Restricted (windowed) self-attention (paper Table 1): each query sees a band of `window` keys.

`band_mask` is the band as an attention mask; `windowed_attention` computes only the
scores inside it, in blocks, with O(N * window) work and memory. `MultiHeadAttention`
uses it with `attention_window=r`; its cached decoding keeps a ring of `r` slots
(`attention_cache.ring_step`).

Shape letters: B batch, H heads, N sequence length, Q query length, K key length,
Dk key/query width per head, Dv value width per head.
"""

from keras import ops

from keras_transformer.layers.scaled_dot_product import attention_weights


def in_band(query_positions, key_positions, window, causal):
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
    query_positions = ops.arange(query_length, dtype="int32")[:, None] + ops.cast(
        offset, "int32"
    )  # (Q, 1)
    key_positions = ops.arange(key_length, dtype="int32")[None, :]  # (1, K)
    return in_band(query_positions, key_positions, window, causal)[None, :, :]  # (1, Q, K)


def _blocks_around(sequence, window, before, after):
    """`(B, H, N, D)` padded to blocks of `window`: each block with `before` and `after` neighbours.

    Returns `(B, H, nb, (before + 1 + after) * window, D)` where block `i` holds the
    positions `(i - before) * window .. (i + 1 + after) * window - 1` (zeros outside).
    """
    shape = ops.shape(sequence)
    blocks = -(-shape[2] // window)
    padded = ops.pad(
        sequence, [[0, 0], [0, 0], [before * window, (blocks + after) * window - shape[2]], [0, 0]]
    )
    padded = ops.reshape(padded, (shape[0], shape[1], blocks + before + after, window, shape[3]))
    parts = [padded[:, :, offset : offset + blocks] for offset in range(before + 1 + after)]
    return ops.reshape(ops.concatenate(parts, axis=3), (shape[0], shape[1], blocks, -1, shape[3]))


def windowed_attention(
    query, key, value, window, causal=False, key_padding_mask=None, dropout=None
):
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
    queries = ops.reshape(
        queries, (ops.shape(query)[0], ops.shape(query)[1], blocks, window, ops.shape(query)[3])
    )
    keys = _blocks_around(key, window, 1, after)  # (B, H, nb, C, Dk), C = (2 + after) * window
    values = _blocks_around(value, window, 1, after)  # (B, H, nb, C, Dv)
    # Positions: query p = i * window + q; key j = (i - 1) * window + c.
    query_positions = ops.reshape(
        ops.arange(blocks * window, dtype="int32"), (blocks, window, 1)
    )  # (nb, W, 1)
    key_positions = (
        ops.arange((2 + after) * window, dtype="int32")[None, :]
        + (ops.arange(blocks, dtype="int32")[:, None] - 1) * window
    )
    key_positions = key_positions[:, None, :]  # (nb, 1, C)
    mask = in_band(query_positions, key_positions, window, causal)  # (nb, W, C)
    mask = ops.logical_and(mask, ops.logical_and(key_positions >= 0, key_positions < length))
    mask = mask[None, None]  # (1, 1, nb, W, C)
    if key_padding_mask is not None:
        padding = ops.cast(key_padding_mask, "bool")[:, None, :, None]  # (B, 1, N, 1)
        padding = _blocks_around(ops.cast(padding, "int32"), window, 1, after)[
            ..., 0
        ]  # (B, 1, nb, C)
        mask = ops.logical_and(mask, ops.cast(padding, "bool")[:, :, :, None, :])
    weights = attention_weights(queries, keys, mask)  # (B, H, nb, W, C) float32
    if dropout is not None:
        weights = dropout(weights)
    outputs = ops.matmul(ops.cast(weights, values.dtype), values)  # (B, H, nb, W, Dv)
    shape = ops.shape(outputs)
    outputs = ops.reshape(outputs, (shape[0], shape[1], blocks * window, shape[4]))
    return outputs[:, :, :length]
