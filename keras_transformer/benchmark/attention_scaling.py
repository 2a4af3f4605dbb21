"""How one encoder layer's cost grows with the sequence length: full attention against a window.

The paper's Table 1 gives self-attention O(n^2 * d) work per layer and restricted
(windowed) self-attention O(r * n * d). `attention_scaling` measures it: one
`EncoderBlock`'s forward and backward pass (gradients for its weights and its input) at
each length n, timed alternately for full attention and for `attention_window=r`, and the
peak memory each adds. Quadratic growth shows as 4x per doubling of n, linear as 2x.

Peak memory: on a GPU, the device allocator's peak during one step. On the CPU, TensorFlow
keeps no allocator statistics, so each point runs in a fresh Python process (no memory freed
by earlier points to reuse) and reports how much the process's peak resident set size
(Linux `VmHWM`, reset just before the step) grew during one step at that length; the
process has built the layer and run it once on 8 positions before. That process takes its
tensors from `malloc`, not the pooled allocator the scripts select (`cpu_allocator`), so the
step's memory is not drawn from blocks an earlier step left in a pool.
"""

import dataclasses
import functools
import json
import math
import os
import subprocess
import sys

import numpy as np

from keras_transformer import cpu_allocator
from keras_transformer.benchmark.timing import fastest_of_alternating


@dataclasses.dataclass(frozen=True)
class ScalingPoint:
    """One sequence length: seconds per forward+backward step and peak bytes, full and windowed."""

    length: int
    full_seconds: float
    window_seconds: float
    full_bytes: int
    window_bytes: int


def encoder_layer_step(
    length,
    window=None,
    hidden_dim=256,
    num_heads=4,
    intermediate_dim=1024,
    batch_size=1,
    dropout=0.1,
    jit_compile=False,
    seed=0,
):
    """A compiled forward+backward pass of one post-LN `EncoderBlock` on `(batch_size, length, hidden_dim)`.

    Returns:
        `step()`, which runs the pass in training mode (dropout on) and returns the sum of
        the squared gradients as a float32 scalar tensor.
    """
    import keras
    import tensorflow as tf

    from keras_transformer.layers.encoder import EncoderBlock

    keras.utils.set_random_seed(seed)
    layer = EncoderBlock(
        num_heads=num_heads,
        intermediate_dim=intermediate_dim,
        dropout=dropout,
        attention_window=window,
    )
    inputs = tf.random.normal((batch_size, length, hidden_dim), seed=seed)
    layer(inputs)  # build

    @tf.function(jit_compile=jit_compile or None)
    def step():
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            loss = tf.reduce_sum(tf.square(layer(inputs, training=True)))
        grads = tape.gradient(loss, [inputs] + layer.trainable_variables)
        return tf.add_n([tf.reduce_sum(tf.square(grad)) for grad in grads])

    return step


def _run_steps(step, repeats):
    for _ in range(repeats):
        result = step()
    return float(result)  # waits for the last step


