"""Position-wise work on the real tokens only: the rows of a padded batch that hold tokens.

Every part of a Transformer layer but attention treats each position alone: the
projections, the feed-forward network, layer normalization, dropout and the residual adds.
On a padded batch `(B, T, D)` they also compute at the padding. A *packing* carries the N
real positions as rows `(N, D)` through that position-wise work, and lays them back out as
`(B, T, ...)` only where positions meet, inside attention (`MultiHeadAttention`'s
`query_packing` and `key_packing`). Every real position gets the same values as on the
padded batch; the padding's rows are never computed. Length-bucketed batches still hold
padding; how much, and what skipping it gains: docs/results-log.md, "Skipping the padding,
and rows a–c again".

A packing is a pair `(positions, mask)`: `mask` the `(B, T)` padding mask, `positions` the
int32 `(N,)` flat indices `b * T + t` of its real positions, in order.

`real_positions` has a result whose size depends on the data. TensorFlow's graphs allow
that; JAX's `jit` does not, so `Transformer` packs on TensorFlow only
(`config.skip_padding`). XLA allows it too, bounded by B * T, but a training step compiled
so ran several times slower than the padded one (docs/results-log.md, "Where the step's time
goes now, and skipping the padding under XLA"), so under XLA (`jit_compile=True`) a packing
carries every position (`packed_positions`): static shapes, the padded model's work.

Shape letters: B batch, T length, N real positions, D width.
"""

import keras
from keras import ops

from keras_transformer.layers.tracing import gradient_scope, in_xla_context


def real_positions(mask):
    """int32 `(N,)`: the flat indices `b * T + t` of the True entries of a bool `(B, T)` mask, in order.

    >>> import numpy as np
    >>> real_positions(np.array([[True, True, False], [True, False, False]])).numpy().tolist()
    [0, 1, 3]
    """
    return ops.cast(ops.where(ops.reshape(mask, (-1,)))[0], "int32")


def packed_positions(mask):
    """int32 `(N,)`: the positions a packing of the bool `(B, T)` mask carries.

    The real ones (`real_positions`), except while TensorFlow traces a function for XLA:
    there every position, `0 .. B * T - 1`, so that the compiled shapes do not depend on
    the data (the padding's rows are computed, and attention still masks them as keys).
    """
    if in_xla_context():
        return ops.arange(ops.shape(mask)[0] * ops.shape(mask)[1], dtype="int32")
    return real_positions(mask)


def packing(mask):
    """The packing `(positions, mask)` of a bool `(B, T)` padding mask (True at real tokens):
    `packed_positions(mask)` and the mask."""
    return packed_positions(mask), mask


def pack(sequence, packing):
    """`(B, T, ...)` -> `(N, ...)`: the rows of the packing's real positions."""
    positions, _ = packing
    rows = ops.reshape(sequence, (-1,) + tuple(sequence.shape[2:]))  # (B * T, ...)

    @ops.custom_gradient
    def pack_rows(rows):
        scope = gradient_scope()

        def gradient(*args, upstream=None):  # PyTorch passes the upstream gradient by keyword
            with scope():
                return _rows_at(
                    args[0] if upstream is None else upstream, _slots(positions, ops.shape(rows)[0])
                )

        return ops.take(rows, positions, axis=0), gradient

    return pack_rows(rows)


def unpack(rows, packing):
    """`(N, ...)` -> `(B, T, ...)`: the rows at their positions, zeros at the padding.

    >>> import numpy as np
    >>> mask = np.array([[True, True, False], [True, False, False]])
    >>> rows = np.array([[1.0], [2.0], [3.0]], "float32")
    >>> unpack(rows, packing(mask))[..., 0].numpy().tolist()
    [[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]
    """
    positions, mask = packing
    batch, length = ops.shape(mask)[0], ops.shape(mask)[1]
    slots = _slots(positions, batch * length)

    @ops.custom_gradient
    def unpack_rows(rows):
        scope = gradient_scope()

        def gradient(*args, upstream=None):
            with scope():
                return ops.take(args[0] if upstream is None else upstream, positions, axis=0)

        return _rows_at(rows, slots), gradient

    return ops.reshape(unpack_rows(rows), (batch, length) + tuple(rows.shape[1:]))


def unpack_heads(rows, packing, heads):
    """`(N, H * K)` -> `(B, H, T, K)`: `unpack` and the split into heads in one gather.

    Attention's projections give the rows of the heads side by side; its matmuls take each
    head's `(T, K)` block. The gather reads row `n`'s head `h` straight into `(b, h, t)`, so the
    transpose from `(B, T, H, K)` (and its own in the backward pass) is never made.

    >>> import numpy as np
    >>> mask = np.array([[True, True, False], [True, False, False]])
    >>> rows = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]], "float32")  # 2 heads of width 1
    >>> unpack_heads(rows, packing(mask), 2)[..., 0].numpy().tolist()
    [[[1.0, 2.0, 0.0], [10.0, 20.0, 0.0]], [[3.0, 0.0, 0.0], [30.0, 0.0, 0.0]]]
    """
    positions, mask = packing
    batch, length = ops.shape(mask)[0], ops.shape(mask)[1]
    depth = rows.shape[-1] // heads
    slots = _head_slots(positions, batch, length, heads)

    @ops.custom_gradient
    def unpack_rows(rows):
        scope = gradient_scope()

        def gradient(*args, upstream=None):
            with scope():
                upstream = args[0] if upstream is None else upstream
                return ops.reshape(
                    ops.take(
                        ops.reshape(upstream, (-1, depth)),
                        _head_rows(positions, length, heads),
                        axis=0,
                    ),
                    (-1, heads * depth),
                )

        return _rows_at(ops.reshape(rows, (-1, depth)), slots), gradient

    return ops.reshape(unpack_rows(rows), (batch, heads, length, depth))


