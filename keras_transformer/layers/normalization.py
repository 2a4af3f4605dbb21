"""Layer normalization over the last axis with its gradient written out.

`keras.layers.LayerNormalization` computes `(x - mean) * rsqrt(var + eps) * gamma + beta` in
float32, and autodiff differentiates every op of it: on the CPU most of the layer norms' time
in a training step went to that backward pass (docs/results-log.md, "Layer norm's gradient
written out, and the packing by gathers"). `LayerNormalization`
here is the same layer, with the same weights, arguments and outputs, whose backward pass is
the closed form (Ba et al., 2016): with x̂ the normalized input, g = dy * gamma and d the width,

    dx = rsqrt(var + eps) * (g - mean(g) - x̂ * mean(g * x̂))
    dgamma = sum over positions of dy * x̂,  dbeta = sum over positions of dy

where the two row means are matrix-vector products with gamma (no `(N, D)` product is built
for them). It applies when normalizing over the last axis with both gamma and beta (every
norm of our layers); other settings run Keras' computation.

Shape letters: N positions (all leading axes), D the normalized width.
"""

import keras
from keras import ops

from keras_transformer.layers.tracing import gradient_scope


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` with the closed-form gradient (see the module docstring).

    Same weights (`gamma`, `beta`) and outputs as Keras' layer; inputs of half precision are
    normalized in float32 and the result cast back, as there.

    Args:
        axis: the normalized axis or axes; the closed form applies to the last one alone.
        **kwargs: Keras' `LayerNormalization` arguments (`epsilon`, `center`, `scale`, ...).

    Example:

    >>> import numpy as np
    >>> layer = LayerNormalization(epsilon=1e-6)
    >>> [round(float(value), 4) for value in layer(np.array([[1.0, 2.0, 3.0]], "float32"))[0]]
    [-1.2247, 0.0, 1.2247]
    """

    def __init__(self, axis=-1, **kwargs):
        # Keras' layer turns an int axis into a list when it builds, which changed its config.
        super().__init__(axis=[axis] if isinstance(axis, int) else axis, **kwargs)

    def call(self, inputs):
        last = len(inputs.shape) - 1
        if (
            self.rms_scaling
            or self.gamma is None
            or self.beta is None
            or list(self.axis) not in ([-1], [last])
        ):
            return super().call(inputs)
        outputs = layer_norm(
            inputs,
            ops.convert_to_tensor(self.gamma),
            ops.convert_to_tensor(self.beta),
            self.epsilon,
        )
        return ops.cast(outputs, self.compute_dtype)


def layer_norm(inputs, gamma, beta, epsilon):
    """`(x - mean) * rsqrt(var + epsilon) * gamma + beta` over the last axis, in float32, cast to
    the dtype of `inputs`; its gradient is the closed form of the module docstring."""
    dtype = inputs.dtype

    @ops.custom_gradient
    def normalize(inputs, gamma, beta):
        values = ops.cast(inputs, "float32")
        centered = values - ops.mean(values, axis=-1, keepdims=True)
        inverse = ops.rsqrt(
            ops.mean(ops.square(centered), axis=-1, keepdims=True) + epsilon
        )  # (..., 1)
        normalized = centered * inverse  # x̂
        outputs = ops.cast(normalized * gamma + beta, dtype)
        scope = gradient_scope()

        def gradient(*args, upstream=None):
            # TensorFlow and JAX pass the upstream gradient as the one argument; PyTorch passes
            # the function's inputs as arguments and it as `upstream` (as in `training.loss`).
            with scope():
                return normalize_gradient(args[0] if upstream is None else upstream)

        def normalize_gradient(upstream):
            upstream = ops.cast(upstream, "float32")
            width = normalized.shape[-1]
            rows = ops.reshape(upstream, (-1, width))  # (N, D)
            scaled = rows * ops.reshape(normalized, (-1, width))  # dy * x̂
            column = ops.reshape(gamma, (width, 1)) / width
            mean_g = ops.reshape(ops.matmul(rows, column), ops.shape(inverse))  # mean(dy * gamma)
            mean_gx = ops.reshape(
                ops.matmul(scaled, column), ops.shape(inverse)
            )  # mean(dy * gamma * x̂)
            grads = (upstream * gamma - mean_g - normalized * mean_gx) * inverse
            return ops.cast(grads, dtype), ops.sum(scaled, axis=0), ops.sum(rows, axis=0)

        return outputs, gradient

    return normalize(inputs, ops.cast(gamma, "float32"), ops.cast(beta, "float32"))
