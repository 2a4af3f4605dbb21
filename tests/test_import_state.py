"""Importing the package changes no process-wide state: stderr, file descriptor 2, os.environ.

Silencing TensorFlow's start-up lines is something a script asks for (by setting
`keras_transformer.QUIET_IMPORT` before the import), never a side effect of an import; the
layers are registered by the import, so a user's `.keras` file of them loads after it.
"""

import json
import subprocess
import sys

from tests.scripts import script_environment

# Runs in a fresh interpreter: records the state, imports every module of the package, records
# it again. Whatever is written to fd 2 while TensorFlow is being imported (a line written the
# moment its import starts) must reach the stderr the process was given.
IMPORT_EVERYTHING = r"""
import json, os, pkgutil, sys, importlib

WITNESS = b"witness: the import of tensorflow starts\n"
changes = []  # os.environ changes made by the package's own code (not by a library it imports)


def audit(event, args):
    if event in ("os.putenv", "os.unsetenv"):
        frame = sys._getframe(1)
        while frame.f_globals.get("__name__") in ("os", "_collections_abc"):
            frame = frame.f_back
        caller = frame.f_globals.get("__name__", "")
        if caller.split(".")[0] == "keras_transformer":
            changes.append(f"{caller}:{frame.f_lineno} {event} {args[0]!r}")


sys.addaudithook(audit)


class Witness:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow":
            os.write(2, WITNESS)
            sys.meta_path.remove(self)
        return None


sys.meta_path.insert(0, Witness())


def state():
    status = os.fstat(2)
    return {"fd2": [status.st_dev, status.st_ino], "stderr": id(sys.stderr)}


before = state()
import keras_transformer

modules = ["keras_transformer"]
for module in pkgutil.walk_packages(keras_transformer.__path__, prefix="keras_transformer."):
    importlib.import_module(module.name)
    modules.append(module.name)
after = state()
print(json.dumps({"before": before, "after": after, "changes": changes, "modules": modules, "tensorflow": "tensorflow" in sys.modules}))
"""


def test_importing_every_module_leaves_stderr_and_the_environment_alone():
    # TF_CPP_MIN_LOG_LEVEL=3: the setting under which TensorFlow's start-up lines would be hidden.
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING],
        capture_output=True,
        env=script_environment(TF_CPP_MIN_LOG_LEVEL="3"),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    record = json.loads(result.stdout.decode().splitlines()[-1])
    assert record["tensorflow"] and "keras_transformer.training.trainer" in record["modules"]
    assert b"witness: the import of tensorflow starts" in result.stderr, "fd 2 was redirected"
    assert record["after"]["fd2"] == record["before"]["fd2"]
    assert record["after"]["stderr"] == record["before"]["stderr"]
    # TensorFlow and other libraries set variables of their own when imported; the package none.
    assert record["changes"] == [], f"os.environ changed by the package: {record['changes']}"


def test_a_keras_file_of_the_layers_loads_after_importing_the_package(tmp_path):
    # A user's `.keras` file names the layers by their registered names: `import
    # keras_transformer` alone must register them, in a process that never used one.
    import keras

    from keras_transformer import MultiHeadAttention, PositionalEncoding

    inputs = keras.Input((4, 8))
    hidden = PositionalEncoding()(inputs)
    outputs = MultiHeadAttention(num_heads=2, key_dim=4)(hidden, hidden)
    path = tmp_path / "user_model.keras"
    keras.Model(inputs, outputs).save(path)
    load = (
        "import sys, keras, keras_transformer\n"
        "model = keras.saving.load_model(sys.argv[1])\n"
        "print(sorted(type(layer).__name__ for layer in model.layers))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", load, str(path)],
        capture_output=True,
        env=script_environment(TF_CPP_MIN_LOG_LEVEL="3"),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    assert "'MultiHeadAttention'" in result.stdout.decode()
    assert "'PositionalEncoding'" in result.stdout.decode()
