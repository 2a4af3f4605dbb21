"""One update, however it is computed: the equivalence matrix of the training paths.

Every path trains the same tiny model three steps on the same global batches (see
tests/equivalence_harness.py) with SGD and with Adam (with attention windows, with SGD),
and must report the same loss and make the same updates as the reference: a plain
`tf.GradientTape` step on the whole global batch on one device, the paper's per-token
normalisation written out. SGD makes the update proportional to the gradient, so a gradient
scaled or normalised by the wrong token count shows in the weight deltas; Adam checks the
optimizer state's path.

Two processes run the harness: one for the single-process paths (two logical CPU
devices for `MirroredStrategy`), and a two-worker `MultiWorkerMirroredStrategy` cluster
on localhost for the multi-worker loop. The `_skip` paths see one more global batch, one
of whose halves has a NaN gradient under a finite loss: every replica (worker) must drop
that update, though only one of them saw the NaN, and go on as the reference.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.scripts import script_environment
from tests.test_faults import free_ports

HARNESS = str(Path(__file__).resolve().parent / "equivalence_harness.py")
SINGLE_PROCESS_PATHS = (
    "reference",
    "loop_default",
    "loop_mirrored",
    "loop_accumulate",
    "fit_default",
    "fit_mirrored",
    "loop_mirrored_skip",
)
CLUSTER_PATHS = ("loop_multi_worker", "loop_multi_worker_skip")
PATHS = SINGLE_PROCESS_PATHS[1:] + CLUSTER_PATHS
OPTIMIZERS = ("sgd", "adam")
LOSS_RTOL = 1e-5
# SGD moves weights by up to ~0.13 per step here, Adam by its learning rate 1e-2.
# Adam divides by the root of its second moment, which turns the rounding noise of
# gradients that are zero in exact arithmetic (the key biases') into moves of ~1e-5.
WEIGHT_ATOL = {"sgd": 1e-6, "adam": 5e-5}


def _run(args, env=None):
    return subprocess.Popen(
        [sys.executable, HARNESS, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=script_environment(**(env or {})),
    )


def _run_cluster(out_dir, *paths):
    """Two local workers of a `MultiWorkerMirroredStrategy` cluster running `paths`: their outputs."""
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    workers = [
        _run(
            [str(out_dir), *paths],
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": index}}
                )
            },
        )
        for index in range(2)
    ]
    return [(worker.communicate(timeout=900)[0], worker.returncode) for worker in workers]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """`{(path, optimizer): npz}` of every path, from the real harness processes."""
    out_dir = tmp_path_factory.mktemp("equivalence")
    single = _run([str(out_dir / "single"), *SINGLE_PROCESS_PATHS])
    output, _ = single.communicate(timeout=900)
    assert single.returncode == 0, output[-4000:]
    for output, returncode in _run_cluster(out_dir / "multi_worker", *CLUSTER_PATHS):
        assert returncode == 0, output[-4000:]
    found = {}
    for path in ("reference", *PATHS):
        for optimizer in OPTIMIZERS:
            directory = out_dir / ("multi_worker" if path in CLUSTER_PATHS else "single")
            found[path, optimizer] = np.load(directory / f"{path}_{optimizer}.npz")
    return found


WINDOWED_PATHS = ("loop_mirrored", "fit_mirrored")


@pytest.fixture(scope="module")
def windowed_records(tmp_path_factory):
    """`{path: npz}` of a model with self-attention windows of 2 positions (sentences of 8-9),
    trained by SGD: the window changes the gradients, which SGD's updates show; how an
    optimizer's state follows the gradients does not depend on the window (`records` checks Adam)."""
    out_dir = tmp_path_factory.mktemp("equivalence_windowed")
    process = _run(
        [str(out_dir), "reference", *WINDOWED_PATHS],
        {"EQUIVALENCE_ATTENTION_WINDOW": "2", "EQUIVALENCE_OPTIMIZERS": "sgd"},
    )
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output[-4000:]
    return {path: np.load(out_dir / f"{path}_sgd.npz") for path in ("reference", *WINDOWED_PATHS)}


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("path", PATHS)
def test_path_makes_the_reference_updates(records, path, optimizer):
    _check_updates(records["reference", optimizer], records[path, optimizer], path, optimizer)


@pytest.mark.parametrize("path", WINDOWED_PATHS)
def test_windowed_attention_under_mirrored_makes_the_reference_updates(
    windowed_records, records, path
):
    reference = windowed_records["reference"]
    assert not np.allclose(
        reference["losses"], records["reference", "sgd"]["losses"], rtol=1e-3
    )  # a window changes the model
    _check_updates(reference, windowed_records[path], path, "sgd")


def _check_updates(reference, record, path, optimizer):
    np.testing.assert_array_equal(record["weights"][0], reference["weights"][0])  # the same start
    np.testing.assert_allclose(
        record["losses"], reference["losses"], rtol=LOSS_RTOL, err_msg="reported losses"
    )
    updates, reference_updates = (
        np.diff(record["weights"], axis=0),
        np.diff(reference["weights"], axis=0),
    )
    assert (
        np.abs(reference_updates).max(axis=1).min() > 100 * WEIGHT_ATOL[optimizer]
    )  # every step moves
    np.testing.assert_allclose(
        updates, reference_updates, rtol=0, atol=WEIGHT_ATOL[optimizer], err_msg="updates"
    )
    np.testing.assert_allclose(
        record["weights"][-1],
        reference["weights"][-1],
        rtol=0,
        atol=WEIGHT_ATOL[optimizer],
        err_msg="weights after 3 steps",
    )
    if "skipped" in record.files:  # the custom loop counts dropped updates
        assert int(record["skipped"]) == (1 if path.endswith("_skip") else 0)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("path", ["fit_default", "fit_mirrored"])
def test_fit_evaluate_reports_the_reference_loss(records, path, optimizer):
    np.testing.assert_allclose(
        float(records[path, optimizer]["evaluate"]),
        float(records["reference", optimizer]["evaluate"]),
        rtol=LOSS_RTOL,
    )


def test_the_halves_hold_different_numbers_of_tokens(records):
    for counts in records["reference", "sgd"]["half_tokens"]:
        assert counts[0] > 2 * counts[1], counts


def test_keras_fit_under_multi_worker_fails_as_documented(tmp_path):
    """docs/distributed.md sends multi-machine users to the custom loop because of this.

    If it fails because Keras now trains there, add `fit_multi_worker` to `PATHS` and
    rewrite the docs' section on `model.fit` across machines.
    """
    for output, returncode in _run_cluster(tmp_path, "fit_multi_worker"):
        assert returncode == 3, output[-4000:]
        unsupported = json.loads(output.strip().splitlines()[-1])["unsupported"]
        assert unsupported.startswith("Attempt to convert a value ({'source_ids': PerReplica:{"), (
            unsupported
        )
