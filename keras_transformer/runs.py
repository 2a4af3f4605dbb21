"""The run directory: what a training run writes, and reading it back.

Layout (written by `training.train_translation` / `experiments/train.py`)::

    <run>/config.json        the model config, training options and data settings of the run's first start
    <run>/starts.jsonl       one JSON line per start (first and every resume): time, step, settings
    <run>/flags.txt          the training command's flags, an absl flag file (`train.py --flagfile=`)
    <run>/spm.model          the joint SentencePiece model
    <run>/source.spm, target.spm, vocab.json (+ target_vocab.json)
                             instead of spm.model: a Marian tokenizer pair (an imported OPUS-MT
                             model; `data.marian`); `run_tokenizer` reads whichever the run has
    <run>/checkpoints/       ckpt-<step>.{index,data-*} and the manager's `checkpoint` state
    <run>/logs/<name>/       TensorBoard event files (train, validation, checkpoints)
    <run>/averaged/          ckpt-<step> written by checkpoint averaging
    <run>/best/              the best-scoring checkpoint (`--score_every`): ckpt-<step> and best.json
    <run>/scores.jsonl       one JSON line per scored evaluation during training (`--score_every`)
    <run>/lease.json         the live trainer's lease on the run (`training.lease`), while one trains
    <run>/.worker_<i>/       a non-chief worker's share of the checkpoint being saved (removed after)

Every module that reads or writes a run uses these names and functions; none spells the
layout itself. `<run>` may be any path `keras_transformer.fs` knows (`gs://bucket/run`,
...); the paths made here are `Path`s for a local run and URLs (`str`) otherwise.

A checkpoint that cannot be read (truncated data, a missing index, an unreadable
`checkpoint` state file) raises `UnreadableCheckpointError`, one line naming the file and
the reason. Whether a failed read means the checkpoint's files are bad (`damage_reason`) or
something else failed (the storage, a permission, a model that does not match) decides
whether training may set the checkpoint aside (`training.checkpoints`).
"""

import json
import re

import numpy as np
import tensorflow as tf
from absl import logging

from keras_transformer import fs
from keras_transformer.data import marian
from keras_transformer.data.tokenizer import Tokenizer
from keras_transformer.model_root import missing_checkpoint_files
from keras_transformer.models.config import model_config
from keras_transformer.models.transformer import build_model

CONFIG_FILE = "config.json"
STARTS_FILE = "starts.jsonl"
FLAGS_FILE = "flags.txt"
TOKENIZER_FILE = "spm.model"
CHECKPOINTS = "checkpoints"
LOGS = "logs"
AVERAGED = "averaged"
BEST = "best"  # also the `--checkpoint` value that names the run's best checkpoint
BEST_FILE = "best.json"  # in best/: the step, score, metric and signature of its checkpoint
SCORES_FILE = "scores.jsonl"
LEASE_FILE = "lease.json"
WORKER_DIR = ".worker_{}"  # a non-chief worker's, by its task id
CHECKPOINT_PREFIX = "ckpt"  # checkpoints are <prefix>-<step>
# Log directories under logs/: the trainer's two, and the checkpoint scores written afterwards.
TRAIN_LOG, VALIDATION_LOG, CHECKPOINT_SCORES_LOG = "train", "validation", "checkpoints"
LOG_NAMES = (TRAIN_LOG, VALIDATION_LOG, CHECKPOINT_SCORES_LOG)


CHECKPOINT_STATE_FILE = "checkpoint"  # tf.train.CheckpointManager's list of checkpoints


class UnreadableCheckpointError(ValueError):
    """A checkpoint, or the checkpoint state file, cannot be read (missing, truncated or corrupt files)."""


class CheckpointReadError(RuntimeError):
    """A checkpoint could not be read, and not because its files are bad: the storage failed
    (unavailable, a permission, a deadline) or the checkpoint does not match the model (a
    shape, a dtype, an optimizer). Nothing is set aside for it."""


# What reading a checkpoint can raise: a truncated data file gives IndexError ("Read less
# bytes than requested"); a missing or cut index, and any failure of the storage, a
# tf.errors.OpError. Only some of them mean damage (`damage_reason`).
READ_ERRORS = (tf.errors.OpError, IndexError)

