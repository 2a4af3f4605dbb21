"""Every public layer, a tiny Transformer, the loss and `model.fit` compute TensorFlow's results on JAX and PyTorch.

The reference run (tests/backend_harness.py) builds every layer case, the mask and
attention functions, cached decoder layers and two tiny Transformers in this process
(TensorFlow), computes the label-smoothed loss and its gradient, fits a tiny Transformer
on batches of the built-in task, and writes their weights, `.keras` files, batches and
outputs. Then ONE fresh process per other backend (`KERAS_BACKEND=jax`,
`KERAS_BACKEND=torch`) loads those weights, files and batches, computes the same outputs
and runs the backend's own checks (`.keras` save and load, `get_config`, cached decoding
against a full pass, implicit masks, dropout, the loss against its formula, and on JAX
`fit` under `keras.distribution.DataParallel` on two CPU devices against `fit` on one).
One test per output compares it with TensorFlow's (max |diff| <= 1e-5, float32; the loss
and its gradient 1e-6, fit's losses after Adam updates 1e-3, greedy and beam search's token
ids exactly, see `backend_harness`); one test per check reports it. What runs on TensorFlow
only (the training loop, sampling, the uncached and constrained searches, export and the
scripts) fails there with one line naming the backend.

Dropout is compared where backends can agree: with dropout off, and with `training=True`
and every rate 0. Its masks come from each backend's own random generator, so each
backend instead shows that a rate r drops about r of the units and scales the rest by
1 / (1 - r), that the same seed draws the same masks, and that dropout changes the model's
output.
"""

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests import backend_harness, runtimes
from tests.scripts import run_script, script_environment

HARNESS = str(Path(__file__).resolve().parent / "backend_harness.py")
BACKENDS = ("jax", "torch")
# JAX compiles every operation it runs eagerly the first time it sees its shapes (about 40
# of the JAX process's 60 s); its persistent cache, outside the repository, keeps them.
JAX_CACHE = Path.home() / ".cache" / "keras_transformer" / "jax_compilation_cache"
BACKEND_ENVIRONMENT = {
    "jax": {
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(JAX_CACHE),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    },
    "torch": {},
}
# The whole run of one backend's process (it takes well under a minute on 2 cores).
TIMEOUT_S = 600


def _load(out_dir):
    checks = json.loads((out_dir / "checks.json").read_text())
    with np.load(out_dir / "outputs.npz") as outputs:
        return {"backend": checks["backend"], "checks": checks["checks"], "outputs": dict(outputs)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The TensorFlow run, in this process: its directory and results."""
    out_dir = tmp_path_factory.mktemp("backend_tensorflow")
    backend_harness.run(out_dir)
    return out_dir, _load(out_dir)


@pytest.fixture(scope="module", params=BACKENDS)
def results(request, reference, tmp_path_factory):
    """One fresh process under `KERAS_BACKEND=<backend>` on the reference's weights: its results."""
    backend = request.param
    if importlib.util.find_spec(backend) is None:
        pytest.fail(f"{backend} is not installed: pip install -e '.[dev]' installs it")
    out_dir = tmp_path_factory.mktemp(f"backend_{backend}")
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, HARNESS, str(out_dir), str(reference[0])],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=script_environment(KERAS_BACKEND=backend, **BACKEND_ENVIRONMENT[backend]),
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    found = _load(out_dir)
    found["seconds"] = time.monotonic() - started
    found["dir"] = out_dir
    return found


def test_the_process_ran_on_its_backend(results):
    assert results["backend"] in BACKENDS


def test_no_case_raised(results, reference):
    for found in (reference[1], results):
        errors = {
            name: check["detail"]
            for name, check in found["checks"].items()
            if name.startswith("error/")
        }
        assert not errors, f"{found['backend']}: " + "\n".join(
            f"{name}: {detail}" for name, detail in errors.items()
        )


