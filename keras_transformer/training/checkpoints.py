"""Checkpoint averaging (paper section 6.1: last 5 checkpoints for base, 20 for big)."""

from pathlib import Path

import tensorflow as tf

from keras_transformer import runs
from keras_transformer.models.transformer import Transformer
from keras_transformer.runs import average_checkpoints, checkpoint_paths


def write_averaged_checkpoint(model_dir, last=None, output_dir=None):
    """Average the last `last` checkpoints of a training run and save the result.

    Args:
        model_dir: run directory (with `config.json` and `checkpoints/`).
        last: how many checkpoints; defaults to the run config's `average_checkpoints`.
        output_dir: defaults to `<model_dir>/averaged`.

    Returns:
        `(path of the new checkpoint, list of the averaged checkpoint paths)`.
    """
    config, _ = runs.read_run_config(model_dir)
    paths = checkpoint_paths(runs.checkpoint_dir(model_dir), last or config.average_checkpoints)
    model = average_checkpoints(Transformer(config), paths)
    step = runs.checkpoint_step(paths[-1])
    output_dir = Path(output_dir or runs.averaged_dir(model_dir))
    path = tf.train.Checkpoint(model=model).write(str(output_dir / f"{runs.CHECKPOINT_PREFIX}-{step}"))
    return path, paths