# What TensorFlow's checkpoint reader says of an index or data file whose bytes are bad; it
# reports these (and any other failure, a storage one included) as a plain UNKNOWN OpError.
_CORRUPT_MESSAGES = (
    "too short to be an sstable",
    "Perhaps the file is corrupt",
    "Checksum does not match",
    "Unable to open table file",
)


def damage_reason(path, error):
    """Why `error`, raised reading the checkpoint at prefix `path`, means its files are bad; None when it does not.

    Damage: a data file shorter than the index says (IndexError), `DataLossError`, a
    corrupt index or data file, or (for a `NotFoundError` or an unknown reader error) an
    index or data file that is not there. Anything else (UnavailableError,
    PermissionDeniedError, DeadlineExceededError, a shape, dtype or object mismatch) is
    not damage.

    Raises:
        OSError: listing the checkpoint's files failed (then it is not known to be damaged).
    """
    if isinstance(error, IndexError):
        return unreadable_reason(error)
    if isinstance(error, tf.errors.DataLossError):
        return unreadable_reason(error)
    if type(error) in (tf.errors.NotFoundError, tf.errors.OpError, tf.errors.UnknownError):
        missing = missing_checkpoint_files(path)
        if missing:
            return {
                ".index": "its index file is missing",
                ".data-*": "its data files are missing",
            }.get(missing[0], f"{path}{missing[0]} is missing")
        if type(error) is not tf.errors.NotFoundError and any(
            text in str(error) for text in _CORRUPT_MESSAGES
        ):
            return unreadable_reason(error)
    return None


def error_line(error):
    """The first line of `error`'s message without TensorFlow's `{{function_node ...}}` and `[Op:...]` wrapping."""
    message = (getattr(error, "message", None) or str(error) or type(error).__name__).splitlines()[
        0
    ]
    return re.sub(r"^\{\{[^}]*\}\}\s*|\s*\[Op:\w+\]$", "", message)


def unreadable_reason(error):
    """One line saying why a checkpoint read failed (`error` one of `READ_ERRORS`)."""
    if isinstance(error, IndexError):
        return f"a data file is shorter than its index says (truncated: {error})"
    message = error_line(error).split(": Unsuccessful TensorSliceReader constructor: ", 1)[-1]
    if (
        isinstance(error, tf.errors.NotFoundError)
        and "Failed to find any matching files" in message
    ):
        return "its index file is missing"
    return f"{type(error).__name__}: {message}"


def config_path(model_dir):
    return fs.join(model_dir, CONFIG_FILE)


def starts_path(model_dir):
    return fs.join(model_dir, STARTS_FILE)


def flags_path(model_dir):
    return fs.join(model_dir, FLAGS_FILE)


def lease_path(model_dir):
    return fs.join(model_dir, LEASE_FILE)


def worker_dir(model_dir, task_id):
    """Where non-chief worker `task_id` writes its share of each checkpoint (`"*"`: a glob of them all)."""
    return fs.join(model_dir, WORKER_DIR.format(task_id))


def tokenizer_path(model_dir):
    return fs.join(model_dir, TOKENIZER_FILE)


def has_marian_tokenizer(model_dir):
    """Whether the run tokenizes with a Marian pair (`data.marian`) instead of `spm.model`."""
    return marian.is_marian_directory(model_dir)


def tokenizer_files(model_dir):
    """The paths of the run's tokenizer files: `spm.model`, or the Marian pair's files."""
    if has_marian_tokenizer(model_dir):
        names = [*marian.MARIAN_FILES, marian.TARGET_VOCAB_FILE, marian.TOKENIZER_CONFIG_FILE]
        return [fs.join(model_dir, name) for name in names if fs.exists(fs.join(model_dir, name))]
    return [_existing_tokenizer_path(model_dir)]


