"""Package attributes imported on first use.

A package whose parts differ in what they need (`keras_transformer.training`: the loss and
schedule are `keras.ops` and run on every backend; the trainer is TensorFlow's) imports the
backend-independent parts at once and the others when a name of theirs is first asked for,
so that `from keras_transformer.training import LabelSmoothedCrossEntropy` works on JAX or
PyTorch where TensorFlow is not installed.
"""

import importlib
import importlib.util
import sys


def lazy_attributes(package, exports):
    """A module-level `__getattr__` (PEP 562) for `package`.

    Args:
        package: the package's `__name__`.
        exports: `{name: module}`: the module that defines each lazily exported name.

    Returns:
        `__getattr__(name)`: imports `exports[name]`'s module and returns (and keeps) the
        name; a submodule of `package` by its name; else `AttributeError`.
    """

    def __getattr__(name):
        module = exports.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
            setattr(sys.modules[package], name, value)
            return value
        if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
