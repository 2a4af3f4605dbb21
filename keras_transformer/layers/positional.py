"""Position information: fixed sinusoids (paper section 3.5) and learned embeddings (Table 3 row E).

Shape letters: B batch, T sequence length, D model width.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_transformer.layers.checks import check_positive_int

# The feature layouts of `PositionalEncoding` (the config's `sinusoid_layout`).
LAYOUTS = ("interleaved", "concatenated")


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(keras.layers.Layer):
    """Sinusoidal positional encoding, as the paper's formula, in one of two feature layouts.

    PE(pos, 2i) = sin(pos / max_wavelength^(2i/D)),
    PE(pos, 2i+1) = cos(pos / max_wavelength^(2i/D)).

    `layout="interleaved"` (the paper's formula as written): even feature indices carry sines
    and odd ones cosines. `layout="concatenated"` (Marian's, OPUS-MT): the same sines and
    cosines as two halves, features 0 .. D/2 - 1 the sines of i = 0 .. D/2 - 1, the rest the
    cosines (with an odd D the sines take the extra feature). Positions start at 0.
    The encoding is computed for any length and has no weights. The layer returns the
    encoding broadcast to the input's shape; add it to the (scaled) embeddings yourself,
    with `keras.layers.Add()`: it keeps the embeddings' implicit padding mask, which the
    `+` operator drops (Keras 3 ops do not propagate masks).

    Args:
        max_wavelength: the base of the wavelengths (10000 in the paper).
        layout: "interleaved" (default) or "concatenated" (`LAYOUTS`).

    Call arguments:
        inputs: `(B, T, D)` embeddings; only their shape and dtype are used.
        start_index: position of the first step (int or scalar tensor), for cached
            decoding one step at a time.
        word_positions: optional int `(B, T)`: the index of the word each token belongs to
            (`WordIndex`). Then the first D / 2 features encode the token's position and
            the last D / 2 its word's, each with the formula above at width D / 2 (in
            the layer's layout).

    Returns:
        `(B, T, D)` encoding in the input dtype.

    Example:

    >>> import keras
    >>> from keras_transformer.layers import PositionalEncoding
    >>> embeddings = keras.Input(shape=(None, 32))
    >>> outputs = keras.layers.Add()([embeddings, PositionalEncoding()(embeddings)])
    >>> keras.Model(embeddings, outputs).output_shape
    (None, None, 32)

    References:
        Vaswani et al., 2017, section 3.5.
    """

    def __init__(self, max_wavelength=10000.0, layout="interleaved", **kwargs):
        super().__init__(**kwargs)
        if not max_wavelength > 0:
            raise ValueError(
                f"max_wavelength must be positive. Received: max_wavelength={max_wavelength!r}"
            )
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}. Received: layout={layout!r}")
        self.max_wavelength = max_wavelength
        self.layout = layout
        self.supports_masking = True
        self.built = True

    def call(self, inputs, start_index=0, word_positions=None):
        shape = ops.shape(inputs)
        length, depth = shape[-2], shape[-1]
        positions = ops.cast(ops.arange(length) + start_index, "float32")  # (T,)
        if word_positions is None:
            encoding = self._encode(positions, depth)  # (T, D)
            return ops.broadcast_to(ops.cast(encoding, inputs.dtype), shape)  # (B, T, D)
        # Half the features for the token's position, half for its word's (same formula, D / 2 wide).
        half = depth // 2
        token_part = ops.broadcast_to(
            self._encode(positions, half), (shape[0], length, half)
        )  # (B, T, D / 2)
        word_part = self._encode(ops.cast(word_positions, "float32"), half)  # (B, T, D / 2)
        return ops.cast(
            ops.concatenate([token_part, word_part], axis=-1), inputs.dtype
        )  # (B, T, D)

    def _encode(self, positions, depth):
        """`(..., depth)` sinusoids of float `positions` of any shape."""
        features = ops.arange(depth)  # (D,)
        if self.layout == "interleaved":  # feature 2i: sin of frequency i, 2i + 1: its cos
            frequency = features // 2
            sines = features % 2 == 0
        else:  # features 0 .. ceil(D/2) - 1: sin of frequency i; the rest: cos of frequency i
            half = (depth + 1) // 2
            sines = features < half
            frequency = ops.where(sines, features, features - half)
        exponents = ops.cast(2 * frequency, "float32") / ops.cast(depth, "float32")  # 2i / D
        inverse_frequencies = ops.exp(-math.log(self.max_wavelength) * exponents)  # (D,)
        angles = positions[..., None] * inverse_frequencies  # (..., D)
        return ops.where(sines, ops.sin(angles), ops.cos(angles))

    def get_config(self):
        config = super().get_config()
        config.update({"max_wavelength": self.max_wavelength, "layout": self.layout})
        return config

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionEmbedding(keras.layers.Layer):
    """Learned positional embedding (Table 3 row E): one trained vector per position.

    Args:
        sequence_length: the number of positions it can represent.
        initializer: initializer of the position table.

    Call arguments:
        inputs: `(B, T, D)` embeddings; only their shape is used. `start_index + T` must
            not exceed `sequence_length`.
        start_index: position of the first step (int or scalar tensor).

    Returns:
        `(B, T, D)` position vectors.

    Example:

    >>> import keras
    >>> from keras_transformer.layers import PositionEmbedding
    >>> embeddings = keras.Input(shape=(16, 32))
    >>> outputs = keras.layers.Add()([embeddings, PositionEmbedding(sequence_length=16)(embeddings)])
    >>> keras.Model(embeddings, outputs).output_shape
    (None, 16, 32)

    References:
        Vaswani et al., 2017, Table 3 row (E); Gehring et al., 2017.
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        check_positive_int("sequence_length", sequence_length)
        self.sequence_length = sequence_length
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, input_shape):
        self.position_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, input_shape[-1]),
            initializer=self.initializer,
        )
        self.built = True

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        positions = ops.slice(
            ops.convert_to_tensor(self.position_embeddings),
            (start_index, 0),
            (shape[-2], shape[-1]),
        )  # (T, D)
        return ops.broadcast_to(ops.cast(positions, inputs.dtype), shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "sequence_length": self.sequence_length,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package="keras_transformer")