def run_tokenizer(model_dir):
    """The tokenizer of a run, the one every script translates, scores, exports and trains with.

    A run holding a Marian tokenizer pair (`source.spm`, ...) gets a `data.marian.MarianTokenizer`
    (source and target text each split by its own model); any other run the `data.Tokenizer`
    of its `spm.model`.

    Raises:
        FileNotFoundError: if the run has neither.
        ValueError: naming a bad tokenizer file (`data.marian.MarianFilesError` for the pair).
    """
    if has_marian_tokenizer(model_dir):
        return marian.MarianTokenizer(model_dir)
    return Tokenizer(_existing_tokenizer_path(model_dir))


def checkpoint_dir(model_dir):
    return fs.join(model_dir, CHECKPOINTS)


def log_dir(model_dir, name=None):
    """`<run>/logs`, or `<run>/logs/<name>` (e.g. "train", "validation", "checkpoints")."""
    return fs.join(model_dir, LOGS, name) if name else fs.join(model_dir, LOGS)


def averaged_dir(model_dir):
    return fs.join(model_dir, AVERAGED)


def best_dir(model_dir):
    return fs.join(model_dir, BEST)


def scores_path(model_dir):
    return fs.join(model_dir, SCORES_FILE)


def read_best(model_dir):
    """The record of a run's best checkpoint (`best/best.json`: `step`, `score`, `metric`,
    `signature`, `checkpoint`, the name of its prefix in `best/`), or None when it has none.

    `best/` is replaced as a whole (`training.checkpoints.save_best`); its `best.json` is
    written last, so a `best/` without it holds no checkpoint yet.
    """
    path = fs.join(best_dir(model_dir), BEST_FILE)
    if not fs.exists(path):
        return None
    return json.loads(fs.read_text(path))


def resolve_checkpoint(model_dir, checkpoint):
    """The checkpoint prefix that `checkpoint` names: `BEST` ("best") is the run's best checkpoint
    (`read_best`); anything else is returned as it is (None: the latest, for the caller).

    Raises:
        ValueError: "best" for a run that kept none (naming the directory and the flag that keeps one).
    """
    if checkpoint != BEST:
        return checkpoint
    record = read_best(model_dir)
    if record is None:
        raise ValueError(
            f"No best checkpoint in {best_dir(model_dir)}: a run keeps one when trained with --score_every"
        )
    return str(fs.join(best_dir(model_dir), record["checkpoint"]))


def read_scores(model_dir):
    """The records of a run's scored evaluations (`scores.jsonl`), oldest first."""
    path = scores_path(model_dir)
    return [json.loads(line) for line in fs.read_text(path).splitlines()] if fs.exists(path) else []


def record_score(model_dir, record):
    """Append `record` (a JSON-able dict with its `step`) to `scores.jsonl`, atomically; records of
    that step or later (written before a resume went back to an earlier checkpoint) are dropped."""
    kept = [line for line in read_scores(model_dir) if line["step"] < record["step"]]
    return fs.write_text(
        scores_path(model_dir),
        "".join(json.dumps(line, sort_keys=True) + "\n" for line in [*kept, record]),
    )


def write_run_config(model_dir, payload):
    """Write `payload` (a JSON-able dict with the model config under "model") as the run's config, atomically."""
    return fs.write_text(config_path(model_dir), json.dumps(payload, indent=2, sort_keys=True))


def record_start(model_dir, payload):
    """Append `payload` (a JSON-able dict: the settings of this start) to the run's `starts.jsonl`, atomically."""
    path = starts_path(model_dir)
    previous = fs.read_text(path) if fs.exists(path) else ""
    return fs.write_text(path, previous + json.dumps(payload, sort_keys=True) + "\n")


def write_flag_file(model_dir, text):
    """Write `text` (an absl flag file) as the run's `flags.txt`, atomically, unless it already
    holds exactly that text (a resume with the same flags leaves the file alone).

    Returns:
        `(written, previous)`: whether the file was written, and the text it held before (None
        when there was no file).
    """
    path = flags_path(model_dir)
    previous = fs.read_text(path) if fs.exists(path) else None
    if previous == text:
        return False, previous
    fs.write_text(path, text)
    return True, previous


def read_starts(model_dir):
    """The payloads `record_start` recorded for a run, oldest first."""
    path = starts_path(model_dir)
    return [json.loads(line) for line in fs.read_text(path).splitlines()] if fs.exists(path) else []


