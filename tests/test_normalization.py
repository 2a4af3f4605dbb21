"""LayerNormalization: Keras' layer norm with the closed-form gradient, on the same weights."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import LayerNormalization
from tests.layer_test_case import B, D, T, cases_for, random_floats, run_case


@pytest.mark.parametrize("name", cases_for(LayerNormalization))
def test_layer(name):
    run_case(name)


def outputs_and_gradients(layer, inputs, upstream):
    """The layer's outputs and the gradients of `sum(outputs * upstream)` for its input, gamma and beta."""
    inputs = tf.cast(inputs, layer.compute_dtype)
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        outputs = layer(inputs)
        loss = tf.reduce_sum(tf.cast(outputs, "float32") * upstream)
    grads = tape.gradient(loss, [inputs, *layer.trainable_variables])
    return [tf.cast(value, "float32").numpy() for value in (outputs, *grads)]


def paired_layers(shape, dtype="float32", **kwargs):
    """Ours and Keras', built for `shape`, with the same random gamma and beta."""
    ours, keras_layer = (
        LayerNormalization(dtype=dtype, **kwargs),
        keras.layers.LayerNormalization(dtype=dtype, **kwargs),
    )
    rng = np.random.default_rng(2)
    for layer in (ours, keras_layer):
        layer.build(shape)
    weights = [rng.standard_normal(variable.shape).astype("float32") for variable in ours.weights]
    for layer in (ours, keras_layer):
        layer.set_weights(weights)
    return ours, keras_layer


@pytest.mark.parametrize("shape", [(B, T, D), (7, D), (B, 3, T, 128)])
def test_outputs_and_gradients_equal_keras_layer_norm(shape):
    """Forward, and the gradients for the input, gamma and beta (the closed form against
    autodiff of Keras' computation), to 1e-5 in float32; inputs off zero mean and unit scale."""
    rng = np.random.default_rng(0)
    inputs = 3.0 * random_floats(rng, *shape) + 1.5
    upstream = random_floats(rng, *shape)
    ours, keras_layer = paired_layers(shape, epsilon=1e-6)
    names = ["outputs", "input gradient", "gamma gradient", "beta gradient"]
    for name, mine, theirs in zip(
        names,
        outputs_and_gradients(ours, inputs, upstream),
        outputs_and_gradients(keras_layer, inputs, upstream),
    ):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5, err_msg=name)


def test_mixed_bfloat16_normalizes_in_float32_as_keras_does():
    """Under `mixed_bfloat16` the statistics are float32 and the result is cast back: outputs and
    input gradients within one bfloat16 rounding (2**-8 relative) of Keras', in bfloat16."""
    rng = np.random.default_rng(1)
    inputs, upstream = 3.0 * random_floats(rng, 64, D) + 1.5, random_floats(rng, 64, D)
    ours, keras_layer = paired_layers((64, D), dtype="mixed_bfloat16", epsilon=1e-6)
    mine, theirs = (
        outputs_and_gradients(ours, inputs, upstream),
        outputs_and_gradients(keras_layer, inputs, upstream),
    )
    assert ours(tf.cast(inputs, "bfloat16")).dtype == tf.bfloat16
    for name, a, b in zip(["outputs", "input gradient"], mine, theirs):
        np.testing.assert_allclose(a, b, rtol=2**-7, atol=2**-7 * np.abs(b).max(), err_msg=name)
    for name, a, b in zip(["gamma gradient", "beta gradient"], mine[2:], theirs[2:]):
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-2 * np.abs(b).max(), err_msg=name)


@pytest.mark.parametrize("kwargs", [dict(axis=1), dict(center=False), dict(scale=False)])
def test_other_settings_run_keras_computation(kwargs):
    """Another axis, or without beta or gamma: Keras' own computation (same outputs)."""
    rng = np.random.default_rng(3)
    inputs, upstream = random_floats(rng, B, T, D), random_floats(rng, B, T, D)
    ours, keras_layer = paired_layers((B, T, D), **kwargs)
    for mine, theirs in zip(
        outputs_and_gradients(ours, inputs, upstream),
        outputs_and_gradients(keras_layer, inputs, upstream),
    ):
        np.testing.assert_array_equal(mine, theirs)
