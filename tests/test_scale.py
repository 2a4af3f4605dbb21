"""Training at scale on two CPU replicas: one decision for all replicas, dropout per replica, resume.

One process runs every case of tests/scale_harness.py (the CPU split into two logical
devices before TensorFlow starts); the tests read its records.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.scale_harness import CASES, OVERFLOW_RUNS, SKIP_PRECISIONS
from tests.scripts import script_environment
from tests.test_dropout import correlation, keep_probability, z_of_dispersion

HARNESS = str(Path(__file__).resolve().parent / "scale_harness.py")


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """`{case: record}`; `KT_SCALE_CASES=a,b` runs only those cases (for a quick rerun of one test)."""
    out_dir = tmp_path_factory.mktemp("scale")
    cases = os.environ.get("KT_SCALE_CASES", ",".join(CASES)).split(",")
    process = subprocess.run(
        [sys.executable, HARNESS, str(out_dir), *cases],
        capture_output=True,
        text=True,
        timeout=2400,  # one process runs every case, on a machine others may share
        env=script_environment(),
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    found = {}
    for case in cases:
        found[case] = json.loads((out_dir / f"{case}.json").read_text())
        for name, key in ((f"{case}.npy", "weights"), (f"{case}.by_hand.npy", "by_hand_weights")):
            if (out_dir / name).exists():
                found[case][key] = np.load(out_dir / name)
    return found


@pytest.mark.parametrize("case", ["loop_split_3_5", "loop_split_0_8"])
def test_uneven_and_empty_replica_batches_make_the_one_device_updates(records, case):
    reference = records["loop_split_reference"]
    assert records[case]["step"] == reference["step"] == 2
    assert records[case]["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    np.testing.assert_allclose(records[case]["weights"], reference["weights"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("precision, accum", OVERFLOW_RUNS)
def test_a_nonfinite_gradient_on_the_second_replica_only_is_never_applied(
    records, precision, accum
):
    overflow, reference = (
        records[f"overflow_{precision}_accum{accum}"],
        records[f"reference_{precision}_accum{accum}"],
    )
    assert overflow["step"] == reference["step"] == 2  # the dropped update is not a step
    assert overflow["skipped"] == 1 and reference["skipped"] == 0
    assert np.isfinite(overflow["weights"]).all()
    # The updates of a run that never saw the bad batch: exactly in float32; under float16 the
    # loss scales differ by a power of two, which float16 kernels with AVX-512 (not with AVX2)
    # round differently, by up to 2e-7 seen.
    np.testing.assert_allclose(
        overflow["weights"],
        reference["weights"],
        rtol=0,
        atol=1e-6 if precision == "mixed_float16" else 0,
    )
    if precision == "mixed_float16":
        assert (
            overflow["loss_scale"] == reference["loss_scale"] / 2
        )  # lowered once, for every replica


def test_consecutive_skips_stop_naming_the_step_and_the_scale(records):
    record = records["consecutive_skips"]
    assert record["error"] == (
        "Training diverged: 3 updates in a row skipped for non-finite values, attempting step 1, loss scale 32 "
        "(max_consecutive_skips=3). The last good checkpoint is None."
    )
    assert (
        record["step"] == 0
        and record["skipped"] == 3
        and record["loss_scale"] == 32.0
        and record["finite"]
    )


def test_replicas_draw_different_dropout_masks_and_reruns_the_same(records):
    assert records["dropout"]["replicas_max_diff"] > 0.1
    assert records["dropout"]["rerun_max_diff"] == 0.0


def test_over_a_run_each_replica_draws_its_own_masks_at_the_rate(records):
    masks = records["dropout_masks"]["weights"]  # dropout_masks.npy: (steps, replicas, units)
    p = keep_probability(0.3)
    for replica in (0, 1):
        assert abs(masks[:, replica].mean() - p) < 5 * np.sqrt(p * (1 - p) / masks[:, replica].size)
    # The replicas' masks are uncorrelated at one step, and across neighbouring steps (a replica
    # offset that equalled a few of the generator's steps would repeat the other's masks there).
    for shift in (0, 1, 2):
        for first, second in ((0, 1), (1, 0)):
            r, bound = correlation(masks[shift:, first], masks[: len(masks) - shift, second])
            assert abs(r) < bound, (shift, first, second, r)
    # Over the run, each unit is kept as often as independent draws keep it, on both replicas.
    assert abs(z_of_dispersion(masks.reshape(-1, masks.shape[-1]), p)) < 5


def test_resumed_run_with_dropout_on_two_replicas_equals_the_uninterrupted_one(records):
    once, split, rerun = records["resume_once"], records["resume_split"], records["resume_rerun"]
    assert once["epochs"] > 1.5  # the resumes fall before and after an epoch boundary
    assert once["batches_drawn"] == split["batches_drawn"] == 2 * 6
    np.testing.assert_array_equal(rerun["weights"], once["weights"])  # the same seed, the same run
    np.testing.assert_allclose(split["weights"], once["weights"], rtol=0, atol=1e-6)
    assert (
        np.abs(once["weights"] - records["resume_changed_reference"]["weights"]).max() > 1e-3
    )  # dropout acts


def test_resume_with_other_replicas_and_accumulation_continues_at_the_same_examples(records):
    changed, reference = records["resume_changed"], records["resume_changed_reference"]
    assert changed["batches_drawn"] == reference["batches_drawn"] == 12
    np.testing.assert_allclose(changed["weights"], reference["weights"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", [case for case in CASES if case.startswith("fit_overflow")])
def test_fit_never_applies_a_nonfinite_gradient_of_either_replica(records, case):
    overflow, reference = records[case], records[case.replace("fit_overflow", "fit_reference")]
    assert np.isfinite(overflow["weights"]).all()
    assert overflow["iterations"] == reference["iterations"]  # the skipped update is not counted
    # Under float16 the reference's gradients, at twice the scale, round a little differently:
    # up to 1e-4 seen with AVX2, 1.6e-4 with AVX-512.
    np.testing.assert_allclose(
        overflow["weights"], reference["weights"], rtol=0, atol=5e-4 if "float16" in case else 0
    )
    if "float16" in case:
        assert overflow["loss_scale"] == reference["loss_scale"] / 2


@pytest.mark.parametrize("case", ["fit_split_2_1", "fit_split_1_0"])
def test_fit_reports_the_token_weighted_loss_for_any_split_of_the_last_batch(records, case):
    record = records[case]  # on two replicas; `expected_*`: the definition on one device
    assert record["loss"] == pytest.approx(record["expected_loss"], rel=1e-5)
    assert record["evaluate"] == pytest.approx(record["expected_evaluate"], rel=1e-5)
    np.testing.assert_allclose(record["weights"], record["by_hand_weights"], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "case", ["fit_reference_float32_accum2", "fit_reference_float32_accum2_one_device"]
)
def test_fit_accumulates_on_two_replicas_and_one_device_as_keras_does_on_one_device(records, case):
    np.testing.assert_allclose(
        records[case]["weights"], records["fit_accumulation_by_hand"]["weights"], rtol=0, atol=1e-6
    )
    assert records[case]["iterations"] == 2


@pytest.mark.parametrize("precision", SKIP_PRECISIONS)
def test_the_loop_and_fit_skip_the_same_update_and_then_make_the_same_updates(records, precision):
    loop, fit = records[f"skip_loop_{precision}"], records[f"skip_fit_{precision}"]
    # The update whose second micro-batch is non-finite on the second replica is skipped whole,
    # once, by both paths: the first and third updates are applied, and nothing of the second.
    assert loop["step"] == fit["iterations"] == 2 and loop["skipped"] == 1
    assert np.isfinite(fit["weights"]).all()
    if precision == "float32":
        np.testing.assert_array_equal(loop["weights"], records["skip_reference_float32"]["weights"])
    else:  # the scale lowered once by both, from the 2**8 the harness starts at
        assert loop["loss_scale"] == fit["loss_scale"] == 2.0**7
    # Under float16, fit's gradients of each micro-batch's mean (the loop's: of the update's sum)
    # round differently.
    np.testing.assert_allclose(
        fit["weights"], loop["weights"], rtol=0, atol=5e-4 if precision == "mixed_float16" else 1e-6
    )
