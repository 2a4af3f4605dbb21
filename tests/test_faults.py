"""Crashes, preemption and several workers, with real processes and signals."""

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_transformer.cli import TRY_AGAIN
from tests.scripts import REPO, TINY_TRAIN_FLAGS, script_environment

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
    deadline = time.time() + timeout
    while not condition():
        assert process.poll() is None, "the training process ended early"
        assert time.time() < deadline, "timed out"
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
    assert "Stopped by SIGTERM during start-up, before any update. Run the same command to resume." in output
    assert latest_step(run_dir) is None and "Traceback" not in output


def test_sigkill_at_three_moments_then_resume(tmp_path):
    run_dir = tmp_path / "run"
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
    code, output = finish(start(run_dir, "--train_steps=14", KT_DUMP_WEIGHTS=str(tmp_path / "resumed.npz")))
    assert code == 0, output[-3000:]
    assert restored_step(output) == target - 2
    assert "Trained to step 14" in output
    assert latest_step(run_dir) == 14

    # 5. Killed three times, it ends exactly where a run never interrupted ends (dropout
    #    0.1: the seed-generator states and the input position come back with the checkpoint).
    code, output = finish(start(tmp_path / "uninterrupted", "--train_steps=14",
                                KT_DUMP_WEIGHTS=str(tmp_path / "uninterrupted.npz")))
    assert code == 0, output[-3000:]
    resumed, uninterrupted = np.load(tmp_path / "resumed.npz"), np.load(tmp_path / "uninterrupted.npz")
    assert len(resumed.files) == len(uninterrupted.files) > 10
    for name in resumed.files:
        np.testing.assert_array_equal(resumed[name], uninterrupted[name], err_msg=name)


def test_sigterm_saves_and_exits_cleanly(tmp_path):
    run_dir = tmp_path / "run"
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


def test_two_workers_train_identically_with_one_set_of_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    processes = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        processes.append(
            start(run_dir, "--strategy=multi_worker", "--train_steps=4",
                  TF_CONFIG=tf_config, KT_DUMP_WEIGHTS=str(tmp_path / f"worker{index}.npz"))
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
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints", "config.json", "logs", "spm.model",
                                                         "starts.jsonl"]
    assert latest_step(run_dir) == 4
    # The chief's checkpoint holds the weights both workers ended with.
    from keras_transformer.training import load_run

    model, _, _ = load_run(run_dir)
    saved = model.get_weights()
    assert len(saved) == len(weights[0].files)
    for index, array in enumerate(saved):
        np.testing.assert_array_equal(array, weights[0][f"arr_{index}"])
