"""Training curves from a run's TensorBoard logs, as a PNG.

`training.Trainer` writes scalars to `<run>/logs/train` (`loss`, `learning_rate`,
`tokens_per_second`, `padding_fraction`) and `<run>/logs/validation` (`loss`,
`perplexity`). They are read from the event files with TensorBoard's reader, without a
TensorBoard server.
"""

import dataclasses

import numpy as np

from keras_transformer import fs, runs


@dataclasses.dataclass(frozen=True)
class Scalars:
    """One scalar series, sorted by step.

    Attributes:
        steps: int array `(N,)`.
        wall_times: float array `(N,)`, seconds since the epoch.
        values: float array `(N,)`.
    """

    steps: np.ndarray
    wall_times: np.ndarray
    values: np.ndarray

    def __len__(self):
        return len(self.steps)


def read_scalars(log_dir):
    """Every scalar in the event files of one TensorBoard log directory.

    Read with TensorBoard's own `EventAccumulator`: `tf.summary.scalar` values (TF2
    tensor summaries of the scalars plugin) and plain `simple_value` scalars (as
    `write_scalar_events` writes them). Several event files (a resumed run writes a new
    one) are merged in the order TensorBoard reads them; when a step was logged more than
    once, the value read last wins. A truncated last record (a file being written) is
    ignored, as TensorBoard does.

    Args:
        log_dir: a directory of `events.out.tfevents.*` files, e.g. `<run>/logs/train`.

    Returns:
        `{tag: Scalars}`; empty when there is no event file.
    """
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    if not fs.glob(fs.join(log_dir, "events.out.tfevents.*")):
        return {}
    accumulator = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0}
    ).Reload()
    series = {}
    for tag in accumulator.Tags()[event_accumulator.SCALARS]:
        series[tag] = [(e.step, e.wall_time, e.value) for e in accumulator.Scalars(tag)]
    for tag in accumulator.Tags()[event_accumulator.TENSORS]:
        if accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars":
            series[tag] = [
                (e.step, e.wall_time, float(tensor_util.make_ndarray(e.tensor_proto).item()))
                for e in accumulator.Tensors(tag)
            ]
    result = {}
    for tag, events in series.items():
        by_step = {
            int(step): (wall_time, value) for step, wall_time, value in events
        }  # the last read wins
        steps = sorted(by_step)
        result[tag] = Scalars(
            np.array(steps, np.int64),
            np.array([by_step[step][0] for step in steps], np.float64),
            np.array([by_step[step][1] for step in steps], np.float64),
        )
    return result


def write_scalar_events(log_dir, records):
    """Write scalars with given wall times as a TensorBoard event file in `log_dir`.

    `tf.summary` stamps each value with the time it is written; scores computed after
    training (e.g. BLEU of each checkpoint) need the time their checkpoint was saved
    instead, so they are written here as raw `Event` records. Event files already in
    `log_dir` are replaced.

    Args:
        log_dir: the directory, e.g. `<run>/logs/checkpoints`.
        records: `(step, wall_time, {tag: value})` tuples.

    Returns:
        the written event file's path.
    """
    import socket

    import tensorflow as tf

    records = sorted(records, key=lambda record: record[0])
    fs.makedirs(log_dir)
    for old in fs.glob(fs.join(log_dir, "events.out.tfevents.*")):
        fs.remove(old)
    first = records[0][1] if records else 0.0
    path = fs.join(log_dir, f"events.out.tfevents.{int(first)}.{socket.gethostname()}")
    with fs.os_errors(path), tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(
            tf.compat.v1.Event(wall_time=first, file_version="brain.Event:2").SerializeToString()
        )
        for step, wall_time, values in records:
            summary = tf.compat.v1.Summary(
                value=[
                    tf.compat.v1.Summary.Value(tag=tag, simple_value=float(value))
                    for tag, value in values.items()
                ]
            )
            event = tf.compat.v1.Event(wall_time=float(wall_time), step=int(step), summary=summary)
            writer.write(event.SerializeToString())
    return path


def read_run_scalars(model_dir):
    """`{"train": {...}, "validation": {...}, "checkpoints": {...}}` (`{tag: Scalars}` each) of a run directory."""
    logs = runs.log_dir(model_dir)
    if not fs.isdir(logs):
        raise FileNotFoundError(f"No TensorBoard logs in {model_dir} (expected {logs})")
    return {name: read_scalars(fs.join(logs, name)) for name in runs.LOG_NAMES}


def run_pauses(model_dir, scalars=None):
    """The pauses of a resumed run: `[(resumed_at, seconds)]`, one per resumption.

    A pause runs from the last event the run's logs hold before a start (`runs.read_starts`)
    to that start: the time the run stood still, and the time it ran on after its last
    logged event before it stopped or crashed. Starts before any logged event (the first)
    add none.

    Args:
        model_dir: a run directory.
        scalars: its `read_run_scalars`, if already read.

    Example:

    >>> run_pauses("runs/builtin_tiny")  # trained in one go
    []
    """
    scalars = read_run_scalars(model_dir) if scalars is None else scalars
    times = np.sort(
        np.concatenate(
            [np.zeros(0)]
            + [series.wall_times for logs in scalars.values() for series in logs.values()]
        )
    )
    pauses = []
    for start in runs.read_starts(model_dir):
        before = times[times < start["time"]]
        if len(before):
            pauses.append((start["time"], float(start["time"] - before[-1])))
    return pauses


