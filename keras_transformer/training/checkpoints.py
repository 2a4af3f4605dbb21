"""Checkpoints that never strand a run, and checkpoint averaging (paper section 6.1).

`restore_newest_readable` resumes from the newest checkpoint that can be read: a damaged
one (truncated data, a missing index, an unreadable `checkpoint` state file) is reported
in one warning line, moved aside into `<checkpoints>/unreadable/<time>/` (never deleted),
and the next older one is tried. `save_checkpoint` turns a failed save (a full disk, a
quota) into one error naming the path, with the previous checkpoint and the state file
untouched, so the same command resumes from them. Averaging: the last 5 checkpoints for
base, 20 for big.
"""

import collections
import re
import time

import tensorflow as tf
from absl import logging

from keras_transformer import fs, runs
from keras_transformer.models.transformer import Transformer
from keras_transformer.runs import UnreadableCheckpointError, average_checkpoints, checkpoint_paths

UNREADABLE_DIR = "unreadable"  # under the checkpoint directory: damaged checkpoints, set aside


class CheckpointSaveError(OSError):
    """A checkpoint could not be written; the previous checkpoints and the state file are intact."""


def restore_newest_readable(checkpoint, directory, manager=None, restore=None):
    """Restore `checkpoint` from the newest readable checkpoint in `directory`.

    Tries the checkpoints of the state file (or, when the state file cannot be read, the
    `ckpt-<step>` files found in `directory`), newest first. One that cannot be read
    (`runs.READ_ERRORS`) is skipped with a one-line warning naming it and the reason. A
    checkpoint that reads but does not match `checkpoint` (another architecture) is an
    error, not damage.

    With `manager` (the `tf.train.CheckpointManager` over `directory`, given by the one
    process that writes it — the chief), the skipped checkpoints and an unreadable state
    file are moved into `<directory>/unreadable/<time>/`, and the state file and
    `manager` are rewritten to list the remaining checkpoints. Nothing is moved when no
    checkpoint can be read.

    Args:
        checkpoint: the `tf.train.Checkpoint` to restore (all its objects must match).
        directory: the checkpoint directory (`runs.checkpoint_dir(run)`), any `fs` path.
        manager: see above; None to only read.
        restore: `(checkpoint, path) -> None` reading one checkpoint (default: all of
            `checkpoint`'s objects must be in it).

    Returns:
        the restored checkpoint prefix, or None when `directory` holds no checkpoint.

    Raises:
        UnreadableCheckpointError: there are checkpoints, but none can be read (one line
            naming the directory and each checkpoint's reason).
    """
    state_error = None
    try:
        state = runs.checkpoint_state(directory)
        candidates = list(state.all_model_checkpoint_paths) if state else []
    except UnreadableCheckpointError as error:
        state_error = error
        candidates = checkpoints_on_disk(directory)
        logging.warning("%s; trying the %d checkpoints found beside it", error, len(candidates))
    skipped = []
    for path in reversed(candidates):
        try:
            (restore or _restore_all)(checkpoint, str(path))
        except runs.READ_ERRORS as error:
            skipped.append((path, runs.unreadable_reason(error)))
            continue
        aside = None
        if manager is not None and (skipped or state_error):
            aside = _set_aside(directory, [skipped_path for skipped_path, _ in skipped], state_error is not None)
            _record_remaining(manager, [p for p in candidates if p not in dict(skipped)])
        for skipped_path, reason in skipped:
            where = f"; moved it to {aside}" if aside else ""
            logging.warning("Skipped unreadable checkpoint %s (%s)%s; trying the next older one", skipped_path, reason,
                            where)
        return str(path)
    if skipped:
        reasons = "; ".join(f"{path}: {reason}" for path, reason in skipped)
        raise UnreadableCheckpointError(f"No readable checkpoint in {directory} ({reasons})")
    if state_error:
        raise state_error
    return None


def _restore_all(checkpoint, path):
    checkpoint.restore(path).assert_existing_objects_matched()


def checkpoints_on_disk(directory):
    """Prefixes of the `ckpt-<step>` checkpoints whose files are in `directory`, oldest first."""
    steps = {}
    for path in fs.glob(fs.join(directory, f"{runs.CHECKPOINT_PREFIX}-*")):
        prefix = str(path).split(".index", 1)[0].split(".data-", 1)[0]
        try:
            steps[runs.checkpoint_step(prefix)] = prefix
        except ValueError:
            continue  # e.g. ckpt-7_temp, the scratch directory of an interrupted save
    return [steps[step] for step in sorted(steps)]


def _set_aside(directory, prefixes, state_file):
    """Move the files of `prefixes` (and the state file) into a fresh `<directory>/unreadable/<time>/`."""
    aside = fs.join(directory, UNREADABLE_DIR, time.strftime("%Y%m%d-%H%M%S"))
    while fs.exists(aside):
        aside = fs.join(directory, UNREADABLE_DIR, f"{fs.name(aside)}-1")
    fs.makedirs(aside)
    files = [path for prefix in prefixes for path in fs.glob(f"{prefix}.*")]
    if state_file:
        files.append(fs.join(directory, runs.CHECKPOINT_STATE_FILE))
    for path in files:
        fs.rename(path, fs.join(aside, str(path).rsplit("/", 1)[-1]))
    return aside