def read_run_config(model_dir):
    """The `(model config, whole config dict)` of a run directory: a `TransformerConfig`, or the
    config of the model its fields describe (`models.config.model_config`: a run written
    with word positions is a `ParsingConfig`).

    Raises:
        FileNotFoundError: naming the directory when it holds no run config.
    """
    path = config_path(model_dir)
    if not fs.exists(path):
        raise FileNotFoundError(
            f"No run config at {path}: is {model_dir} a training run directory?"
        )
    payload = json.loads(fs.read_text(path))
    return model_config(payload["model"]), payload


def load_run_pairs(model_dir, split):
    """The `(source, target)` pairs of `split` ("train", "val", "test") of the data a run
    trained on (its `config.json`'s data section; `data.sources.load_pairs`)."""
    from keras_transformer.data.sources import load_pairs

    data = read_run_config(model_dir)[1]["data"]
    return load_pairs(
        data["dataset"], split, data["src_lang"], data["tgt_lang"], data["data_dir"], data["files"]
    )


def checkpoint_step(path):
    """The step number in a checkpoint prefix such as `.../ckpt-1200`.

    Example:

    >>> checkpoint_step("runs/demo/checkpoints/ckpt-1200")
    1200
    """
    name = str(path).rstrip("/").rsplit("/", 1)[-1]
    try:
        return int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        raise ValueError(
            f"Cannot read a step from the checkpoint name {path!r} (expected '<prefix>-<step>')"
        ) from None


def checkpoint_paths(directory, last=None, until_step=None):
    """Paths of the complete checkpoints in `directory`, oldest first (the last `last`).

    Args:
        directory: a checkpoint directory (`checkpoint_dir(run)`).
        last: keep only the newest this many.
        until_step: only the checkpoints of this step and earlier (the run as it was then).

    Raises:
        ValueError: there is no checkpoint (up to `until_step`), or fewer than `last`
            (naming both numbers).
    """
    state = checkpoint_state(directory)
    paths = (
        list(state.all_model_checkpoint_paths) if state is not None else _found_on_disk(directory)
    )
    if until_step is not None:
        paths = [path for path in paths if checkpoint_step(path) <= until_step]
    upto = "" if until_step is None else f" up to step {until_step}"
    if not paths:
        raise ValueError(f"No checkpoints in {directory}{upto}")
    if last and last > len(paths):
        raise ValueError(
            f"Asked for the last {last} checkpoints, but {directory} holds {len(paths)}{upto}. "
            f"Average fewer, or train with --keep_checkpoints >= {last}."
        )
    return paths[-last:] if last else paths


def checkpoint_times(directory, paths):
    """Save times (seconds since the epoch) of the checkpoints at `paths`, as the manager recorded them."""
    state = checkpoint_state(directory)
    recorded = list(state.all_model_checkpoint_timestamps) if state is not None else []
    if len(recorded) == len(paths):
        return [float(time) for time in recorded]
    return [fs.mtime(f"{path}.index") for path in paths]


def checkpoint_state(directory):
    """The `CheckpointState` of a checkpoint directory (its `checkpoint` file), or None when it has none.

    Paths in it are full paths (the file keeps them relative to `directory`).

    Raises:
        UnreadableCheckpointError: the state file's content does not parse
            (`tf.train.get_checkpoint_state` would log a warning and report no checkpoint).
        OSError: the state file could not be read (the storage failed; it is not damaged).
    """
    from google.protobuf import text_format
    from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState

    path = fs.join(directory, CHECKPOINT_STATE_FILE)
    if not fs.exists(path):
        return None
    state = CheckpointState()
    try:
        text_format.Parse(fs.read_bytes(path).decode("utf-8"), state)
        if not state.model_checkpoint_path:
            raise ValueError("it names no latest checkpoint")
    except (UnicodeDecodeError, text_format.ParseError, ValueError) as error:
        raise UnreadableCheckpointError(
            f"Cannot read the checkpoint state file {path}: {error}"
        ) from None

    def full(prefix):
        return (
            prefix
            if prefix.startswith("/") or fs.is_url(prefix)
            else str(fs.join(directory, prefix))
        )

    state.model_checkpoint_path = full(state.model_checkpoint_path)
    state.all_model_checkpoint_paths[:] = [
        full(prefix) for prefix in state.all_model_checkpoint_paths
    ]
    return state


