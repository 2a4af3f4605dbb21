"""PositionwiseFeedForward: FFN(x) = max(0, x W1 + b1) W2 + b2 (eq. 2)."""

import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import PositionwiseFeedForward
from tests.layer_test_case import B, D, F, T, cases_for, random_floats, run_case


def as_numpy(tensor):
    return ops.convert_to_numpy(tensor)


@pytest.mark.parametrize("name", cases_for(PositionwiseFeedForward))
def test_layer(name):
    run_case(name)


def test_equals_equation_2():
    rng = np.random.default_rng(0)
    inputs = random_floats(rng, B, T, D)
    layer = PositionwiseFeedForward(intermediate_dim=F, bias_initializer="random_normal")
    outputs = as_numpy(layer(inputs))
    w1, b1 = as_numpy(layer.intermediate_dense.kernel), as_numpy(layer.intermediate_dense.bias)
    w2, b2 = as_numpy(layer.output_dense.kernel), as_numpy(layer.output_dense.bias)
    assert w1.shape == (D, F) and w2.shape == (F, D)
    expected = np.maximum(0.0, inputs @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=1e-5)


def test_applies_to_each_position_separately():
    rng = np.random.default_rng(1)
    inputs = random_floats(rng, B, T, D)
    layer = PositionwiseFeedForward(intermediate_dim=F)
    outputs = as_numpy(layer(inputs))
    order = rng.permutation(T)
    np.testing.assert_allclose(
        as_numpy(layer(inputs[:, order])), outputs[:, order], rtol=0, atol=1e-6
    )
    np.testing.assert_allclose(as_numpy(layer(inputs[:, 2:3])), outputs[:, 2:3], rtol=0, atol=1e-6)


def test_training_false_disables_dropout():
    rng = np.random.default_rng(2)
    inputs = random_floats(rng, B, T, D)
    layer = PositionwiseFeedForward(intermediate_dim=F, dropout=0.5)
    inference = as_numpy(layer(inputs, training=False))
    np.testing.assert_array_equal(as_numpy(layer(inputs, training=False)), inference)
    reference = PositionwiseFeedForward(intermediate_dim=F, dropout=0.0)
    reference(inputs)
    reference.set_weights(layer.get_weights())
    np.testing.assert_allclose(as_numpy(reference(inputs)), inference, rtol=0, atol=1e-6)
    first, second = as_numpy(layer(inputs, training=True)), as_numpy(layer(inputs, training=True))
    assert np.abs(first - inference).max() > 1e-3
    assert np.abs(first - second).max() > 1e-3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(intermediate_dim=0), "intermediate_dim=0"),
        (dict(intermediate_dim=8, dropout=1.5), "dropout=1.5"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PositionwiseFeedForward(**kwargs)
