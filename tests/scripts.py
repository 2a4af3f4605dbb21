"""Running the experiments/ scripts as real processes, for the script tests."""

import os
import queue
import shutil
import subprocess
import sys
import threading
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


def train_tiny_tokenizer(directory):
    """Write into `directory` the `spm.model` a fresh built-in run of `TINY_TRAIN_FLAGS` trains,
    by the code train.py runs (`training.run.prepare_tokenizer`).

    The `tiny_tokenizer` fixture holds one for the session: a test whose subject is not the
    tokenizer copies it into a new run directory (`seed_tokenizer`) rather than have every
    train.py process spend seconds making the same bytes (SentencePiece training is
    deterministic; tests/test_experiments_train.py checks a trained run holds these bytes).
    """
    from keras_transformer.data.sources import load_pairs, whole_words
    from keras_transformer.models.config import get_preset
    from keras_transformer.training.options import TrainOptions
    from keras_transformer.training.run import prepare_tokenizer

    config = get_preset("tiny", **TINY_MODEL)
    pairs = load_pairs("builtin", "train")
    prepare_tokenizer(
        directory,
        pairs,
        config.vocabulary_size,
        TrainOptions().seed,
        model_type=config.tokenizer_type,
        whole_words=whole_words("builtin", pairs),
    )


def seed_tokenizer(run_dir, tokenizer):
    """Put `tokenizer` (the `tiny_tokenizer` fixture) into the new run directory `run_dir`, where
    train.py would have trained the same file; returns `run_dir`."""
    from keras_transformer.runs import tokenizer_path

    Path(run_dir).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer, tokenizer_path(run_dir))
    return run_dir


def assign_random_weights(model, std=0.3, seed=0):
    """Give every weight of `model` values drawn from N(0, std^2) (no zero bias, no unit norm
    left): a model whose outputs depend on every weight, for conversion and search checks."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(0.0, std, weight.shape).astype(np.float32))
    return model


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


SEQUENCE = str(REPO / "tests" / "script_sequence.py")


def run_sequence(steps, cwd=REPO, env=None, timeout=600):
    """Run `steps` (`[[script, args, options?], ...]`) one after another in one process
    (tests/script_sequence.py: TensorFlow imported once); returns the `CompletedProcess`."""
    import json

    return subprocess.run(
        [sys.executable, SEQUENCE, json.dumps(steps)],
        cwd=cwd,
        env=env or script_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class ScriptSession:
    """`experiments/<name>` run as a process that answers its stdin line by line.

    `send(line)` writes a line (stdin stays open); `answer(timeout)` returns the next stdout
    line, without its line end (None once stdout ended), and fails the test when none comes
    within `timeout` seconds; `close(timeout)` closes stdin and returns `(exit status, stderr)`.
    Used as a context manager, the process is killed on the way out.
    """

    def __init__(self, name, *args, env=None):
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "experiments" / name), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            cwd=REPO,
            env=env or script_environment(),
        )
        self._lines, self._stderr = queue.Queue(), []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()

    def _read_stdout(self):
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _read_stderr(self):
        self._stderr.append(self.process.stderr.read())

    def send(self, line):
        self.process.stdin.write(f"{line}\n")
        self.process.stdin.flush()

    def answer(self, timeout):
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no answer within {timeout:.0f} s") from None

    def close(self, timeout):
        self.process.stdin.close()
        status = self.process.wait(timeout=timeout)
        self._stderr_reader.join(timeout=timeout)
        return status, "".join(self._stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.process.kill()
        self.process.wait()
