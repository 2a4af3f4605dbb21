"""Checkpoints that never strand a run, and checkpoint averaging (paper section 6.1).

`restore_newest_readable` resumes from the newest checkpoint that can be read. Only damage
(`runs.damage_reason`: truncated data, a missing index or data file, corrupt bytes) makes it
skip a checkpoint: it is reported in one warning line and, by the training run's chief,
moved aside into `<checkpoints>/unreadable/<time>/` (never deleted), and the next older one
is tried. Any other failure (the storage unavailable, a permission, a deadline, a checkpoint
that does not match the model) stops with one line naming the checkpoint and the error,
and nothing is moved. The state file is never the only record: without one (or with one
that does not parse) the `ckpt-<step>` files on disk are used, and the replacement state
file is written before anything is moved. `check_workers_restored_alike` then compares what every
worker restored. `save_checkpoint` turns a failed save (a full disk, a quota) into one
error naming the path and the checkpoints kept, never removing the one the state file
lists. Averaging: the last 5 checkpoints for base, 20 for big.
"""

import collections
import json
import time

import numpy as np
import tensorflow as tf
from absl import logging

from keras_transformer import fs, runs
from keras_transformer.models.transformer import build_model
from keras_transformer.runs import (
    CheckpointReadError,
    UnreadableCheckpointError,
    average_checkpoints,
    checkpoint_paths,
    checkpoints_on_disk,
)

UNREADABLE_DIR = "unreadable"  # under the checkpoint directory: damaged checkpoints, set aside

# What restoring a checkpoint can raise: read errors, and a checkpoint that does not match
# the objects restored into (ValueError: a shape; AssertionError: objects not found).
RESTORE_ERRORS = (*runs.READ_ERRORS, ValueError, AssertionError)


class CheckpointSaveError(OSError):
    """A checkpoint could not be written; the message names the checkpoints kept."""


class WorkersDisagreeError(RuntimeError):
    """The workers of a run restored different steps or weights."""


def restore_newest_readable(checkpoint, directory, manager=None, restore=None):
    """Restore `checkpoint` from the newest readable checkpoint in `directory`.

    Tries the checkpoints the state file lists (or, when there is no state file or it
    does not parse, the `ckpt-<step>` prefixes on disk that have an index), newest first.
    One whose files are damaged (`runs.damage_reason`) is skipped with a one-line warning
    naming it and the reason. Any other error stops at once (`CheckpointReadError`): a
    transient storage error never makes an older checkpoint the one training continues
    from.

    With `manager` (the `tf.train.CheckpointManager` over `directory`, given only by the
    training run's chief), the state file and `manager` are then rewritten to list the
    remaining checkpoints, and only after that are the skipped checkpoints moved into
    `<directory>/unreadable/<time>/` (an unreadable state file is copied there before it
    is replaced). Nothing is moved when no checkpoint can be read, or without `manager`.

    Args:
        checkpoint: the `tf.train.Checkpoint` to restore (all its objects must match).
        directory: the checkpoint directory (`runs.checkpoint_dir(run)`), any `fs` path.
        manager: see above; None to only read.
        restore: `(checkpoint, path) -> None` reading one checkpoint (default: all of
            `checkpoint`'s objects must be in it).

    Returns:
        the restored checkpoint prefix, or None when `directory` holds no checkpoint.

    Raises:
        UnreadableCheckpointError: there are checkpoints, but every one is damaged (one
            line naming the directory and each checkpoint's reason).
        CheckpointReadError: a checkpoint or the state file could not be read for a
            reason other than damage (one line naming it and the error).
    """
    state_error = None
    try:
        state = runs.checkpoint_state(directory)
    except UnreadableCheckpointError as error:
        state, state_error = None, error
    except OSError as error:
        raise CheckpointReadError(
            f"Cannot read the checkpoint state file in {directory}: {error}. " + _NOTHING_MOVED
        ) from None
    if state is not None:
        candidates = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    else:
        candidates = checkpoints_on_disk(directory)
        if state_error:
            logging.warning(
                "%s; trying the %d checkpoints found beside it", state_error, len(candidates)
            )
        elif candidates:
            logging.warning(
                "No checkpoint state file in %s; trying the %d checkpoints found there, newest first",
                directory,
                len(candidates),
            )
    skipped = []
    for path in reversed(candidates):
        try:
            (restore or _restore_all)(checkpoint, str(path))
        except RESTORE_ERRORS as error:
            try:
                reason = runs.damage_reason(path, error)
            except OSError as listing:
                raise CheckpointReadError(
                    f"Cannot restore checkpoint {path}: {_reason(error)} (and listing its "
                    f"files failed: {listing}). {_NOTHING_MOVED}"
                ) from None
            if reason is None:
                raise CheckpointReadError(
                    f"Cannot restore checkpoint {path}: {type(error).__name__}: "
                    f"{_reason(error)}. It is not damaged: {_NOTHING_MOVED}"
                ) from None
            skipped.append((path, reason))
            continue
        aside = None
        if manager is not None and (
            skipped or state is None or list(manager.checkpoints) != candidates
        ):
            aside = _repair(
                directory, manager, candidates, [prefix for prefix, _ in skipped], state_error
            )
        for skipped_path, reason in skipped:
            where = f"; moved it to {aside}" if aside else ""
            logging.warning(
                "Skipped unreadable checkpoint %s (%s)%s; trying the next older one",
                skipped_path,
                reason,
                where,
            )
        return str(path)
    if skipped:
        reasons = "; ".join(f"{path}: {reason}" for path, reason in skipped)
        raise UnreadableCheckpointError(f"No readable checkpoint in {directory} ({reasons})")
    if state_error:
        raise state_error
    return None


