"""Dropout whose masks differ between the replicas of a `tf.distribute` step.

Keras draws a dropout mask from the layer's seed generator: a `(seed, counter)` state that
every replica of a replicated step reads alike, so N replicas given the same batch drop the
same units and regularize like one. `ReplicaDropout` folds the replica's id (its index in
the sync group, counted over every worker) into the seed it draws, so the replicas draw N
independent masks, while the generator's state (in the model's variables and our
checkpoints) stays one shared counter: a rerun with the same seed draws the same masks, and
a resumed run continues the interrupted run's draws.

On one device, and on backends without a replica context, the seed is the generator's own.

On TensorFlow the mask takes half the random bits of `keras.random.dropout`'s (`dropout_mask_16`):
each 32 random bits of the counter-based generator decide two units, a unit kept where its 16
bits are at least `round(65536 * rate)`: a unit is dropped with probability
`round(65536 * rate) / 65536`, within 7.7e-6 of `rate` (Keras' draws, floats of the input's
dtype, quantize it too: to 1/128 in bfloat16). Kept units are scaled by `1 / (1 - rate)`, as
Keras scales them. On JAX and PyTorch the layer calls `keras.random.dropout`.
"""

import keras
from keras import ops

from keras_transformer.layers.checks import check_rate

# The 16-bit draws of `dropout_mask_16`: a unit is dropped with probability threshold / _LEVELS.
_LEVELS = 1 << 16

# An odd constant near 2**32 / golden ratio: replica r's seeds start r * _REPLICA_STRIDE
# away from replica 0's, far from any other generator's seed (drawn in [1, 1e9]).
_REPLICA_STRIDE = 0x9E3779B1


def replica_id():
    """The id of the current replica in its sync group (a scalar tensor), or None on one replica."""
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context.replica_id_in_sync_group


def drop_threshold(rate):
    """The 16-bit threshold of `rate`: units whose draw is below it are dropped.

    >>> drop_threshold(0.1), drop_threshold(0.5)
    (6554, 32768)
    """
    return min(round(rate * _LEVELS), _LEVELS - 1)


def dropout_mask_16(shape, rate, seed):
    """TensorFlow: a boolean keep-mask of `shape`, each unit kept with probability
    `1 - drop_threshold(rate) / 65536`, two units per 32-bit draw of
    `tf.random.stateless_uniform` (Philox) from `seed` (int32 `(2,)`). XLA compiles it."""
    import tensorflow as tf

    size = tf.reduce_prod(shape)
    bits = tf.random.stateless_uniform(
        [(size + 1) // 2], seed=seed, minval=None, maxval=None, dtype=tf.uint32
    )
    draws = tf.reshape(tf.bitcast(bits, tf.uint16), [-1])[:size]  # two 16-bit draws per 32 bits
    return tf.reshape(draws >= tf.constant(drop_threshold(rate), tf.uint16), shape)


def _tensorflow_dropout(inputs, rate, noise_shape, seed):
    import tensorflow as tf

    shape = tf.shape(inputs)
    if noise_shape is not None:
        shape = tf.stack(
            [shape[axis] if size is None else size for axis, size in enumerate(noise_shape)]
        )
    seed = tf.cast(
        tf.math.floormod(seed, tf.int32.max - 1), tf.int32
    )  # int32 seeds compile with XLA
    keep = dropout_mask_16(shape, rate, seed)
    scale = tf.cast(1.0 / (1.0 - rate), inputs.dtype)
    return tf.where(keep, inputs * scale, tf.zeros((), inputs.dtype))


class ReplicaSeedGenerator(keras.random.SeedGenerator):
    """A `keras.random.SeedGenerator` whose draws inside a replicated step depend on the replica."""

    def next(self, ordered=True):
        seed = super().next(ordered=ordered)
        replica = replica_id()
        if replica is None:
            return seed
        offset = ops.cast(replica, seed.dtype) * _REPLICA_STRIDE
        return seed + ops.stack([offset, ops.zeros_like(offset)])


@keras.saving.register_keras_serializable(package="keras_transformer")
class ReplicaDropout(keras.layers.Layer):
    """`keras.layers.Dropout` with an independent mask on every replica (see the module docstring).

    Args:
        rate: fraction of the input units to drop, in [0, 1).
        noise_shape: as `keras.layers.Dropout`'s.
        seed: the seed generator's initial seed (default: drawn from Keras' global seed).

    Call arguments:
        inputs: any tensor.
        training: drop units only when True.

    Example:

    >>> import numpy as np
    >>> layer = ReplicaDropout(0.5, seed=1)
    >>> layer(np.ones((1, 4), "float32"), training=False).numpy().tolist()
    [[1.0, 1.0, 1.0, 1.0]]
    """

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        check_rate("rate", rate)
        self.rate = rate
        self.noise_shape = noise_shape
        self.seed = seed
        self.supports_masking = True
        self.built = True
        if rate > 0:
            self.seed_generator = ReplicaSeedGenerator(seed)

    def call(self, inputs, training=False):
        if training and self.rate > 0:
            if keras.backend.backend() == "tensorflow":
                return _tensorflow_dropout(
                    inputs, self.rate, self.noise_shape, self.seed_generator.next()
                )
            return keras.random.dropout(
                inputs, self.rate, noise_shape=self.noise_shape, seed=self.seed_generator
            )
        return inputs

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "noise_shape": self.noise_shape, "seed": self.seed})
        return config

    def compute_output_shape(self, input_shape):
        return input_shape
