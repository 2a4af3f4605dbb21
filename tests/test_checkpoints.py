"""Checkpoints that never strand a run: damaged ones are skipped and set aside by the training run's chief only;
any other error moves nothing; the state file is never the only record (a full disk: tests/test_fs.py; kills and
workers: tests/test_faults.py)."""

import logging
import shutil

import pytest
import tensorflow as tf

from keras_transformer import cli, runs
from keras_transformer.models.config import get_preset
from keras_transformer.training import (
    DataOptions,
    Trainer,
    TrainOptions,
    train_translation,
    write_averaged_checkpoint,
)
from keras_transformer.training.checkpoints import (
    UNREADABLE_DIR,
    CheckpointSaveError,
    checkpoints_on_disk,
    restore_newest_readable,
)
from tests.conftest import TRAINED_RUN_CONFIG, TRAINED_RUN_STEPS
from tests.faulty_fs import Fault, FaultyFilesystem

FIRST = TRAINED_RUN_STEPS // 2  # trained_run holds ckpt-60 and ckpt-120


def copy_run(trained_run, tmp_path, name="run"):
    return shutil.copytree(trained_run, tmp_path / name)


def truncate_data(run, step):
    (path,) = (run / "checkpoints").glob(f"ckpt-{step}.data-*")
    path.write_bytes(path.read_bytes()[:1000])


def state_text(run):
    return (run / "checkpoints" / "checkpoint").read_text()


def listing(run):
    return sorted(str(path.relative_to(run)) for path in run.rglob("*"))


# trained_run's own options (tests/conftest.py): train_translation over a copy resumes it.
TRAINED_RUN_OPTIONS = dict(
    batch_tokens=1024, checkpoint_every=60, eval_every=0, log_every=60, progress=False
)


@pytest.fixture(scope="module")
def trainer_on(trained_run):
    """A function making a Trainer of trained_run's config over a run directory (without restoring)."""
    config = get_preset("tiny", **TRAINED_RUN_CONFIG, train_steps=TRAINED_RUN_STEPS)
    return lambda run, **options: Trainer(
        config, run, TrainOptions(**{"batch_tokens": 1024, "progress": False, **options})
    )


def resume(run, train_steps=TRAINED_RUN_STEPS, **options):
    """train_translation over `run` as trained_run was trained, to `train_steps` (with nothing left to train, it
    restores and returns)."""
    config = get_preset("tiny", **TRAINED_RUN_CONFIG, train_steps=train_steps)
    return train_translation(
        config, run, TrainOptions(**{**TRAINED_RUN_OPTIONS, **options}), DataOptions("builtin")
    )


def test_resume_skips_a_truncated_checkpoint_sets_it_aside_and_continues(
    trained_run, tmp_path, trainer_on, caplog
):
    run = copy_run(trained_run, tmp_path)
    truncate_data(run, TRAINED_RUN_STEPS)
    damaged = sorted(
        path.name for path in (run / "checkpoints").glob(f"ckpt-{TRAINED_RUN_STEPS}.*")
    )
    trainer = trainer_on(run)
    before = listing(run)
    assert trainer.restore() == str(
        run / "checkpoints" / f"ckpt-{FIRST}"
    )  # a reader (an evaluation) only reads:
    assert listing(run) == before  # nothing moved
    with caplog.at_level(logging.WARNING, logger="absl"):
        path = trainer.restore(repair=True)  # what train() does
    assert path == str(run / "checkpoints" / f"ckpt-{FIRST}") and trainer.step == FIRST
    warning = [
        record.getMessage() for record in caplog.records if "Skipped" in record.getMessage()
    ][-1]
    (aside,) = (run / "checkpoints" / UNREADABLE_DIR).iterdir()
    assert warning == (
        f"Skipped unreadable checkpoint {run}/checkpoints/ckpt-{TRAINED_RUN_STEPS} (a data file is "
        "shorter than its index says (truncated: Read less bytes than requested)); moved it to "
        f"{aside}; trying the next older one"
    )
    assert sorted(path.name for path in aside.iterdir()) == damaged  # moved, not deleted
    # The state file and the manager forget it: a new save lists ckpt-60 and the new one.
    assert runs.checkpoint_paths(run / "checkpoints") == [path]
    assert trainer.manager.latest_checkpoint == path
    assert trainer.save() == path  # the same step again: rewritten in place, and no other listed
    assert runs.checkpoint_paths(run / "checkpoints") == [path]


