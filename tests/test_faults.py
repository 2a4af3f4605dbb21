"""Crashes, preemption and several workers, with real processes and signals."""

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.cli import TRY_AGAIN
from tests.scripts import REPO, TINY_TRAIN_FLAGS, script_environment, seed_tokenizer

HARNESS = str(Path(__file__).resolve().parent / "train_harness.py")
FLAGS = [*TINY_TRAIN_FLAGS, "--checkpoint_every=2", "--keep_checkpoints=10", "--log_every=1"]


def start(run_dir, *flags, **env):
    return subprocess.Popen(
        [sys.executable, HARNESS, f"--model_dir={run_dir}", *FLAGS, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=script_environment(**env),
    )


def finish(process, timeout=600):
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def latest_step(run_dir):
    path = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    return int(path.rsplit("-", 1)[1]) if path else None


def wait_for(condition, process, timeout=300):
    """Wait until `condition()`; fails the test if `process` ends first or `timeout` seconds pass
    (then the process is killed, not left training after the test)."""
    deadline = time.time() + timeout
    while not condition():
        if process.poll() is not None:
            output, _ = process.communicate()
            raise AssertionError(f"the training process ended early:\n{output[-3000:]}")
        if time.time() > deadline:
            process.kill()
            output, _ = process.communicate()
            raise AssertionError(f"timed out after {timeout} s:\n{output[-3000:]}")
        time.sleep(0.05)


def restored_step(output):
    match = re.search(r"Restored \S+ckpt-(\d+) at step (\d+)", output)
    return int(match.group(2)) if match else None


def test_sigterm_during_start_up_stops_before_any_update(tmp_path):
    run_dir = tmp_path / "run"
    process = start(run_dir, "--train_steps=40")
    lines = []
    for line in process.stdout:
        lines.append(line)
        if "Training preset" in line:  # logged once SIGTERM is watched, before the data is read
            process.send_signal(signal.SIGTERM)
            break
    code, output = finish(process)
    output = "".join(lines) + output
    assert code == TRY_AGAIN, output[-3000:]  # preempted: the scheduler runs the same command again
    assert (
        "Stopped by SIGTERM during start-up, before any update. Run the same command to resume."
        in output
    )
    assert latest_step(run_dir) is None and "Traceback" not in output


def test_sigkill_at_three_moments_then_resume(tmp_path, tiny_tokenizer):
    run_dir = seed_tokenizer(tmp_path / "run", tiny_tokenizer)
    # 1. Killed between checkpoints, once ckpt-4 is committed.
    process = start(run_dir, "--train_steps=40")
    wait_for(lambda: (latest_step(run_dir) or 0) >= 4, process)
    process.send_signal(signal.SIGKILL)
    code, _ = finish(process)
    assert code == -signal.SIGKILL
    committed = latest_step(run_dir)

    # 2. Resumes from it; killed while committing the checkpoint two saves later.
    target = committed + 4
    code, output = finish(start(run_dir, "--train_steps=40", KT_KILL_ON_COMMIT=str(target)))
    assert code == -signal.SIGKILL, output[-3000:]
    assert restored_step(output) == committed, output[-3000:]
    assert "harness: killing during the commit" in output
    assert latest_step(run_dir) == target - 2  # the torn checkpoint is not the latest
    torn = run_dir / "checkpoints" / f"ckpt-{target}.index"
    assert torn.exists()  # its files were written...
    torn.write_bytes(torn.read_bytes()[:10])  # ...and are now also corrupt

    # 3. Resumes from the last complete checkpoint; killed during start-up (tracing).
    process = start(run_dir, "--train_steps=40")
    lines = []
    for line in process.stdout:
        lines.append(line)
        if "Restored" in line:
            break
    process.send_signal(signal.SIGKILL)
    code, output = finish(process)
    assert restored_step("".join(lines)) == target - 2

    # 4. Runs to the end from the same checkpoint, never loading the torn one.
    code, output = finish(
        start(run_dir, "--train_steps=14", KT_DUMP_WEIGHTS=str(tmp_path / "resumed.npz"))
    )
    assert code == 0, output[-3000:]
    assert restored_step(output) == target - 2
    assert "Trained to step 14" in output
    assert latest_step(run_dir) == 14

    # 5. Killed three times, it ends exactly where a run never interrupted ends (dropout
    #    0.1: the seed-generator states and the input position come back with the checkpoint).
    code, output = finish(
        start(
            seed_tokenizer(tmp_path / "uninterrupted", tiny_tokenizer),
            "--train_steps=14",
            KT_DUMP_WEIGHTS=str(tmp_path / "uninterrupted.npz"),
        )
    )
    assert code == 0, output[-3000:]
    resumed, uninterrupted = (
        np.load(tmp_path / "resumed.npz"),
        np.load(tmp_path / "uninterrupted.npz"),
    )
    assert len(resumed.files) == len(uninterrupted.files) > 10
    for name in resumed.files:
        np.testing.assert_array_equal(resumed[name], uninterrupted[name], err_msg=name)


def test_sigterm_saves_and_exits_cleanly(tmp_path, tiny_tokenizer):
    run_dir = seed_tokenizer(tmp_path / "run", tiny_tokenizer)
    process = start(run_dir, "--train_steps=500")
    wait_for(lambda: (latest_step(run_dir) or 0) >= 2, process)
    process.send_signal(signal.SIGTERM)
    code, output = finish(process)
    assert code == TRY_AGAIN, output[-3000:]
    match = re.search(r"Stopped by SIGTERM at step (\d+)", output)
    assert match, output[-3000:]
    stopped = int(match.group(1))
    assert latest_step(run_dir) == stopped
    code, output = finish(start(run_dir, f"--train_steps={stopped + 2}"))
    assert code == 0, output[-3000:]
    assert restored_step(output) == stopped
    assert f"Trained to step {stopped + 2}" in output


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("localhost", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def test_two_workers_train_identically_with_one_set_of_checkpoints(tmp_path, tiny_tokenizer):
    run_dir = seed_tokenizer(tmp_path / "run", tiny_tokenizer)
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    processes = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        processes.append(
            start(
                run_dir,
                "--strategy=multi_worker",
                "--train_steps=4",
                TF_CONFIG=tf_config,
                KT_DUMP_WEIGHTS=str(tmp_path / f"worker{index}.npz"),
            )
        )
    results = [finish(process) for process in processes]
    for code, output in results:
        assert code == 0, output[-4000:]
        assert "Trained to step 4" in output
    weights = [np.load(tmp_path / f"worker{index}.npz") for index in range(2)]
    assert len(weights[0].files) == len(weights[1].files) > 10
    for name in weights[0].files:
        np.testing.assert_array_equal(weights[0][name], weights[1][name])
    # Only the chief's checkpoints and logs remain; the other worker cleaned up.
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "checkpoints",
        "config.json",
        "flags.txt",
        "logs",
        "spm.model",
        "starts.jsonl",
    ]
    assert latest_step(run_dir) == 4
    # The chief's checkpoint holds the weights both workers ended with.
    from keras_transformer.training import load_run

    model, _, _ = load_run(run_dir)
    saved = model.get_weights()
    assert len(saved) == len(weights[0].files)
    for index, array in enumerate(saved):
        np.testing.assert_array_equal(array, weights[0][f"arr_{index}"])


# --- Faults from tests/faulty_fs.py: a kill at each stage of a save, and workers that restore different states ---

SAVE_SCRIPT = """
import json, sys
from tests.faulty_fs import install_from_environment
from keras_transformer.models.config import get_preset
from keras_transformer.training import Trainer, TrainOptions

run, config, steps = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
trainer = Trainer(get_preset("tiny", **config), run, TrainOptions(batch_tokens=1024, keep_checkpoints=2, progress=False))
trainer.restore(repair=True)
install_from_environment()
for step in steps:
    trainer.optimizer.iterations.assign(step)
    trainer.save()
print("saved all")
"""

# The save of ckpt-122 (after ckpt-121; the manager keeps 2, so it sweeps ckpt-120) killed at each of its stages
# (tests/faulty_fs.py lists them): what the run directory is then made into ("as left"; after the merge, also
# without the new index, as a kill inside the merge leaves it, or without the state file), and the step the next
# start restores from each.
SAVE_STAGES = {
    "before_merge": (dict(call="checkpoint.merge", path="ckpt-122"), {"as left": 121}),
    "after_merge": (
        dict(call="checkpoint.merge", path="ckpt-122", when="after"),
        {"as left": 121, "no index": 121, "no state file": 122},
    ),
    "state_file_written_not_renamed": (
        dict(call="file_io.rename", path="checkpoints/checkpoint.tmp", after=2),
        {"as left": 121},
    ),
    "sweep_after_the_old_index": (
        dict(call="file_io.delete_file", path="ckpt-120.index", when="after"),
        {"as left": 122},
    ),
    "sweep_after_the_old_data": (
        dict(call="file_io.delete_file", path="ckpt-120.data", when="after"),
        {"as left": 122},
    ),
    "before_the_second_state_write": (
        dict(call="file_io.atomic_write_string_to_file", after=3),
        {"as left": 122},
    ),
}


@pytest.mark.parametrize("stage", sorted(SAVE_STAGES))
def test_a_kill_at_each_stage_of_a_save_leaves_a_run_that_resumes(trained_run, tmp_path, stage):
    from keras_transformer import runs
    from keras_transformer.models.config import get_preset
    from keras_transformer.training import Trainer, TrainOptions
    from tests.conftest import TRAINED_RUN_CONFIG
    from tests.faulty_fs import KILL, Fault, environment

    killed = shutil.copytree(trained_run, tmp_path / "killed")
    fault, outcomes = SAVE_STAGES[stage]
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            SAVE_SCRIPT,
            str(killed),
            json.dumps(TRAINED_RUN_CONFIG),
            "[121, 122, 123]",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=script_environment(**environment(Fault(**fault, error=KILL))),
    )
    assert result.returncode == -signal.SIGKILL, result.stdout[-2000:] + result.stderr[-3000:]
    assert "faulty_fs: killing the process at" in result.stdout and "saved all" not in result.stdout
    for variant, expected in outcomes.items():
        run = shutil.copytree(killed, tmp_path / variant.replace(" ", "_"))
        checkpoints = run / "checkpoints"
        if variant == "no index":
            (checkpoints / "ckpt-122.index").unlink()
        elif variant == "no state file":
            (checkpoints / "checkpoint").unlink()
        trainer = Trainer(
            get_preset("tiny", **TRAINED_RUN_CONFIG),
            run,
            TrainOptions(batch_tokens=1024, keep_checkpoints=2, progress=False),
        )
        assert trainer.restore(repair=True) == str(checkpoints / f"ckpt-{expected}"), variant
        assert trainer.step == expected
        # It goes on: the next save is listed with the one before, and every listed checkpoint reads.
        trainer.optimizer.iterations.assign(expected + 1)
        trainer.save()
        listed = runs.checkpoint_paths(checkpoints)
        assert [runs.checkpoint_step(path) for path in listed] == [expected, expected + 1], variant
        for path in listed:
            runs.read_model_weights(trainer.model, path)
        assert not (checkpoints / "unreadable").exists()  # nothing damaged, nothing set aside


