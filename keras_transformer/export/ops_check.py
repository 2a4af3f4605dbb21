"""Which ops a SavedModel needs, and whether the stock TF Serving model server has them all.

`tensorflow_model_server` runs the core TensorFlow ops and links the TensorFlow Text ops
(the `Sentencepiece*` ops among them); it cannot run Python (`PyFunc`, `EagerPyFunc`,
i.e. `tf.py_function` / `tf.numpy_function`) or ops from other custom libraries.

`check_saved_model_ops` reads every op of the SavedModel (the main graph and every
function of its library) and sorts each into:

* `"tensorflow"`: registered when only `tensorflow` is imported (looked up in a fresh
  Python process, so ops that this process registered, e.g. by importing
  `tensorflow_text`, do not count);
* `"tensorflow_text"`: a `Sentencepiece*` op registered by TensorFlow Text's SentencePiece
  kernel library;
* `"python"`: one of `DENIED_OPS`, which call back into Python;
* `"xla"`: an `Xla*` op (e.g. `XlaDynamicUpdateSlice`, which Keras' TensorFlow backend
  emits for `ops.slice_update`): registered in TensorFlow, but outside `jit_compile` it
  runs only through on-demand XLA compilation, which the model server disables on CPU
  (`--xla_cpu_compilation_enabled`) and fails on GPU;
* `"unregistered"`: anything else (a custom op).

Only the first two are allowed. The registry read is this interpreter's TensorFlow, or
that of another interpreter (`python=`), e.g. of an environment holding the TensorFlow and
TensorFlow Text of an older model server. From the command line:

    python -m keras_transformer.export.ops_check saved_models/numbers/1 [PYTHON]
"""

import collections
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

DENIED_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
XLA_OP_PREFIX = "Xla"
TEXT_OP_PREFIX = "Sentencepiece"
ALLOWED_ORIGINS = ("tensorflow", "tensorflow_text")

# Python source run first in a process that must see TensorFlow alone: `keras`,
# `tf_keras` and `keras_transformer` cannot be imported there (TensorFlow tries to import
# Keras and goes on without it), so anything it needs from them fails loudly.
TENSORFLOW_ONLY_PRELUDE = r'''
import importlib.abc
import importlib.machinery
import sys

_REFUSED = ("keras", "tf_keras", "keras_transformer")


class _RefuseLoader(importlib.abc.Loader):
    def create_module(self, spec):
        raise ImportError(spec.name + " is not importable in this TensorFlow-only process")

    def exec_module(self, module):
        raise ImportError(module.__name__)


class _RefuseFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _REFUSED:
            return importlib.machinery.ModuleSpec(name, _RefuseLoader())
        return None


sys.meta_path.insert(0, _RefuseFinder())


def load_sentencepiece_ops():
    """Register TensorFlow Text's SentencePiece ops without importing tensorflow_text
    (whose Python package imports Keras); TF Serving links the same kernels."""
    import glob
    import importlib.util
    import os

    import tensorflow as tf

    spec = importlib.util.find_spec("tensorflow_text")
    if spec is None:
        raise ImportError("tensorflow_text is not installed")
    (root,) = spec.submodule_search_locations
    libraries = sorted(glob.glob(os.path.join(root, "python", "ops", "*sentencepiece*.so")))
    if not libraries:
        raise ImportError("no SentencePiece op library under " + root)
    for library in libraries:
        tf.load_op_library(library)
    return libraries
'''

_ORIGINS_SCRIPT = (
    TENSORFLOW_ONLY_PRELUDE
    + r'''
import json

names = json.loads(sys.stdin.read())
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

origins = {name: "tensorflow" for name in names if op_def_registry.get(name) is not None}
try:
    load_sentencepiece_ops()
except ImportError:  # without tensorflow_text the Sentencepiece* ops stay "unregistered" (not allowed)
    pass
for name in names:
    if name not in origins and name.startswith("'''
    + TEXT_OP_PREFIX
    + r"""") and op_def_registry.get(name) is not None:
        origins[name] = "tensorflow_text"
print("OP_ORIGINS=" + json.dumps(origins))
from importlib import metadata

runtime = {"tensorflow": tf.__version__}
try:
    runtime["tensorflow-text"] = metadata.version("tensorflow-text")
except metadata.PackageNotFoundError:
    pass
print("RUNTIME=" + json.dumps(runtime))
"""
)


@dataclasses.dataclass(frozen=True)
class OpsReport:
    """The ops of a SavedModel and where each comes from.

    Attributes:
        ops: op type -> number of nodes using it.
        origins: op type -> "tensorflow", "tensorflow_text", "python", "xla" or "unregistered".
        runtime: the runtime whose registry was read, e.g. "tensorflow 2.20.0, tensorflow-text 2.20.1".
    """

    ops: dict
    origins: dict
    runtime: str = ""

    @property
    def disallowed(self):
        """Ops the stock model server cannot run, sorted."""
        return sorted(op for op, origin in self.origins.items() if origin not in ALLOWED_ORIGINS)

    @property
    def ok(self):
        return not self.disallowed

    def by_origin(self):
        """origin -> sorted op types."""
        groups = collections.defaultdict(list)
        for op in sorted(self.origins):
            groups[self.origins[op]].append(op)
        return dict(groups)

    def summary(self):
        """Human-readable lines: the ops grouped by origin, and the verdict."""
        lines = [
            f"{origin} ({len(ops)}): {', '.join(ops)}"
            for origin, ops in sorted(self.by_origin().items())
        ]
        checked = f" (registry of {self.runtime})" if self.runtime else ""
        if self.ok:
            lines.append(
                f"All {len(self.origins)} op types are TensorFlow core or TensorFlow Text ops{checked}."
            )
        else:
            lines.append(
                f"Not servable by the stock model server{checked}: {', '.join(self.disallowed)}"
            )
        return "\n".join(lines)


