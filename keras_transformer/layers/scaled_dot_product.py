"""Scaled dot-product attention (paper eq. 1), the function every attention here computes.

Shape letters: Q query length, K key length, Dk key/query width, Dv value width; `...`
any leading (batch, head) axes.
"""

import math

import keras
from keras import ops

# Added to masked scores before the softmax. The softmax runs in float32 (also under
# mixed precision), where -1e9 underflows exp() to exactly 0.
MASK_VALUE = -1e9


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