def test_missing_index_and_unreadable_state_file(trained_run, tmp_path, trainer_on, caplog):
    checkpoint = trainer_on(tmp_path / "unused").checkpoint
    # A missing index: skipped, reason named.
    run = copy_run(trained_run, tmp_path, "no_index")
    (run / "checkpoints" / f"ckpt-{TRAINED_RUN_STEPS}.index").unlink()
    with caplog.at_level(logging.WARNING, logger="absl"):
        assert restore_newest_readable(checkpoint, run / "checkpoints") == str(
            run / "checkpoints" / f"ckpt-{FIRST}"
        )
    assert f"ckpt-{TRAINED_RUN_STEPS} (its index file is missing)" in caplog.text
    assert not (run / "checkpoints" / UNREADABLE_DIR).exists()  # without a manager nothing is moved
    # A state file that does not parse: the checkpoints beside it are used, the file is kept aside and rewritten,
    # the replacement written before anything is moved.
    run = copy_run(trained_run, tmp_path, "bad_state")
    bad = 'model_checkpoint_path: "ckpt-120"\x00garbage {'
    (run / "checkpoints" / "checkpoint").write_text(bad)
    truncate_data(run, TRAINED_RUN_STEPS)
    manager = tf.train.CheckpointManager(
        checkpoint, str(run / "checkpoints"), max_to_keep=5, checkpoint_name="ckpt"
    )
    assert manager.latest_checkpoint is None  # what TensorFlow alone makes of it: a fresh run
    with pytest.raises(
        runs.UnreadableCheckpointError,
        match=r"^Cannot read the checkpoint state file .*/checkpoint",
    ):
        runs.load_run(run)  # readers say so in one line
    with FaultyFilesystem() as filesystem:
        assert (
            restore_newest_readable(checkpoint, run / "checkpoints", manager)
            == manager.latest_checkpoint
        )
    assert runs.checkpoint_step(manager.latest_checkpoint) == FIRST
    assert [runs.checkpoint_step(p) for p in runs.checkpoint_paths(run / "checkpoints")] == [FIRST]
    (aside,) = (run / "checkpoints" / UNREADABLE_DIR).iterdir()
    assert sorted(path.name for path in aside.iterdir()) == [
        "checkpoint",
        "ckpt-120.data-00000-of-00001",
        "ckpt-120.index",
    ]
    assert (aside / "checkpoint").read_text() == bad
    renames = [
        path for call, path in filesystem.calls if call in ("gfile.rename", "file_io.rename")
    ]
    (replacement,) = [
        i
        for i, path in enumerate(renames)
        if path.startswith(str(run / "checkpoints" / "checkpoint."))
    ]
    moves = [
        i
        for i, path in enumerate(renames)
        if path.startswith(str(run / "checkpoints" / "ckpt-120."))
    ]
    assert len(moves) == 2 and replacement < min(
        moves
    )  # the state file is replaced, then files are moved


def test_none_readable_is_one_line_and_moves_nothing(trained_run, tmp_path, trainer_on):
    run = copy_run(trained_run, tmp_path)
    truncate_data(run, FIRST), truncate_data(run, TRAINED_RUN_STEPS)
    before = sorted(path.name for path in (run / "checkpoints").iterdir())
    with pytest.raises(runs.UnreadableCheckpointError) as error:
        trainer_on(run).restore()
    message = str(error.value)
    assert (
        message.startswith(f"No readable checkpoint in {run}/checkpoints (") and "\n" not in message
    )
    assert (
        f"ckpt-{FIRST}: a data file is shorter" in message
        and f"ckpt-{TRAINED_RUN_STEPS}: a data" in message
    )
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == before


