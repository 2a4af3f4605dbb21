"""Versioned, atomic SavedModel export of a `TranslationModule` for TF Serving.

Layout (what TF Serving's file system source expects, one integer directory per version):

    saved_models/<name>/
        models.config                   example TF Serving model config (kept once written)
        1/
            saved_model.pb              signatures: serving_default, translate, translate_ids, translate_nbest, score
            variables/
            assets/spm.model            the SentencePiece model (tf.saved_model.Asset); for a run
                                        with a Marian tokenizer pair, its files instead
                                        (assets/source.spm, target.spm, vocab.json, ...)
            assets.extra/tf_serving_warmup_requests
            assets.extra/export_info.json
        2/ ...

An export first claims its version number (two exports at once get two numbers), writes
the version into a hidden directory beside the versions (`saved_models/<name>/.<n>.tmp-<random>`,
which TF Serving ignores: it is not an integer), checks it (warmup requests replayed through
the loaded copy, op allowlist), and only then publishes it (`model_root.publish_version`):
on a local disk with one rename, so a server never sees a partial version; on an object store
(`gs://`) file by file with `saved_model.pb` last, so a version directory that has
`saved_model.pb` is complete. A failed export removes its partial copy and publishes
nothing. A write that fails (a full disk, a quota, a file-size limit) raises `ExportError`,
one line naming the model directory and the file.
"""

import dataclasses
import json
import os
import shlex
import tempfile
from pathlib import Path

import tensorflow as tf
from absl import logging

from keras_transformer import fs
from keras_transformer.data.marian import MarianTokenizer
from keras_transformer.decoding.translator import load_export
from keras_transformer.export import ops_check as ops_check_lib
from keras_transformer.export import warmup as warmup_lib
from keras_transformer.export.model_config import MODEL_CONFIG_FILE, write_model_config
from keras_transformer.export.translator import SIGNATURES
from keras_transformer.layers.checks import check_positive_int
from keras_transformer.model_root import list_versions, next_version, publish_version
from keras_transformer.runs import read_run_config

TOKENIZER_ASSET = "spm.model"
EXPORT_INFO_FILE = "export_info.json"
# The newest released model server (TensorFlow 2.20 with TensorFlow Text 2.20), the runtime
# the test suite loads exports in (tests/runtimes.py); docs/serving.md lists the others.
SERVING_IMAGE = "tensorflow/serving:2.20.0"


class ExportError(OSError):
    """An export could not be written; its partial copy was removed and the existing versions are untouched."""