def pack_heads(sequence, packing):
    """`(B, H, T, K)` -> `(N, H * K)`: the heads side by side at the packing's real positions,
    one gather (the inverse of `unpack_heads`; see there).

    >>> import numpy as np
    >>> mask = np.array([[True, True, False], [True, False, False]])
    >>> rows = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]], "float32")
    >>> pack_heads(unpack_heads(rows, packing(mask), 2), packing(mask)).numpy().tolist()
    [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]
    """
    positions, _ = packing
    batch, heads, length, depth = (
        ops.shape(sequence)[0],
        sequence.shape[1],
        ops.shape(sequence)[2],
        sequence.shape[3],
    )

    @ops.custom_gradient
    def pack_rows(sequence):
        scope = gradient_scope()

        def gradient(*args, upstream=None):
            with scope():
                upstream = args[0] if upstream is None else upstream
                slots = _head_slots(positions, batch, length, heads)
                unpacked = _rows_at(ops.reshape(upstream, (-1, depth)), slots)
                return ops.reshape(unpacked, (batch, heads, length, depth))

        rows = ops.take(
            ops.reshape(sequence, (-1, depth)), _head_rows(positions, length, heads), axis=0
        )
        return ops.reshape(rows, (-1, heads * depth)), gradient

    return pack_rows(sequence)


def _head_rows(positions, length, heads):
    """int32 `(N * H,)`: for each packed row n and head h (in that order), the row `(b, h, t)` of a
    `(B * H * T, K)` view, where `positions[n] = b * T + t`."""
    batch_index, time_index = positions // length, positions % length
    head = ops.arange(heads, dtype="int32")[None, :]
    return ops.reshape((batch_index[:, None] * heads + head) * length + time_index[:, None], (-1,))


def _head_slots(positions, batch, length, heads):
    """int32 `(B * H * T,)`: for each `(b, h, t)`, the row `n * H + h` of a `(N * H, K)` view
    of the packed rows, or `N * H` (past the last) at the padding."""
    count = ops.shape(positions)[0]
    slots = ops.reshape(
        _slots(positions, batch * length), (batch, 1, length)
    )  # n, or N at the padding
    head = ops.arange(heads, dtype="int32")[None, :, None]
    return ops.reshape(ops.where(slots == count, count * heads, slots * heads + head), (-1,))


# Both directions are gathers, forward and backward: a scatter of the N rows into zeros (and
# the segment sum that differentiates a gather) cost a training step more than these gathers
# (docs/results-log.md, "Layer norm's gradient written out, and the packing by gathers").


def _slots(positions, size):
    """int32 `(size,)`: each flat position's row among the packing's N, N where it has none."""
    count = ops.shape(positions)[0]
    slots = ops.full((size,), count, dtype="int32")
    return ops.scatter_update(
        slots, ops.expand_dims(positions, -1), ops.arange(count, dtype="int32")
    )


def _rows_at(rows, slots):
    """`(N, ...)` -> `(len(slots), ...)`: row `slots[i]` of `rows`, zeros where it is N."""
    zeros = ops.zeros((1,) + tuple(rows.shape[1:]), dtype=rows.dtype)
    return ops.take(ops.concatenate([rows, zeros], axis=0), slots, axis=0)


# The same three steps as layers, for functional models (Keras cannot infer the size of
# `real_positions` from its op alone).


@keras.saving.register_keras_serializable(package="keras_transformer")
class RealPositions(keras.layers.Layer):
    """`mask (B, T)` -> int32 `(N,)`: `packed_positions` as a layer (the real positions;
    every position under XLA)."""

    def call(self, mask):
        return packed_positions(mask)

    def compute_output_spec(self, mask):
        return keras.KerasTensor((None,), dtype="int32")


@keras.saving.register_keras_serializable(package="keras_transformer")
class Pack(keras.layers.Layer):
    """`(sequence (B, T, ...), positions (N,))` -> `(N, ...)`: `pack` as a layer."""

    def call(self, sequence, positions):
        return pack(sequence, (positions, None))

    def compute_output_spec(self, sequence, positions):
        return keras.KerasTensor((None,) + tuple(sequence.shape[2:]), dtype=sequence.dtype)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Unpack(keras.layers.Layer):
    """`(rows (N, ...), positions (N,), mask (B, T))` -> `(B, T, ...)`: `unpack` as a layer."""

    def call(self, rows, positions, mask):
        return unpack(rows, (positions, mask))

    def compute_output_spec(self, rows, positions, mask):
        return keras.KerasTensor(tuple(mask.shape[:2]) + tuple(rows.shape[1:]), dtype=rows.dtype)