def test_readers_name_the_damaged_checkpoint_in_one_line(trained_run, tmp_path):
    run = copy_run(trained_run, tmp_path)
    truncate_data(run, TRAINED_RUN_STEPS)
    expected = (
        f"^Cannot read checkpoint {run}/checkpoints/ckpt-{TRAINED_RUN_STEPS}: a data file is shorter than "
        r"its index says \(truncated: Read less bytes than requested\)$"
    )
    with pytest.raises(runs.UnreadableCheckpointError, match=expected) as error:
        runs.load_run(run)  # translate.py, evaluate.py, export.py
    assert isinstance(error.value, cli.USER_ERRORS)  # the scripts print it as one line
    with pytest.raises(runs.UnreadableCheckpointError, match=expected):
        write_averaged_checkpoint(run, last=2)


def test_unwritable_run_directory_is_reported_before_training(tmp_path, monkeypatch):
    from keras_transformer.training import DataOptions, train_translation
    from keras_transformer.training import run as run_module

    monkeypatch.setattr(
        run_module, "load_pairs", lambda *args: pytest.fail("read the corpus before the check")
    )
    (tmp_path / "a_file").write_text("")
    with pytest.raises(OSError, match=f"^Cannot write to {tmp_path}/a_file/run: "):
        train_translation(
            get_preset("tiny", **TRAINED_RUN_CONFIG),
            tmp_path / "a_file" / "run",
            TrainOptions(progress=False),
            DataOptions("builtin"),
        )


@pytest.mark.parametrize(
    "error",
    [
        tf.errors.UnavailableError,
        tf.errors.PermissionDeniedError,
        tf.errors.DeadlineExceededError,
        tf.errors.OpError,
    ],
)
def test_an_error_that_is_not_damage_stops_in_one_line_and_moves_nothing(
    trained_run, tmp_path, trainer_on, error
):
    """A transient error reading the newest checkpoint never makes an older one the run's (nor moves a file)."""
    run = copy_run(trained_run, tmp_path)
    before = listing(run)
    trainer = trainer_on(run)
    # The trainer's restore opens a reader first, then restores: both fail, as a flaky bucket would.
    faults = [
        Fault(call, path=f"ckpt-{TRAINED_RUN_STEPS}", error=error, times=None)
        for call in ("checkpoint.reader", "checkpoint.restore")
    ]
    with FaultyFilesystem(*faults), pytest.raises(runs.CheckpointReadError) as raised:
        trainer.restore(repair=True)
    message = str(raised.value)
    assert message.startswith(
        f"Cannot restore checkpoint {run}/checkpoints/ckpt-{TRAINED_RUN_STEPS}: "
        f"{error.__name__}: injected {error.__name__} at checkpoint.reader "
    )
    assert (
        message.endswith(
            "It is not damaged: nothing was moved; run the same command again once the cause is "
            "fixed."
        )
        and "\n" not in message
    )
    assert listing(run) == before and trainer.step == 0
    # Once the storage answers, the same checkpoint is restored.
    assert trainer.restore(repair=True) == str(run / "checkpoints" / f"ckpt-{TRAINED_RUN_STEPS}")


def test_a_transient_error_reading_the_state_file_moves_nothing(trained_run, tmp_path, trainer_on):
    run = copy_run(trained_run, tmp_path)
    before = listing(run)
    with FaultyFilesystem(
        Fault("gfile.GFile", path="checkpoints/checkpoint", error=tf.errors.UnavailableError)
    ):
        with pytest.raises(
            runs.CheckpointReadError,
            match=f"^Cannot read the checkpoint state file in {run}/checkpoints"
            ": .*injected UnavailableError.* nothing was moved",
        ):
            trainer_on(run).restore(repair=True)
    assert listing(run) == before


