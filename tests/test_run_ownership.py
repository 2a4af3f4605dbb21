"""Long runs under a scheduler: one owner per run directory (its lease), the data a run trains
on (its fingerprint), and the start-up of several workers; real train.py processes."""

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from keras_transformer import fs
from keras_transformer.cli import TRY_AGAIN
from keras_transformer.runs import lease_path, read_starts, worker_dir
from keras_transformer.training.lease import LeaseLostError, RunDirectoryBusyError, RunLease
from tests import scripts
from tests.scripts import TINY_TRAIN_FLAGS, seed_tokenizer
from tests.test_faults import FLAGS, finish, free_ports, latest_step, start, wait_for


def run_sequence(steps):
    """`tests.scripts.run_sequence` of `steps`: `(returncode, output)`."""
    result = scripts.run_sequence(steps)
    return result.returncode, result.stdout + result.stderr


def errors(output):
    assert "Traceback" not in output, output[-3000:]
    return [line[len("error: ") :] for line in output.splitlines() if line.startswith("error: ")]


def test_a_lease_is_taken_over_only_after_its_timeout(tmp_path):
    first, second = RunLease(tmp_path, timeout=1.0), RunLease(tmp_path, timeout=1.0)
    first.acquire()
    with pytest.raises(
        RunDirectoryBusyError, match=f"^{tmp_path} is being trained by {socket.gethostname()} pid "
    ):
        second.acquire()
    first.renew()  # still its own
    time.sleep(1.2)
    second.acquire()  # the heartbeat is older than the timeout: taken over
    with pytest.raises(
        LeaseLostError, match=f"^{tmp_path} was taken over by {socket.gethostname()} pid "
    ):
        first.renew()
    first.release()  # not its lease any more: left alone
    assert json.loads(fs.read_text(lease_path(tmp_path)))["owner"] == second.owner["owner"]
    second.release()
    assert not lease_path(tmp_path).exists()


def test_a_lease_whose_process_ended_on_this_host_is_taken_over_at_once(tmp_path):
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        for host, pid, taken in (
            (socket.gethostname(), int(ended.stdout), True),
            ("lost-node", int(ended.stdout), False),
            (socket.gethostname(), live.pid, False),
        ):
            lease_path(tmp_path).write_text(
                json.dumps({"owner": "0" * 16, "host": host, "pid": pid, "heartbeat": time.time()})
            )
            lease = RunLease(tmp_path, timeout=600)
            if taken:
                lease.acquire()
                lease.release()
            else:
                with pytest.raises(
                    RunDirectoryBusyError, match=f"is being trained by {host} pid {pid} "
                ):
                    lease.acquire()
    finally:
        live.kill()
        live.wait()


