"""The SavedModel export: script, layout, signatures in a clean process, bad input, atomicity, ops.

Three real processes besides pytest, each run once per module:

* `experiments/export.py` on the `trained_run` fixture writes `saved_models/numbers/1`
  (the export every other test reads);
* ONE clean process loads it with TensorFlow alone (Keras and keras_transformer cannot be
  imported there; TensorFlow Text's SentencePiece kernels are loaded as TF Serving links
  them), calls every signature on the normal and the bad inputs, then loads the int8
  export of the same weights (`model.quantize("int8")`, exported in this process) and
  translates with it, and writes the results to a JSON file that the tests below compare
  with in-library decoding;
* `saved_model_cli show --all` lists the signatures.

The op allowlist check starts one more (TensorFlow-only) process to read the op registry.
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data.builtin_task import builtin_task
from keras_transformer.data.sources import load_pairs
from keras_transformer.decoding import SavedModelTranslator, make_search_fn
from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.text import decode_text, encode_source, translate
from keras_transformer.export import (
    SIGNATURES,
    ExportError,
    TranslationModule,
    assert_servable_ops,
    check_saved_model_ops,
    export_saved_model,
    list_versions,
    read_warmup_requests,
    serving,
)
from keras_transformer.export import translator as translator_module
from keras_transformer.export.ops_check import TENSORFLOW_ONLY_PRELUDE
from keras_transformer.training import load_run
from tests import runtimes
from tests.scripts import run_script

REPO = Path(__file__).resolve().parents[1]
NAME = "numbers"
BEAM = dict(beam_size=4, length_penalty=0.6, max_output_offset=50)
SCORE_TOLERANCE = 1e-4

SENTENCES = [text for text, _ in builtin_task("test")[:5]] + ["one", "Zwölf Äpfel, bitte!"]
LONG_TEXT = ("nine hundred ninety nine thousand " * 300)[:10_000]
INVALID_UTF8 = b"seven \xff\xfe hundred \xc3"
# The bad inputs, alone and in one batch of very different lengths.
ODD_INPUTS = [b"", b"   \t ", LONG_TEXT.encode(), INVALID_UTF8, b"one", SENTENCES[0].encode()]


def _env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}


def _b64(strings):
    return [base64.b64encode(s).decode("ascii") for s in strings]


def _unb64(strings):
    return [base64.b64decode(s) for s in strings]


# --- the export, made by the script ---


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory):
    """`experiments/export.py` run once: (stdout, version directory); its progress lines are on stderr."""
    export_dir = tmp_path_factory.mktemp("saved_models")
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "experiments" / "export.py"),
            f"--model_dir={trained_run}",
            f"--export_dir={export_dir}",
            f"--name={NAME}",
            "--beam_size=4",
            "--length_penalty=0.6",
            "--max_output_offset=50",
            "--warmup_sentences=twenty one",
            "--warmup_sentences=",
            f"--warmup_sentences={SENTENCES[1]}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=_env(),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    steps = [line for line in result.stderr.splitlines() if line.startswith("... ")]
    assert steps == [
        f"... Loading {trained_run}",
        "... Tracing the 5 signatures and saving the SavedModel",
        "... Writing the warmup requests",
        "... Loading the copy and replaying the 6 warmup requests through it",
        "... Checking the ops against the model server's",
    ], result.stderr[-3000:]
    # Its two loads of the export (the check, the sample) print no warning per function that
    # the export's custom gradients were not saved (`decoding.translator.load_export`).
    assert "unsaved custom gradients" not in result.stderr, result.stderr[-3000:]
    return result.stdout, export_dir / NAME / "1"


def test_export_script_prints_path_signatures_and_a_loaded_sample(exported):
    stdout, version_dir = exported
    assert f"Exported {version_dir}" in stdout
    assert (
        "serving_default(text: string [None]) -> score: float32 [None], translation: string [None]"
        in stdout
    )
    assert (
        "translate(text: string [None]) -> score: float32 [None], translation: string [None]"
        in stdout
    )
    assert (
        "translate_ids(source_ids: int32 [None, None]) -> scores: float32 [None], token_ids: int32 [None, None]"
        in stdout
    )
    assert (
        "score(source: string [None], target: string [None]) -> log_probability: float32 [None]"
        in stdout
    )
    assert (
        "translate_nbest(text: string [None]) -> scores: float32 [None, 4], translations: string [None, 4]"
        in stdout
    )
    sample = load_pairs("builtin", "val")[0][0]  # the run's validation split
    assert f"Sample (loaded export): {sample!r} -> '" in stdout
    # The commands that serve this model and ask it for the sample's translation.
    docker_run, curl = stdout.split("Serve it with TF Serving, then ask it (docs/serving.md):\n")[
        1
    ].splitlines()
    assert docker_run == (
        f"  docker run --rm -p 8500:8500 -p 8501:8501 --mount type=bind,source={version_dir.parent},"
        f"target=/models/{NAME} -e MODEL_NAME={NAME} tensorflow/serving:2.20.0"
    )
    assert (
        curl
        == f'  curl -X POST http://localhost:8501/v1/models/{NAME}:predict -d \'{{"instances": ["{sample}"]}}\''
    )
    assert (
        "beam_size=4, length_penalty=0.6, max_output_offset=50, max_output_length=98, max_source_length=48"
        in stdout
    )


def test_loading_an_export_drops_only_the_warning_about_its_unsaved_gradients(exported, caplog):
    """TensorFlow warns, for each function of an export, that its custom gradients were not
    saved, which the export leaves out on purpose; `load_export` drops that warning, and only
    while it loads."""
    import logging

    from keras_transformer.decoding.translator import load_export

    version_dir = str(exported[1])

    def unsaved_gradient_warnings(load):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="absl"):
            load(version_dir)
        return [r for r in caplog.records if "unsaved custom gradients" in r.getMessage()]

    assert len(unsaved_gradient_warnings(tf.saved_model.load)) >= 5  # one per signature at least
    assert unsaved_gradient_warnings(load_export) == []
    assert unsaved_gradient_warnings(SavedModelTranslator) == []
    assert unsaved_gradient_warnings(tf.saved_model.load)  # the filter left with the load


def test_export_takes_search_settings_from_the_run_unless_a_flag_overrides_them(
    trained_run, tmp_path
):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    config["model"].update(beam_size=2, length_penalty=1.0, max_output_offset=20)
    (run_dir / "config.json").write_text(json.dumps(config))
    result = run_script(
        "export.py",
        f"--model_dir={run_dir}",
        f"--export_dir={tmp_path / 'exports'}",
        "--name=settings",
        "--max_output_offset=10",
        "--nocheck_ops",
        "--warmup_sentences=one",
    )
    assert (
        "Settings: beam_size=2, length_penalty=1.0, max_output_offset=10, max_output_length=58,"
        in result.stdout
    )
    assert (
        "translate_nbest(text: string [None]) -> scores: float32 [None, 2], translations: string [None, 2]"
        in result.stdout
    )


def test_version_layout_asset_warmup_and_model_config(exported, trained_run):
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    _, version_dir = exported
    model_root = version_dir.parent
    assert sorted(entry.name for entry in model_root.iterdir()) == [
        "1",
        "models.config",
    ]  # no .tmp-* left
    assert (version_dir / "saved_model.pb").is_file() and (
        version_dir / "variables" / "variables.index"
    ).is_file()
    # The SentencePiece model is an asset of the SavedModel.
    assert (version_dir / "assets" / "spm.model").read_bytes() == (
        Path(trained_run) / "spm.model"
    ).read_bytes()
    # Warmup: PredictionLog records for every signature, parsed back from the TFRecord file.
    logs = read_warmup_requests(version_dir)
    requests = [log.predict_log.request for log in logs]
    assert [r.model_spec.signature_name for r in requests] == [
        "serving_default",
        "serving_default",
        "translate",
        "translate_ids",
        "translate_nbest",
        "score",
    ]
    assert all(r.model_spec.name == NAME for r in requests)
    assert tf.make_ndarray(requests[1].inputs["text"]).tolist() == [
        b"twenty one",
        b"",
        SENTENCES[1].encode(),
    ]
    assert tf.make_ndarray(requests[3].inputs["source_ids"]).dtype == np.int32
    # An example TF Serving model config beside the versions.
    config = text_format.Parse(
        (model_root / "models.config").read_text(), model_server_config_pb2.ModelServerConfig()
    )
    (entry,) = config.model_config_list.config
    assert (entry.name, entry.base_path, entry.model_platform) == (
        NAME,
        f"/models/{NAME}",
        "tensorflow",
    )
    info = json.loads((version_dir / "assets.extra" / "export_info.json").read_text())
    assert info["settings"]["max_output_length"] == 98 and info["vocabulary_size"] == 128


def test_evaluate_scores_an_export_on_the_corpus_of_its_run(
    exported, trained_run, tmp_path, multi30k_dir
):
    """export.py records the run's corpus in export_info.json; evaluate.py --saved_model scores
    an export whose run translated EN→FR on Multi30k on the French references with no corpus
    flag given (the defaults are builtin and EN→DE), and refuses `--tgt_lang=de`."""
    from keras_transformer.runs import read_run_config
    from tests.test_experiments_decode import assert_scored_on_french_and_german_refused

    _, version_dir = exported
    info_file = Path("assets.extra") / "export_info.json"
    info = json.loads((version_dir / info_file).read_text())
    assert info["data"] == read_run_config(trained_run)[1]["data"]
    copy = tmp_path / NAME / "1"
    shutil.copytree(version_dir, copy)
    info["data"].update(dataset="multi30k", tgt_lang="fr", data_dir=str(multi30k_dir))
    (copy / info_file).write_text(json.dumps(info))
    assert_scored_on_french_and_german_refused(  # a model root: its version 1
        f"--saved_model={copy.parent}",
        multi30k_dir,
        f"{copy} translates en→fr (its export_info.json)",
    )


def test_saved_model_cli_lists_the_signatures(exported):
    _, version_dir = exported
    cli = Path(sys.executable).parent / "saved_model_cli"
    result = subprocess.run(
        [str(cli), "show", "--all", "--dir", str(version_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("serving_default", "translate", "translate_ids", "translate_nbest", "score"):
        assert f"signature_def['{name}']" in result.stdout
    for tensor in (
        "inputs['text']",
        "inputs['source_ids']",
        "inputs['source']",
        "inputs['target']",
        "outputs['translation']",
        "outputs['score']",
        "outputs['token_ids']",
        "outputs['scores']",
        "outputs['log_probability']",
        "outputs['translations']",
    ):
        assert tensor in result.stdout


# --- the op allowlist ---


def test_every_op_is_core_tensorflow_or_sentencepiece(exported):
    _, version_dir = exported
    report = check_saved_model_ops(version_dir)
    print(report.summary())
    assert report.ok, report.summary()
    groups = report.by_origin()
    assert set(groups) == {"tensorflow", "tensorflow_text"}
    assert set(groups["tensorflow_text"]) == {
        "SentencepieceOp",
        "SentencepieceTokenizeOp",
        "SentencepieceDetokenizeOp",
    }
    assert {"While", "TopKV2", "UnicodeTranscode", "EnsureShape", "ScatterNd"} <= set(
        groups["tensorflow"]
    )


def test_every_op_is_registered_in_the_loading_runtime(exported, loader_python):
    _, version_dir = exported
    python, runtime = loader_python
    report = check_saved_model_ops(version_dir, python=python)
    assert report.ok, report.summary()
    if runtime != "exporting":
        assert (
            report.runtime.startswith(f"tensorflow {runtime}.")
            and f"tensorflow-text {runtime}." in report.runtime
        )


def test_ops_check_flags_python_and_custom_ops(tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    class PythonOp(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def __call__(self, x):
            return tf.py_function(lambda v: v * 2, [x], tf.float32)

    directory = tmp_path / "python_op"
    tf.saved_model.save(PythonOp(), str(directory))
    # Turn one node into an op that no library registers, as a custom op would appear.
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((directory / "saved_model.pb").read_bytes())
    library = proto.meta_graphs[0].graph_def.library
    function = next(
        f for f in library.function if any(node.op == "EagerPyFunc" for node in f.node_def)
    )
    next(node for node in function.node_def if node.op != "EagerPyFunc").op = "MyCustomOp"
    # And one node of the main graph into an XLA-only op (what `ops.slice_update` emits).
    next(
        node for node in proto.meta_graphs[0].graph_def.node if node.op == "Const"
    ).op = "XlaDynamicUpdateSlice"
    (directory / "saved_model.pb").write_bytes(proto.SerializeToString())

    report = check_saved_model_ops(directory)
    assert not report.ok
    assert report.origins["EagerPyFunc"] == "python"
    assert report.origins["MyCustomOp"] == "unregistered"
    assert report.origins["XlaDynamicUpdateSlice"] == "xla"
    assert report.origins["Identity"] == "tensorflow"
    assert report.disallowed == ["EagerPyFunc", "MyCustomOp", "XlaDynamicUpdateSlice"]
    expected = (
        "EagerPyFunc \\(python\\), MyCustomOp \\(unregistered\\), XlaDynamicUpdateSlice \\(xla\\)"
    )
    with pytest.raises(
        ValueError,
        match=f"model server of tensorflow {tf.__version__}, tensorflow-text .*: {expected}",
    ):
        assert_servable_ops(directory)


@pytest.fixture(scope="module")
def windowed_export(run_objects, tmp_path_factory):
    """The trained weights with `attention_window=3`, exported once in this process (ops checked; the test
    loads the copy instead of replaying warmup requests)."""
    import dataclasses

    from keras_transformer import Transformer

    model, tokenizer, config = run_objects
    windowed = Transformer(dataclasses.replace(config, attention_window=3))
    windowed.set_weights(model.get_weights())
    translator = TranslationModule(
        windowed, tokenizer, beam_size=4, length_penalty=0.6, max_output_offset=10
    )
    searches = []
    with pytest.MonkeyPatch.context() as patch:  # counts the beam searches the export traces
        patch.setattr(
            translator_module,
            "beam_search",
            lambda *args, **kwargs: (
                searches.append(kwargs["num_return"]) or beam_search(*args, **kwargs)
            ),
        )
        result = export_saved_model(
            translator,
            tmp_path_factory.mktemp("windowed"),
            "windowed",
            warmup_sentences=["twenty one"],
            verify=False,
        )
    traces = {
        method: getattr(translator, method).experimental_get_tracing_count()
        for method in (*SIGNATURES.values(), "_best")
    }
    return windowed, tokenizer, translator, result, (traces, searches)


def test_the_export_traces_each_function_once_and_the_search_once_per_width(windowed_export):
    """A concrete function traced before `tf.saved_model.save` is keyed outside its save context, and
    the save traced every function again. `translate` and `translate_ids` share one search (`_best`);
    `translate_nbest` returns K hypotheses, a search of its own."""
    traces, searches = windowed_export[-1]
    assert traces == {method: 1 for method in (*SIGNATURES.values(), "_best")}, traces
    assert sorted(searches) == [1, 4], searches


def test_a_windowed_model_exports_with_servable_ops_and_decodes_as_the_full_pass(
    windowed_export, loader_python
):
    """A windowed decoder's ring-buffer cache passes the op allowlist of every loading runtime, and the
    export loaded there (a clean process: TensorFlow and TensorFlow Text only) decodes as the full pass."""
    from keras_transformer.decoding import recompute_beam_search

    windowed, tokenizer, translator, result, _ = windowed_export
    python, runtime = loader_python
    # The export checked the ops against this TensorFlow's registry before publishing.
    report = (
        result.ops if runtime == "exporting" else check_saved_model_ops(result.path, python=python)
    )
    assert report.ok, report.summary()
    source_ids = encode_source(tokenizer, tf.constant(SENTENCES[:3]), translator.max_source_length)
    full_ids, full_scores = recompute_beam_search(
        windowed, source_ids, beam_size=4, length_penalty=0.6, max_output_offset=10
    )  # the export's buffer: S + offset
    outputs = call_signature_in_runtime(
        python,
        result.path,
        "translate_ids",
        runtime=None if runtime == "exporting" else runtime,
        source_ids=source_ids.numpy(),
    )
    np.testing.assert_array_equal(outputs["token_ids"], full_ids[:, 0])
    np.testing.assert_allclose(outputs["scores"], full_scores[:, 0], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def int8_export(trained_run, tmp_path_factory):
    """The trained weights quantized with `model.quantize("int8")`, exported once in this process (ops
    checked against this TensorFlow's registry before publishing); the clean process of `served` loads it."""
    translator = TranslationModule.from_run(trained_run, quantization="int8", **BEAM)
    result = export_saved_model(
        translator,
        tmp_path_factory.mktemp("int8"),
        "numbers_int8",
        warmup_sentences=["twenty one"],
        verify=False,
    )
    return translator, result


def test_an_int8_model_exports_with_servable_ops(int8_export, loader_python):
    """Every op of the int8 export is a core op in every loading runtime: its matmuls are
    `BatchMatMulV3` (int8 x int8 -> int32), and no float `Einsum` projection is left."""
    translator, result = int8_export
    python, runtime = loader_python
    assert {weight.dtype for weight in translator.model.weights} == {"int8", "float32"}
    report = (
        result.ops if runtime == "exporting" else check_saved_model_ops(result.path, python=python)
    )
    assert report.ok, report.summary()
    assert "BatchMatMulV3" in report.ops and "Einsum" not in report.ops


# --- in-library references ---


@pytest.fixture(scope="module")
def run_objects(trained_run):
    return load_run(trained_run)


@pytest.fixture(scope="module")
def translator(run_objects):
    model, tokenizer, _ = run_objects
    return TranslationModule(model, tokenizer, **BEAM)


def _log_probability(model, tokenizer, source, target):
    """log P(target pieces + EOS | source), computed here step by step with NumPy."""
    source_ids = encode_source(tokenizer, [source], 48)
    pieces = tokenizer.tokenize([target]).to_list()[0]
    target_in = np.array([[2] + pieces], np.int32)
    encoder_outputs, mask = model.encode(source_ids)
    logits = np.asarray(model.decode(target_in, encoder_outputs, mask))[0].astype(
        np.float64
    )  # (T, V)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(sum(log_probs[t, token] for t, token in enumerate(pieces + [3])))


@pytest.fixture(scope="module")
def reference(run_objects):
    """What in-library decoding gives for the test inputs (same settings as the export, whose
    buffer is the source width + the offset)."""
    model, tokenizer, _ = run_objects
    texts, scores = translate(model, tokenizer, SENTENCES, "beam", **BEAM)
    source_ids = encode_source(tokenizer, SENTENCES, 48)
    outputs = make_search_fn(model, "beam", **BEAM)(source_ids)
    token_ids = outputs["token_ids"].numpy()[:, 0]
    assert [t.decode() for t in decode_text(tokenizer, token_ids).numpy()] == texts
    long_ids = encode_source(tokenizer, [LONG_TEXT], 48).numpy()
    long_text, _ = translate(model, tokenizer, [LONG_TEXT], "beam", **BEAM)
    nbest = make_search_fn(model, "beam", num_return=BEAM["beam_size"], **BEAM)(source_ids)
    nbest_texts = decode_text(tokenizer, nbest["token_ids"]).numpy()  # (B, K)
    return {
        "texts": texts,
        "scores": scores,
        "source_ids": source_ids.numpy(),
        "token_ids": token_ids,
        "search_scores": outputs["scores"].numpy()[:, 0],
        "log_probabilities": [
            _log_probability(model, tokenizer, s, t) for s, t in zip(SENTENCES, texts)
        ],
        "long_ids": long_ids,
        "long_text": long_text[0],
        "pieces": [tokenizer.tokenize([t]).to_list()[0] for t in texts],
        "nbest_texts": [[text.decode() for text in row] for row in nbest_texts],
        "nbest_scores": nbest["scores"].numpy(),
    }


# --- ONE clean process for every check of the loaded export ---

LOADER = Path(__file__).with_name("clean_process_loader.py")


def run_tensorflow_only(python, code, *args):
    """Run `code` with `python` in a process that may import TensorFlow (and TensorFlow Text) but
    not Keras or keras_transformer (`TENSORFLOW_ONLY_PRELUDE`); returns its stdout."""
    result = subprocess.run(
        [python, "-c", TENSORFLOW_ONLY_PRELUDE + code, *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        | {"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, f"{python}:\n{result.stderr[-5000:]}"
    return result.stdout


_CALL_SIGNATURE = """
import json
import sys

import numpy as np
import tensorflow as tf

load_sentencepiece_ops()
case = json.loads(sys.argv[1])
inputs = {name: tf.constant(value, case["dtypes"][name]) for name, value in case["inputs"].items()}
outputs = tf.saved_model.load(case["export"]).signatures[case["signature"]](**inputs)


def plain(value):
    array = np.asarray(value)
    if array.dtype.kind in "OS":
        return [plain(row) for row in array] if array.ndim else array.item().decode()
    return array.tolist()


print("CALLED=" + json.dumps({"outputs": {key: plain(value) for key, value in outputs.items()},
                              "tensorflow": tf.__version__, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def call_signature_in_runtime(python, export, signature, runtime=None, **inputs):
    """Call `signature` of the SavedModel `export` in a TensorFlow-only process of `python`
    (`run_tensorflow_only`) with `inputs` (int arrays as int32, else strings); checks that the
    process imported neither Keras nor keras_transformer and, given `runtime` ("2.20"), ran
    that TensorFlow. Returns the outputs as lists, strings decoded."""
    inputs = {name: np.asarray(value).tolist() for name, value in inputs.items()}
    dtypes = {
        name: "int32" if np.asarray(value).dtype.kind in "iu" else "string"
        for name, value in inputs.items()
    }
    case = {"export": str(export), "signature": signature, "inputs": inputs, "dtypes": dtypes}
    called = json.loads(
        run_tensorflow_only(str(python), _CALL_SIGNATURE, json.dumps(case)).split("CALLED=")[1]
    )
    if runtime is not None:
        assert called["tensorflow"].startswith(runtime + "."), called["tensorflow"]
    assert not {"keras", "keras_transformer"} & set(called["modules"]), called["modules"]
    return called["outputs"]


# The interpreters that load the export: this one (TensorFlow 2.21, without Keras), and a
# clean environment per serving runtime (tests/runtimes.py; 2.19 and 2.18 on request).
LOADER_RUNTIMES = ["exporting", *runtimes.selected_runtimes()]


@pytest.fixture(
    scope="module",
    params=LOADER_RUNTIMES,
    ids=[f"tf{r}" if r[0].isdigit() else r for r in LOADER_RUNTIMES],
)
def loader_python(request):
    """`(interpreter, runtime)`: this process's, or the clean environment of a serving runtime."""
    if request.param == "exporting":
        return sys.executable, request.param
    python, versions, seconds = runtimes.runtime_python(request.param)
    print(
        f"runtime {request.param}: {versions}, created in {seconds:.0f} s"
        if seconds
        else f"runtime {request.param}: {versions}"
    )
    return str(python), request.param


@pytest.fixture(scope="module")
def served(exported, int8_export, reference, run_objects, loader_python, tmp_path_factory):
    _, version_dir = exported
    python, runtime = loader_python
    _, tokenizer, _ = run_objects
    directory = tmp_path_factory.mktemp("served")
    long_row = np.arange(60, dtype=np.int32) % 100 + 4  # 60 pieces: longer than max_source_length
    case = {
        "export": str(version_dir),
        "int8_export": str(int8_export[1].path),
        "sentences": _b64([s.encode() for s in SENTENCES]),
        "targets": _b64([t.encode() for t in reference["texts"]]),
        "source_ids": reference["source_ids"].tolist(),
        "odd": _b64(ODD_INPUTS),
        "replaced": INVALID_UTF8.decode("utf-8", errors="replace"),
        "long_ids": reference["long_ids"].tolist(),
        "dirty_ids": [[5, 999, -7, 3] + [0] * 57, list(map(int, long_row)) + [3]],
        "clean_ids": [[5, 1, 1, 3] + [0] * 44, list(map(int, long_row[:47])) + [3]],
    }
    (directory / "case.json").write_text(json.dumps(case))
    run_tensorflow_only(
        python, LOADER.read_text(), str(directory / "case.json"), str(directory / "out.json")
    )
    out = json.loads((directory / "out.json").read_text())
    if runtime != "exporting":
        assert out["runtime"]["tensorflow"].startswith(runtime + "."), out["runtime"]
        assert out["runtime"]["tensorflow-text"].startswith(runtime + "."), out["runtime"]
    return out


def _texts(encoded):
    return [text.decode("utf-8") for text in _unb64(encoded)]  # strict: outputs are valid UTF-8


def test_clean_process_imports_only_tensorflow(served):
    assert served["core_only"] == {"SentencepieceOp": False, "ReadVariableOp": True}
    for module in ("keras", "keras_transformer", "tf_keras", "tensorflow_text"):
        assert module not in served["modules"]
    assert served["asset_path"].endswith("assets/spm.model")


def test_translate_matches_in_library_decoding(served, reference):
    for name in ("translate", "serving_default"):
        assert _texts(served[name]["translation"]) == reference["texts"]
        np.testing.assert_allclose(served[name]["score"], reference["scores"], atol=SCORE_TOLERANCE)
    np.testing.assert_allclose(
        served["function_translate"]["score"], reference["scores"], atol=SCORE_TOLERANCE
    )


def test_translate_ids_matches_in_library_search(served, reference):
    np.testing.assert_array_equal(served["translate_ids"]["token_ids"], reference["token_ids"])
    np.testing.assert_allclose(
        served["translate_ids"]["scores"], reference["search_scores"], atol=SCORE_TOLERANCE
    )


def test_translate_nbest_is_the_library_beam_search_returning_k(served, reference):
    nbest = served["translate_nbest"]
    assert [_texts(row) for row in nbest["translations"]] == reference["nbest_texts"]
    np.testing.assert_allclose(nbest["scores"], reference["nbest_scores"], atol=SCORE_TOLERANCE)
    assert np.array(nbest["scores"]).shape == (len(SENTENCES), BEAM["beam_size"])
    assert all(row == sorted(row, reverse=True) for row in nbest["scores"])  # best first
    # Row 0 is `translate`'s translation; the K hypotheses are distinct.
    assert [_texts(row)[0] for row in nbest["translations"]] == _texts(
        served["translate"]["translation"]
    )
    np.testing.assert_allclose(
        [row[0] for row in nbest["scores"]], served["translate"]["score"], atol=SCORE_TOLERANCE
    )
    assert any(len(set(_texts(row))) > 1 for row in nbest["translations"])


def test_translate_nbest_bad_inputs(served):
    odd = served["odd_nbest"]
    assert np.array(odd["scores"]).shape == (len(ODD_INPUTS), BEAM["beam_size"])
    for index in (0, 1):  # "" and whitespace only: K empty translations, scores 0.0
        assert _texts(odd["translations"][index]) == [""] * BEAM["beam_size"]
        assert odd["scores"][index] == [0.0] * BEAM["beam_size"]
    for index, alone in enumerate(
        served["odd_alone"]
    ):  # the batch's best rows equal one-at-a-time translate
        assert _texts(odd["translations"][index])[0] == _texts(alone["translation"])[0]
        assert odd["scores"][index][0] == pytest.approx(alone["score"][0], abs=SCORE_TOLERANCE)


def test_score_is_the_forced_decoding_log_probability(served, reference):
    np.testing.assert_allclose(
        served["score"], reference["log_probabilities"], atol=SCORE_TOLERANCE
    )
    # Where a translation re-tokenizes to its own ids, its beam score is log P / lp(|Y|)
    # (the cached search and the full decoder pass round differently: a looser tolerance).
    checked = 0
    for index, pieces in enumerate(reference["pieces"]):
        ids = [int(i) for i in reference["token_ids"][index] if i != 0]
        if pieces + [3] == ids:
            penalty = ((5.0 + len(ids)) / 6.0) ** 0.6
            assert served["score"][index] / penalty == pytest.approx(
                reference["scores"][index], abs=1e-3
            )
            checked += 1
    assert checked > 0


def test_empty_and_whitespace_inputs_give_empty_translations(served):
    for index in (0, 1):  # "" and whitespace only
        assert _texts(served["odd_alone"][index]["translation"]) == [""]
        assert served["odd_alone"][index]["score"] == [0.0]
    assert len(served["empty_score"]) == 2 and all(np.isfinite(served["empty_score"]))


def test_long_input_is_truncated_to_the_max_source_length(served, reference, run_objects):
    _, tokenizer, _ = run_objects
    assert len(LONG_TEXT) == 10_000 and reference["long_ids"].shape == (1, 48)  # 47 pieces + EOS
    (long_translation,) = _texts(served["odd_alone"][2]["translation"])
    assert long_translation == reference["long_text"]
    # translate(text) == translate_ids(text's first 47 pieces + EOS), detokenized.
    assert (
        decode_text(tokenizer, np.array(served["long_ids"], np.int32)).numpy()[0].decode()
        == long_translation
    )


def test_invalid_utf8_is_replaced_and_the_output_is_valid(served):
    (translation,) = _texts(served["odd_alone"][3]["translation"])  # strict UTF-8 decoding
    assert translation == _texts(served["replaced"]["translation"])[0]
    assert served["odd_alone"][3]["score"] == pytest.approx(
        served["replaced"]["score"], abs=SCORE_TOLERANCE
    )


def test_batch_of_very_different_lengths_equals_one_at_a_time(served):
    batch = served["odd_batch"]
    assert batch["shapes"] == [[len(ODD_INPUTS)], [len(ODD_INPUTS)]]
    alone = served["odd_alone"]
    assert _texts(batch["translation"]) == [_texts(one["translation"])[0] for one in alone]
    np.testing.assert_allclose(
        batch["score"], [one["score"][0] for one in alone], atol=SCORE_TOLERANCE
    )


def test_token_ids_out_of_vocabulary_become_unk_and_long_rows_are_cut(served):
    dirty, clean = served["dirty_ids"]
    assert dirty == clean


def test_empty_batch_gives_empty_outputs(served):
    assert served["empty_batch"]["translate"] == [[0], [0]]
    # scores, token_ids: a buffer of S + max_output_offset = 0 + 50 slots
    assert served["empty_batch"]["translate_ids"] == [[0], [0, 50]]
    assert served["empty_batch"]["translate_nbest"] == [[0, 4], [0, 4]]  # scores, translations
    assert served["empty_batch"]["score"] == [0]


def test_wrong_dtype_or_rank_is_a_clear_error_and_the_model_keeps_working(served, reference):
    errors = served["errors"]
    spec = "TensorSpec(shape=(None,), dtype=tf.string, name='text')"
    # The tf.functions of the loaded object check the spec before running.
    assert (
        errors["function_int_text"]["type"] == "TypeError"
        and spec in errors["function_int_text"]["message"]
    )
    assert (
        errors["function_rank2_text"]["type"] == "TypeError"
        and spec in errors["function_rank2_text"]["message"]
    )
    assert (
        "TensorSpec(shape=(None, None), dtype=tf.int32, name='source_ids')"
        in errors["function_float_ids"]["message"]
    )
    # The signatures (what TF Serving runs) answer with InvalidArgument errors naming what was expected.
    assert errors["signature_int_text"]["type"] == "InvalidArgumentError"
    assert (
        "expected to be a string tensor but is a int32 tensor"
        in errors["signature_int_text"]["message"]
    )
    assert (
        "expected to be a int32 tensor but is a float tensor"
        in errors["signature_float_ids"]["message"]
    )
    assert (
        "expected to be a string tensor but is a int32 tensor"
        in errors["nbest_int_text"]["message"]
    )
    assert "is not compatible with expected shape [?]" in errors["nbest_rank2_text"]["message"]
    assert "is not compatible with expected shape [?]" in errors["signature_rank2_text"]["message"]
    assert "is not compatible with expected shape [?]" in errors["signature_scalar_text"]["message"]
    assert "is not compatible with expected shape [?,?]" in errors["signature_rank1_ids"]["message"]
    missing = errors["signature_missing_input"]
    assert missing["type"] == "TypeError" and "text" in missing["message"]
    assert (
        "`source` and `target` must hold the same number of texts"
        in errors["score_batch_mismatch"]["message"]
    )
    assert _texts(served["after_errors"]["translation"]) == reference["texts"]


def test_the_int8_export_in_a_clean_process_decodes_as_the_library(served, int8_export, reference):
    translator, _ = int8_export
    outputs = make_search_fn(translator.model, "beam", **BEAM)(reference["source_ids"])
    np.testing.assert_array_equal(served["int8"]["token_ids"], outputs["token_ids"].numpy()[:, 0])
    np.testing.assert_allclose(
        served["int8"]["scores"], outputs["scores"].numpy()[:, 0], atol=SCORE_TOLERANCE
    )
    texts, scores = translate(translator.model, translator.tokenizer, SENTENCES, "beam", **BEAM)
    assert _texts(served["int8"]["translate"]["translation"]) == texts
    np.testing.assert_allclose(served["int8"]["translate"]["score"], scores, atol=SCORE_TOLERANCE)


# --- atomic, versioned export (in this process) ---


def test_bad_settings_are_refused_before_anything_is_written(run_objects, translator, tmp_path):
    from keras_transformer import Transformer

    model, tokenizer, _ = run_objects
    with pytest.raises(ValueError, match="beam_size must be a positive integer"):
        TranslationModule(model, tokenizer, beam_size=0)
    with pytest.raises(ValueError, match="max_source_length exceeds the model's max_length"):
        TranslationModule(model, tokenizer, max_source_length=49)
    # A model whose decoder has a vocabulary of its own, with the run's one-vocabulary tokenizer.
    own_target = model.config.replace(
        share_embeddings=False, target_vocabulary_size=model.config.vocabulary_size + 8
    )
    with pytest.raises(
        ValueError,
        match="different target vocabularies. Received: tokenizer.target_vocabulary_size="
        f"{tokenizer.vocabulary_size}, the model's target vocabulary size="
        f"{model.config.vocabulary_size + 8}$",
    ):
        TranslationModule(Transformer(own_target), tokenizer)
    with pytest.raises(TypeError, match="warmup sentences must be str or bytes"):
        export_saved_model(translator, tmp_path, NAME, warmup_sentences=["one", 2])
    with pytest.raises(ValueError, match="name must be"):
        export_saved_model(translator, tmp_path, "../elsewhere")
    assert list(tmp_path.iterdir()) == []


def _tree_digest(directory):
    digest = hashlib.sha256()
    for path in sorted(Path(directory).rglob("*")):
        digest.update(str(path.relative_to(directory)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_failed_export_leaves_no_partial_version(exported, translator, tmp_path, monkeypatch):
    _, version_dir = exported
    model_root = tmp_path / NAME
    shutil.copytree(version_dir, model_root / "1")
    before = _tree_digest(model_root / "1")
    written = []

    def failing_write(directory, logs):  # the disk fills up while the warmup file is written
        written.append(sorted(entry.name for entry in Path(directory).iterdir()))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(serving.warmup_lib, "write_warmup_requests", failing_write)
    with pytest.raises(
        ExportError,
        match=f"^Could not export 'numbers' to {model_root}: No space left on device. "
        "The partial export was removed",
    ):
        export_saved_model(translator, tmp_path, NAME, verify=False, check_ops=False)
    assert (
        written and "saved_model.pb" in written[0]
    )  # it failed midway, after the SavedModel was saved
    assert sorted(entry.name for entry in model_root.iterdir()) == ["1"]
    assert _tree_digest(model_root / "1") == before

    monkeypatch.undo()
    result = export_saved_model(translator, tmp_path, NAME, verify=False, check_ops=False)
    assert result.version == 2 and result.path == model_root / "2"
    assert list_versions(model_root) == [1, 2]
    assert sorted(entry.name for entry in model_root.iterdir()) == ["1", "2", "models.config"]
    assert (result.path / "assets" / "spm.model").is_file()
    assert len(read_warmup_requests(result.path)) == 6
    with pytest.raises(FileExistsError, match="Version 2 of 'numbers' already exists"):
        export_saved_model(translator, tmp_path, NAME, version=2, verify=False, check_ops=False)
    assert list_versions(model_root) == [1, 2] and _tree_digest(model_root / "1") == before


def test_translate_script_reads_input_as_the_saved_model_does(trained_run, translator, tmp_path):
    """translate.py on the bad inputs: the exported functions' translations and scores, warnings naming lines."""
    source = tmp_path / "odd.txt"
    source.write_bytes(b"\n".join(ODD_INPUTS) + b"\n")
    result = run_script(
        "translate.py", f"--model_dir={trained_run}", f"--input={source}", "--scores"
    )
    outputs = translator.translate(tf.constant(ODD_INPUTS))
    expected = [t.decode() for t in outputs["translation"].numpy()]
    lines = [line.split("\t") for line in result.stdout.split("\n")[:-1]]
    assert [text for text, _ in lines] == expected
    np.testing.assert_allclose(
        [float(score) for _, score in lines], outputs["score"].numpy(), atol=SCORE_TOLERANCE
    )
    assert (
        lines[0][1] == lines[1][1] == "0.0000"
    )  # blank lines, as the SavedModel scores an empty text
    assert (
        f"Warning: {source}, line 3: " in result.stderr
        and "cut to the first 47 (max_source_length 48)" in result.stderr
    )
    assert f"Warning: {source}, line 4: invalid UTF-8 replaced by U+FFFD" in result.stderr
    assert "line 5" not in result.stderr and "line 6" not in result.stderr


def test_translator_called_in_python_runs_the_exported_functions(translator, served):
    outputs = translator.translate(tf.constant(SENTENCES))  # traced already by the exports above
    assert [t.decode() for t in outputs["translation"].numpy()] == _texts(
        served["translate"]["translation"]
    )
    np.testing.assert_allclose(
        outputs["score"].numpy(), served["translate"]["score"], atol=SCORE_TOLERANCE
    )
    odd = translator.translate(tf.constant(ODD_INPUTS))
    assert [t.decode() for t in odd["translation"].numpy()] == _texts(
        served["odd_batch"]["translation"]
    )
