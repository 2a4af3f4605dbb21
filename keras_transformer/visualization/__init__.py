"""Attention heatmaps and training curves, written as PNG files (matplotlib, no screen).

Example:

>>> import numpy as np, tempfile, os
>>> from keras_transformer.visualization import plot_attention_heads
>>> scores = np.full((2, 3, 4), 0.25)                  # (H, Q, K)
>>> path = plot_attention_heads(scores, ["a", "b", "c"], ["w", "x", "y", "z"],
...                             os.path.join(tempfile.mkdtemp(), "heads.png"))
>>> path.name
'heads.png'
"""

from keras_transformer.visualization.attention import (
    KINDS,
    AttentionMaps,
    attention_maps,
    figure_size,
    plot_attention,
    plot_attention_heads,
)
from keras_transformer.visualization.curves import (
    Scalars,
    plot_training_curves,
    read_run_scalars,
    read_scalars,
    run_pauses,
    run_start,
    without_pauses,
    write_scalar_events,
)

__all__ = [
    "KINDS",
    "AttentionMaps",
    "Scalars",
    "attention_maps",
    "figure_size",
    "plot_attention",
    "plot_attention_heads",
    "plot_training_curves",
    "read_run_scalars",
    "read_scalars",
    "run_pauses",
    "run_start",
    "without_pauses",
    "write_scalar_events",
]