_NOTHING_MOVED = "nothing was moved; run the same command again once the cause is fixed."


def checkpoint_manager(checkpoint, directory, **kwargs):
    """`tf.train.CheckpointManager(checkpoint, directory, **kwargs)`, also over a state file that is not text.

    TensorFlow's constructor fails on such a file (it treats any other unreadable state file
    as none); the manager then starts with no checkpoint listed, as it does for those, and
    `restore_newest_readable` rebuilds its list from the checkpoints on disk.
    """
    from tensorflow.python.checkpoint import checkpoint_management

    try:
        return tf.train.CheckpointManager(checkpoint, str(directory), **kwargs)
    except UnicodeDecodeError:
        read_state = checkpoint_management.get_checkpoint_state
        checkpoint_management.get_checkpoint_state = lambda *args, **kwargs: None
        try:
            return tf.train.CheckpointManager(checkpoint, str(directory), **kwargs)
        finally:
            checkpoint_management.get_checkpoint_state = read_state


def _restore_all(checkpoint, path):
    checkpoint.restore(path).assert_existing_objects_matched()


def _repair(directory, manager, candidates, skipped, state_error):
    """Rewrite the state file to list the readable checkpoints, then move the `skipped` ones (and a copy of
    an unreadable state file) aside; returns the directory they went to, or None when nothing was moved."""
    aside = None
    if skipped or state_error:
        aside = fs.join(directory, UNREADABLE_DIR, time.strftime("%Y%m%d-%H%M%S"))
        while fs.exists(aside):
            aside = fs.join(directory, UNREADABLE_DIR, f"{fs.name(aside)}-1")
        fs.makedirs(aside)
    if state_error:  # kept as it was; the replacement below takes its place in one rename
        state_file = fs.join(directory, runs.CHECKPOINT_STATE_FILE)
        fs.write_bytes(fs.join(aside, runs.CHECKPOINT_STATE_FILE), fs.read_bytes(state_file))
    remaining = [
        prefix for prefix in candidates if prefix not in skipped and fs.exists(f"{prefix}.index")
    ]
    _record_remaining(manager, remaining)
    for path in [path for prefix in skipped for path in fs.glob(f"{prefix}.*")]:
        fs.rename(path, fs.join(aside, str(path).rsplit("/", 1)[-1]))
    return aside


def _record_remaining(manager, prefixes):
    """Make `manager` (and its state file) list exactly `prefixes`, oldest first, the last the latest."""
    times = {}
    try:
        state = runs.checkpoint_state(manager.directory)
        if state and len(state.all_model_checkpoint_timestamps) == len(
            state.all_model_checkpoint_paths
        ):
            times = dict(
                zip(state.all_model_checkpoint_paths, state.all_model_checkpoint_timestamps)
            )
    except UnreadableCheckpointError:
        pass
    # CheckpointManager reads its state file only when built; these are the two fields it keeps of it.
    manager._maybe_delete = collections.OrderedDict(
        (str(prefix), times.get(prefix) or fs.mtime(f"{prefix}.index")) for prefix in prefixes
    )
    manager._latest_checkpoint = str(prefixes[-1])
    manager._record_state()