def time_full_and_windowed(length, window, rounds=3, repeats=None, **layer_args):
    """Best-of-`rounds` seconds per step of full and windowed attention at `length`, timed alternately.

    `repeats` steps make one timing (default: enough for ~64k tokens, at least 1).
    """
    repeats = repeats or max(1, 65536 // length)
    steps = {
        "full": encoder_layer_step(length, None, **layer_args),
        "window": encoder_layer_step(length, window, **layer_args),
    }
    for step in steps.values():
        float(step())  # trace and warm up
    fastest = fastest_of_alternating(
        {name: functools.partial(_run_steps, step, repeats) for name, step in steps.items()}, rounds
    )
    return fastest["full"][0] / repeats, fastest["window"][0] / repeats


WARM_LENGTH = 8  # the peak-memory baseline: one step on this many positions


def _resident_high_water_bytes():
    """This process's peak resident set size (`VmHWM`; unlike `ru_maxrss`, not inherited across exec)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("/proc/self/status has no VmHWM line")


def _peak_bytes_here(length, window, layer_args):
    """Peak bytes one step at `length` adds, measured in this process (see the module docstring)."""
    import tensorflow as tf

    gpu = bool(tf.config.list_physical_devices("GPU"))
    warm = encoder_layer_step(WARM_LENGTH, window, **layer_args)
    float(warm())  # load the kernels and allocate what every length needs
    step = encoder_layer_step(length, window, **layer_args)
    if gpu:
        tf.config.experimental.reset_memory_stats("GPU:0")
        before = tf.config.experimental.get_memory_info("GPU:0")["current"]
        float(step())
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] - before
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
        clear_refs.write("5")  # reset the high-water mark to the current resident size
    before = _resident_high_water_bytes()
    float(step())
    return _resident_high_water_bytes() - before


def peak_bytes(length, window=None, **layer_args):
    """Peak memory added by one step of `encoder_layer_step(length, window)`, measured in a fresh process."""
    code = (
        "import json, os, sys\n"
        "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')\n"
        "from keras_transformer.benchmark.attention_scaling import _peak_bytes_here\n"
        "print(json.dumps(_peak_bytes_here(*json.loads(sys.argv[1]))))\n"
    )
    arguments = json.dumps([length, window, layer_args])
    env = {**os.environ, cpu_allocator.ENVIRONMENT_VARIABLE: "false"}
    result = subprocess.run(
        [sys.executable, "-c", code, arguments],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"Measuring peak memory at length {length}, window {window} failed:\n{result.stderr[-2000:]}"
        )
    return int(json.loads(result.stdout.strip().splitlines()[-1]))


def attention_scaling(
    lengths=(128, 512, 2048, 8192),
    window=64,
    rounds=3,
    repeats=None,
    memory=True,
    log=print,
    **layer_args,
):
    """Time and peak memory of one encoder layer's forward+backward pass at each length, full vs windowed.

    Args:
        lengths: sequence lengths n, increasing.
        window: r, the windowed variant's `attention_window`.
        rounds: alternating timing rounds; each variant keeps its fastest.
        repeats: steps per timing (default: ~64k tokens' worth).
        memory: also measure peak memory (one fresh process per length and variant).
        log: prints each point as it is measured.
        **layer_args: `encoder_layer_step`'s layer arguments (hidden_dim, num_heads, ...).

    Returns:
        a list of `ScalingPoint`s, one per length (bytes are 0 when `memory` is False).
    """
    points = []
    for length in lengths:
        full_seconds, window_seconds = time_full_and_windowed(
            length, window, rounds, repeats, **layer_args
        )
        full_bytes = window_bytes = 0
        if memory:
            full_bytes = peak_bytes(length, None, **layer_args)
            window_bytes = peak_bytes(length, window, **layer_args)
        points.append(ScalingPoint(length, full_seconds, window_seconds, full_bytes, window_bytes))
        log(
            f"n={length}: full {full_seconds * 1e3:.1f} ms, {full_bytes / 2**20:.0f} MiB; "
            f"window {window} {window_seconds * 1e3:.1f} ms, {window_bytes / 2**20:.0f} MiB"
        )
    return points


def growth_per_doubling(lengths, values):
    """For each step between consecutive lengths: (values ratio) ** (1 / doublings of the length).

    >>> growth_per_doubling([128, 512, 2048], [1.0, 16.0, 256.0])
    [4.0, 4.0]
    >>> growth_per_doubling([100, 200], [3.0, 6.0])
    [2.0]
    """
    return [
        float((after / before) ** (1.0 / math.log2(n_after / n_before)))
        for n_before, n_after, before, after in zip(lengths, lengths[1:], values, values[1:])
    ]


def format_scaling_table(points, window):
    """The points as a markdown table, with the growth per doubling of n from the previous length."""
    lengths = [point.length for point in points]
    columns = {
        "full": [point.full_seconds for point in points],
        "window": [point.window_seconds for point in points],
        "full_bytes": [point.full_bytes for point in points],
        "window_bytes": [point.window_bytes for point in points],
    }
    growth = {
        name: [None] + growth_per_doubling(lengths, values) if all(values) else [None] * len(points)
        for name, values in columns.items()
    }

    def with_growth(value, factor, scale, unit):
        text = f"{value * scale:,.1f} {unit}" if value else "-"
        return text if factor is None else f"{text} ({factor:.2f}x)"

    lines = [
        f"| n | full: ms (growth per doubling) | r = {window}: ms | full: peak MiB | r = {window}: peak MiB "
        "| time full / windowed |",
        "|---|---|---|---|---|---|",
    ]
    for index, point in enumerate(points):
        cells = [
            f"{point.length:,}",
            with_growth(point.full_seconds, growth["full"][index], 1e3, "ms"),
            with_growth(point.window_seconds, growth["window"][index], 1e3, "ms"),
            with_growth(point.full_bytes, growth["full_bytes"][index], 2.0**-20, "MiB"),
            with_growth(point.window_bytes, growth["window_bytes"][index], 2.0**-20, "MiB"),
            f"{point.full_seconds / point.window_seconds:.2f}x",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_scaling(points, window, path):
    """Log-log plot of time and peak memory against n, full and windowed, with O(n) and O(n^2) guides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = np.array([point.length for point in points], dtype=float)
    panels = [("seconds per forward+backward step", "full_seconds", "window_seconds", 1.0)]
    if all(point.full_bytes and point.window_bytes for point in points):
        panels.append(("peak memory (MiB)", "full_bytes", "window_bytes", 2.0**-20))
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for axis, (label, full_field, window_field, scale) in zip(axes[0], panels):
        full = np.array([getattr(point, full_field) for point in points]) * scale
        windowed = np.array([getattr(point, window_field) for point in points]) * scale
        axis.loglog(lengths, full, "o-", color="tab:red", label="full attention")
        axis.loglog(lengths, windowed, "o-", color="tab:blue", label=f"window r = {window}")
        axis.loglog(
            lengths, full[-1] * (lengths / lengths[-1]) ** 2, ":", color="gray", label="~ n^2"
        )
        axis.loglog(
            lengths, windowed[-1] * (lengths / lengths[-1]), "--", color="gray", label="~ n"
        )
        axis.set_xlabel("sequence length n")
        axis.set_ylabel(label)
        axis.set_xticks(lengths, [f"{int(n):,}" for n in lengths])
        axis.legend()
    figure.suptitle("One encoder layer, forward + backward")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