class ServingModule(tf.Module):
    """The root object of an exported translator.

    Attributes (also on the loaded SavedModel):
        translator: the `TranslationModule` (its model's variables, its tokenizer).
        tokenizer_model: `tf.saved_model.Asset` of the SentencePiece model, copied to
            `assets/spm.model` (for clients of `translate_ids` that tokenize themselves;
            the in-graph tokenizer holds the same model in its op).
        tokenizer_files: instead, for a Marian tokenizer pair, a dict of its files' assets
            (`assets/source.spm`, ...), keyed by file name with `.` as `_`.
        translate, translate_ids, translate_nbest, score: the translator's `tf.function`s. Called on the
            loaded object, a wrong dtype or rank raises a `TypeError` naming the expected
            `TensorSpec` (the signatures check only at run time).
    """

    def __init__(self, translator, tokenizer_files):
        super().__init__(name="serving")
        self.translator = translator
        if isinstance(translator.tokenizer, MarianTokenizer):
            self.tokenizer_files = {
                path.name.replace(".", "_"): tf.saved_model.Asset(str(path))
                for path in tokenizer_files
            }
        else:
            (tokenizer_file,) = tokenizer_files
            self.tokenizer_model = tf.saved_model.Asset(str(tokenizer_file))
        self.translate = translator.translate
        self.translate_ids = translator.translate_ids
        self.translate_nbest = translator.translate_nbest
        self.score = translator.score

    def signatures(self):
        """Signature name -> the translator's `tf.function`, for `tf.saved_model.save`.

        The functions, not their concrete functions: `tf.saved_model.save` then traces each
        inside its save context, where it also lists the module's functions. A concrete
        function traced before the save is keyed outside that context, and the save would
        trace every function a second time.
        """
        return {name: getattr(self.translator, method) for name, method in SIGNATURES.items()}


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What `export_saved_model` wrote.

    Attributes:
        path: the version directory, e.g. `saved_models/numbers/3`.
        name: the model name.
        version: the integer version.
        signatures: `signature_specs(path)`.
        ops: the `ops_check.OpsReport`, or None when not checked.
        model_config: path of the example `models.config`, or None.
    """

    path: Path
    name: str
    version: int
    signatures: dict
    ops: object = None
    model_config: Path = None


def _check_name(name):
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(".")
        or "/" in name
        or os.sep in name
    ):
        raise ValueError(
            f"name must be a non-empty directory name without '/' that does not start with '.'. Received: name={name!r}"
        )


def _check_version(version):
    check_positive_int("version", version)


def signature_specs(saved_model_dir, tags="serve"):
    """The signatures of a SavedModel, read from `saved_model.pb` (nothing is loaded).

    Returns:
        `{signature: {"inputs": {name: (dtype, shape)}, "outputs": {...}}}` with dtype
        names like "string" and shapes as tuples (None for a dimension of any size).
    """
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString(fs.read_bytes(fs.join(saved_model_dir, "saved_model.pb")))
    (meta_graph,) = [graph for graph in saved_model.meta_graphs if tags in graph.meta_info_def.tags]

    def spec(info):
        shape = None
        if not info.tensor_shape.unknown_rank:
            shape = tuple(None if dim.size < 0 else dim.size for dim in info.tensor_shape.dim)
        return tf.dtypes.as_dtype(info.dtype).name, shape

    specs = {}
    for key, signature in sorted(meta_graph.signature_def.items()):
        if key.startswith("__"):
            continue  # internal (__saved_model_init_op)
        specs[key] = {
            "inputs": {name: spec(info) for name, info in sorted(signature.inputs.items())},
            "outputs": {name: spec(info) for name, info in sorted(signature.outputs.items())},
        }
    return specs


def format_signatures(specs):
    """`signature_specs` as lines like `translate(text: string [None]) -> translation: string [None], ...`."""

    def describe(tensors):
        return ", ".join(
            f"{name}: {dtype} {list(shape) if shape is not None else '?'}"
            for name, (dtype, shape) in tensors.items()
        )

    lines = [
        f"{key}({describe(value['inputs'])}) -> {describe(value['outputs'])}"
        for key, value in specs.items()
    ]
    return "\n".join(lines)


def tokenizer_assets(tokenizer):
    """File name -> bytes of the tokenizer files an export carries in `assets/`: the
    SentencePiece model (`TOKENIZER_ASSET`), or a Marian pair's files (`MarianFiles.contents`)."""
    if isinstance(tokenizer, MarianTokenizer):
        return tokenizer.files.contents()
    return {TOKENIZER_ASSET: tokenizer.model_proto}


def _write_export_info(saved_model_dir, translator, name, data):
    info = {
        "name": name,
        "signatures": {key: method for key, method in SIGNATURES.items()},
        "settings": translator.settings,
        "vocabulary_size": translator.vocabulary_size,
        "special_ids": {"pad": 0, "unk": 1, "bos": 2, "eos": 3},
    }
    assets = [f"assets/{name}" for name in tokenizer_assets(translator.tokenizer)]
    if len(assets) == 1:
        info["tokenizer_asset"] = assets[0]
    else:
        info["tokenizer_assets"] = assets
    if data is not None:
        info["data"] = data
    fs.write_text(
        fs.join(saved_model_dir, warmup_lib.ASSETS_EXTRA, EXPORT_INFO_FILE),
        json.dumps(info, indent=2, sort_keys=True) + "\n",
    )


