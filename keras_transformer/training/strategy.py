"""Create a `tf.distribute` strategy by name."""

import keras
import tensorflow as tf

from keras_transformer.backends import require_tensorflow

STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")


def create_strategy(name="default", devices=None, tpu=None):
    """A `tf.distribute.Strategy`.

    Args:
        name: "default" (no distribution: one device), "mirrored" (all local GPUs, or the
            `devices` given, e.g. `["/cpu:0", "/cpu:1"]` for logical CPU devices),
            "multi_worker" (`MultiWorkerMirroredStrategy`, configured by the `TF_CONFIG`
            environment variable), or "tpu" (`TPUStrategy` for the TPU named by `tpu`).
        devices: device names for "mirrored".
        tpu: TPU name or address for "tpu" ("" = local).

    Raises:
        ValueError: unknown name.
        RuntimeError: off TensorFlow (one line; on JAX, `keras.distribution.DataParallel`
            distributes `Transformer.fit`).
    """
    require_tensorflow(
        "tf.distribute strategies (training.create_strategy)",
        hint="use keras.distribution.DataParallel" if keras.backend.backend() == "jax" else None,
    )
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(devices=devices)
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"Unknown strategy {name!r}. Valid strategies: {', '.join(STRATEGIES)}")


def is_chief(strategy):
    """Whether this worker writes checkpoints, logs and exports (always True off multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type in (None, "chief"):
        return True
    return (
        task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().as_dict()
    )