class WordIndex(keras.layers.Layer):
    """The index of the word each token belongs to, read from a table of piece kinds.

    The table holds one kind per vocabulary id: `WORD_START` for a piece that begins a
    source word (SentencePiece's `▁` pieces, and EOS, which stands after the last word),
    `TAG` for a target symbol that stands for a word (a POS tag of a linearized tree; tags
    start with `▁` too, so they also start a word on the source side), `OTHER` for the
    rest. It is a non-trainable weight, set once from the tokenizer (`set_kinds`), saved
    with the model's checkpoints and exports.

    * `source(ids)`: the word of each source piece, 0-based (pieces of one word share it;
      EOS gets the word count `n`).
    * `target(ids)`: for each decoder input (BOS first, then the target prefix), the
      number of tags in it up to and including this position: the index of the word whose
      tag comes next, so the query predicting a word's tag has that word's index.

    Args:
        vocabulary_size: V.

    Example:

    >>> import numpy as np
    >>> layer = WordIndex(6)
    >>> layer.set_kinds([0, 0, 0, 1, 1, 2])  # id 3 (EOS) and 4 start words, 5 is a tag
    >>> np.asarray(layer.source(np.array([[4, 1, 4, 3]]))).tolist()
    [[0, 0, 1, 2]]
    >>> np.asarray(layer.target(np.array([[2, 4, 5, 4, 5]]))).tolist()
    [[0, 0, 1, 1, 2]]
    """

    OTHER, WORD_START, TAG = 0, 1, 2

    def __init__(self, vocabulary_size, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("vocabulary_size", vocabulary_size)
        self.vocabulary_size = vocabulary_size
        self.kinds = self.add_weight(
            name="piece_kinds",
            shape=(vocabulary_size,),
            dtype="int32",
            initializer="zeros",
            trainable=False,
        )
        self.built = True

    def set_kinds(self, kinds):
        """Set the table: `(V,)` ints, each `OTHER`, `WORD_START` or `TAG`."""
        kinds = np.asarray(kinds, dtype="int32")
        if (
            kinds.shape != (self.vocabulary_size,)
            or not ((kinds >= self.OTHER) & (kinds <= self.TAG)).all()
        ):
            raise ValueError(
                f"kinds must be {self.vocabulary_size} values in (0, 1, 2). Received shape {kinds.shape}"
            )
        self.kinds.assign(kinds)

    def source(self, token_ids):
        kinds = ops.take(
            ops.convert_to_tensor(self.kinds), ops.cast(token_ids, "int32"), axis=0
        )  # (B, S)
        starts = ops.cast(ops.greater_equal(kinds, self.WORD_START), "int32")
        return ops.maximum(ops.cumsum(starts, axis=-1) - 1, 0)

    def target(self, token_ids):
        kinds = ops.take(
            ops.convert_to_tensor(self.kinds), ops.cast(token_ids, "int32"), axis=0
        )  # (B, T)
        return ops.cumsum(ops.cast(ops.equal(kinds, self.TAG), "int32"), axis=-1)

    def call(self, token_ids):
        return self.source(token_ids)

    def get_config(self):
        config = super().get_config()
        config.update({"vocabulary_size": self.vocabulary_size})
        return config