def saved_model_ops(saved_model_dir):
    """Op types used in a SavedModel: the main graph of every MetaGraph and every function.

    Nodes whose type names a function of the library (direct function calls) are not
    counted; the function's own nodes are.

    Returns:
        a `collections.Counter` of op type -> number of nodes.
    """
    from tensorflow.core.protobuf import saved_model_pb2

    from keras_transformer import fs

    path = fs.join(saved_model_dir, "saved_model.pb")
    if not fs.isfile(path):
        raise FileNotFoundError(f"No saved_model.pb in {saved_model_dir}")
    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString(fs.read_bytes(path))
    counts = collections.Counter()
    for meta_graph in saved_model.meta_graphs:
        graph = meta_graph.graph_def
        functions = {function.signature.name for function in graph.library.function}
        nodes = list(graph.node)
        for function in graph.library.function:
            nodes.extend(function.node_def)
        counts.update(node.op for node in nodes if node.op not in functions)
    return counts


# (interpreter, op type) -> origin found by a lookup process; the registry of a fresh
# process is the same every time, so each op is looked up once per interpreter.
_ORIGINS_CACHE = {}
# interpreter -> "tensorflow X, tensorflow-text Y", read by its first lookup process.
_RUNTIMES = {}


def _denied(name):
    if name in DENIED_OPS:
        return "python"
    if name.startswith(XLA_OP_PREFIX):
        return "xla"
    return None


def _lookup(names, python, timeout):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [python, "-c", _ORIGINS_SCRIPT],
        input=json.dumps(names),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    values = {}
    for line in result.stdout.splitlines():
        key, _, value = line.partition("=")
        if key in ("OP_ORIGINS", "RUNTIME"):
            values[key] = json.loads(value)
    if result.returncode != 0 or len(values) != 2:
        raise RuntimeError(
            f"Looking up the TensorFlow op registry of {python} failed:\n{result.stderr[-3000:]}"
        )
    _RUNTIMES[python] = ", ".join(
        f"{package} {version}" for package, version in values["RUNTIME"].items()
    )
    return {name: values["OP_ORIGINS"].get(name, "unregistered") for name in names}


def op_origins(op_names, python=None, timeout=300):
    """Sort op types by origin, looked up in a fresh process that imports only TensorFlow.

    Args:
        op_names: op types.
        python: the interpreter to run (default: this one).

    Returns:
        op type -> "tensorflow", "tensorflow_text", "python", "xla" or "unregistered".
    """
    python = str(python or sys.executable)
    names = sorted(set(op_names))
    unknown = [name for name in names if not _denied(name) and (python, name) not in _ORIGINS_CACHE]
    if unknown or python not in _RUNTIMES:
        for name, origin in _lookup(unknown, python, timeout).items():
            _ORIGINS_CACHE[python, name] = origin
    return {name: _denied(name) or _ORIGINS_CACHE[python, name] for name in names}


def check_saved_model_ops(saved_model_dir, python=None):
    """The `OpsReport` of a SavedModel (see the module docstring).

    Args:
        saved_model_dir: a SavedModel directory.
        python: the interpreter whose op registry is read (default: this one); pass one of
            an environment holding an older TensorFlow and TensorFlow Text to check that
            runtime (an op it lacks is "unregistered").
    """
    ops = saved_model_ops(saved_model_dir)
    origins = op_origins(ops, python=python)
    return OpsReport(
        ops=dict(ops), origins=origins, runtime=_RUNTIMES[str(python or sys.executable)]
    )


def assert_servable_ops(saved_model_dir, python=None):
    """Like `check_saved_model_ops`, but raises `ValueError` naming the disallowed ops and the runtime."""
    report = check_saved_model_ops(saved_model_dir, python=python)
    if not report.ok:
        details = ", ".join(f"{op} ({report.origins[op]})" for op in report.disallowed)
        raise ValueError(
            f"{saved_model_dir} uses ops the stock TF Serving model server of {report.runtime} cannot run: {details}. "
            "Only core TensorFlow ops and TensorFlow Text's SentencePiece ops are allowed "
            "(no tf.py_function / tf.numpy_function, no Xla* ops, no custom op libraries)."
        )
    return report


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2):
        print(
            "usage: python -m keras_transformer.export.ops_check SAVED_MODEL_DIR [PYTHON]",
            file=sys.stderr,
        )
        return 2
    if len(argv) == 2 and not (Path(argv[1]).is_file() and os.access(argv[1], os.X_OK)):
        print(
            f"PYTHON must be an interpreter (e.g. venv/bin/python). Received: {argv[1]}",
            file=sys.stderr,
        )
        return 2
    report = check_saved_model_ops(argv[0], python=argv[1] if len(argv) == 2 else None)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
