"""Running the experiments/ scripts as real processes, for the script tests."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A model small enough that training runs in seconds (`get_preset("tiny", **TINY_MODEL)`).
TINY_MODEL = dict(
    num_encoder_layers=1,
    num_decoder_layers=1,
    hidden_dim=32,
    intermediate_dim=64,
    num_heads=2,
    vocabulary_size=64,
    max_length=48,
)
TINY_BATCH_TOKENS = 512
# The same model and batches as a training script's flags.
TINY_TRAIN_FLAGS = (
    *(f"--{name}={value}" for name, value in TINY_MODEL.items()),
    f"--batch_tokens={TINY_BATCH_TOKENS}",
    "--eval_every=0",
    "--noprogress",
)


def script_environment(**extra):
    """The test process's environment, quiet TensorFlow logs, the repository importable."""
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def run_script(name, *args, stdin=None, check=True, timeout=900, env=None):
    """Run `experiments/<name>` with `args` (in `env`, default `script_environment()`); returns the
    `CompletedProcess` (text output).

    With `check`, a non-zero exit fails the test, showing the end of both streams.
    """
    result = subprocess.run(
        [sys.executable, str(REPO / "experiments" / name), *args],
        input=stdin,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
        cwd=REPO,
        env=env or script_environment(),
    )
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result
