"""Token embedding scaled by sqrt(d_model), with the tied pre-softmax projection (section 3.4).

Shape letters: B batch, T sequence length, D model width, V vocabulary size.
"""

import math

import keras
from keras import ops

from keras_transformer.layers.checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_transformer")
class SharedEmbedding(keras.layers.Layer):
    """Token embedding whose matrix is also the output projection.

    Forward: `E[ids] * sqrt(D)` (the paper multiplies the embedding weights by sqrt(d_model)).
    Reverse (`reverse=True`): `hidden @ E^T`, the pre-softmax linear transformation sharing
    the same weight matrix; logits are returned in float32 for a stable softmax under mixed
    precision. With `mask_zero=True` (default) id 0 is padding and the forward output
    carries a Keras implicit padding mask.

    Args:
        vocabulary_size: V.
        embedding_dim: D.
        scale: multiply the embeddings by sqrt(D) (paper default).
        mask_zero: treat id 0 as padding and produce an implicit mask.
        embeddings_initializer: defaults to normal(0, D^-0.5), so the scaled embeddings
            have unit variance.

    Call arguments:
        inputs: int ids `(B, T)`, or hidden states `(B, T, D)` with `reverse=True`.
        reverse: project hidden states to vocabulary logits.

    Returns:
        `(B, T, D)` embeddings, or float32 `(B, T, V)` logits with `reverse=True`.

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
        self.supports_masking = mask_zero

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.embedding_dim),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def call(self, inputs, reverse=False):
        if reverse:
            kernel = ops.cast(self.embeddings, self.compute_dtype)
            logits = ops.matmul(inputs, ops.transpose(kernel))  # (B, T, V)
            return ops.cast(logits, "float32")
        outputs = ops.take(self.embeddings, ops.cast(inputs, "int32"), axis=0)  # (B, T, D)
        outputs = ops.cast(outputs, self.compute_dtype)
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
            }
        )
        return config

    def compute_output_shape(self, input_shape, reverse=False):
        if reverse:
            return tuple(input_shape[:-1]) + (self.vocabulary_size,)
        return tuple(input_shape) + (self.embedding_dim,)

    def compute_output_spec(self, inputs, reverse=False):
        shape = self.compute_output_shape(inputs.shape, reverse=reverse)
        dtype = "float32" if reverse else self.compute_dtype
        return keras.KerasTensor(shape, dtype=dtype)
