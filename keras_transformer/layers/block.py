"""What the encoder and decoder layers share: arguments, sub-layers, residual wiring."""

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.checks import check_positive_int, check_rate
from keras_transformer.layers.dropout import ReplicaDropout
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.normalization import LayerNormalization


def residual_sublayer(inputs, sublayer, layer_norm, dropout, normalize_first, training):
    """Post-LN: LayerNorm(x + Dropout(Sublayer(x))); pre-LN: x + Dropout(Sublayer(LayerNorm(x))).

    Args:
        inputs: `(B, T, D)`.
        sublayer: callable `x -> (y, extra)`; `extra` (attention scores, a cache, or None) is
            passed through.
        layer_norm: the sub-layer's `LayerNormalization`.
        dropout: the sub-layer's `Dropout`, applied to its output before the residual add.
        normalize_first: pre-LN when True, the paper's post-LN when False.
        training: whether dropout is active.

    Returns:
        `(outputs (B, T, D), extra)`.
    """
    residual = inputs
    if normalize_first:
        inputs = layer_norm(inputs)
    outputs, extra = sublayer(inputs)
    outputs = residual + dropout(outputs, training=training)
    if not normalize_first:
        outputs = layer_norm(outputs)
    return outputs, extra


class TransformerBlock(keras.layers.Layer):
    """Base of `EncoderBlock` and `DecoderBlock`: validated arguments and named sub-layers.

    Subclasses list their sub-layers in `SUBLAYERS`; each name gets the sub-layer itself
    (`MultiHeadAttention`, or `PositionwiseFeedForward` for "feed_forward"), a
    `{name}_layer_norm` and a `{name}_dropout`.
    """

    SUBLAYERS = ()

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        key_dim=None,
        value_dim=None,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation="relu",
        layer_norm_epsilon=1e-6,
        normalize_first=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        attention_window=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("intermediate_dim", intermediate_dim)
        if attention_window is not None:
            check_positive_int("attention_window", attention_window)
        self.attention_window = attention_window
        for name, dim in (("key_dim", key_dim), ("value_dim", value_dim)):
            if dim is not None:
                check_positive_int(name, dim)
        for name, rate in (
            ("dropout", dropout),
            ("attention_dropout", attention_dropout),
            ("activation_dropout", activation_dropout),
        ):
            check_rate(name, rate)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.normalize_first = normalize_first
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True
        for name in self.SUBLAYERS:
            setattr(self, name, self._make_sublayer(name))
            norm = LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name=f"{name}_layer_norm"
            )
            setattr(self, f"{name}_layer_norm", norm)
            setattr(
                self,
                f"{name}_dropout",
                ReplicaDropout(dropout, dtype=self.dtype_policy, name=f"{name}_dropout"),
            )

    def _make_sublayer(self, name):
        if name == "feed_forward":
            return PositionwiseFeedForward(
                self.intermediate_dim,
                activation=self.activation,
                dropout=self.activation_dropout,
                kernel_initializer=self.kernel_initializer,
                bias_initializer=self.bias_initializer,
                dtype=self.dtype_policy,
                name=name,
            )
        return MultiHeadAttention(
            self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            dropout=self.attention_dropout,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            attention_window=self.attention_window if name == "self_attention" else None,
            dtype=self.dtype_policy,
            name=name,
        )

    def _build_norms_and_dropouts(self, input_shape):
        for name in self.SUBLAYERS:
            getattr(self, f"{name}_layer_norm").build(input_shape)
            getattr(self, f"{name}_dropout").build(input_shape)

    def _sublayer(self, inputs, name, function, training):
        """Run `function` as the residual sub-layer `name` (see `residual_sublayer`)."""
        return residual_sublayer(
            inputs,
            function,
            getattr(self, f"{name}_layer_norm"),
            getattr(self, f"{name}_dropout"),
            self.normalize_first,
            training,
        )

    def _feed_forward(self, inputs, training):
        return self._sublayer(
            inputs,
            "feed_forward",
            lambda x: (self.feed_forward(x, training=training), None),
            training,
        )[0]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "activation_dropout": self.activation_dropout,
                "activation": keras.activations.serialize(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "normalize_first": self.normalize_first,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "attention_window": self.attention_window,
            }
        )
        return config