def test_one_live_process_per_run_directory_and_preemption_exits_75(tmp_path, tiny_tokenizer):
    run_dir = seed_tokenizer(tmp_path / "run", tiny_tokenizer)
    owner = start(run_dir, "--train_steps=500")
    wait_for(lambda: (latest_step(run_dir) or 0) >= 2, owner)
    lease = json.loads(lease_path(run_dir).read_text())
    assert lease["pid"] == owner.pid
    wait_for(lambda: latest_step(run_dir) >= 4, owner)
    assert (
        json.loads(lease_path(run_dir).read_text())["heartbeat"] > lease["heartbeat"]
    )  # renewed as it trains
    # A second process on the same directory is refused in one line, with the status that says "try again".
    code, output = run_sequence(
        [
            [
                "train.py",
                [f"--model_dir={run_dir}", *FLAGS, "--train_steps=500"],
                {"status": TRY_AGAIN},
            ]
        ]
    )
    assert code == 0, output[-3000:]
    (refusal,) = errors(output)
    assert refusal.startswith(
        f"{run_dir} is being trained by {socket.gethostname()} pid {owner.pid} (its lease "
        f"{run_dir}/lease.json was renewed "
    ), refusal
    assert refusal.endswith(
        "s after the last renewal, --lease_timeout): run the same command again once that "
        "process has stopped"
    ), refusal
    # Preempted: it saves, exits with 75 and hands the directory back.
    owner.send_signal(signal.SIGTERM)
    code, output = finish(owner)
    assert code == TRY_AGAIN, output[-3000:]
    assert not lease_path(run_dir).exists()

    # Killed without a chance to clean up: its lease stays. On the same host, its pid gone, the
    # same command takes it over at once; a `.worker_<i>` directory left by a worker killed
    # mid-save is removed.
    stopped = latest_step(run_dir)
    owner = start(run_dir, "--train_steps=500")
    wait_for(lambda: latest_step(run_dir) > stopped, owner)
    owner.send_signal(signal.SIGKILL)
    finish(owner)
    assert json.loads(lease_path(run_dir).read_text())["pid"] == owner.pid
    stale = worker_dir(run_dir, 3)
    (stale / "checkpoints").mkdir(parents=True)
    command = [f"--model_dir={run_dir}", *FLAGS]
    code, output = run_sequence(
        [["train.py", [*command, f"--train_steps={latest_step(run_dir) + 1}"]]]
    )
    assert code == 0, output[-3000:]
    assert (
        f"Taking over {run_dir} from {socket.gethostname()} pid {owner.pid}, which is no longer running"
        in output
    )
    assert f"Removed {stale}, left by a worker stopped while saving" in output
    assert not stale.exists() and not lease_path(run_dir).exists()
    assert "Trained to step" in output

    # A lease left by a process on another host (a lost node) is refused until its heartbeat is
    # --lease_timeout seconds old, then taken over.
    lease_path(run_dir).write_text(
        json.dumps(
            {"owner": "0" * 16, "host": "lost-node", "pid": owner.pid, "heartbeat": time.time()}
        )
    )
    code, output = run_sequence(
        [
            ["train.py", [*command, "--train_steps=500"], {"status": TRY_AGAIN}],
            [
                "train.py",
                [*command, f"--train_steps={latest_step(run_dir) + 1}", "--lease_timeout=1"],
            ],
        ]
    )
    assert code == 0, output[-3000:]
    (refusal,) = errors(output)
    assert refusal.startswith(f"{run_dir} is being trained by lost-node pid {owner.pid} "), refusal
    assert (
        f"Taking over {run_dir} from lost-node pid {owner.pid}, whose last heartbeat was " in output
    )
    assert not lease_path(run_dir).exists()
    assert "Trained to step" in output


def _write_split(directory, split, pairs):
    paths = []
    for side, index in (("src", 0), ("tgt", 1)):
        path = directory / f"{split}.{side}"
        path.write_text("".join(pair[index] + "\n" for pair in pairs), encoding="utf-8")
        paths.append(str(path))
    return paths


def _corpus(tmp_path, name="data"):
    from keras_transformer.data.sources import load_pairs

    directory = tmp_path / name
    directory.mkdir()
    train_src, train_tgt = _write_split(directory, "train", load_pairs("builtin", "train")[:2000])
    val_src, val_tgt = _write_split(directory, "val", load_pairs("builtin", "val")[:16])
    return [
        "--dataset=files",
        f"--train_src={train_src}",
        f"--train_tgt={train_tgt}",
        f"--val_src={val_src}",
        f"--val_tgt={val_tgt}",
    ], directory