def test_workers_that_restore_different_states_stop_in_one_line(tmp_path, tiny_tokenizer):
    """Worker 1 finds the newest checkpoint damaged (its copy, here a DataLossError) and restores an older one:
    the all-gathered check stops both workers before any update, and nothing is moved."""
    from tests.faulty_fs import Fault, environment

    run_dir = seed_tokenizer(tmp_path / "run", tiny_tokenizer)
    code, output = finish(start(run_dir, "--train_steps=4"))
    assert code == 0 and latest_step(run_dir) == 4, output[-3000:]
    before = sorted(path.name for path in (run_dir / "checkpoints").iterdir())
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    damaged = environment(
        Fault("checkpoint.reader", path="ckpt-4", error=tf.errors.DataLossError, times=None)
    )
    processes = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        processes.append(
            start(
                run_dir,
                "--strategy=multi_worker",
                "--train_steps=6",
                TF_CONFIG=tf_config,
                **(damaged if index == 1 else {}),
            )
        )
    try:
        results = [finish(process, timeout=300) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:  # a worker left waiting: not after this test
                process.kill()
    for code, output in results:
        assert code == 1, output[-4000:]
        (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
        assert re.fullmatch(
            r"error: The workers restored different states \(replica 0: checkpoint 4, step 4, checksum "
            r"-?\d+; replica 1: checkpoint 2, step 2, checksum -?\d+\): every worker must read the "
            r"same checkpoint directory\. Stopped before training; nothing was moved\.",
            line,
        ), line
        assert "Traceback" not in output
    assert (
        sorted(path.name for path in (run_dir / "checkpoints").iterdir()) == before
        and latest_step(run_dir) == 4
    )


MIRRORED_SCRIPT = """
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from keras_transformer.training.checkpoints import WorkersDisagreeError, check_workers_restored_alike

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    step = tf.Variable(7, dtype=tf.int64)
    weights = [tf.Variable(tf.random.normal([3, 4], seed=1)), tf.Variable(tf.ones([2], tf.bfloat16))]
check_workers_restored_alike(strategy, "run/checkpoints/ckpt-7", step, weights)
print("replicas agree")
weights[0].values[1].assign(-weights[0].values[0])  # one replica's copy of a weight differs
try:
    check_workers_restored_alike(strategy, "run/checkpoints/ckpt-7", step, weights)
except WorkersDisagreeError as error:
    print(error)
"""


def test_the_restore_check_compares_every_replica_of_one_worker():
    result = subprocess.run(
        [sys.executable, "-c", MIRRORED_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=script_environment(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    agree, disagree = result.stdout.strip().splitlines()
    assert agree == "replicas agree"
    match = re.fullmatch(
        r"The workers restored different states \(replica 0: checkpoint 7, step 7, checksum (-?\d+); "
        r"replica 1: checkpoint 7, step 7, checksum (-?\d+)\): every worker must read the same "
        r"checkpoint directory\. Stopped before training; nothing was moved\.",
        disagree,
    )
    assert match and match.group(1) != match.group(2), disagree
