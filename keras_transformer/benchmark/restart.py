"""What a restart costs: launch to first update, resuming early and late in a run.

A run of `experiments/train.py` is started once on a synthetic corpus (number words,
English -> German), then its checkpoint is copied to positions `early` and `late` (the step
counter and the input's position set as if that many updates had been trained; weights
are the same) and `train.py` is launched on each copy to train one more update, the two
launches alternating over `rounds`. The time is from `Popen` to the line the trainer logs
after its first update: reading and tokenizing the corpus, planning, restoring, tracing
and the update itself.
"""

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from keras_transformer.data.builtin_task import english_number, german_number

REPO = Path(__file__).resolve().parents[2]


def write_synthetic_corpus(directory, pairs, seed=0):
    """`pairs` random number-word pairs as `train.en`/`train.de` (and 500 for `val.*`) in `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, count in (("train", pairs), ("val", 500)):
        numbers = rng.integers(1, 1_000_000, count)
        (directory / f"{split}.en").write_text(
            "\n".join(english_number(int(n)) for n in numbers) + "\n"
        )
        (directory / f"{split}.de").write_text(
            "\n".join(german_number(int(n)) for n in numbers) + "\n"
        )
    return directory


@dataclasses.dataclass
class RestartTiming:
    step: int
    seconds: list


def set_position(model_dir, step, batches_per_update):
    """Rewrite the run's latest checkpoint as step `step`, its input `step * batches_per_update` batches on."""
    from keras_transformer.runs import read_run_config
    from keras_transformer.training import Trainer, TrainOptions

    config, payload = read_run_config(model_dir)
    trainer = Trainer(config, model_dir, TrainOptions(**payload["training"]))
    trainer.restore()
    trainer.optimizer.iterations.assign(step)
    trainer._batches_drawn.assign(step * batches_per_update)
    trainer.save()


def time_to_first_update(model_dir, flags, step, timeout=1800):
    """Seconds from launching `train.py` (resuming at `step`) to its log line for step `step + 1`."""
    command = [
        sys.executable,
        str(REPO / "experiments" / "train.py"),
        f"--model_dir={model_dir}",
        f"--train_steps={step + 1}",
        "--log_every=1",
        "--noprogress",
        *flags,
    ]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    marker = f"step {step + 1}/"
    elapsed, lines = None, []
    for line in process.stdout:
        lines.append(line)
        if elapsed is None and marker in line:
            elapsed = time.perf_counter() - start
    process.wait(timeout=timeout)
    if process.returncode != 0 or elapsed is None:
        raise RuntimeError(f"train.py failed resuming at step {step}:\n{''.join(lines[-20:])}")
    return elapsed


def restart_times(work_dir, flags, steps=(100, 100_000), rounds=3, batches_per_update=1):
    """`RestartTiming` for each of `steps`: a prepared run copied anew for each launch, launches alternating."""
    work_dir = Path(work_dir)
    prepared = {}
    for step in steps:
        prepared[step] = work_dir / f"prepared_{step}"
        if not prepared[step].exists():
            shutil.copytree(work_dir / "base", prepared[step])
            set_position(prepared[step], step, batches_per_update)
    timings = {step: RestartTiming(step, []) for step in steps}
    for _ in range(rounds):
        for step in steps:
            run_dir = work_dir / f"run_{step}"
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.copytree(prepared[step], run_dir)
            timings[step].seconds.append(time_to_first_update(run_dir, flags, step))
    return [timings[step] for step in steps]
