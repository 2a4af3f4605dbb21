"""Attention masks, in one convention for the whole toolkit.

Shape letters: B batch, Q query length, K key length, L sequence length.

* A **padding mask** has shape `(B, L)`: `True` where a position holds a real token.
* An **attention mask** has shape `(B, Q, K)` (or `(1, Q, K)` to broadcast over the batch):
  `True` where query position `q` may attend to key position `k`.

Keras' implicit masks (the `_keras_mask` produced by an `Embedding(mask_zero=True)` or our
`SharedEmbedding`) are padding masks in the same convention; `merge_masks` folds them,
explicit padding masks, explicit attention masks and the causal mask into one attention mask.
"""

from keras import ops


def padding_mask(token_ids, pad_id=0):
    """Padding mask of token ids: `True` at real tokens.

    Args:
        token_ids: int tensor `(B, L)`.
        pad_id: the id used for padding.

    Returns:
        bool tensor `(B, L)`.
    """
    return ops.not_equal(token_ids, pad_id)


def causal_mask(query_length, key_length=None, offset=0):
    """Look-ahead mask: query `q` may attend to keys `k <= offset + q`.

    With `offset=0` and `query_length == key_length` this is the usual lower triangle.
    During cached decoding the queries are positions `offset, offset + 1, ...` of a
    preallocated key buffer of length `key_length`, so the same function masks the
    buffer's unwritten slots.

    Args:
        query_length: number of query positions Q (int or scalar tensor).
        key_length: number of key positions K; defaults to `query_length`.
        offset: position of the first query in the key sequence (int or scalar tensor).

    Returns:
        bool tensor `(1, Q, K)`.
    """
    if key_length is None:
        key_length = query_length
    query_positions = ops.arange(query_length, dtype="int32") + ops.cast(offset, "int32")
    key_positions = ops.arange(key_length, dtype="int32")
    mask = ops.greater_equal(query_positions[:, None], key_positions[None, :])  # (Q, K)
    return mask[None, :, :]  # (1, Q, K)


def implicit_mask(tensor):
    """The Keras implicit padding mask attached to `tensor`, or `None`."""
    return getattr(tensor, "_keras_mask", None)


def merge_masks(
    query_length,
    key_length,
    query_padding_mask=None,
    key_padding_mask=None,
    attention_mask=None,
    causal=False,
    causal_offset=0,
):
    """Fold padding, attention and causal masks into one `(B|1, Q, K)` attention mask.

    Only the **key** padding mask removes attention targets. A padded *query* row keeps
    attending to real keys (its output is ignored downstream), so a row never becomes
    fully masked by query padding; `query_padding_mask` is accepted for symmetry with
    Keras' implicit masks and is deliberately not applied to the scores.

    Args:
        query_length: Q.
        key_length: K.
        query_padding_mask: optional bool `(B, Q)`; unused for masking (see above).
        key_padding_mask: optional bool `(B, K)`.
        attention_mask: optional bool `(B, Q, K)` or `(1, Q, K)`.
        causal: whether to add the look-ahead mask.
        causal_offset: position of the first query among the keys (cached decoding).

    Returns:
        bool tensor `(B|1, Q, K)`, or `None` when there is nothing to mask.
    """
    del query_padding_mask
    mask = None
    if key_padding_mask is not None:
        mask = ops.cast(key_padding_mask, "bool")[:, None, :]  # (B, 1, K)
    if attention_mask is not None:
        attention_mask = ops.cast(attention_mask, "bool")
        mask = attention_mask if mask is None else ops.logical_and(mask, attention_mask)
    if causal:
        look_ahead = causal_mask(query_length, key_length, causal_offset)
        mask = look_ahead if mask is None else ops.logical_and(mask, look_ahead)
    return mask