def test_a_precision_that_changes_the_checkpoint_is_refused(trained_run, tmp_path, trainer_on):
    run = copy_run(trained_run, tmp_path)
    before = listing(run)
    # Through the API: the trainer's own restore says what does not match, in one line, and moves nothing.
    with pytest.raises(
        runs.CheckpointReadError, match=f"^Cannot restore checkpoint {run}/checkpoints/ckpt-120: "
    ) as e:
        trainer_on(run, precision="mixed_float16").restore(repair=True)
    assert "\n" not in str(e.value) and str(e.value).endswith(
        "It is not damaged: nothing was moved; run the same command again once the cause is fixed."
    )
    assert listing(run) == before
    # Through train_translation (train.py): refused with the other resume settings, before anything is read.
    with pytest.raises(ValueError) as e:
        resume(run, precision="mixed_float16")
    assert str(e.value) == (
        f"{run} was started with precision='float32', now precision='mixed_float16': its "
        "checkpoints hold an optimizer of type Adam, this start would build one of type "
        "LossScaleOptimizer. Resume with precision='float32', or start a new model_dir."
    )
    assert listing(run) == before


def test_no_state_file_resumes_from_the_newest_readable_checkpoint_on_disk(trained_run, tmp_path):
    run = copy_run(trained_run, tmp_path)
    (run / "checkpoints" / "checkpoint").unlink()
    # What a save killed before its index was written leaves: data, no index. It is not a checkpoint.
    (data,) = (run / "checkpoints").glob(f"ckpt-{TRAINED_RUN_STEPS}.data-*")
    shutil.copy(data, run / "checkpoints" / "ckpt-130.data-00000-of-00001")
    assert [runs.checkpoint_step(path) for path in checkpoints_on_disk(run / "checkpoints")] == [
        FIRST,
        TRAINED_RUN_STEPS,
    ]
    _, results = resume(run)
    assert results["step"] == TRAINED_RUN_STEPS  # not step 0 over the checkpoints
    assert runs.read_starts(run)[-1]["step"] == TRAINED_RUN_STEPS
    assert [runs.checkpoint_step(path) for path in runs.checkpoint_paths(run / "checkpoints")] == [
        FIRST,
        TRAINED_RUN_STEPS,
    ]
    assert (run / "checkpoints" / "ckpt-130.data-00000-of-00001").exists()  # not moved, not listed
    assert not (run / "checkpoints" / UNREADABLE_DIR).exists()


def test_starts_record_the_step_restored_and_an_unreadable_state_file_is_recovered_through_train_translation(
    trained_run, tmp_path
):
    # The state file lists ckpt-120, which is damaged: the start restores (and records) step 60.
    run = copy_run(trained_run, tmp_path)
    truncate_data(run, TRAINED_RUN_STEPS)
    _, results = resume(run, train_steps=FIRST)  # nothing to train after step 60
    assert results["step"] == FIRST and runs.read_starts(run)[-1]["step"] == FIRST
    # A state file that does not parse: train_translation reaches the recovery (the checkpoints on disk).
    run = copy_run(trained_run, tmp_path, "bad_state")
    (run / "checkpoints" / "checkpoint").write_bytes(b"\xff\xfe not a state file")
    _, results = resume(run)
    assert (
        results["step"] == TRAINED_RUN_STEPS
        and runs.read_starts(run)[-1]["step"] == TRAINED_RUN_STEPS
    )
    (aside,) = (run / "checkpoints" / UNREADABLE_DIR).iterdir()
    assert [path.name for path in aside.iterdir()] == ["checkpoint"]
    assert runs.latest_checkpoint(run) == str(
        run / "checkpoints" / f"ckpt-{TRAINED_RUN_STEPS}"
    )  # rewritten


def test_with_no_state_file_and_only_damaged_checkpoints_training_does_not_start_over(
    trained_run, tmp_path, trainer_on
):
    run = copy_run(trained_run, tmp_path)
    (run / "checkpoints" / "checkpoint").unlink()
    truncate_data(run, FIRST), truncate_data(run, TRAINED_RUN_STEPS)
    with pytest.raises(
        runs.UnreadableCheckpointError, match=f"^No readable checkpoint in {run}/checkpoints "
    ):
        trainer_on(run).restore(repair=True)


