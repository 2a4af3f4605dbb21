"""Position information: fixed sinusoids (paper section 3.5) and learned embeddings (Table 3 row E).

Shape letters: B batch, T sequence length, D model width.
"""

import math

import keras
from keras import ops

from keras_transformer.layers.checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(keras.layers.Layer):
    """Sinusoidal positional encoding, interleaved exactly as the paper's formula.

    PE(pos, 2i) = sin(pos / max_wavelength^(2i/D)),
    PE(pos, 2i+1) = cos(pos / max_wavelength^(2i/D)).

    Even feature indices carry sines and odd ones cosines (not two concatenated halves).
    The encoding is computed for any length and has no weights. The layer returns the
    encoding broadcast to the input's shape; add it to the (scaled) embeddings yourself,
    with `keras.layers.Add()`: it keeps the embeddings' implicit padding mask, which the
    `+` operator drops (Keras 3 ops do not propagate masks).

    Args:
        max_wavelength: the base of the wavelengths (10000 in the paper).

    Call arguments:
        inputs: `(B, T, D)` embeddings; only their shape and dtype are used.
        start_index: position of the first step (int or scalar tensor), for cached
            decoding one step at a time.

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

    def __init__(self, max_wavelength=10000.0, **kwargs):
        super().__init__(**kwargs)
        if not max_wavelength > 0:
            raise ValueError(f"max_wavelength must be positive. Received: max_wavelength={max_wavelength!r}")
        self.max_wavelength = max_wavelength
        self.supports_masking = True
        self.built = True

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        length, depth = shape[-2], shape[-1]
        positions = ops.cast(ops.arange(length) + start_index, "float32")  # (T,)
        features = ops.arange(depth)  # (D,)
        exponents = ops.cast(features - features % 2, "float32") / ops.cast(depth, "float32")  # 2i / D
        inverse_frequencies = ops.exp(-math.log(self.max_wavelength) * exponents)  # (D,)
        angles = positions[:, None] * inverse_frequencies[None, :]  # (T, D)
        encoding = ops.where(features % 2 == 0, ops.sin(angles), ops.cos(angles))  # (T, D)
        return ops.broadcast_to(ops.cast(encoding, inputs.dtype), shape)  # (B, T, D)

    def get_config(self):
        config = super().get_config()
        config.update({"max_wavelength": self.max_wavelength})
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
