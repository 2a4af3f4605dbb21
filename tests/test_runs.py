"""The run directory module: the layout the trainer writes, and reading it back."""

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import runs
from keras_transformer.models.config import get_preset
from tests.conftest import TRAINED_RUN_CONFIG, TRAINED_RUN_STEPS


def test_the_trainer_writes_the_documented_layout(trained_run):
    assert runs.config_path(trained_run).is_file() and runs.tokenizer_path(trained_run).is_file()
    assert any(runs.log_dir(trained_run, runs.TRAIN_LOG).glob("events.out.tfevents.*"))
    paths = runs.checkpoint_paths(runs.checkpoint_dir(trained_run))
    assert [runs.checkpoint_step(path) for path in paths] == [60, TRAINED_RUN_STEPS]
    assert runs.latest_checkpoint(trained_run) == paths[-1]
    assert all(path.rsplit("/", 1)[1].startswith(f"{runs.CHECKPOINT_PREFIX}-") for path in paths)
    times = runs.checkpoint_times(runs.checkpoint_dir(trained_run), paths)
    assert len(times) == 2 and times[0] <= times[1]


def test_config_round_trip(tmp_path):
    config = get_preset("tiny", **TRAINED_RUN_CONFIG)
    runs.write_run_config(tmp_path, {"model": config.to_dict(), "data": {"dataset": "builtin"}})
    assert json.loads(runs.config_path(tmp_path).read_text())["data"] == {"dataset": "builtin"}
    read, payload = runs.read_run_config(tmp_path)
    assert read == config and payload["model"] == config.to_dict()
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file


def test_load_run_reads_the_latest_or_the_average(trained_run):
    latest, _, config = runs.load_run(trained_run)
    first, _, _ = runs.load_run(
        trained_run, checkpoint=runs.checkpoint_paths(runs.checkpoint_dir(trained_run))[0]
    )
    averaged, _, _ = runs.load_run(trained_run, average_last=2)
    assert config.hidden_dim == TRAINED_RUN_CONFIG["hidden_dim"]
    for a, b, mean in zip(latest.get_weights(), first.get_weights(), averaged.get_weights()):
        np.testing.assert_allclose(mean, (a.astype("float64") + b) / 2, rtol=1e-6, atol=1e-7)


def test_with_no_state_file_readers_find_the_checkpoints_on_disk(tmp_path, trained_run):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (runs.checkpoint_dir(run) / runs.CHECKPOINT_STATE_FILE).unlink()
    paths = runs.checkpoint_paths(runs.checkpoint_dir(run))
    assert [runs.checkpoint_step(path) for path in paths] == [60, TRAINED_RUN_STEPS]
    assert runs.latest_checkpoint(run) == paths[-1]
    assert len(runs.checkpoint_times(runs.checkpoint_dir(run), paths)) == 2
    found, _, _ = runs.load_run(run)
    listed, _, _ = runs.load_run(trained_run)
    for a, b in zip(found.get_weights(), listed.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_mistakes_name_what_is_wrong(tmp_path, trained_run):
    with pytest.raises(FileNotFoundError, match=f"No run config at {tmp_path}/config.json"):
        runs.load_run(tmp_path)
    with pytest.raises(ValueError, match="Cannot read a step from the checkpoint name 'ckpt-best'"):
        runs.checkpoint_step("ckpt-best")
    with pytest.raises(ValueError, match=f"No checkpoints in {tmp_path}"):
        runs.checkpoint_paths(tmp_path)
    with pytest.raises(ValueError, match=r"Asked for the last 3 checkpoints, but .* holds 2\."):
        runs.load_run(trained_run, average_last=3)


def _read_error(model, prefix):
    try:
        tf.train.Checkpoint(model=model).read(str(prefix)).expect_partial()
    except runs.READ_ERRORS as error:
        return error
    pytest.fail(f"{prefix} read without an error")


def _damage(path, how):
    data = next(path.parent.glob(f"{path.name}.data-*"))
    if how == "truncated data":
        data.write_bytes(data.read_bytes()[:1000])
    elif how == "a flipped data byte":
        content = bytearray(data.read_bytes())
        content[500] ^= 0xFF
        data.write_bytes(bytes(content))
    elif how == "truncated index":
        index = path.parent / f"{path.name}.index"
        index.write_bytes(index.read_bytes()[:10])
    elif how == "no index":
        (path.parent / f"{path.name}.index").unlink()
    elif how == "no data":
        data.unlink()


@pytest.mark.parametrize(
    "how, reason",
    [
        (
            "truncated data",
            "a data file is shorter than its index says (truncated: Read less bytes than requested)",
        ),
        ("a flipped data byte", "DataLossError: TensorBundle at {path} shard 0 "),
        ("truncated index", "OpError: file is too short to be an sstable"),
        ("no index", "its index file is missing"),
        ("no data", "its data files are missing"),
    ],
)
def test_damage_is_told_from_its_files(trained_run, run_model, tmp_path, how, reason):
    run = shutil.copytree(trained_run, tmp_path / "run")
    path = run / "checkpoints" / f"ckpt-{TRAINED_RUN_STEPS}"
    _damage(path, how)
    assert runs.damage_reason(path, _read_error(run_model[0], path)).startswith(
        reason.format(path=path)
    )


def test_a_checkpoint_without_one_of_its_data_shards_names_it(tmp_path):
    """Shards are counted from their names (`-of-<n>`); another checkpoint's (ckpt-30) are not its."""
    path = tmp_path / "ckpt-3"
    for name in ("ckpt-3.index", "ckpt-3.data-00000-of-00002", "ckpt-30.data-00001-of-00002"):
        (tmp_path / name).write_bytes(b"")
    error = tf.errors.NotFoundError(None, None, "not found")
    assert runs.damage_reason(path, error) == f"{path}.data-00001-of-00002 is missing"


@pytest.mark.parametrize(
    "error",
    [
        tf.errors.UnavailableError,
        tf.errors.PermissionDeniedError,
        tf.errors.DeadlineExceededError,
        tf.errors.NotFoundError,
        tf.errors.OpError,
    ],
)
def test_errors_of_the_storage_are_not_damage(trained_run, run_model, error):
    """A checkpoint whose files are all there is not damaged, whatever its read raised (the reader reports most
    failures as a plain OpError; a NotFoundError for a variable the checkpoint lacks is a mismatch)."""
    from tests.faulty_fs import Fault, FaultyFilesystem

    path = runs.checkpoint_dir(trained_run) / f"ckpt-{TRAINED_RUN_STEPS}"
    with FaultyFilesystem(Fault("checkpoint.read", error=error)):
        raised = _read_error(run_model[0], path)
    assert type(raised) is error and runs.damage_reason(path, raised) is None


def test_the_state_file_lists_full_paths_and_a_storage_error_is_not_damage(trained_run):
    from tests.faulty_fs import Fault, FaultyFilesystem

    directory = runs.checkpoint_dir(trained_run)
    state = runs.checkpoint_state(directory)
    assert (
        "ckpt-" in (directory / "checkpoint").read_text()
        and str(directory) not in (directory / "checkpoint").read_text()
    )
    assert list(state.all_model_checkpoint_paths) == [
        str(directory / "ckpt-60"),
        str(directory / "ckpt-120"),
    ]
    assert state.model_checkpoint_path == str(directory / "ckpt-120")
    with FaultyFilesystem(
        Fault("gfile.GFile", path="checkpoint", error=tf.errors.UnavailableError)
    ):
        with pytest.raises(OSError, match="injected UnavailableError"):
            runs.checkpoint_state(directory)
