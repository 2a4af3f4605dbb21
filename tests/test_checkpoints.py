"""Checkpoints that never strand a run: damaged ones are skipped and set aside (a failed save: tests/test_fs.py)."""

import logging
import shutil

import pytest
import tensorflow as tf

from keras_transformer import cli, runs
from keras_transformer.models.config import get_preset
from keras_transformer.training import Trainer, TrainOptions, write_averaged_checkpoint
from keras_transformer.training.checkpoints import UNREADABLE_DIR, restore_newest_readable
from tests.conftest import TRAINED_RUN_CONFIG, TRAINED_RUN_STEPS

FIRST = TRAINED_RUN_STEPS // 2  # trained_run holds ckpt-60 and ckpt-120


def copy_run(trained_run, tmp_path, name="run"):
    return shutil.copytree(trained_run, tmp_path / name)


def truncate_data(run, step):
    (path,) = (run / "checkpoints").glob(f"ckpt-{step}.data-*")
    path.write_bytes(path.read_bytes()[:1000])


def state_text(run):
    return (run / "checkpoints" / "checkpoint").read_text()


@pytest.fixture(scope="module")
def trainer_on(trained_run):
    """A function making a Trainer of trained_run's config over a run directory (without restoring)."""
    config = get_preset("tiny", **TRAINED_RUN_CONFIG, train_steps=TRAINED_RUN_STEPS)
    return lambda run: Trainer(config, run, TrainOptions(batch_tokens=1024, progress=False))


def test_resume_skips_a_truncated_checkpoint_sets_it_aside_and_continues(trained_run, tmp_path, trainer_on, caplog):
    run = copy_run(trained_run, tmp_path)
    truncate_data(run, TRAINED_RUN_STEPS)
    damaged = sorted(path.name for path in (run / "checkpoints").glob(f"ckpt-{TRAINED_RUN_STEPS}.*"))
    trainer = trainer_on(run)
    with caplog.at_level(logging.WARNING, logger="absl"):
        path = trainer.restore()
    assert path == str(run / "checkpoints" / f"ckpt-{FIRST}") and trainer.step == FIRST
    (warning,) = [record.getMessage() for record in caplog.records if "Skipped" in record.getMessage()]
    (aside,) = (run / "checkpoints" / UNREADABLE_DIR).iterdir()
    assert warning == (f"Skipped unreadable checkpoint {run}/checkpoints/ckpt-{TRAINED_RUN_STEPS} (a data file is "
                       "shorter than its index says (truncated: Read less bytes than requested)); moved it to "
                       f"{aside}; trying the next older one")
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
        assert restore_newest_readable(checkpoint, run / "checkpoints") == str(run / "checkpoints" / f"ckpt-{FIRST}")
    assert f"ckpt-{TRAINED_RUN_STEPS} (its index file is missing)" in caplog.text
    assert not (run / "checkpoints" / UNREADABLE_DIR).exists()  # without a manager nothing is moved
    # A state file that does not parse: the checkpoints beside it are used, the file is set aside and rewritten.
    run = copy_run(trained_run, tmp_path, "bad_state")
    (run / "checkpoints" / "checkpoint").write_text("model_checkpoint_path: \"ckpt-120\"\x00garbage {")
    manager = tf.train.CheckpointManager(checkpoint, str(run / "checkpoints"), max_to_keep=5, checkpoint_name="ckpt")
    assert manager.latest_checkpoint is None  # what TensorFlow alone makes of it: a fresh run
    with pytest.raises(runs.UnreadableCheckpointError, match=r"^Cannot read the checkpoint state file .*/checkpoint"):
        runs.load_run(run)  # readers say so in one line
    assert restore_newest_readable(checkpoint, run / "checkpoints", manager) == manager.latest_checkpoint
    assert runs.checkpoint_step(manager.latest_checkpoint) == TRAINED_RUN_STEPS
    assert [runs.checkpoint_step(p) for p in runs.checkpoint_paths(run / "checkpoints")] == [FIRST, TRAINED_RUN_STEPS]
    (aside,) = (run / "checkpoints" / UNREADABLE_DIR).iterdir()
    assert [path.name for path in aside.iterdir()] == ["checkpoint"]


def test_none_readable_is_one_line_and_moves_nothing(trained_run, tmp_path, trainer_on):
    run = copy_run(trained_run, tmp_path)
    truncate_data(run, FIRST), truncate_data(run, TRAINED_RUN_STEPS)
    before = sorted(path.name for path in (run / "checkpoints").iterdir())
    with pytest.raises(runs.UnreadableCheckpointError) as error:
        trainer_on(run).restore()
    message = str(error.value)
    assert message.startswith(f"No readable checkpoint in {run}/checkpoints (") and "\n" not in message
    assert f"ckpt-{FIRST}: a data file is shorter" in message and f"ckpt-{TRAINED_RUN_STEPS}: a data" in message
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == before


def test_readers_name_the_damaged_checkpoint_in_one_line(trained_run, tmp_path):
    run = copy_run(trained_run, tmp_path)
    truncate_data(run, TRAINED_RUN_STEPS)
    expected = (f"^Cannot read checkpoint {run}/checkpoints/ckpt-{TRAINED_RUN_STEPS}: a data file is shorter than "
                r"its index says \(truncated: Read less bytes than requested\)$")
    with pytest.raises(runs.UnreadableCheckpointError, match=expected) as error:
        runs.load_run(run)  # translate.py, evaluate.py, export.py
    assert isinstance(error.value, cli.USER_ERRORS)  # the scripts print it as one line
    with pytest.raises(runs.UnreadableCheckpointError, match=expected):
        write_averaged_checkpoint(run, last=2)


def test_unwritable_run_directory_is_reported_before_training(tmp_path, monkeypatch):
    from keras_transformer.training import DataOptions, run as run_module, train_translation

    monkeypatch.setattr(run_module, "load_pairs", lambda *args: pytest.fail("read the corpus before the check"))
    (tmp_path / "a_file").write_text("")
    with pytest.raises(OSError, match=f"^Cannot write to {tmp_path}/a_file/run: "):
        train_translation(get_preset("tiny", **TRAINED_RUN_CONFIG), tmp_path / "a_file" / "run",
                          TrainOptions(progress=False), DataOptions("builtin"))
