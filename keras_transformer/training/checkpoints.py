"""Checkpoint averaging (paper section 6.1: last 5 checkpoints for base, 20 for big)."""

from pathlib import Path

import numpy as np
import tensorflow as tf


def checkpoint_paths(checkpoint_dir, last=None):
    """Paths of the complete checkpoints in `checkpoint_dir`, oldest first (the last `last`).

    Raises:
        ValueError: there is no checkpoint, or fewer than `last` (naming both numbers).
    """
    state = tf.train.get_checkpoint_state(str(checkpoint_dir))
    if state is None or not state.all_model_checkpoint_paths:
        raise ValueError(f"No checkpoints in {checkpoint_dir}")
    paths = list(state.all_model_checkpoint_paths)
    if last and last > len(paths):
        raise ValueError(
            f"Asked for the last {last} checkpoints, but {checkpoint_dir} holds {len(paths)}. "
            f"Average fewer, or train with --keep_checkpoints >= {last}."
        )
    return paths[-last:] if last else paths


def read_model_weights(model, path):
    """Load the model weights of a trainer checkpoint (`tf.train.Checkpoint(model=...)`) into `model`.

    Optimizer state in the checkpoint is ignored; every model variable must be found.
    """
    tf.train.Checkpoint(model=model).read(str(path)).expect_partial().assert_existing_objects_matched()
    return model


def average_checkpoints(model, paths):
    """Set `model`'s variables to the element-wise mean over the checkpoints at `paths`.

    The checkpoints must have been written by the toolkit's trainer (a
    `tf.train.Checkpoint` holding `model=`). Floating-point weights are averaged; other
    state (e.g. integer seed-generator states) keeps its value from the last checkpoint.
    Optimizer slots are ignored.

    Args:
        model: a built model with the same architecture.
        paths: checkpoint prefixes (e.g. from `checkpoint_paths`).

    Returns:
        the model, with averaged weights.
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint path. Received: []")
    variables = [v for v in model.weights if "float" in str(v.dtype)]
    sums = [np.zeros(v.shape, dtype=np.float64) for v in variables]
    for path in paths:
        read_model_weights(model, path)
        for total, variable in zip(sums, variables):
            total += np.asarray(variable.numpy(), dtype=np.float64)
    for total, variable in zip(sums, variables):
        variable.assign((total / len(paths)).astype(variable.dtype))
    return model


def write_averaged_checkpoint(model_dir, last=None, output_dir=None):
    """Average the last `last` checkpoints of a training run and save the result.

    Args:
        model_dir: run directory (with `config.json` and `checkpoints/`).
        last: how many checkpoints; defaults to the run config's `average_checkpoints`.
        output_dir: defaults to `<model_dir>/averaged`.

    Returns:
        `(path of the new checkpoint, list of the averaged checkpoint paths)`.
    """
    from keras_transformer.models.transformer import Transformer
    from keras_transformer.training.trainer import read_run_config

    config, _ = read_run_config(model_dir)
    paths = checkpoint_paths(Path(model_dir) / "checkpoints", last or config.average_checkpoints)
    model = average_checkpoints(Transformer(config), paths)
    step = int(paths[-1].rsplit("-", 1)[-1])
    output_dir = Path(output_dir or Path(model_dir) / "averaged")
    path = tf.train.Checkpoint(model=model).write(str(output_dir / f"ckpt-{step}"))
    return path, paths