def latest_checkpoint(model_dir):
    """The newest complete checkpoint of a run, or None (`UnreadableCheckpointError` as `checkpoint_state`).

    The state file's latest; with no state file, the newest checkpoint on disk (`checkpoints_on_disk`):
    the state file is never the only record of a run's checkpoints.
    """
    state = checkpoint_state(checkpoint_dir(model_dir))
    if state is None:
        found = _found_on_disk(checkpoint_dir(model_dir))
        return found[-1] if found else None
    return state.model_checkpoint_path or None


def checkpoints_on_disk(directory):
    """Prefixes of the `ckpt-<step>` checkpoints in `directory` that have an index, oldest first.

    A prefix with data but no index (a save killed before its index was written) is not
    one; neither is `ckpt-<step>_temp/`, the scratch directory of an interrupted save.
    """
    steps = {}
    for path in fs.glob(fs.join(directory, f"{CHECKPOINT_PREFIX}-*.index")):
        prefix = str(path)[: -len(".index")]
        try:
            steps[checkpoint_step(prefix)] = prefix
        except ValueError:
            continue
    return [steps[step] for step in sorted(steps)]


def _found_on_disk(directory):
    """`checkpoints_on_disk(directory)`, with a warning when there are any (the state file is missing)."""
    found = checkpoints_on_disk(directory)
    if found:
        logging.warning(
            "No checkpoint state file in %s; reading the %d checkpoints found there",
            directory,
            len(found),
        )
    return found


def read_model_weights(model, path):
    """Load the model weights of a trainer checkpoint (`tf.train.Checkpoint(model=...)`) into `model`.

    Each of the model's variables is read by its path (`decoder_layer_2/feed_forward/...`),
    the name the checkpoint records for it, when the checkpoint names every one of them once
    with its shape: a checkpoint written before the model's layers were created in another
    order still loads, where matching the object graph would miss, or swap, same-shaped
    weights. Otherwise (a layer renamed since) the object graph is matched, as TensorFlow
    restores. Optimizer state in the checkpoint is ignored; every model variable must be found.

    Raises:
        UnreadableCheckpointError: naming the checkpoint and why its files cannot be read.
        CheckpointReadError: the checkpoint does not hold this model's weights (one line
            naming a missing one).
    """
    try:
        unmatched = _read_weights_by_path(model, path)
        if not unmatched:
            return model
        tf.train.Checkpoint(model=model).read(
            str(path)
        ).expect_partial().assert_existing_objects_matched()
    except READ_ERRORS as error:
        raise UnreadableCheckpointError(
            f"Cannot read checkpoint {path}: {unreadable_reason(error)}"
        ) from None
    except AssertionError:
        raise CheckpointReadError(
            f"Checkpoint {path} does not hold this model's weights: {len(unmatched)} of "
            f"{len(model.weights)} not found by name and shape (the first: {unmatched[0]}); was "
            "it written by a run of another model or config?"
        ) from None
    return model


def _checkpoint_keys(path):
    """A checkpoint's reader and `{variable name: [its keys]}` from the object graph it records."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.compat.v1.train.NewCheckpointReader(
        str(path)
    )  # load_checkpoint misreads ram:// prefixes as directories
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    keys = {}
    for node in graph.nodes:
        for attribute in node.attributes:
            if attribute.name == "VARIABLE_VALUE":
                keys.setdefault(attribute.full_name, []).append(attribute.checkpoint_key)
    return reader, keys


def _read_weights_by_path(model, path):
    """Assign every model variable the checkpoint value recorded under its path, and return [];
    unless the checkpoint names each once with the variable's shape: then assign nothing and
    return the paths of those it does not."""
    reader, keys = _checkpoint_keys(path)
    shapes = reader.get_variable_to_shape_map()
    found, unmatched = [], []
    for variable in model.weights:
        variable_keys = keys.get(variable.path, ())
        if len(variable_keys) == 1 and shapes[variable_keys[0]] == list(variable.shape):
            found.append((variable, variable_keys[0]))
        else:
            unmatched.append(variable.path)
    if not unmatched:
        for variable, key in found:
            variable.assign(tf.cast(reader.get_tensor(key), variable.dtype))
    return unmatched


def average_checkpoints(model, paths):
    """Set `model`'s variables to the element-wise mean over the checkpoints at `paths`.

    The checkpoints must have been written by the toolkit's trainer (a
    `tf.train.Checkpoint` holding `model=`). Floating-point weights are averaged.
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