@pytest.mark.parametrize("stage", ["checkpoint.merge", "file_io.delete_file"])
def test_a_failed_save_names_what_it_kept_and_never_removes_the_listed_checkpoint(
    trained_run, tmp_path, trainer_on, stage
):
    """Before the merge nothing of the new checkpoint is listed; while sweeping, the state file already lists it."""
    run = copy_run(trained_run, tmp_path)
    trainer = trainer_on(run, keep_checkpoints=2)
    trainer.restore(repair=True)
    trainer.optimizer.iterations.assign(TRAINED_RUN_STEPS + 1)
    with FaultyFilesystem(Fault(stage, error=tf.errors.ResourceExhaustedError)):
        with pytest.raises(CheckpointSaveError) as raised:
            trainer.save()
    new, first, last = (
        str(run / "checkpoints" / f"ckpt-{step}") for step in (121, FIRST, TRAINED_RUN_STEPS)
    )
    message = str(raised.value)
    assert message.startswith(
        f"Could not save checkpoint {new}: injected ResourceExhaustedError at {stage} "
    )
    if stage == "checkpoint.merge":
        assert message.endswith(
            f"Checkpoints kept: {first}, {last}. The last checkpoint, {last}, and the state file "
            "are intact: run the same command to resume from it once the cause is fixed."
        )
        assert not list((run / "checkpoints").glob("ckpt-121*"))  # its partial files are gone
        resumed = TRAINED_RUN_STEPS
    else:  # the oldest could not be deleted: it is still there, and so is the new one the state file lists
        assert message.endswith(
            f"Checkpoints kept: {first}, {last}, {new}. The state file lists {new}, complete, as "
            "the latest: run the same command to resume from it once the cause is fixed."
        )
        resumed = TRAINED_RUN_STEPS + 1
    fresh = trainer_on(run)
    assert (
        fresh.restore(repair=True) == str(run / "checkpoints" / f"ckpt-{resumed}")
        and fresh.step == resumed
    )


def _splitmix_sum(values):
    """The restore check's checksum written out in numpy: each value's bits (int64, sign-extended
    from its width) plus its position times the golden ratio, mixed by SplitMix64's finalizer on
    int64 (arithmetic shifts), summed modulo 2**64."""
    import numpy as np

    from keras_transformer.training.checkpoints import _GOLDEN, _MIX1, _MIX2

    widths = {2: np.int16, 4: np.int32, 8: np.int64}
    bits = np.concatenate(
        [
            (v.view(widths[v.itemsize]) if v.dtype.kind == "f" else v).astype(np.int64).ravel()
            for v in values
        ]
    )
    with np.errstate(over="ignore"):
        z = bits + np.arange(len(bits), dtype=np.int64) * np.int64(_GOLDEN)
        z = (z ^ (z >> 30)) * np.int64(_MIX1)
        z = (z ^ (z >> 27)) * np.int64(_MIX2)
        z ^= z >> 31
        return int(np.sum(z, dtype=np.int64))


@pytest.mark.parametrize("chunk", [1 << 22, 7, 1])
def test_the_restore_checksum_is_splitmix_over_every_value_in_any_chunks(monkeypatch, chunk):
    """`_checksum` (what `check_workers_restored_alike` all-gathers) mixes the values in chunks:
    the sum over every value and its position is the same for any chunk size, variables split
    across chunks or alone in one."""
    import numpy as np

    from keras_transformer.training import checkpoints

    rng = np.random.default_rng(0)
    values = [
        rng.normal(size=(3, 4)).astype("float32"),
        rng.normal(size=5).astype("float16"),
        rng.integers(-9, 9, size=6).astype("int64"),
        np.array(2.5, "float64"),
        rng.normal(size=(2, 9)).astype("float32"),
    ]
    monkeypatch.setattr(checkpoints, "_CHECKSUM_CHUNK", chunk)
    variables = [tf.Variable(value) for value in values]
    assert int(checkpoints._checksum(variables)) == _splitmix_sum(values)
    swapped = [values[0].copy(), *values[1:]]
    swapped[0][0, :2] = swapped[0][0, 1::-1]  # two values trade places
    assert int(checkpoints._checksum([tf.Variable(v) for v in swapped])) != _splitmix_sum(values)
