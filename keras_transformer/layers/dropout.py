"""Dropout whose masks differ between the replicas of a `tf.distribute` step.

Keras draws a dropout mask from the layer's seed generator: a `(seed, counter)` state that
every replica of a replicated step reads alike, so N replicas given the same batch drop the
same units and regularize like one. `ReplicaDropout` folds the replica's id (its index in
the sync group, counted over every worker) into the seed it draws, so the replicas draw N
independent masks, while the generator's state (in the model's variables and our
checkpoints) stays one shared counter: a rerun with the same seed draws the same masks, and
a resumed run continues the interrupted run's draws.

On one device, and on backends without a replica context, the seed is the generator's own:
the masks equal `keras.layers.Dropout`'s.
"""

import keras
from keras import ops

from keras_transformer.layers.checks import check_rate

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
            return keras.random.dropout(inputs, self.rate, noise_shape=self.noise_shape, seed=self.seed_generator)
        return inputs

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "noise_shape": self.noise_shape, "seed": self.seed})
        return config

    def compute_output_shape(self, input_shape):
        return input_shape
