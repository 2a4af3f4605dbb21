"""A filesystem that fails where a test says: a chosen call raises a chosen `tf.errors` type, or kills the process.

While a `FaultyFilesystem` is installed (a context manager; in a subprocess,
`install_from_environment`), these calls go through it, each under the name a `Fault`
uses:

- `tf.io.gfile.<name>`, what `keras_transformer.fs` calls: "gfile.exists", "gfile.isdir",
  "gfile.glob", "gfile.listdir", "gfile.makedirs", "gfile.stat", "gfile.remove",
  "gfile.rmtree", "gfile.rename", "gfile.copy", "gfile.walk", "gfile.GFile" (opening a file).
- `tensorflow.python.lib.io.file_io.<name>`, what `tf.train.CheckpointManager` calls to
  record and sweep: "file_io.atomic_write_string_to_file" (the `checkpoint` state file),
  "file_io.rename" (inside that atomic write: its temporary file becomes the state file),
  "file_io.delete_file", "file_io.get_matching_files".
- Checkpoint I/O: "checkpoint.restore" and "checkpoint.read" (`tf.train.Checkpoint`'s),
  "checkpoint.write" (`tf.train.Checkpoint._write`, under `write` and
  `CheckpointManager.save`), "checkpoint.reader" (`tf.compat.v1.train.NewCheckpointReader`),
  "checkpoint.merge" (the step of a save that turns the shards written under
  `<prefix>_temp/` into `<prefix>.index` and `<prefix>.data-*`; TensorFlow's saver runs it
  eagerly in a single-worker process).

A call's path is its first argument as text. The stages of one `CheckpointManager.save`
of `<prefix>`, in order, and the calls that mark them: "checkpoint.merge" (before it: only
`<prefix>_temp/` exists; after it: the complete files, not yet listed), then
"file_io.atomic_write_string_to_file" of the state file naming `<prefix>` (its "file_io.rename"
commits it), then "file_io.delete_file" of the checkpoints beyond `max_to_keep`, then the
state file a second time.

Example (a transient error at the first restore of ckpt-120, then the real call)::

    with FaultyFilesystem(Fault("checkpoint.restore", path="ckpt-120",
                                error=tf.errors.UnavailableError)):
        ...

In a subprocess: `environment(Fault(...))` gives the variable to pass, and the process
calls `install_from_environment()` first (tests/train_harness.py does).
"""

import dataclasses
import functools
import json
import os
import signal

import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint as checkpoint_module
from tensorflow.python.lib.io import file_io
from tensorflow.python.ops import gen_io_ops

KILL = (
    "kill"  # a Fault's `error` that SIGKILLs the process (after printing one line naming the call)
)
ENVIRONMENT_VARIABLE = "KT_FAULTS"

_GFILE_CALLS = (
    "exists",
    "isdir",
    "glob",
    "listdir",
    "makedirs",
    "stat",
    "remove",
    "rmtree",
    "rename",
    "copy",
    "walk",
    "GFile",
)
_FILE_IO_CALLS = ("atomic_write_string_to_file", "rename", "delete_file", "get_matching_files")
_CHECKPOINT_CALLS = {
    "checkpoint.restore": "restore",
    "checkpoint.read": "read",
    "checkpoint.write": "_write",
}


@dataclasses.dataclass
class Fault:
    """One failure: the `after`+1-th call named `call` whose path contains `path` fails, `times` times (None: always).

    `error` is a `tf.errors.OpError` subclass (raised with a message naming the call and
    path) or `KILL`; `when` is "before" (the real call does not happen) or "after" (it
    happens, then the fault).
    """

    call: str
    path: str = ""
    error: object = tf.errors.UnavailableError
    when: str = "before"
    after: int = 0
    times: int = 1
    seen: int = dataclasses.field(default=0, init=False)

    def matches(self, call, path):
        if call != self.call or self.path not in path:
            return False
        self.seen += 1
        return self.seen > self.after and (
            self.times is None or self.seen <= self.after + self.times
        )

    def strike(self, call, path):
        if self.error == KILL:
            print(
                f"faulty_fs: killing the process at {call} {path} ({self.when} the call)",
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)
        message = f"injected {self.error.__name__} at {call} {path}"
        if (
            self.error is tf.errors.OpError
        ):  # the base class: what TensorFlow's checkpoint reader raises for most errors
            raise tf.errors.OpError(None, None, message, tf.errors.UNKNOWN)
        raise self.error(None, None, message)

    def to_dict(self):
        error = self.error if self.error == KILL else self.error.__name__
        return {
            "call": self.call,
            "path": self.path,
            "error": error,
            "when": self.when,
            "after": self.after,
            "times": self.times,
        }

    @classmethod
    def from_dict(cls, spec):
        spec = dict(spec)
        if spec.get("error", KILL) != KILL:
            spec["error"] = getattr(tf.errors, spec["error"])
        return cls(**spec)


def _path_text(value):
    if hasattr(value, "numpy"):  # a string tensor (the saver's merge)
        value = value.numpy()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return os.fspath(value) if isinstance(value, (str, os.PathLike)) else str(value)


class FaultyFilesystem:
    """Install `faults` on the calls the module docstring lists; `calls` records `(call, path)` of every call made."""

    def __init__(self, *faults):
        self.faults = list(faults)
        self.calls = []
        self._originals = []

    def _wrap(self, call, function, path_argument=0):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            path = _path_text(args[path_argument]) if len(args) > path_argument else ""
            self.calls.append((call, path))
            fault = next((fault for fault in self.faults if fault.matches(call, path)), None)
            if fault is not None and fault.when == "before":
                fault.strike(call, path)
            result = function(*args, **kwargs)
            if fault is not None:
                fault.strike(call, path)
            return result

        return wrapper

    def _patch(self, owner, attribute, call, path_argument=0):
        original = getattr(owner, attribute)
        self._originals.append((owner, attribute, original))
        setattr(owner, attribute, self._wrap(call, original, path_argument))

    def install(self):
        for name in _GFILE_CALLS:
            self._patch(tf.io.gfile, name, f"gfile.{name}")
        for name in _FILE_IO_CALLS:
            self._patch(file_io, name, f"file_io.{name}")
        for call, method in _CHECKPOINT_CALLS.items():
            self._patch(
                checkpoint_module.Checkpoint, method, call, path_argument=1
            )  # args[0] is the Checkpoint
        self._patch(tf.compat.v1.train, "NewCheckpointReader", "checkpoint.reader")
        self._patch(gen_io_ops, "merge_v2_checkpoints", "checkpoint.merge", path_argument=1)
        return self

    def uninstall(self):
        for owner, attribute, original in reversed(self._originals):
            setattr(owner, attribute, original)
        self._originals.clear()

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc_info):
        self.uninstall()


def environment(*faults):
    """The environment variable that makes `install_from_environment` install `faults` in a subprocess."""
    return {ENVIRONMENT_VARIABLE: json.dumps([fault.to_dict() for fault in faults])}


def install_from_environment():
    """Install the faults `environment` described (nothing when the variable is unset); returns the filesystem or None."""
    spec = os.environ.get(ENVIRONMENT_VARIABLE)
    if not spec:
        return None
    return FaultyFilesystem(*(Fault.from_dict(fault) for fault in json.loads(spec))).install()
