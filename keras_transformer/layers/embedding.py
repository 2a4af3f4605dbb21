"""Token embedding scaled by sqrt(d_model), with the tied pre-softmax projection (section 3.4),
and the bias some models add to the logits after it.

Shape letters: B batch, T sequence length, D model width, V vocabulary size.
"""

import math

import keras
from keras import ops

from keras_transformer.layers import quantization
from keras_transformer.layers.checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_transformer")
class SharedEmbedding(keras.layers.Layer):
    """Token embedding whose matrix is also the output projection.

    Forward: `E[ids] * sqrt(D)` (the paper multiplies the embedding weights by sqrt(d_model)).
    Reverse (`reverse=True`): `hidden @ E^T`, the pre-softmax linear transformation sharing
    the same weight matrix; logits are returned in float32 for a stable softmax under mixed
    precision. With `mask_zero=True` (default) id 0 is padding and the forward output
    carries a Keras implicit padding mask.

    **Int8.** `layer.quantize("int8")` (Keras' API, as `keras.layers.ReversibleEmbedding`;
    see `quantization`) stores `embeddings` as int8 with a float32 scale per token,
    `embeddings_scale (V,)`: the lookup divides each row by its scale, and the reverse
    projection multiplies int8 hidden states by the int8 matrix (one scale per logit).

    Args:
        vocabulary_size: V.
        embedding_dim: D.
        scale: multiply the embeddings by sqrt(D) (paper default).
        mask_zero: treat id 0 as padding and produce an implicit mask.
        embeddings_initializer: defaults to normal(0, D^-0.5), so the scaled embeddings
            have unit variance.
        quantization_config: the `keras.quantizers.QuantizationConfig` of an int8 layer
            (set by `quantize`; None: Keras' defaults).

    Call arguments:
        inputs: int ids `(B, T)`, or hidden states `(B, T, D)` with `reverse=True`.
        reverse: project hidden states to vocabulary logits.
        output_ids: with `reverse=True`, None or int `(V',)`: the logits of these tokens
            only (a vocabulary shortlist).

    Returns:
        `(B, T, D)` embeddings, or float32 `(B, T, V)` logits with `reverse=True`
        (`(B, T, V')` with `output_ids`).

    Example:

    >>> import keras
    >>> from keras_transformer.layers import SharedEmbedding
    >>> ids = keras.Input(shape=(None,), dtype="int32")
    >>> embedding = SharedEmbedding(vocabulary_size=100, embedding_dim=16)
    >>> hidden = embedding(ids)
    >>> logits = embedding(hidden, reverse=True)
    >>> keras.Model(ids, logits).output_shape
    (None, None, 100)

    References:
        Vaswani et al., 2017, section 3.4; Press & Wolf, 2017.
    """

    def __init__(
        self,
        vocabulary_size,
        embedding_dim,
        scale=True,
        mask_zero=True,
        embeddings_initializer=None,
        quantization_config=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("embedding_dim", embedding_dim)
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.scale = scale
        self.mask_zero = mask_zero
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(stddev=embedding_dim**-0.5)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.quantization_config = quantization_config
        self.supports_masking = mask_zero

    def build(self, input_shape=None):
        shape = (self.vocabulary_size, self.embedding_dim)
        if self.quantization_mode:  # e.g. rebuilt from the config of a quantized layer
            self.quantized_build(
                shape, mode=self.quantization_mode, config=self.quantization_config
            )
        else:
            self.embeddings = self.add_weight(
                name="embeddings", shape=shape, initializer=self.embeddings_initializer
            )
        self.built = True

    def call(self, inputs, reverse=False, output_ids=None):
        if reverse:
            kernel = (
                self.embeddings
                if output_ids is None
                else ops.take(self.embeddings, output_ids, axis=0)
            )
            kernel = ops.cast(kernel, self.compute_dtype)
            logits = ops.matmul(inputs, ops.transpose(kernel))  # (B, T, V)
            return ops.cast(logits, "float32")
        outputs = ops.take(self.embeddings, ops.cast(inputs, "int32"), axis=0)  # (B, T, D)
        return self._scaled(ops.cast(outputs, self.compute_dtype))

    def _scaled(self, outputs):
        if self.scale:
            outputs = outputs * ops.cast(math.sqrt(self.embedding_dim), self.compute_dtype)
        return outputs

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero or "int" not in str(inputs.dtype):
            return mask
        return ops.not_equal(inputs, 0)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "embedding_dim": self.embedding_dim,
                "scale": self.scale,
                "mask_zero": self.mask_zero,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
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

    def compute_output_shape(self, input_shape, reverse=False, output_ids_shape=None):
        if reverse:
            return tuple(input_shape[:-1]) + (
                (self.vocabulary_size,) if output_ids_shape is None else tuple(output_ids_shape)
            )
        return tuple(input_shape) + (self.embedding_dim,)

    def compute_output_spec(self, inputs, reverse=False, output_ids=None):
        shape = self.compute_output_shape(
            inputs.shape,
            reverse=reverse,
            output_ids_shape=None if output_ids is None else output_ids.shape,
        )
        dtype = "float32" if reverse else self.compute_dtype
        return keras.KerasTensor(shape, dtype=dtype)

    # --- int8: Keras' quantization hooks (see `quantization`), as `keras.layers.ReversibleEmbedding` ---

    def quantize(self, mode=None, type_check=True, config=None):
        if type_check and type(self) is not SharedEmbedding:
            raise self._not_implemented_error(self.quantize)
        if mode not in quantization.MODES:
            raise self._quantization_mode_error(mode)
        self.quantization_config = config
        values, scale = quantization.quantize_kernel(
            self.embeddings, (1,), config
        )  # a scale per token
        shape = tuple(self.embeddings.shape)
        del self.embeddings  # untracks the float variable
        self.quantized_build(shape, mode, config)
        self.embeddings.assign(values)
        self.embeddings_scale.assign(scale)
        self.dtype_policy = quantization.quantized_policy(self, mode)

    def quantized_build(self, embeddings_shape, mode, config=None):
        if mode != "int8":
            raise self._quantization_mode_error(mode)
        self._int8_build(embeddings_shape, config)
        self._is_quantized = True

    def _int8_build(self, embeddings_shape, config=None):
        self.inputs_quantizer = quantization.inputs_quantizer(config)
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=embeddings_shape,
            initializer="zeros",
            dtype="int8",
            trainable=False,
        )
        self.embeddings_scale = self.add_weight(
            name="embeddings_scale", shape=embeddings_shape[:1], initializer="ones", trainable=False
        )

    def _int8_call(self, inputs, reverse=False, output_ids=None):
        if reverse:  # the scale of token v divides logit v
            kernel, scale = self.embeddings, self.embeddings_scale
            if output_ids is not None:
                kernel, scale = (
                    ops.take(kernel, output_ids, axis=0),
                    ops.take(scale, output_ids, axis=0),
                )
            return quantization.quantized_matmul(
                inputs, ops.transpose(kernel), scale, self.inputs_quantizer, "float32"
            )  # (B, T, V|V')
        ids = ops.cast(inputs, "int32")
        rows = ops.cast(ops.take(self.embeddings, ids, axis=0), "float32")  # (B, T, D)
        scale = ops.cast(ops.take(self.embeddings_scale, ids, axis=0), "float32")  # (B, T)
        return self._scaled(
            ops.cast(ops.divide(rows, ops.expand_dims(scale, -1)), self.compute_dtype)
        )

    def _quantization_mode_error(self, mode):
        return quantization.mode_error(mode)

    @property
    def variable_serialization_spec(self):
        """Quantization mode -> the names of the variables `save_own_variables` writes, in order."""
        return {None: ["embeddings"], "int8": ["embeddings", "embeddings_scale"]}

    def save_own_variables(self, store):
        quantization.save_variables(self, store)

    def load_own_variables(self, store):
        quantization.load_variables(self, store)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LogitsBias(keras.layers.Layer):
    """A learned bias, one per output token, added to float32 logits (Marian's
    `final_logits_bias`; the paper has none).

    The bias is a float32 weight `bias (V,)` (zeros at first) and the sum is float32, whatever
    the dtype policy: the layer does not autocast (under mixed precision Keras would cast the
    float32 logits and the bias to the compute dtype).

    Args:
        vocabulary_size: V.

    Call arguments:
        logits: float32 `(..., V)`, or `(..., V')` with `output_ids`.
        output_ids: None, or int `(V',)`: the tokens the logits are of (a vocabulary shortlist).

    Returns:
        float32 logits of the same shape, with the bias added.

    Example:

    >>> import numpy as np
    >>> layer = LogitsBias(4)
    >>> _ = layer.bias.assign([0.0, 1.0, 2.0, 3.0])
    >>> np.asarray(layer(np.zeros((1, 1, 4), "float32"))).tolist()
    [[[0.0, 1.0, 2.0, 3.0]]]
    >>> np.asarray(layer(np.zeros((1, 2), "float32"), output_ids=np.array([3, 1]))).tolist()
    [[3.0, 1.0]]
    """

    def __init__(self, vocabulary_size, **kwargs):
        super().__init__(**{**kwargs, "autocast": False})
        check_positive_int("vocabulary_size", vocabulary_size)
        self.vocabulary_size = vocabulary_size
        self.bias = self.add_weight(
            name="bias", shape=(vocabulary_size,), initializer="zeros", dtype="float32"
        )
        self.built = True

    def call(self, logits, output_ids=None):
        bias = ops.convert_to_tensor(self.bias)
        if output_ids is not None:
            bias = ops.take(bias, output_ids, axis=0)
        return ops.cast(logits, "float32") + bias

    def get_config(self):
        config = super().get_config()
        config.update({"vocabulary_size": self.vocabulary_size})
        return config

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, logits, output_ids=None):
        return keras.KerasTensor(logits.shape, dtype="float32")