def load_run(model_dir, checkpoint=None, average_last=None, dtype=None, quantization=None):
    """The trained model and tokenizer of a run directory.

    Args:
        model_dir: a directory written by `train_translation` / `experiments/train.py`.
        checkpoint: a checkpoint prefix to load (default: the latest in `checkpoints/`), or
            "best": the run's best-scoring checkpoint (`resolve_checkpoint`).
        average_last: instead, average the last this many checkpoints (not with `checkpoint`).
        dtype: dtype policy of the rebuilt model (default float32).
        quantization: None, or "int8": the weights, once read, quantized with
            `model.quantize("int8")` (`Transformer.quantize`).

    Returns:
        `(model, tokenizer, config)`.

    Raises:
        FileNotFoundError / ValueError naming the directory when it is not a run or has no
        checkpoint.
    """
    if checkpoint and average_last:
        raise ValueError(
            f"Pass a checkpoint ({checkpoint}) or average_last ({average_last}), not both"
        )
    config, _ = read_run_config(model_dir)
    tokenizer = run_tokenizer(model_dir)
    model = build_model(config, dtype=dtype)
    if average_last:
        average_checkpoints(model, checkpoint_paths(checkpoint_dir(model_dir), average_last))
    else:
        checkpoint = resolve_checkpoint(model_dir, checkpoint) or latest_checkpoint(model_dir)
        if not checkpoint:
            raise ValueError(f"No checkpoint in {checkpoint_dir(model_dir)}")
        read_model_weights(model, checkpoint)
    if quantization is not None:
        model.quantize(quantization)
    return model, tokenizer, config


def _existing_tokenizer_path(model_dir):
    path = tokenizer_path(model_dir)
    if not fs.exists(path):
        raise FileNotFoundError(f"No tokenizer at {path}")
    return path


def load_ensemble(model_dirs, checkpoint=None, average_last=None, dtype=None, quantization=None):
    """The models of several runs, searching as one (`decoding.Ensemble`), and their tokenizer.

    Args:
        model_dirs: run directories trained with one tokenizer (the same `spm.model`: copy
            the first run's into each new `--model_dir` before training it).
        checkpoint: a checkpoint prefix of the first run (default: its latest); the other
            runs load their latest.
        average_last, dtype, quantization: as `load_run`, for every run.

    Returns:
        `(ensemble, tokenizer, config)`: the first run's tokenizer and config. With one
        directory, `load_run`'s model itself.

    Raises:
        ValueError naming the run whose tokenizer differs from the first run's, before any
        model is loaded.
    """
    from keras_transformer.decoding.ensemble import Ensemble

    model_dirs = list(model_dirs)
    if not model_dirs:
        raise ValueError("load_ensemble needs at least one run directory")
    if len(model_dirs) == 1:
        return load_run(model_dirs[0], checkpoint, average_last, dtype, quantization)
    first = {fs.name(path): fs.read_bytes(path) for path in tokenizer_files(model_dirs[0])}
    for model_dir in model_dirs[1:]:
        files = {fs.name(path): fs.read_bytes(path) for path in tokenizer_files(model_dir)}
        if files != first:
            path = tokenizer_files(model_dir)[0]
            raise ValueError(
                f"{path} is not the tokenizer of {model_dirs[0]}: the runs of an ensemble share one (copy it into "
                "a run's directory before training it)"
            )
    model, tokenizer, config = load_run(
        model_dirs[0], checkpoint, average_last, dtype, quantization
    )
    others = [
        load_run(model_dir, None, average_last, dtype, quantization)[0]
        for model_dir in model_dirs[1:]
    ]
    return Ensemble([model, *others]), tokenizer, config