def run_start(model_dir, scalars=None):
    """When the run began (seconds since the epoch): its first start, else its first logged event.

    The origin of the minutes that `plot_training_curves` draws and `score_checkpoints.py`
    prints, so the two agree. A run's first start (`runs.read_starts`) precedes its first
    logged event by the start-up (the tokenizer, tracing); runs written before starts were
    recorded fall back to the first event.

    Args:
        model_dir: a run directory.
        scalars: its `read_run_scalars`, if already read.

    Raises:
        ValueError: no start recorded and the logs hold no scalars.
    """
    starts = runs.read_starts(model_dir)
    if starts:
        return float(starts[0]["time"])
    scalars = read_run_scalars(model_dir) if scalars is None else scalars
    firsts = [
        series.wall_times[0] for logs in scalars.values() for series in logs.values() if len(series)
    ]
    if not firsts:
        raise ValueError(f"{model_dir} records no start, and its TensorBoard logs hold no scalars")
    return float(min(firsts))


def without_pauses(wall_times, pauses):
    """`wall_times` (seconds since the epoch) less every pause of `pauses` (`run_pauses`) that began before them."""
    wall_times = np.asarray(wall_times, dtype=np.float64)
    return wall_times - sum(
        ((wall_times >= resumed_at) * seconds for resumed_at, seconds in pauses), 0.0
    )


PANELS = (
    (
        "loss",
        (
            (runs.TRAIN_LOG, "loss", "training loss"),
            (runs.VALIDATION_LOG, "loss", "validation loss"),
        ),
        "loss (label-smoothed)",
    ),
    ("learning rate", ((runs.TRAIN_LOG, "learning_rate", "learning rate"),), "learning rate"),
    (
        "validation BLEU",
        (
            (runs.CHECKPOINT_SCORES_LOG, "bleu", "BLEU"),
            (runs.CHECKPOINT_SCORES_LOG, "chrf", "chrF"),
        ),
        "score",
    ),
    ("throughput", ((runs.TRAIN_LOG, "tokens_per_second", "tokens / s"),), "target tokens / s"),
)
"""The panels of `plot_training_curves`: (title, ((log, tag, legend), ...), y label)."""


def plot_training_curves(
    model_dir, path, title=None, dpi=100, figsize=(17.0, 7.0), skip_pauses=False, scalars=None
):
    """Plot loss, validation loss, learning rate, validation BLEU and throughput against step and wall time.

    The top row has the training step on the x axis, the bottom row the wall-clock time
    since the run began (minutes, `run_start`). Wall time includes validation and checkpoint
    pauses, and the idle time between an interrupted run and its resumption (unless
    `skip_pauses`). The BLEU panel shows the scores `experiments/score_checkpoints.py`
    wrote to `logs/checkpoints` (at the times the checkpoints were saved), or "not logged".

    Args:
        model_dir: a run directory with `logs/train` and `logs/validation`.
        path: the PNG file to write (parent directories are created).
        title: the figure title (default: the run directory's name).
        dpi: resolution; the image is `figsize * dpi` pixels.
        figsize: figure size in inches.
        skip_pauses: leave out the time between a stop and its resumption (`run_pauses`):
            the bottom row is then training time.
        scalars: the run's `read_run_scalars`, if already read.

    Returns:
        the written path.

    Raises:
        FileNotFoundError: no logs; ValueError: the logs hold no scalars.

    Example:

    >>> plot_training_curves("runs/builtin_tiny", "curves.png")
    PosixPath('curves.png')
    """
    from matplotlib.figure import Figure

    scalars = read_run_scalars(model_dir) if scalars is None else scalars
    if not any(scalars.values()):
        raise ValueError(f"The TensorBoard logs of {model_dir} hold no scalars")
    start = run_start(model_dir, scalars)
    pauses = run_pauses(model_dir, scalars) if skip_pauses else []
    time_axis = "training time (minutes, pauses left out)" if skip_pauses else "wall time (minutes)"

    figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    axes = figure.subplots(2, len(PANELS), squeeze=False)
    for column, (panel_title, curves, y_label) in enumerate(PANELS):
        for row, x_name in enumerate(("step", time_axis)):
            ax = axes[row, column]
            plotted = False
            for log, tag, legend in curves:
                series = scalars[log].get(tag)
                if series is None or not len(series):
                    continue
                x = (
                    series.steps
                    if row == 0
                    else (without_pauses(series.wall_times, pauses) - start) / 60.0
                )
                marker = "o" if log != "train" or len(series) < 20 else None
                ax.plot(x, series.values, marker=marker, markersize=4, label=legend)
                plotted = True
            if not plotted:
                ax.text(
                    0.5,
                    0.5,
                    "not logged",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                    color="gray",
                )
            ax.set_xlabel(x_name)
            ax.set_ylabel(y_label)
            ax.set_title(
                f"{panel_title} vs {'step' if row == 0 else time_axis.split(' (')[0]}", fontsize=10
            )
            ax.grid(True, alpha=0.3)
            if plotted and len(curves) > 1:
                ax.legend(fontsize=8)
            if panel_title == "learning rate" and plotted:
                ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    figure.suptitle(title or f"training curves: {fs.name(model_dir)}", fontsize=11)
    return fs.write_from(path, lambda file: figure.savefig(file, dpi=dpi, format="png"))
