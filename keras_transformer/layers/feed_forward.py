"""Position-wise feed-forward network (paper section 3.3, eq. 2).

Shape letters: B batch, T sequence length, D model width, F inner width.
"""

import keras

from keras_transformer.layers.checks import check_positive_int, check_rate
from keras_transformer.layers.dropout import ReplicaDropout


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """FFN(x) = activation(x W1 + b1) W2 + b2, applied to each position separately.

    The paper uses ReLU: max(0, x W1 + b1) W2 + b2 with D=512, F=2048. The output width
    equals the input width, inferred in `build`.

    Args:
        intermediate_dim: inner width F (d_ff).
        activation: activation of the inner layer ("relu" in the paper; "gelu" etc.).
        dropout: dropout on the inner activations (0 in the paper).
        use_bias: whether both projections have biases.
        kernel_initializer: initializer of both kernels.
        bias_initializer: initializer of both biases.
        quantization_config: the `keras.quantizers.QuantizationConfig` of both `Dense`
            layers once int8 (`model.quantize`; None: Keras' defaults).

    Call arguments:
        inputs: `(B, T, D)`.
        training: whether dropout is active.

    Returns:
        `(B, T, D)`.

    Example:

    >>> import keras
    >>> from keras_transformer.layers import PositionwiseFeedForward
    >>> hidden = keras.Input(shape=(None, 32))
    >>> outputs = PositionwiseFeedForward(intermediate_dim=64)(hidden)
    >>> keras.Model(hidden, outputs).output_shape
    (None, None, 32)

    References:
        Vaswani et al., 2017, section 3.3.
    """

    def __init__(
        self,
        intermediate_dim,
        activation="relu",
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        quantization_config=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("intermediate_dim", intermediate_dim)
        check_rate("dropout", dropout)
        self.intermediate_dim = intermediate_dim
        self.activation = keras.activations.get(activation)
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.quantization_config = quantization_config
        self.supports_masking = True
        dense_kwargs = dict(
            use_bias=use_bias,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
        )
        self.intermediate_dense = keras.layers.Dense(
            intermediate_dim,
            activation=self.activation,
            quantization_config=quantization_config,
            name="intermediate_dense",
            **dense_kwargs,
        )
        self.intermediate_dropout = ReplicaDropout(
            dropout, dtype=self.dtype_policy, name="intermediate_dropout"
        )
        self._dense_kwargs = dense_kwargs

    def build(self, input_shape):
        self.intermediate_dense.build(input_shape)
        self.intermediate_dropout.build(None)
        self.output_dense = keras.layers.Dense(
            input_shape[-1],
            quantization_config=self.quantization_config,
            name="output_dense",
            **self._dense_kwargs,
        )
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))
        self.built = True

    def call(self, inputs, training=None):
        hidden = self.intermediate_dense(inputs)  # (B, T, F)
        hidden = self.intermediate_dropout(hidden, training=training)
        return self.output_dense(hidden)  # (B, T, D)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "activation": keras.activations.serialize(self.activation),
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "quantization_config": keras.saving.serialize_keras_object(
                    self.quantization_config
                ),
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["quantization_config"] = keras.saving.deserialize_keras_object(
            config.get("quantization_config")
        )
        return super().from_config(config)

    def compute_output_shape(self, input_shape):
        return input_shape