def read_export_info(saved_model_dir):
    """The `assets.extra/export_info.json` of a SavedModel directory as a dict; `{}` for a
    SavedModel exported without one (not by `export_saved_model`).

    Raises:
        ValueError: the file is not a JSON object (naming it).
    """
    path = fs.join(saved_model_dir, warmup_lib.ASSETS_EXTRA, EXPORT_INFO_FILE)
    if not fs.exists(path):
        return {}
    try:
        info = json.loads(fs.read_text(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(info, dict):
        raise ValueError(f"{path} is not a JSON object")
    return info


def _save(translator, directory, name, warmup_sentences, verify, check_ops, data, progress):
    """Write and check a complete version in `directory` (a fresh temporary directory)."""
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer_files = []
        for file_name, contents in tokenizer_assets(translator.tokenizer).items():
            tokenizer_files.append(Path(scratch) / file_name)
            tokenizer_files[-1].write_bytes(contents)
        module = ServingModule(translator, tokenizer_files)
        progress(f"Tracing the {len(SIGNATURES)} signatures and saving the SavedModel")
        with fs.os_errors(directory):
            tf.saved_model.save(
                module,
                str(directory),
                signatures=module.signatures(),
                # Inference only: the model's custom gradients (layer normalization, packing)
                # are not traced into the export, which a server never differentiates.
                options=tf.saved_model.SaveOptions(experimental_custom_gradients=False),
            )
    progress("Writing the warmup requests")
    logs = warmup_lib.warmup_requests(translator, name, warmup_sentences)
    warmup_lib.write_warmup_requests(directory, logs)
    _write_export_info(directory, translator, name, data)
    if verify:
        progress(f"Loading the copy and replaying the {len(logs)} warmup requests through it")
        loaded = load_export(directory)
        warmup_lib.replay_warmup_requests(loaded, warmup_lib.read_warmup_requests(directory))
        del loaded
    if not check_ops:
        return None
    progress("Checking the ops against the model server's")
    return ops_check_lib.assert_servable_ops(directory)


def validation_sample(model_dir):
    """The first source sentence of the run's validation split (the corpus in its config.json).

    Raises:
        OSError / ValueError: if the split cannot be read (e.g. a corpus directory that moved).
    """
    from keras_transformer.data.sources import load_pairs

    _, payload = read_run_config(model_dir)
    data = payload.get("data", {})
    pairs = load_pairs(
        data.get("dataset", "builtin"),
        "val",
        data.get("src_lang", "en"),
        data.get("tgt_lang", "de"),
        data.get("data_dir"),
        data.get("files"),
    )
    if not pairs:
        raise ValueError(f"The validation split of {model_dir} is empty")
    return pairs[0][0]


def serving_commands(model_root, name, sample="twenty one", image=SERVING_IMAGE):
    """The shell commands that serve `model_root` with TF Serving and ask it for a translation.

    Returns:
        `(docker_run, curl)`: a `docker run` of `image` mounting `model_root` at
        `/models/<name>` (for a URL such as `gs://bucket/saved_models/<name>`: reading it
        there, with `MODEL_BASE_PATH` its parent), and a REST request to its default
        signature with `sample`.
    """
    if fs.is_url(model_root):
        base = str(fs.parent(model_root))
        docker_run = (
            f"docker run --rm -p 8500:8500 -p 8501:8501 "
            f"-e MODEL_BASE_PATH={shlex.quote(base)} -e MODEL_NAME={name} {image}"
        )
    else:
        source = Path(model_root).resolve()
        docker_run = (
            f"docker run --rm -p 8500:8500 -p 8501:8501 "
            f"--mount type=bind,source={shlex.quote(str(source))},target=/models/{name} -e MODEL_NAME={name} {image}"
        )
    payload = json.dumps({"instances": [sample]}, ensure_ascii=False)
    curl = f"curl -X POST http://localhost:8501/v1/models/{name}:predict -d {shlex.quote(payload)}"
    return docker_run, curl


def export_saved_model(
    translator,
    export_dir="saved_models",
    name="translator",
    version=None,
    warmup_sentences=warmup_lib.DEFAULT_WARMUP_SENTENCES,
    verify=True,
    check_ops=True,
    model_config_base_path=None,
    data=None,
    progress=None,
):
    """Export `translator` as `<export_dir>/<name>/<version>/`, atomically.

    Steps: claim the version number (`model_root.claim_version`), then, all inside
    `<export_dir>/<name>/.<version>.tmp-<random>/`: `tf.saved_model.save` with the
    signatures `serving_default` (= `translate`), `translate`, `translate_ids`, `translate_nbest` and `score`
    and the SentencePiece model as an asset; warmup requests
    (`assets.extra/tf_serving_warmup_requests`) and `assets.extra/export_info.json`;
    with `verify`, load the copy and replay every warmup request through it; with
    `check_ops`, refuse ops the stock model server lacks (`ops_check`). Then the version is
    published (`model_root.publish_version`): on a local disk one rename, atomic; on an
    object store (`gs://`) file by file, `saved_model.pb` last, so the version's directory
    can be listed before it is complete but has `saved_model.pb` only once it is. On any
    error (a full disk included) the temporary directory and the claim are removed and the
    existing versions are untouched; a killed export leaves them behind (hidden names TF
    Serving and `resolve_saved_model` ignore; the number stays taken until they are removed).

    Args:
        translator: a `TranslationModule`.
        export_dir: root of all exported models.
        name: the model name (TF Serving's `MODEL_NAME`), a directory name.
        version: an integer version; default: the next free number (`model_root.next_version`:
            above every version and every number another export holds; 1 for the first). An
            existing version is never replaced.
        warmup_sentences: source texts of the warmup requests.
        verify: replay the warmup requests through the loaded copy before publishing.
        check_ops: run the op allowlist check before publishing.
        model_config_base_path: `base_path` written to `<export_dir>/<name>/models.config`
            (default `/models/<name>`, where docs/serving.md mounts the directory);
            an existing file is kept.
        data: the corpus the model was trained on, a run's `config.json` data section
            (`read_run_config(model_dir)[1]["data"]`), written to `export_info.json` so that
            `experiments/evaluate.py --saved_model` scores the export on its own corpus and
            language pair (`cli.corpus_of_export`). None: not recorded.
        progress: called with a line naming each step as it starts (e.g. `print`).

    Returns:
        an `ExportResult`.

    Raises:
        FileExistsError: if `version` exists.
        ExportError: a write failed (a full disk, a quota); one line naming the file.
        ValueError / TypeError: on invalid arguments (before anything is written).
    """
    _check_name(name)
    if version is not None:
        _check_version(version)
    warmup_sentences = warmup_lib.check_sentences(warmup_sentences)
    model_root = fs.join(export_dir, name)
    if version is not None and version in list_versions(model_root):
        raise FileExistsError(
            f"Version {version} of {name!r} already exists at {fs.join(model_root, str(version))}; versions are never "
            f"overwritten. Choose another version, or none to export as version {next_version(model_root)}."
        )
    results = {}

    def write(directory):
        try:
            results["ops"] = _save(
                translator,
                directory,
                name,
                warmup_sentences,
                verify,
                check_ops,
                data,
                progress or (lambda line: None),
            )
        except OSError as error:
            raise ExportError(
                f"Could not export {name!r} to {model_root}: {_reason(error)}. The partial export was removed and "
                "no version was published: run the same command once the cause is fixed."
            ) from None

    target = publish_version(model_root, write, version)
    ops = results["ops"]
    try:
        base_path = model_config_base_path or f"/models/{name}"
        config_path = write_model_config(fs.join(model_root, MODEL_CONFIG_FILE), {name: base_path})
    except OSError as err:  # the version is published; the example config is optional
        logging.warning("Could not write the example TF Serving model config: %s", err)
        config_path = None
    return ExportResult(
        path=target,
        name=name,
        version=int(fs.name(target)),
        signatures=signature_specs(target),
        ops=ops,
        model_config=config_path,
    )


def _reason(error):
    """Why a write of the export failed, in one line naming the file (`error` an `OSError`)."""
    reason = (error.strerror or str(error)).splitlines()[0]
    if error.filename is not None and fs.name(error.filename) not in reason:
        reason = f"{reason}: {error.filename}"
    return reason
