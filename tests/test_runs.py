"""The run directory module: the layout the trainer writes, and reading it back."""

import json

import numpy as np
import pytest

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
    first, _, _ = runs.load_run(trained_run, checkpoint=runs.checkpoint_paths(runs.checkpoint_dir(trained_run))[0])
    averaged, _, _ = runs.load_run(trained_run, average_last=2)
    assert config.hidden_dim == TRAINED_RUN_CONFIG["hidden_dim"]
    for a, b, mean in zip(latest.get_weights(), first.get_weights(), averaged.get_weights()):
        np.testing.assert_allclose(mean, (a.astype("float64") + b) / 2, rtol=1e-6, atol=1e-7)


def test_mistakes_name_what_is_wrong(tmp_path, trained_run):
    with pytest.raises(FileNotFoundError, match=f"No run config at {tmp_path}/config.json"):
        runs.load_run(tmp_path)
    with pytest.raises(ValueError, match="Cannot read a step from the checkpoint name 'ckpt-best'"):
        runs.checkpoint_step("ckpt-best")
    with pytest.raises(ValueError, match=f"No checkpoints in {tmp_path}"):
        runs.checkpoint_paths(tmp_path)
    with pytest.raises(ValueError, match=r"Asked for the last 3 checkpoints, but .* holds 2\."):
        runs.load_run(trained_run, average_last=3)
