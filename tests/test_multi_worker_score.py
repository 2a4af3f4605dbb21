"""`--score_every` under a two-worker `MultiWorkerMirroredStrategy` cluster on localhost: both
workers decode, take the chief's figures (`trainer._chief_values`) and log the same scores at the
same steps, and neither waits for the other beyond the decode (the run ends within a timeout)."""

import json
import re

from keras_transformer import runs
from tests.scripts import seed_tokenizer
from tests.test_faults import finish, free_ports, start

# The trainer's line for each scored evaluation: step, figures, best and patience count.
SCORE_LINE = re.compile(r"\] (step (\d+) bleu \S+ chrf \S+ \(best .*\) )in [\d.]+ s$")


def score_lines(output):
    """`{step: the score line without its time}` of a worker's log."""
    lines = {}
    for line in output.splitlines():
        match = SCORE_LINE.search(line)
        if match:
            lines[int(match.group(2))] = match.group(1)
    return lines


def test_two_workers_log_the_chiefs_scores_at_the_same_steps(tmp_path, tiny_tokenizer):
    run_dir = seed_tokenizer(tmp_path / "run", tiny_tokenizer)
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    processes = [
        start(
            run_dir,
            "--strategy=multi_worker",
            "--train_steps=4",
            "--score_every=2",
            "--score_sentences=4",
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        for index in range(2)
    ]
    try:
        results = [finish(process, timeout=300) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:  # a worker left waiting in a collective: not after this test
                process.kill()
    for code, output in results:
        assert code == 0, output[-4000:]
        assert "Trained to step 4" in output and "Traceback" not in output
    chief, other = (score_lines(output) for _, output in results)
    records = runs.read_scores(run_dir)
    assert [record["step"] for record in records] == sorted(chief) == [2, 4]
    for record in records:
        values = " ".join(f"{name} {value:.2f}" for name, value in record["values"].items())
        assert chief[record["step"]].startswith(f"step {record['step']} {values} (best "), record
    assert other == chief
    best = runs.read_best(run_dir)
    assert (best["step"], best["score"]) in {(r["step"], r["score"]) for r in records}
    # Only the chief keeps the best checkpoint; the other worker's copy was removed.
    assert sorted(path.name for path in (run_dir / "best").iterdir()) == [
        "best.json",
        f"ckpt-{best['step']}.data-00000-of-00001",
        f"ckpt-{best['step']}.index",
    ]
