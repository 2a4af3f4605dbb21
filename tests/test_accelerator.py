"""Row h (experiments/benchmark_accelerator.py): our model and the keras-hub peer on JAX or
PyTorch, timed where TensorFlow is not installed; and the packages that import without it."""

import json
import subprocess
import sys

import numpy as np
import pytest

from keras_transformer.benchmark import cpu_peak, training_flops
from keras_transformer.benchmark.accelerator import BATCHES, SETTINGS, select_batches
from keras_transformer.benchmark.backends import load_batches
from keras_transformer.models import TransformerConfig
from tests.scripts import REPO, TINY_MODEL, run_script, script_environment

# A process where importing TensorFlow (or TensorFlow Text) fails, as on a machine without them.
WITHOUT_TENSORFLOW = (
    "import sys\nfor name in ('tensorflow', 'tensorflow_text'):\n    sys.modules[name] = None\n"
)


def _batch(batch_size, source_length, target_length):
    ids = np.ones((batch_size, source_length), "int32")
    return {
        "source_ids": ids,
        "target_ids": np.ones((batch_size, target_length), "int32"),
    }, np.ones((batch_size, target_length), "int32")


def test_select_batches_keeps_the_most_common_shapes_in_order():
    a, b, c = (4, 8, 8), (2, 16, 16), (1, 32, 32)
    shapes = [c, a, b, a, b, a, c, b, a]
    batches = [_batch(*shape) for shape in shapes]
    chosen = select_batches(batches, num_shapes=2, per_shape=2)
    assert [batch[0]["target_ids"].shape for batch in chosen] == [(4, 8), (2, 16), (4, 8), (2, 16)]
    assert [id(batch) for batch in chosen] == [id(batches[index]) for index in (1, 2, 3, 4)]
    assert len(select_batches(batches, num_shapes=3, per_shape=9)) == len(batches)


def test_training_and_benchmark_packages_import_their_tensorflow_parts_when_asked():
    import keras_transformer.training as training

    assert training.Trainer.__module__ == "keras_transformer.training.trainer"
    assert training.run.__name__ == "keras_transformer.training.run"  # a submodule by its name
    with pytest.raises(
        AttributeError, match="'keras_transformer.training' has no attribute 'Trainr'"
    ):
        _ = training.Trainr


@pytest.fixture(scope="module")
def work_dir(multi30k_dir, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("row_h")
    result = run_script(
        "benchmark_accelerator.py",
        f"--work_dir={work_dir}",
        f"--data_dir={multi30k_dir}",
        "--preset=tiny",
        *(f"--{name}={value}" for name, value in {**TINY_MODEL, "vocabulary_size": 200}.items()),
        "--batch_tokens=512",
        "--num_shapes=2",
        "--per_shape=1",
        "--rounds=1",
        "--precision=mixed_bfloat16",
        "--noworkers",
    )
    assert "2 batches written" in result.stdout and "CPU flags:" in result.stdout, result.stdout
    return work_dir


def test_prepare_counts_real_target_tokens_and_their_flops(work_dir):
    settings = json.loads((work_dir / SETTINGS).read_text())
    batches = load_batches(work_dir / BATCHES)
    config = TransformerConfig.from_dict(settings["config"])
    assert len(batches) == 2 and len({labels.shape for _, labels in batches}) == 2
    for (inputs, labels), tokens, flops in zip(
        batches, settings["target_tokens"], settings["flops"]
    ):
        assert np.count_nonzero(labels == 0) > 0  # the batch has padding, which is not counted
        assert tokens == np.count_nonzero(labels)
        expected = training_flops(
            config, np.count_nonzero(inputs["source_ids"], 1), np.count_nonzero(labels, 1)
        )
        assert flops == pytest.approx(expected, rel=1e-12)


def test_row_h_times_both_models_on_jax_without_tensorflow(work_dir):
    code = WITHOUT_TENSORFLOW + (
        "from keras_transformer.benchmark.accelerator import worker\n"
        f"worker({str(work_dir)!r})\n"
        "assert sys.modules['tensorflow'] is None and sys.modules['tensorflow_text'] is None\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env=script_environment(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu"),
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "backend jax" in completed.stdout and "ours: first step on" in completed.stdout, (
        completed.stdout
    )
    settings = json.loads((work_dir / SETTINGS).read_text())
    result = json.loads((work_dir / "result_jax_mixed_bfloat16.json").read_text())
    peak = cpu_peak("bfloat16")
    assert (result["peak_dtype"], result["peak_flops_per_second"]) == (
        "bfloat16",
        peak.flops_per_second,
    )
    assert result["jit_compile"] == {"ours": True, "keras-hub": True}
    for name in ("ours", "keras-hub"):
        model = result["models"][name]
        seconds = sum(model["seconds"])
        assert len(model["seconds"]) == 2 and min(model["seconds"]) > 0
        assert model["tokens_per_second"] * seconds == pytest.approx(
            sum(settings["target_tokens"]), rel=1e-9
        )
        assert model["mfu"] * seconds * peak.flops_per_second == pytest.approx(
            sum(settings["flops"]), rel=1e-9
        )