def _record_remaining(manager, prefixes):
    """Make `manager` (and its state file) list exactly `prefixes`, oldest first, the last the latest."""
    times = {}
    try:
        state = runs.checkpoint_state(manager.directory)
        if state and len(state.all_model_checkpoint_timestamps) == len(state.all_model_checkpoint_paths):
            times = dict(zip(state.all_model_checkpoint_paths, state.all_model_checkpoint_timestamps))
    except UnreadableCheckpointError:
        pass
    # CheckpointManager reads its state file only when built; these are the two fields it keeps of it.
    manager._maybe_delete = collections.OrderedDict(
        (str(prefix), times.get(prefix) or fs.mtime(f"{prefix}.index")) for prefix in prefixes
    )
    manager._latest_checkpoint = str(prefixes[-1])
    manager._record_state()


def save_checkpoint(manager, step):
    """`manager.save(checkpoint_number=step)`; a failed save raises one line naming the path.

    The files a failed save left (never those of a checkpoint the state file lists) are
    removed; the previous checkpoints and the state file are untouched, so the same
    command resumes from them.

    Returns:
        the saved checkpoint prefix.

    Raises:
        CheckpointSaveError: naming the checkpoint, the reason and the checkpoint kept.
    """
    prefix = fs.join(manager.directory, f"{runs.CHECKPOINT_PREFIX}-{step}")
    listed = set(manager.checkpoints)
    try:
        return manager.save(checkpoint_number=step)
    except (tf.errors.OpError, OSError) as error:
        if str(prefix) not in listed:
            _remove_partial(prefix)
        kept = manager.latest_checkpoint if manager.latest_checkpoint in listed else None
        raise CheckpointSaveError(
            f"Could not save checkpoint {prefix}: {_reason(error)}. "
            + (f"The last checkpoint, {kept}, and the state file are intact: run the same command to resume "
               "from it once the cause is fixed." if kept else "No earlier checkpoint was written.")
        ) from None


def write_checkpoint(checkpoint, prefix):
    """`checkpoint.write(prefix)`; a failed write raises one line naming the path and removes its files."""
    try:
        return checkpoint.write(str(prefix))
    except (tf.errors.OpError, OSError) as error:
        _remove_partial(prefix)
        raise CheckpointSaveError(f"Could not write checkpoint {prefix}: {_reason(error)}") from None


def _reason(error):
    """The first line of `error`'s message without TensorFlow's `{{function_node ...}}` and `[Op:...]` wrapping."""
    message = (getattr(error, "message", None) or str(error) or type(error).__name__).splitlines()[0]
    return re.sub(r"^\{\{[^}]*\}\}\s*|\s*\[Op:\w+\]$", "", message)


def _remove_partial(prefix):
    for path in fs.glob(f"{prefix}.*") + fs.glob(f"{prefix}_temp*"):
        try:
            fs.rmtree(path) if fs.isdir(path) else fs.remove(path)
        except OSError as error:
            logging.warning("Could not remove %s, left by the failed save: %s", path, error)


def write_averaged_checkpoint(model_dir, last=None, output_dir=None):
    """Average the last `last` checkpoints of a training run and save the result.

    Args:
        model_dir: run directory (with `config.json` and `checkpoints/`).
        last: how many checkpoints; defaults to the run config's `average_checkpoints`.
        output_dir: defaults to `<model_dir>/averaged`. The checkpoint is written beside it
            under a claim (`fs.staging`; a second averaging into the same prefix at once is
            refused) and published with `fs.publish_prefix`: data files first, `.index` last
            (an existing `.index` of that prefix is removed first), so a reader that finds the
            `.index` finds the data it lists. A failed write leaves the previous files.

    Returns:
        `(path of the new checkpoint, list of the averaged checkpoint paths)`.

    Raises:
        runs.UnreadableCheckpointError: naming a checkpoint that cannot be read.
        CheckpointSaveError: naming the averaged checkpoint when it cannot be written.
    """
    config, _ = runs.read_run_config(model_dir)
    paths = checkpoint_paths(runs.checkpoint_dir(model_dir), last or config.average_checkpoints)
    model = average_checkpoints(Transformer(config), paths)
    step = runs.checkpoint_step(paths[-1])
    output_dir = output_dir or runs.averaged_dir(model_dir)
    prefix = fs.join(output_dir, f"{runs.CHECKPOINT_PREFIX}-{step}")
    with fs.staging(prefix, exist_ok=True) as staged:  # written aside, then published with its .index last
        write_checkpoint(tf.train.Checkpoint(model=model), fs.join(staged, fs.name(prefix)))
        fs.publish_prefix(fs.join(staged, fs.name(prefix)), prefix)
    return str(prefix), paths
