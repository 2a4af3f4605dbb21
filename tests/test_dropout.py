"""`ReplicaDropout`'s masks on TensorFlow: two units per 32-bit draw (`dropout_mask_16`).

The replicas' independent masks are tested in test_scale.py; the layer on every backend in
test_backends.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers.dropout import ReplicaDropout, drop_threshold, dropout_mask_16

SHAPE = (999, 1001)  # an odd number of units: the last 32-bit draw decides one unit


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
def test_units_are_dropped_at_the_rate_independently_and_kept_ones_scaled(rate):
    ones = np.ones(SHAPE, "float32")
    dropped = ReplicaDropout(rate, seed=5)(ones, training=True).numpy()
    kept = dropped != 0
    units = kept.size
    assert abs((1 - kept.mean()) - rate) < 5 * np.sqrt(rate * (1 - rate) / units)
    np.testing.assert_array_equal(dropped[kept], np.float32(1 / (1 - rate)))
    # The two units of one 32-bit draw (flat positions 2k and 2k + 1), and neighbours across
    # draws, are uncorrelated.
    flat = kept.reshape(-1).astype("float64")
    for first, second in ((flat[0:-1:2], flat[1::2]), (flat[1:-1:2], flat[2::2])):
        assert abs(np.corrcoef(first, second)[0, 1]) < 5 / np.sqrt(first.size)


def test_the_mask_is_the_philox_bits_read_as_16_bit_halves():
    seed = tf.constant([123, 4], tf.int32)
    mask = dropout_mask_16(tf.constant(SHAPE), 0.3, seed).numpy()
    units = int(np.prod(SHAPE))
    bits = tf.random.stateless_uniform([(units + 1) // 2], seed=seed, minval=None, maxval=None, dtype=tf.uint32)
    halves = bits.numpy().astype("<u4").view("<u2")[:units]  # little-endian: low half first
    np.testing.assert_array_equal(mask, (halves >= drop_threshold(0.3)).reshape(SHAPE))


def test_compiled_masks_equal_eager_ones_and_gradients_follow_the_mask():
    inputs = tf.random.stateless_normal((8, 33, 16), seed=(1, 2))
    layers = [ReplicaDropout(0.2, seed=9) for _ in range(2)]

    def dropped(layer, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * tf.cast(tf.range(16), tf.float32))
        return y, tape.gradient(loss, x)

    eager = dropped(layers[0], inputs)
    compiled = tf.function(dropped, jit_compile=True)(layers[1], inputs)
    for a, b in zip(eager, compiled, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    y, grad = eager
    keep = y.numpy() != 0
    np.testing.assert_allclose(grad.numpy(), keep * np.arange(16) / 0.8, rtol=1e-6)


def test_noise_shape_broadcasts_one_mask_and_bfloat16_keeps_its_dtype():
    dropped = ReplicaDropout(0.5, noise_shape=(None, 1, 64), seed=3)(np.ones((4, 7, 64), "float32"), training=True)
    dropped = dropped.numpy()
    np.testing.assert_array_equal(dropped, np.broadcast_to(dropped[:, :1], dropped.shape))
    assert 0 < (dropped == 0).mean() < 1
    half = ReplicaDropout(0.1, seed=3, dtype="mixed_bfloat16")(np.ones(SHAPE, "float32"), training=True)
    assert half.dtype == tf.bfloat16
    assert abs(float(tf.reduce_mean(tf.cast(half == 0, tf.float32))) - 0.1) < 0.002
