"""Every layer case, and a whole Transformer, served from a SavedModel in a fresh process.

The module fixture wraps each `LAYER_CASES` row (and a tiny `Transformer`) in a functional
model, exports it with `model.export(..., format="tf_saved_model")`, and stores its inputs
and outputs in a `.npz`. Then ONE separate Python process, which imports TensorFlow and
never keras_transformer, loads every SavedModel, calls its serving signature and reports
the largest absolute difference per case; one test per case checks it.
"""

import fcntl
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_transformer import Transformer, get_preset, layers
from tests.layer_test_case import LAYER_CASES, functional_model

MAX_ABS_DIFF = 1e-5
TRANSFORMER_CASE = "transformer"

# Runs in the separate process: TensorFlow only. A meta-path hook makes any import of
# keras_transformer fail, and the result records that it never got imported.
SERVE_SCRIPT = r"""
import json
import pathlib
import sys


class RefuseToolkit:
    def find_spec(self, name, path=None, target=None):
        if name == "keras_transformer" or name.startswith("keras_transformer."):
            raise ImportError("the serving process must not import " + name)
        return None


sys.meta_path.insert(0, RefuseToolkit())

import numpy as np
import tensorflow as tf

root = pathlib.Path(sys.argv[1])
differences = {}
for name in json.loads((root / "cases.json").read_text()):
    data = np.load(root / (name + ".npz"))
    serve = tf.saved_model.load(str(root / name)).signatures["serving_default"]
    inputs = {key[len("input_"):]: tf.constant(data[key]) for key in data.files if key.startswith("input_")}
    (output,) = serve(**inputs).values()
    difference = np.abs(output.numpy().astype("float64") - data["expected"].astype("float64"))
    differences[name] = float(difference.max()) if output.shape == data["expected"].shape else float("inf")
result = {"differences": differences, "imported_toolkit": "keras_transformer" in sys.modules}
(root / "result.json").write_text(json.dumps(result))
"""


def _export(model, inputs, directory, name):
    expected = np.asarray(model(inputs))
    if not isinstance(inputs, dict):
        inputs = {"inputs": inputs}
    np.savez(
        directory / f"{name}.npz",
        expected=expected,
        **{f"input_{key}": value for key, value in inputs.items()},
    )
    model.export(str(directory / name), format="tf_saved_model", verbose=False)


def _export_and_serve(directory):
    directory.mkdir(parents=True, exist_ok=True)
    for name, case in LAYER_CASES.items():
        inputs = case.inputs()
        _export(
            functional_model(case.layer_cls(**case.init_kwargs), inputs, case.call_kwargs),
            inputs,
            directory,
            name,
        )
    config = get_preset(
        "tiny",
        vocabulary_size=31,
        num_encoder_layers=1,
        num_decoder_layers=1,
        hidden_dim=16,
        intermediate_dim=32,
        num_heads=2,
        max_length=16,
    )
    inputs = {
        "source_ids": np.array([[5, 6, 7, 8], [9, 10, 0, 0]], "int32"),
        "target_ids": np.array([[1, 11, 12], [1, 13, 0]], "int32"),
    }
    _export(Transformer(config), inputs, directory, TRANSFORMER_CASE)
    (directory / "cases.json").write_text(json.dumps([*LAYER_CASES, TRANSFORMER_CASE]))

    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    completed = subprocess.run(
        [sys.executable, "-c", SERVE_SCRIPT, str(directory)],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads((directory / "result.json").read_text())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`{"differences": {case: max abs diff}, "imported_toolkit": bool}`, computed once per run.

    Under pytest-xdist the workers share one result through the session's temporary
    directory (a file lock makes the first worker compute it, the others read it).
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return _export_and_serve(tmp_path_factory.mktemp("saved_models"))
    shared = tmp_path_factory.getbasetemp().parent / "layers_saved_model"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = shared / "result.json"
        if not result.exists():
            _export_and_serve(shared)
    return json.loads(result.read_text())


def test_serving_process_did_not_import_the_toolkit(served):
    assert served["imported_toolkit"] is False
    assert set(served["differences"]) == {*LAYER_CASES, TRANSFORMER_CASE}


@pytest.mark.parametrize("name", [*LAYER_CASES, TRANSFORMER_CASE])
def test_saved_model_outputs_equal_keras_outputs(served, name):
    assert served["differences"][name] < MAX_ABS_DIFF


def test_layer_cases_cover_every_public_layer():
    public = {
        getattr(layers, name) for name in layers.__all__ if isinstance(getattr(layers, name), type)
    }
    assert {case.layer_cls for case in LAYER_CASES.values()} == public
    assert {"shared_embedding", "shared_embedding_reverse"} <= set(LAYER_CASES)
    assert {
        "encoder_block_post_ln",
        "encoder_block_pre_ln",
        "decoder_block_post_ln",
        "decoder_block_pre_ln",
    } <= set(LAYER_CASES)
