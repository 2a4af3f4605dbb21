"""Special token ids, output-length limits and the GNMT length penalty used by every search.

`as_source_ids`, `length_penalty`, `source_lengths`, `output_limits` and `mask_banned` are
`keras.ops`, as the searches that use them (every backend).

Shape letters: B batch, S source length (padded), L output buffer length.

Length conventions shared by `greedy_search`, `sample` and `beam_search`:

* The **output buffer** has `L` slots (a static Python int when `max_length` is given).
  Outputs exclude BOS; a hypothesis that ends with EOS includes it; slots after the last
  token hold PAD (0).
* Each sentence may produce at most `limit_b = min(source_length_b + max_output_offset, L)`
  tokens, where `source_length_b` counts the non-PAD tokens of its source (EOS included).
  A hypothesis that reaches its limit without EOS ends there (it is truncated, no EOS
  is appended).
* `|Y|` in the length penalty is the number of output tokens, EOS included.
"""

import math

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.data.tokenizer import BOS_ID, PAD_ID
from keras_transformer.layers.checks import check_non_negative_int, check_positive_int

# Ids that a search never emits: PAD would read as "sequence over" and BOS only starts
# the decoder input. Their log-probabilities are set to -inf (not renormalized).
BANNED_IDS = (PAD_ID, BOS_ID)


def length_penalty(length, alpha):
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al., 2016, eq. 14).

    Args:
        length: int or int tensor, the number of output tokens |Y| (EOS included).
        alpha: float >= 0; 0 turns the penalty off (lp = 1).

    Returns:
        float32 tensor of `length`'s shape (a tensor of the Keras backend).
    """
    length = ops.cast(length, "float32")
    return ops.power((5.0 + length) / 6.0, ops.cast(alpha, "float32"))


def as_source_ids(source_ids):
    """Source ids as an int32 `(B, S)` tensor of the backend (from any integer tensor, array or
    nested list).

    Raises:
        ValueError: naming the dtype of non-integer ids, or the shape of ids that are not
            `(batch, length)`.
    """
    source_ids = ops.convert_to_tensor(source_ids)
    dtype = keras.backend.standardize_dtype(source_ids.dtype)
    if "int" not in dtype:
        raise ValueError(f"source_ids must hold integer token ids. Received: dtype={dtype}")
    shape = source_ids.shape  # a TensorShape of unknown rank in a graph traced for any shape
    rank = shape.rank if isinstance(shape, tf.TensorShape) else len(shape)
    if rank is not None and rank != 2:
        raise ValueError(
            f"source_ids must have shape (batch, length). Received: shape={tuple(shape)}"
        )
    return ops.cast(source_ids, "int32")


def source_lengths(source_ids):
    """Number of non-PAD tokens of each source: int32 `(B,)`."""
    return ops.sum(ops.cast(ops.not_equal(source_ids, PAD_ID), "int32"), axis=1)


def _position_limit(model):
    """Longest decoder input the model can place (learned positions), or None."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "positional", None) == "learned":
        return config.max_length
    return None


def check_max_output_offset(max_output_offset):
    check_non_negative_int("max_output_offset", max_output_offset)


def buffer_length(model, source_ids, max_length=None, max_output_offset=50):
    """The output buffer length `L`.

    * `max_length` given: `L = max_length`, a static Python int (one compiled shape for
      every input). It must not exceed the positions a learned-position model can place.
    * `max_length=None`: `L = S + max_output_offset`, `S` being the padded source width
      (a Python int when the source shape is static, else a scalar tensor fixed per call),
      capped at `model.config.max_length` for learned positions.

    Returns:
        a Python int or an int32 scalar tensor.
    """
    check_max_output_offset(max_output_offset)
    limit = _position_limit(model)
    if max_length is not None:
        check_positive_int("max_length", max_length)
        if limit is not None and max_length > limit:
            raise ValueError(
                "max_length exceeds the positions of the model's learned position embedding. "
                f"Received: max_length={max_length}, model.config.max_length={limit}"
            )
        return max_length
    width = source_ids.shape[1]
    if width is not None:
        length = int(width) + max_output_offset
        return length if limit is None else min(length, limit)
    length = tf.shape(source_ids)[1] + max_output_offset
    return length if limit is None else tf.minimum(length, limit)


def output_limits(source_ids, buffer_size, max_output_offset):
    """Per-sentence maximum output length `min(source_length + offset, L)`: int32 `(B,)`."""
    return ops.minimum(source_lengths(source_ids) + max_output_offset, buffer_size)


def mask_banned(log_probs, token_ids=None):
    """Set the log-probabilities (or logits) of `BANNED_IDS` to -inf. `(..., V)` -> `(..., V)`.

    `token_ids`: None (entry v is token v), or int `(V,)`: the token of each entry (a
    vocabulary shortlist)."""
    if token_ids is None:
        token_ids = ops.arange(ops.shape(log_probs)[-1])
    banned = ops.any(
        ops.equal(ops.cast(token_ids, "int32")[:, None], ops.array(BANNED_IDS, "int32")[None, :]),
        axis=1,
    )  # (V,)
    return ops.where(banned, ops.cast(-math.inf, log_probs.dtype), log_probs)