def check_workers_restored_alike(strategy, restored, step, variables):
    """Stop unless every replica of `strategy` restored the same checkpoint, step and variable values.

    Each replica's `(restored step, step, checksum of variables)` is all-gathered (a
    collective: every worker calls this at the same point). The checksum hashes the bits of
    every value with its position, so it is exact and independent of the order of the sum
    (`_checksum`). Nothing is checked
    under a single replica.

    Args:
        strategy: the run's `tf.distribute.Strategy`.
        restored: the restored checkpoint prefix, or None.
        step: the step variable (`optimizer.iterations`).
        variables: the variables to compare (weights, optimizer state, input position).

    Raises:
        WorkersDisagreeError: one line naming what each worker restored.
    """
    if strategy.num_replicas_in_sync == 1:
        return
    restored_step = runs.checkpoint_step(restored) if restored else -1

    @tf.function
    def gather():
        def replica_fn():
            local = tf.stack(
                [
                    tf.constant(restored_step, tf.int64),
                    tf.cast(step, tf.int64),
                    _checksum(variables),
                ]
            )
            return tf.distribute.get_replica_context().all_gather(local[tf.newaxis], axis=0)

        return strategy.run(replica_fn)

    rows = np.asarray(strategy.experimental_local_results(gather())[0])
    if (rows == rows[0]).all():
        return
    found = "; ".join(
        f"replica {replica}: {'checkpoint ' + str(row[0]) if row[0] >= 0 else 'no checkpoint'}, step {row[1]}, "
        f"checksum {row[2]}"
        for replica, row in enumerate(rows)
    )
    raise WorkersDisagreeError(
        f"The workers restored different states ({found}): every worker must read the same checkpoint directory. "
        "Stopped before training; nothing was moved."
    )


def _checksum(variables):
    """An int64 hash of the bits of every value of `variables`: each value's bits, mixed with its position
    by SplitMix64's finalizer (on int64, so its shifts are arithmetic), summed (so the order of the
    sum does not matter, and no two changes cancel by symmetry).

    The values are mixed in chunks of up to `_CHECKSUM_CHUNK` values (variables concatenated in
    order; a larger one alone): a few mixing ops for the whole model instead of a dozen per
    variable, which made tracing this function take seconds, and a bounded temporary.
    """
    chunks, size = [[]], 0
    for variable in variables:
        value = tf.reshape(tf.convert_to_tensor(variable), [-1])
        if value.dtype.is_floating:
            value = tf.bitcast(value, {2: tf.int16, 4: tf.int32, 8: tf.int64}[value.dtype.size])
        elif not (value.dtype.is_integer or value.dtype.is_bool):
            continue
        if chunks[-1] and size + int(value.shape[0]) > _CHECKSUM_CHUNK:
            chunks.append([])
            size = 0
        chunks[-1].append(tf.cast(value, tf.int64))
        size += int(value.shape[0])
    total, offset = tf.constant(0, tf.int64), 0
    for chunk in filter(None, chunks):
        bits = tf.concat(chunk, axis=0)
        positions = tf.range(offset, offset + int(bits.shape[0]), dtype=tf.int64)
        offset += int(bits.shape[0])
        z = bits + positions * tf.constant(_GOLDEN, tf.int64)
        z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 30)) * tf.constant(_MIX1, tf.int64)
        z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 27)) * tf.constant(_MIX2, tf.int64)
        total += tf.reduce_sum(tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 31)))
    return total


_CHECKSUM_CHUNK = 1 << 22  # values: a 32 MiB int64 temporary


# SplitMix64's constants as signed int64 (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB); plain
# numbers: a tensor made at import would start TensorFlow before a multi-worker strategy can configure it.
_GOLDEN, _MIX1, _MIX2 = (
    value - (1 << 64) for value in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
)


def save_checkpoint(manager, step):
    """`manager.save(checkpoint_number=step)`; a failed save raises one line naming the path and what was kept.

    The files a failed save left are removed, unless the state file lists that
    checkpoint (TensorFlow records it before sweeping older ones, so a save can fail
    after that); when the state file cannot be read nothing is removed.

    Returns:
        the saved checkpoint prefix.

    Raises:
        CheckpointSaveError: naming the checkpoint, the reason, the checkpoints kept and
            the one the state file lists as the latest.
    """
    prefix = str(fs.join(manager.directory, f"{runs.CHECKPOINT_PREFIX}-{step}"))
    try:
        return manager.save(checkpoint_number=step)
    except (tf.errors.OpError, OSError) as error:
        reason = _reason(error)
    try:
        state = runs.checkpoint_state(manager.directory)
    except (UnreadableCheckpointError, OSError):
        state = False  # unknown: remove nothing
    if state is not False and (state is None or prefix not in state.all_model_checkpoint_paths):
        _remove_partial(prefix)
    try:
        kept = checkpoints_on_disk(manager.directory)
    except OSError:
        kept = []
    names = f"Checkpoints kept: {', '.join(str(path) for path in kept)}. " if kept else ""
    if state is False:
        after = "The state file could not be read, so nothing was removed: run the same command once the cause is fixed."
    elif state:
        latest = state.model_checkpoint_path
        if latest == prefix:
            after = f"The state file lists {latest}, complete, as the latest"
        else:
            after = f"The last checkpoint, {latest}, and the state file are intact"
        after += ": run the same command to resume from it once the cause is fixed."
    elif kept:
        after = (
            "The state file lists none of them: the same command resumes from the newest readable one once the "
            "cause is fixed."
        )
    else:
        after = (
            "No checkpoint was kept: the same command starts from step 0 once the cause is fixed."
        )
    raise CheckpointSaveError(f"Could not save checkpoint {prefix}: {reason}. {names}{after}")


