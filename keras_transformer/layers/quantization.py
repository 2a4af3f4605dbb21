"""Int8 weights through Keras' own quantization API (`model.quantize("int8")`): what our layers share.

Keras' `Dense`, `EinsumDense` and `Embedding` implement the hooks that `keras.Model.quantize`
and `keras.Layer.__call__` use; `MultiHeadAttention` and `SharedEmbedding` implement the
same ones (`quantize`, `quantized_build`, `_int8_build`, `_int8_call`,
`variable_serialization_spec`, `save_own_variables` / `load_own_variables`) with the
helpers here, and compute what Keras' `Dense` computes in int8:

* each kernel is stored as int8 values and a float32 scale per output channel, from
  `keras.quantizers.AbsMaxQuantizer` over the axes the kernel contracts (the float kernel
  is `int8 / scale`), and the layer's dtype policy becomes `int8_from_<its policy>`;
* at each call the inputs are quantized per position (abs-max over the contracted axis,
  the config's activation quantizer, by default `AbsMaxQuantizer`), multiplied as
  int8 x int8 -> int32, and the product is divided by `inputs_scale * kernel_scale`. With
  `Int8QuantizationConfig(activation_quantizer=None)` only the weights are int8
  (the int8 kernel is cast to float in the matmul).

Only "int8" is implemented; another mode raises Keras' own error for a mode a layer does
not support (`NotImplementedError`, one line naming the mode).
"""

import contextlib
import gc

import keras
from keras import ops

MODES = ("int8",)


def mode_error(mode):
    """Keras' error for a quantization mode a layer does not support (`Layer._quantization_mode_error`)."""
    return NotImplementedError(
        f"Invalid quantization mode. Expected one of {MODES}. Received: quantization_mode={mode}"
    )


def quantize_kernel(kernel, reduced_axes, config=None):
    """A float kernel as int8 values and a scale per output channel.

    Args:
        kernel: the float variable.
        reduced_axes: the axes the layer contracts (the scale is the abs-max over them).
        config: a `keras.quantizers.QuantizationConfig` whose `weight_quantizer` (its value
            range and epsilon) replaces the default `AbsMaxQuantizer`, or None.

    Returns:
        `(int8 values of the kernel's shape, scale of the kernel's shape without reduced_axes)`.
    """
    quantizer = keras.quantizers.QuantizationConfig.weight_quantizer_or_default(
        config, keras.quantizers.AbsMaxQuantizer()
    )
    values, scale = quantizer(kernel, axis=reduced_axes, to_numpy=True)
    return values, ops.squeeze(scale, axis=reduced_axes)


def inputs_quantizer(config=None):
    """The quantizer of a layer's inputs: the config's activation quantizer (None: weight-only),
    by default `keras.quantizers.AbsMaxQuantizer` (Keras' default for int8)."""
    return keras.quantizers.QuantizationConfig.activation_quantizer_or_default(
        config, keras.quantizers.AbsMaxQuantizer()
    )


def quantized_matmul(inputs, kernel, kernel_scale, quantizer, dtype):
    """`inputs @ (kernel / kernel_scale)` with an int8 kernel, as Keras' `Dense._int8_call` computes it.

    Its gradient with respect to `inputs` is the float one through the de-quantized kernel
    (Keras' custom gradient), so the layers below still train (the int8 kernel does not).

    Args:
        inputs: float `(..., K)`.
        kernel: int8 `(K, N)`.
        kernel_scale: float32 `(N,)`, one scale per output channel.
        quantizer: the inputs' quantizer (`inputs_quantizer`); None multiplies the float
            inputs by the int8 kernel.
        dtype: the dtype of the result.

    Returns:
        `(..., N)` in `dtype`, de-scaled in float32 (also under mixed precision, where Keras
        reads the scale variables in the compute dtype).
    """

    @ops.custom_gradient
    def matmul(inputs, kernel, kernel_scale):
        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            float_kernel = ops.divide(ops.cast(kernel, "float32"), kernel_scale)  # (K, N)
            inputs_grad = ops.matmul(
                ops.cast(upstream, "float32"), ops.transpose(float_kernel)
            )  # (..., K)
            return ops.cast(inputs_grad, inputs.dtype), None, None

        scale = kernel_scale
        quantized = inputs
        if quantizer is not None:
            quantized, inputs_scale = quantizer(inputs, axis=-1)  # int8 (..., K), (..., 1)
            scale = ops.multiply(scale, ops.cast(inputs_scale, "float32"))
        outputs = ops.matmul(quantized, kernel)  # int32 (..., N) for int8 inputs
        return ops.cast(ops.divide(ops.cast(outputs, "float32"), scale), dtype), grad

    return matmul(inputs, ops.convert_to_tensor(kernel), ops.cast(kernel_scale, "float32"))


def quantized_policy(layer, mode):
    """The dtype policy of `layer` once quantized: `<mode>_from_<its float policy>`."""
    policy = layer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):  # a model's map: this layer's entry
        policy = policy[layer.path] if layer.path else policy.default_policy
    return keras.dtype_policies.get(f"{mode}_from_{policy.name}")


def save_variables(layer, store):
    """`save_own_variables`: the variables `layer.variable_serialization_spec` names for its mode, in order."""
    if not layer.built:
        return
    for index, name in enumerate(_serialized_names(layer)):
        store[str(index)] = getattr(layer, name)


def load_variables(layer, store):
    """`load_own_variables`: the inverse of `save_variables` (Keras' count check first)."""
    layer._check_load_own_variables(store)
    if not layer.built:
        return
    for index, name in enumerate(_serialized_names(layer)):
        getattr(layer, name).assign(store[str(index)])


def _serialized_names(layer):
    mode = layer.quantization_mode
    if mode not in layer.variable_serialization_spec:
        raise mode_error(mode)
    return layer.variable_serialization_spec[mode]


@contextlib.contextmanager
def one_garbage_collection():
    """One garbage collection at the end instead of one per float variable removed.

    Keras' `Layer.__delattr__` runs `gc.collect()` for every variable it removes, and
    quantizing removes every float kernel (ours in `MultiHeadAttention.quantize`, Keras' in
    `Dense.quantize`): each collection walks the whole heap, so quantizing even a tiny model
    cost one heap walk per kernel, longer in a process holding more objects. Inside the block
    the objects that existed
    before it are frozen (`gc.freeze`), which those collections skip; the float kernels,
    freed by reference counting, go as before, and one full collection runs at the end.
    Where the process has frozen objects already (`gc.get_freeze_count`), for instance inside
    another such block (`Transformer.quantize` around `MultiHeadAttention.quantize`), the
    block leaves the collector as it is.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()
