"""The beam's top-k over K * V candidates, in two exact stages (`keras.ops`, every backend).

A beam step keeps the 2K best of K * V candidates per sentence (32,000 for K = 4 and an
8,000-piece vocabulary). On a CPU one `top_k` over that row costs about as much as the
output projection that made the logits (TensorFlow's kernel keeps a heap per row).
`top_k` here splits each row into blocks of `b` consecutive candidates and:

1. takes every block's maximum (a plain reduction) and keeps the k blocks with the
   largest maxima;
2. runs `top_k` over the k * b candidates of those blocks, in their original order.

**Exact, ties included.** Order candidates by value (descending), then index
(ascending), as `ops.top_k` does. A block ranks by its best candidate in that order
(maxima first, lower block index on ties: blocks are consecutive, so a lower block
holds the lower indices). If a top-k candidate `c` lay in a block outside the k kept,
those k blocks' best candidates would all rank before the best of `c`'s block, hence
before `c`: k candidates before `c`, so `c` is not in the top k. The kept blocks are put
back in index order (`ops.sort`) before stage 2, so its ties break by index as in one
`top_k`. Padding (to a whole number of blocks) is -inf at indices past the row, so it
ranks after every real candidate. Values and indices therefore equal `ops.top_k`'s.

Cost: a reduction over the row plus two small `top_k`s over `n / b` and `k * b`
values; `b ~ sqrt(n / k)` balances the two.
"""

import math

import keras
from keras import ops

# The name scope of the two stages' ops (`benchmark.profile` counts them with the top-k).
SCOPE = "top_k_in_two_stages"


def block_size(width, k):
    """Candidates per block for rows of `width` and a top-`k`: the power of two nearest
    `sqrt(width / k)`, at least 2."""
    return max(2, 2 ** round(math.log2(max(width / k, 1.0)) / 2))


def top_k(values, k, block=None):
    """`ops.top_k(values, k)` over the last axis of a `(B, n)` tensor, in two stages.

    Args:
        values: float `(B, n)`; B may be unknown (an unknown `n` takes one `ops.top_k`).
        k: how many to keep (`k <= n`).
        block: candidates per block (default `block_size(n, k)`). With fewer than k + 1
            blocks this is one `ops.top_k`.

    Returns:
        `(top_values (B, k), indices int32 (B, k))`, equal to `ops.top_k(values, k)`:
        sorted by value, ties by lower index where the backend's `top_k` ranks them so
        (TensorFlow, JAX; PyTorch's `topk` ranks ties in no fixed order).
    """
    width = values.shape[-1]
    if width is None:
        blocks = 0
    else:
        block = block or block_size(width, k)
        blocks = -(-width // block)
    if blocks <= k:
        top_values, indices = ops.top_k(values, k)
        return top_values, ops.cast(indices, "int32")
    with keras.name_scope(SCOPE):
        return _two_stages(values, k, block, blocks, width)


def _two_stages(values, k, block, blocks, width):
    """Stage 1 and 2 of `top_k` over `blocks` blocks of `block` candidates."""
    if blocks * block > width:
        values = ops.pad(values, ((0, 0), (0, blocks * block - width)), constant_values=-math.inf)
    grouped = ops.reshape(values, (-1, blocks, block))  # (B, blocks, b)
    _, kept = ops.top_k(ops.max(grouped, axis=-1), k)  # (B, k)
    kept = ops.sort(
        ops.cast(kept, "int32"), axis=-1
    )  # index order: stage 2 breaks ties as one top_k
    gathered = ops.reshape(take_per_row(grouped, kept), (-1, k * block))  # (B, k * b)
    top_values, positions = ops.top_k(gathered, k)  # (B, k)
    positions = ops.cast(positions, "int32")
    kept_block = take_per_row(kept, positions // block)  # (B, k)
    return top_values, kept_block * block + positions % block


def take_per_row(tensor, indices):
    """`tensor (A, K, ...)` picked per row by `indices int32 (A, M)` -> `(A, M, ...)`, as
    `tf.gather(tensor, indices, batch_dims=1)`: one gather over the `A * K` flattened rows
    (`ops.take_along_axis` would broadcast the indices over the trailing axes first)."""
    shape = ops.shape(tensor)
    rows, width = shape[0], shape[1]
    flat = ops.reshape(tensor, (-1,) + tuple(shape[2:]))  # (A * K, ...)
    offsets = ops.arange(rows, dtype="int32")[:, None] * width  # (A, 1)
    picked = ops.take(flat, ops.reshape(indices + offsets, (-1,)), axis=0)  # (A * M, ...)
    return ops.reshape(picked, (-1, ops.shape(indices)[1]) + tuple(shape[2:]))