def write_checkpoint(checkpoint, prefix):
    """`checkpoint.write(prefix)`; a failed write raises one line naming the path and removes its files."""
    try:
        return checkpoint.write(str(prefix))
    except (tf.errors.OpError, OSError) as error:
        _remove_partial(prefix)
        raise CheckpointSaveError(
            f"Could not write checkpoint {prefix}: {_reason(error)}"
        ) from None


_reason = runs.error_line


def _remove_partial(prefix):
    for path in fs.glob(f"{prefix}.*") + fs.glob(f"{prefix}_temp*"):
        try:
            fs.rmtree(path) if fs.isdir(path) else fs.remove(path)
        except OSError as error:
            logging.warning("Could not remove %s, left by the failed save: %s", path, error)


def save_best(checkpoint, directory, step, record):
    """Replace the best checkpoint `directory` (`runs.best_dir`) by `checkpoint` at `step`.

    A new directory holding `ckpt-<step>` and `best.json` (`record`, with the name of the
    checkpoint added) is written beside `directory` under a claim (`fs.staging`), then
    published in its place (`fs.publish`): on a local disk one rename swaps the old for
    the new, never a mix; elsewhere `best.json` moves last, so a reader that finds it finds
    the checkpoint it names (`runs.read_best`). A failed write leaves the previous best.

    Returns:
        the checkpoint prefix in `directory`.

    Raises:
        CheckpointSaveError: naming the checkpoint when it cannot be written.
    """
    name = f"{runs.CHECKPOINT_PREFIX}-{step}"
    with fs.staging(directory, exist_ok=True) as staged:
        write_checkpoint(checkpoint, fs.join(staged, name))
        fs.write_text(
            fs.join(staged, runs.BEST_FILE),
            json.dumps({**record, "checkpoint": name}, indent=2, sort_keys=True),
        )
        try:
            fs.publish(staged, directory, last=(runs.BEST_FILE,), replace=True)
        except OSError as error:
            raise CheckpointSaveError(
                f"Could not publish the best checkpoint {fs.join(directory, name)}: {_reason(error)}"
            ) from None
    return str(fs.join(directory, name))


def write_averaged_checkpoint(model_dir, last=None, output_dir=None):
    """Average the last `last` checkpoints of a training run and save the result.

    Args:
        model_dir: run directory (with `config.json` and `checkpoints/`).
        last: how many checkpoints; defaults to the run config's `average_checkpoints`.
        output_dir: defaults to `<model_dir>/averaged`. The checkpoint is written beside it
            under a claim (`fs.staging`; a second averaging into the same prefix at once is
            refused) and published with `fs.publish_prefix`: data files first, `.index` last
            (an existing `.index` of that prefix is removed first), so a reader that finds the
            `.index` finds the data it lists. A failed write leaves the previous files; a
            failure while publishing can leave the prefix without its `.index` (no checkpoint).

    Returns:
        `(path of the new checkpoint, list of the averaged checkpoint paths)`.

    Raises:
        runs.UnreadableCheckpointError: naming a checkpoint that cannot be read.
        CheckpointSaveError: naming the averaged checkpoint when it cannot be written.
    """
    config, _ = runs.read_run_config(model_dir)
    paths = checkpoint_paths(runs.checkpoint_dir(model_dir), last or config.average_checkpoints)
    model = average_checkpoints(build_model(config), paths)
    step = runs.checkpoint_step(paths[-1])
    output_dir = output_dir or runs.averaged_dir(model_dir)
    prefix = fs.join(output_dir, f"{runs.CHECKPOINT_PREFIX}-{step}")
    with fs.staging(
        prefix, exist_ok=True
    ) as staged:  # written aside, then published with its .index last
        write_checkpoint(tf.train.Checkpoint(model=model), fs.join(staged, fs.name(prefix)))
        fs.publish_prefix(fs.join(staged, fs.name(prefix)), prefix)
    return str(prefix), paths
