"""Smoke tests of experiments/train.py and experiments/average_checkpoints.py (real subprocesses)."""

import json
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tests.scripts import REPO, TINY_TRAIN_FLAGS, run_script, script_environment

TINY_FLAGS = [*TINY_TRAIN_FLAGS, "--checkpoint_every=3", "--log_every=2"]


def run(name, *args):
    result = run_script(name, *args)
    return result.stdout + result.stderr


def one_line_error(result):
    """The message of a script's one-line `error: ...` report; fails on a traceback."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0][len("error: ") :]


def test_user_errors_are_one_line(tmp_path):
    failed = run_script(
        "average_checkpoints.py", f"--model_dir={tmp_path / 'missing'}", check=False
    )
    assert failed.returncode == 1
    assert (
        one_line_error(failed) == f"No run config at {tmp_path / 'missing'}/config.json: is "
        f"{tmp_path / 'missing'} a training run directory?"
    )
    failed = run_script(
        "train.py", "--dataset=files", "--train_src=a.txt", "--train_tgt=b.txt", check=False
    )
    assert failed.returncode == 2
    assert one_line_error(failed) == "--dataset=files needs --val_src, --val_tgt. (see --help)"
    assert (
        "With no flags" not in failed.stdout + failed.stderr
    )  # the error, not the whole help text


def test_no_tensorflow_noise_unless_asked(tmp_path):
    """A user error on a CPU machine prints exactly its one line; TF_CPP_MIN_LOG_LEVEL=0 brings TensorFlow's back."""
    script = [
        sys.executable,
        str(REPO / "experiments" / "average_checkpoints.py"),
        f"--model_dir={tmp_path}",
    ]
    quiet_env = {k: v for k, v in script_environment().items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    quiet = subprocess.run(script, capture_output=True, text=True, env=quiet_env, timeout=300)
    assert quiet.returncode == 1
    assert quiet.stderr.splitlines() == [
        f"error: No run config at {tmp_path}/config.json: is {tmp_path} a training run directory?"
    ], quiet.stderr
    loud = subprocess.run(
        script,
        capture_output=True,
        text=True,
        env={**quiet_env, "TF_CPP_MIN_LOG_LEVEL": "0"},
        timeout=300,
    )
    assert loud.returncode == 1 and len(loud.stderr.splitlines()) > 1


def test_help_lists_the_documented_flags():
    shown = run_script("train.py", "--help", check=False).stdout  # absl exits with 1 after --help
    for flag in (
        "--preset",
        "--dataset",
        "--data_dir",
        "--hidden_dim",
        "--train_steps",
        "--on_nonfinite",
        "--[no]traceback",
    ):
        assert f"  {flag}" in shown, flag
    # The usage example keeps its line continuation.
    assert "--data_dir=../shared/data/multi30k \\\n        --preset=small" in shown


def test_train_then_resume_then_average(tmp_path, tiny_tokenizer):
    run_dir = tmp_path / "run"
    output = run(
        "train.py",
        f"--model_dir={run_dir}",
        "--train_steps=6",
        "--bucket_boundaries=12,24",
        "--sampling_alpha=0.5",
        *TINY_FLAGS,
    )
    assert "Trained to step 6" in output
    assert "Sharding callback duration" not in output  # TensorFlow's INFO line at every save
    assert (
        "CPU allocator pooled (TF_CPU_ALLOCATOR_USE_BFC=true)" in output
    )  # selected before TensorFlow's first op
    data = json.loads((run_dir / "config.json").read_text())["data"]
    assert data["bucket_boundaries"] == [12, 24] and data["sampling_alpha"] == 0.5
    assert f"Checkpoints: {run_dir}/checkpoints/ckpt-6" in output
    # The tokenizer other tests copy into their new runs (tests.scripts.seed_tokenizer) is this one.
    assert (run_dir / "spm.model").read_bytes() == tiny_tokenizer.read_bytes()
    # A resume that changes what the data position means is refused before anything is written.
    failed = run_script(
        "train.py",
        f"--model_dir={run_dir}",
        "--train_steps=9",
        "--sampling_alpha=0.5",
        *TINY_FLAGS,
        check=False,
    )
    assert failed.returncode == 1
    assert one_line_error(failed) == (
        f"{run_dir} was started with bucket_boundaries=[12, 24], now bucket_boundaries=None: its data position "
        "(in checkpoints) counts batches planned with the first value. Resume with bucket_boundaries=[12, 24], "
        "or start a new model_dir."
    )
    # The same command with more steps (and another accumulation) continues from step 6.
    output = run(
        "train.py",
        f"--model_dir={run_dir}",
        "--train_steps=9",
        "--bucket_boundaries=12,24",
        "--sampling_alpha=0.5",
        "--accum_steps=2",
        *TINY_FLAGS,
    )
    assert "Restored" in output and "ckpt-6" in output
    assert "Trained to step 9" in output
    # The first start's config is kept; every start is recorded.
    assert json.loads((run_dir / "config.json").read_text())["training"]["accum_steps"] == 1
    starts = [json.loads(line) for line in (run_dir / "starts.jsonl").read_text().splitlines()]
    assert [(start["step"], start["training"]["accum_steps"]) for start in starts] == [
        (0, 1),
        (6, 2),
    ]
    # A different architecture in the same directory is refused, naming the field.
    failed = run_script(
        "train.py",
        f"--model_dir={run_dir}",
        "--train_steps=9",
        *TINY_FLAGS,
        "--hidden_dim=64",
        check=False,
    )
    assert failed.returncode == 1 and "hidden_dim: 32 -> 64" in one_line_error(failed)
    # --traceback shows where it came from instead.
    failed = run_script(
        "train.py",
        f"--model_dir={run_dir}",
        "--train_steps=9",
        *TINY_FLAGS,
        "--hidden_dim=64",
        "--traceback",
        check=False,
    )
    assert failed.returncode != 0 and "Traceback (most recent call last)" in failed.stderr
    failed = run_script(
        "train.py", f"--model_dir={run_dir}", "--bucket_boundaries=8,x", *TINY_FLAGS, check=False
    )
    assert (
        failed.returncode != 0
        and "--bucket_boundaries must be integers. Received: 8,x" in failed.stderr
    )
    failed = run_script(
        "train.py", f"--model_dir={run_dir}", "--sampling_alpha=0", *TINY_FLAGS, check=False
    )
    assert (
        failed.returncode != 0
        and "--sampling_alpha: The subword sampling alpha must be a number in (0, 1]. Received: alpha=0.0"
        in failed.stderr
    )
    failed = run_script("average_checkpoints.py", f"--model_dir={run_dir}", "--last=5", check=False)
    assert failed.returncode == 1
    assert (
        one_line_error(failed)
        == f"Asked for the last 5 checkpoints, but {run_dir}/checkpoints holds 3. "
        "Average fewer, or train with --keep_checkpoints >= 5."
    )
    output = run("average_checkpoints.py", f"--model_dir={run_dir}", "--last=2")
    assert "Averaged 2 checkpoints" in output
    averaged = tf.train.load_checkpoint(str(run_dir / "averaged" / "ckpt-9"))
    six = tf.train.load_checkpoint(str(run_dir / "checkpoints" / "ckpt-6"))
    nine = tf.train.load_checkpoint(str(run_dir / "checkpoints" / "ckpt-9"))
    key = next(
        k
        for k in averaged.get_variable_to_shape_map()
        if "embeddings" in k and "OPTIMIZER" not in k
    )
    np.testing.assert_allclose(
        averaged.get_tensor(key),
        (six.get_tensor(key) + nine.get_tensor(key)) / 2,
        rtol=1e-6,
        atol=1e-7,
    )
