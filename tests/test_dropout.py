"""`ReplicaDropout`'s masks on TensorFlow: two units per 32-bit draw (`dropout_mask_16`).

The replicas' independent masks are tested in test_scale.py; the layer on every backend in
test_backends.py.
"""

import keras
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
    bits = tf.random.stateless_uniform(
        [(units + 1) // 2], seed=seed, minval=None, maxval=None, dtype=tf.uint32
    )
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
    dropped = ReplicaDropout(0.5, noise_shape=(None, 1, 64), seed=3)(
        np.ones((4, 7, 64), "float32"), training=True
    )
    dropped = dropped.numpy()
    np.testing.assert_array_equal(dropped, np.broadcast_to(dropped[:, :1], dropped.shape))
    assert 0 < (dropped == 0).mean() < 1
    half = ReplicaDropout(0.1, seed=3, dtype="mixed_bfloat16")(
        np.ones(SHAPE, "float32"), training=True
    )
    assert half.dtype == tf.bfloat16
    assert abs(float(tf.reduce_mean(tf.cast(half == 0, tf.float32))) - 0.1) < 0.002


# What a whole run sees: one layer called step after step (its generator's counter advancing),
# beside Keras' own dropout layer drawing as many masks.
RUN_SHAPE, RUN_STEPS = (8, 25, 32), 120  # (B, T, D); 96,000 units a step


def run_masks(layer, steps=RUN_STEPS, shape=RUN_SHAPE):
    """`(steps, *shape)` keep-masks of `layer` called `steps` times on ones, as one run calls it."""
    ones = np.ones(shape, "float32")
    return np.stack([layer(ones, training=True).numpy() != 0 for _ in range(steps)])


def keep_probability(rate):
    return 1 - drop_threshold(rate) / 65536


def z_of_dispersion(masks, p_keep):
    """How many standard deviations the units' keep counts over the steps spread beyond the
    binomial spread of independent draws (a unit kept every step, or never, shows here)."""
    counts = masks.reshape(masks.shape[0], -1).sum(axis=0)
    steps = masks.shape[0]
    statistic = ((counts - steps * p_keep) ** 2).sum() / (
        steps * p_keep * (1 - p_keep)
    )  # chi2, N dof
    return (statistic - counts.size) / np.sqrt(2 * counts.size)


def correlation(first, second):
    first, second = first.reshape(-1).astype("float64"), second.reshape(-1).astype("float64")
    return np.corrcoef(first, second)[0, 1], 5 / np.sqrt(first.size)


@pytest.fixture(scope="module")
def whole_run():
    """`{rate: (ours, keras')}`: the masks of a run of ReplicaDropout and of keras.layers.Dropout."""
    return {
        rate: (
            run_masks(ReplicaDropout(rate, seed=11)),
            run_masks(keras.layers.Dropout(rate, seed=11)),
        )
        for rate in (0.1, 0.3)
    }


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_over_a_run_the_kept_fraction_matches_the_threshold_and_keras(whole_run, rate):
    ours, theirs = whole_run[rate]
    p = keep_probability(rate)
    units = ours.size
    assert (
        abs(p - (1 - rate)) <= 0.5 / 65536
    )  # the threshold rounds the rate to the nearest 1/65536
    assert abs(ours.mean() - (1 - rate)) < 5 * np.sqrt(p * (1 - p) / units) + 0.5 / 65536
    # Two-sample: our kept fraction against Keras' masks drawn over as many units.
    assert abs(ours.mean() - theirs.mean()) < 5 * np.sqrt(2 * p * (1 - p) / units)
    # Every step on its own too: no step draws a mask much denser or sparser than the rate.
    per_step = ours.reshape(RUN_STEPS, -1).mean(axis=1)
    assert np.abs(per_step - p).max() < 5 * np.sqrt(p * (1 - p) / ours[0].size)


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_each_step_draws_a_fresh_mask_and_every_unit_is_kept_at_the_rate(whole_run, rate):
    ours, theirs = whole_run[rate]
    # A unit's mask at one step and the next are uncorrelated ...
    r, bound = correlation(ours[:-1], ours[1:])
    assert abs(r) < bound
    # ... and over the run each unit is kept as often as independent draws keep it: the same
    # dispersion statistic passes Keras' masks.
    assert abs(z_of_dispersion(ours, keep_probability(rate))) < 5
    assert abs(z_of_dispersion(theirs, 1 - rate)) < 5


def test_within_a_step_the_halves_of_a_draw_and_neighbouring_positions_are_independent(whole_run):
    ours, _ = whole_run[0.3]
    flat = ours.reshape(RUN_STEPS, -1)
    depth, length = RUN_SHAPE[2], RUN_SHAPE[1] * RUN_SHAPE[2]
    pairs = {
        "the two halves of a 32-bit draw": (flat[:, 0::2], flat[:, 1::2]),
        "neighbours across draws": (flat[:, 1:-1:2], flat[:, 2::2]),
        "the same channel at the next position": (flat[:, :-depth], flat[:, depth:]),
        "the same position in the next sentence": (flat[:, :-length], flat[:, length:]),
    }
    for name, (first, second) in pairs.items():
        r, bound = correlation(first, second)
        assert abs(r) < bound, (name, r)
    # Both halves dropped as often as independent draws drop two units (the joint 2 x 2 table).
    first, second = flat[:, 0::2], flat[:, 1::2]
    q = 1 - keep_probability(0.3)
    both = (~first & ~second).mean()
    assert abs(both - q * q) < 5 * np.sqrt(q * q * (1 - q * q) / first.size)


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_kept_units_are_scaled_exactly_as_keras_scales_them(dtype):
    inputs = tf.random.stateless_normal((64, 257), seed=(3, 4))
    ours = ReplicaDropout(0.1, seed=2, dtype=dtype)(inputs, training=True).numpy()
    theirs = keras.layers.Dropout(0.1, seed=2, dtype=dtype)(inputs, training=True).numpy()
    both = (ours != 0) & (theirs != 0)
    assert both.mean() > 0.7
    np.testing.assert_array_equal(ours[both], theirs[both])


def test_the_mean_of_a_dropped_input_is_the_input():
    layer, ones = ReplicaDropout(0.1, seed=8), np.ones(RUN_SHAPE, "float32")
    outputs = np.stack([layer(ones, training=True).numpy() for _ in range(20)]).astype("float64")
    p = keep_probability(0.1)
    # Kept units are scaled by 1 / (1 - rate); a unit is kept with p within 1e-4 of 1 - rate.
    assert abs(outputs.mean() - p / 0.9) < 5 * np.sqrt(p * (1 - p) / outputs.size) / 0.9
    assert abs(p / 0.9 - 1) < 1e-4
