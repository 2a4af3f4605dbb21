"""Every public layer and the Transformer document themselves with an example, and every
docstring example of every module of the package runs as a doctest, none skipped.

Examples name what a user has, as a user types it: a trained run `runs/builtin_tiny`, the
Multi30k copy `../shared/data/multi30k`, an exported `saved_models/numbers/1`. Each module's
examples run in a fresh working directory laid out like a checkout beside `shared/`
(`<tmp>/main`, `<tmp>/shared`), holding just the resources its examples name: a copy of the
session's `trained_run`, a link to the `multi30k_dir` fixture, the session's export. So
what the examples write stays in a temporary directory, and every module's test also runs
alone (`-k corpus`).
"""

import doctest
import importlib
import inspect
import pkgutil
import re
import shutil
from pathlib import Path

import pytest

import keras_transformer
from keras_transformer import layers, models

PUBLIC_CLASSES = [
    getattr(layers, name) for name in layers.__all__ if inspect.isclass(getattr(layers, name))
] + [models.Transformer]
ARCHITECTURE_DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
README = Path(__file__).resolve().parents[1] / "README.md"
RUN = "runs/builtin_tiny"
MULTI30K = "../shared/data/multi30k"
SAVED_MODEL_ROOT = "saved_models/numbers"
# The module whose example exports `SAVED_MODEL_ROOT`/1 runs first, so modules that read
# that export reuse it instead of exporting again (each still exports alone).
EXPORTING_MODULE = "keras_transformer.export"
MODULES = sorted(
    (
        module.name
        for module in pkgutil.walk_packages(keras_transformer.__path__, prefix="keras_transformer.")
    ),
    key=lambda name: name != EXPORTING_MODULE,
)
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def test_every_layer_is_public_and_listed():
    names = {cls.__name__ for cls in PUBLIC_CLASSES}
    assert names == {
        "MultiHeadAttention",
        "PositionalEncoding",
        "PositionEmbedding",
        "SharedEmbedding",
        "PositionwiseFeedForward",
        "EncoderBlock",
        "DecoderBlock",
        "LayerNormalization",
        "Transformer",
    }
    for name in names:
        assert getattr(keras_transformer, name) in PUBLIC_CLASSES


@pytest.mark.parametrize("cls", PUBLIC_CLASSES, ids=lambda cls: cls.__name__)
def test_class_docstring_has_an_example(cls):
    docstring = inspect.getdoc(cls)
    assert docstring, f"{cls.__name__} has no class docstring"
    assert "\nExample:" in docstring, f"{cls.__name__}'s docstring has no Example section"
    example = docstring.split("\nExample:", 1)[1]
    assert ">>> " in example, f"{cls.__name__}'s Example has no doctest"
    assert "Args:" in docstring


def _doctests(module):
    return doctest.DocTestFinder().find(module)


def _example_source(module):
    return "\n".join(example.source for test in _doctests(module) for example in test.examples)


@pytest.fixture(scope="session")
def exports():
    """The session's SavedModel export of the trained run (`saved_models/numbers`), once made."""
    return {}


def _saved_model_root(request, exports, tmp_path_factory):
    """`saved_models/numbers` with version 1 exported from the trained run, made at most once."""
    if SAVED_MODEL_ROOT not in exports:
        from keras_transformer.export import TranslationModule, export_saved_model

        root = tmp_path_factory.mktemp("doctest_export") / "saved_models"
        export_saved_model(
            TranslationModule.from_run(request.getfixturevalue("trained_run"), beam_size=4),
            root,
            name="numbers",
        )
        exports[SAVED_MODEL_ROOT] = root / "numbers"
    return exports[SAVED_MODEL_ROOT]


def _working_directory(module, root, request, exports):
    """`root/main`, holding what `module`'s examples name, with `root/shared` beside it."""
    source = _example_source(module)
    workdir = root / "main"
    workdir.mkdir()
    if RUN in source:  # a copy: examples may write into the run (checkpoints, logs)
        shutil.copytree(request.getfixturevalue("trained_run"), workdir / RUN)
    if MULTI30K in source:
        link = root / "shared" / "data" / "multi30k"
        link.parent.mkdir(parents=True)
        link.symlink_to(request.getfixturevalue("multi30k_dir"), target_is_directory=True)
    if SAVED_MODEL_ROOT + "/" in source and "export_saved_model(" not in source:
        link = workdir / SAVED_MODEL_ROOT
        link.parent.mkdir(parents=True)
        link.symlink_to(
            _saved_model_root(request, exports, request.getfixturevalue("tmp_path_factory")),
            target_is_directory=True,
        )
    return workdir


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name, request, tmp_path, monkeypatch, exports):
    module = importlib.import_module(module_name)
    workdir = _working_directory(module, tmp_path, request, exports)
    monkeypatch.chdir(workdir)
    result = doctest.testmod(module, optionflags=OPTIONS, verbose=False)
    assert result.failed == 0, (
        f"{result.failed} of {result.attempted} doctest examples failed in {module_name}"
    )
    public = [
        obj
        for obj in vars(module).values()
        if obj in PUBLIC_CLASSES and obj.__module__ == module_name
    ]
    if public:
        assert result.attempted > 0
    if (workdir / SAVED_MODEL_ROOT / "1").is_dir() and not (
        workdir / SAVED_MODEL_ROOT
    ).is_symlink():
        exports.setdefault(
            SAVED_MODEL_ROOT, workdir / SAVED_MODEL_ROOT
        )  # the export module's own export


def test_no_docstring_example_is_skipped():
    """Every example runs: no module's docstrings hold `+SKIP` (nor a SKIP option set otherwise)."""
    skipped = [
        test.name
        for module_name in MODULES
        for test in _doctests(importlib.import_module(module_name))
        if "+SKIP" in (test.docstring or "")
        or any(example.options.get(doctest.SKIP) for example in test.examples)
    ]
    assert skipped == [], f"docstrings with skipped examples: {skipped}"


def _run_python_blocks(doc):
    """The namespace after running the ```python blocks of `doc` in order, in one namespace."""
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.DOTALL)
    namespace = {"__blocks__": len(blocks)}
    for block in blocks:
        exec(compile(block, str(doc), "exec"), namespace)
    return namespace


def test_readme_examples_run():
    """README's layers example trains a classifier; its model example gives (1, 2, V) logits."""
    namespace = _run_python_blocks(README)
    assert namespace["__blocks__"] == 2
    assert namespace["classifier"].output_shape == (None, 2)
    assert tuple(namespace["logits"].shape) == (1, 2, 8000)


def test_architecture_doc_snippets_run():
    """The ```python blocks of docs/architecture.md run in order, in one namespace."""
    namespace = _run_python_blocks(ARCHITECTURE_DOC)
    assert namespace["__blocks__"] >= 5
    assert tuple(namespace["logits"].shape) == (2, 3, 100)
    assert tuple(namespace["step_logits"].shape) == (2, 1, 100)
    assert namespace["mixed"].compute_dtype == "bfloat16"