@pytest.mark.parametrize("name", backend_harness.OUTPUT_NAMES)
def test_output_equals_tensorflow(results, reference, name):
    expected = reference[1]["outputs"].get(name)
    found = results["outputs"].get(name)
    assert expected is not None, f"the TensorFlow run computed no {name} (see test_no_case_raised)"
    assert found is not None, (
        f"the {results['backend']} run computed no {name} (see test_no_case_raised)"
    )
    assert found.shape == expected.shape, (found.shape, expected.shape)
    diff = (
        float(np.max(np.abs(found.astype("float64") - expected.astype("float64"))))
        if found.size
        else 0.0
    )
    bound = backend_harness.output_atol(name)
    assert diff <= bound, (
        f"{results['backend']} {name}: max |diff| {diff:.3g} from TensorFlow (bound {bound:g})"
    )


@pytest.mark.parametrize("name", backend_harness.CHECK_NAMES)
def test_check_holds_on_the_backend(results, name):
    check = results["checks"].get(name)
    assert check is not None, (
        f"the {results['backend']} run did not check {name} (see test_no_case_raised)"
    )
    assert check["ok"], f"{results['backend']} {name}: {check['detail']}"


@pytest.mark.parametrize(
    "backend, name",
    [
        (backend, name)
        for backend, names in backend_harness.BACKEND_CHECK_NAMES.items()
        for name in names
    ],
)
def test_backend_check_holds_on_its_backend(results, backend, name):
    """A check of one backend only (DataParallel on JAX): it holds there, and no other backend records it."""
    check = results["checks"].get(name)
    if results["backend"] != backend:
        assert check is None, f"{results['backend']} recorded {name}, a check of {backend} only"
        return
    assert check is not None, f"the {backend} run did not check {name} (see test_no_case_raised)"
    assert check["ok"], f"{backend} {name}: {check['detail']}"


@pytest.mark.parametrize(
    "name", (*backend_harness.CHECK_NAMES, *backend_harness.BACKEND_CHECK_NAMES["tensorflow"])
)
def test_check_holds_on_tensorflow(reference, name):
    check = reference[1]["checks"].get(name)
    assert check is not None, f"the TensorFlow run did not check {name} (see test_no_case_raised)"
    assert check["ok"], f"tensorflow {name}: {check['detail']}"


@pytest.mark.parametrize("runtime", runtimes.selected_runtimes())
def test_weights_fit_on_the_backend_serve_its_translations_from_a_saved_model(
    results, reference, tmp_path, runtime
):
    """The weights `fit` trained on JAX or PyTorch, loaded into a TensorFlow model and exported
    with the in-graph tokenizer, answer text in / text out in a clean environment holding only
    a released model server's TensorFlow and TensorFlow Text with the n-best texts that
    backend's own beam search gave (`backend_harness.translate_fitted`)."""
    from keras_transformer import Transformer, get_preset
    from keras_transformer.data import Tokenizer
    from keras_transformer.export import TranslationModule, export_saved_model
    from tests.test_export import call_signature_in_runtime

    translated = json.loads((results["dir"] / backend_harness.FIT_TRANSLATIONS).read_text())
    sources, texts = translated["sources"], translated["texts"]
    assert len({text for row in texts for text in row}) > len(sources), (
        f"{results['backend']}'s fitted model: {texts}"
    )
    config = get_preset("tiny", **backend_harness.FIT_MODEL)
    model = Transformer(config)
    model({"source_ids": np.ones((1, 2), "int32"), "target_ids": np.ones((1, 2), "int32")})
    model.load_weights(results["dir"] / backend_harness.FIT_WEIGHTS)
    tokenizer = Tokenizer(reference[0] / "fit_spm.model")
    exported = export_saved_model(
        TranslationModule(model, tokenizer, **backend_harness.FIT_BEAM),
        tmp_path,
        "fit",
        warmup_sentences=sources[:1],
    )
    python, _, _ = runtimes.runtime_python(runtime)
    served = call_signature_in_runtime(
        python, exported.path, "translate_nbest", runtime=runtime, text=sources
    )
    assert served["translations"] == texts


def test_a_script_on_another_backend_fails_in_one_line(tmp_path):
    result = run_script(
        "translate.py",
        f"--model_dir={tmp_path}",
        check=False,
        env=script_environment(KERAS_BACKEND="jax"),
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: experiments/translate.py runs on the TensorFlow backend only, not on jax "
        "(KERAS_BACKEND=jax; see docs/backends.md)"
    )
    assert "Traceback" not in result.stderr
