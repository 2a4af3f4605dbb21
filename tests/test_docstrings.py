"""Every public layer and the Transformer document themselves with an example, and every
docstring example of every module of the package runs as a doctest."""

import doctest
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import keras_transformer
from keras_transformer import layers, models

PUBLIC_CLASSES = [
    getattr(layers, name) for name in layers.__all__ if inspect.isclass(getattr(layers, name))
] + [models.Transformer]
ARCHITECTURE_DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
MODULES = [module.name for module in pkgutil.walk_packages(keras_transformer.__path__, prefix="keras_transformer.")]


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


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest examples failed in {module_name}"
    public = [obj for obj in vars(module).values() if obj in PUBLIC_CLASSES and obj.__module__ == module_name]
    if public:
        assert result.attempted > 0


def test_architecture_doc_snippets_run():
    """The ```python blocks of docs/architecture.md run in order, in one namespace."""
    blocks = re.findall(r"```python\n(.*?)```", ARCHITECTURE_DOC.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert len(blocks) >= 5
    namespace = {}
    for block in blocks:
        exec(compile(block, str(ARCHITECTURE_DOC), "exec"), namespace)
    assert tuple(namespace["logits"].shape) == (2, 3, 100)
    assert tuple(namespace["step_logits"].shape) == (2, 1, 100)
    assert namespace["mixed"].compute_dtype == "bfloat16"