def test_resume_on_changed_data_is_refused_unless_accepted(tmp_path):
    corpus, data = _corpus(tmp_path)
    run_dir = tmp_path / "run"
    train = [
        f"--model_dir={run_dir}",
        *corpus,
        *TINY_TRAIN_FLAGS,
        "--checkpoint_every=1",
        "--log_every=1",
    ]
    code, output = run_sequence([["train.py", [*train, "--train_steps=1"]]])
    assert code == 0, output[-3000:]
    recorded = json.loads((run_dir / "config.json").read_text())["data_fingerprint"]
    assert recorded["train"]["examples"] == 2000 and recorded["val"]["examples"] == 16
    assert recorded["train"]["target"]["file"] == str(data / "train.tgt")
    # One sentence of the training targets changes: same count, other contents.
    target = data / "train.tgt"
    lines = target.read_text(encoding="utf-8").splitlines(keepends=True)
    target.write_text("".join(["changed\n", *lines[1:]]), encoding="utf-8")
    code, output = run_sequence(
        [
            ["train.py", [*train, "--train_steps=2"], {"status": 1}],
            ["train.py", [*train, "--train_steps=2", "--allow_changed_data"]],
            ["train.py", [*train, "--train_steps=3"]],  # the accepted data is the run's now
        ]
    )
    assert code == 0, output[-3000:]
    (refusal,) = errors(output)
    assert refusal.startswith(
        f"{target} (2000 examples, sha256 {recorded['train']['target']['sha256'][:12]} when "
        "recorded; now 2000, "
    ), refusal
    assert refusal.endswith(
        f" changed since {run_dir} recorded it: its checkpoints' input position counts examples "
        "of the recorded data. Restore that data, start a new model_dir, or accept the change "
        "with --allow_changed_data."
    ), refusal
    assert f"Resuming {run_dir} on changed data, as --allow_changed_data asks: {target} (" in output
    assert "Trained to step 3" in output
    now = json.loads((run_dir / "config.json").read_text())["data_fingerprint"]
    assert now["train"]["source"] == recorded["train"]["source"]
    assert now["train"]["target"]["sha256"] != recorded["train"]["target"]["sha256"]
    assert [
        start["data_fingerprint"]["train"]["target"]["sha256"] for start in read_starts(run_dir)
    ] == [recorded["train"]["target"]["sha256"]] + 2 * [now["train"]["target"]["sha256"]]


def _cluster(tmp_path, flags_of_worker, timeout=300):
    """Start a two-worker cluster (`flags_of_worker(index)` each); returns the processes."""
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    return [
        start(
            *flags_of_worker(index),
            "--strategy=multi_worker",
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        for index in range(2)
    ]


def _stop(process):
    if process.poll() is None:
        process.kill()
    return finish(process)


def test_workers_reading_different_data_both_stop(tmp_path):
    corpus, data = _corpus(tmp_path)
    other, other_data = _corpus(tmp_path, "copy")
    (other_data / "train.src").write_text(
        "a different line\n" + (data / "train.src").read_text().split("\n", 1)[1]
    )
    processes = _cluster(
        tmp_path, lambda index: (tmp_path / "run", *(other if index else corpus), "--train_steps=2")
    )
    for index, process in enumerate(processes):
        code, output = finish(process, timeout=300)
        assert code == 1, output[-3000:]
        own = other_data if index else data
        assert errors(output) == [
            f"Worker 1 reads different data than worker 0: {own / 'train.src'} (its example "
            "count or contents differ). Every worker must read the same copy of the corpus."
        ]


def test_a_worker_that_cannot_write_stops_at_start(tmp_path):
    (tmp_path / "a_file").write_text("")
    chief, worker = _cluster(
        tmp_path, lambda index: (tmp_path / ("a_file/run" if index else "run"), "--train_steps=2")
    )
    try:
        code, output = finish(worker, timeout=300)
        assert code == 1, output[-3000:]
        assert errors(output)[0].startswith(f"Cannot write to {tmp_path}/a_file/run: "), output[
            -3000:
        ]
    finally:
        _stop(chief)  # left waiting for the other worker


def test_a_worker_waits_for_the_tokenizer_as_long_as_asked(tmp_path):
    # The second worker's directory never gets the chief's tokenizer (another directory).
    chief, worker = _cluster(
        tmp_path,
        lambda index: (
            tmp_path / ("other" if index else "run"),
            "--train_steps=2",
            "--tokenizer_wait=3",
        ),
    )
    try:
        code, output = finish(worker, timeout=300)
        assert code == 1, output[-3000:]
        assert errors(output) == [
            f"The chief did not write {tmp_path}/other/spm.model within 3 s: if it is still "
            "training the tokenizer, wait longer (--tokenizer_wait)"
        ]
    finally:
        _stop(chief)
