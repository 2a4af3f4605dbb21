"""Publishing exports, CTranslate2 directories and checkpoints: complete or absent, one writer per name.

`fs.publish` renames a finished directory on a local disk (atomic) and moves it file by file
elsewhere, its completing file last; `ram://` (TensorFlow's in-memory filesystem) takes the
file-by-file path that `gs://` takes. A kill is simulated by recording the whole tree before
and after every `tf.io.gfile` call the code makes (tests/faulty_fs.py): each recorded tree is
exactly what a process killed at that moment leaves, and each one is checked. Real kills
(SIGKILL) at chosen calls run in subprocesses; raised errors are injected at every call.
"""

import logging
import secrets
import subprocess
import sys
import threading

import pytest
import tensorflow as tf
from tensorflow.python.lib.io import file_io

from keras_transformer import fs
from keras_transformer.model_root import (
    list_versions,
    missing_files,
    publish_version,
    resolve_saved_model,
)
from tests.faulty_fs import KILL, Fault, FaultyFilesystem, environment
from tests.scripts import REPO, script_environment

FAKE_VERSION_FILES = (
    "assets/spm.model",
    "fingerprint.pb",
    "saved_model.pb",
    "variables/variables.data-00000-of-00001",
    "variables/variables.index",
)


def _root(kind, tmp_path):
    if kind == "local":
        return tmp_path / "models"
    if kind == "file":
        return (tmp_path / "models").as_uri()
    return f"ram://publishing-{secrets.token_hex(4)}/models"


def _write_fake(content):
    """A `write(directory)` for `publish_version` that writes a SavedModel's files, each holding `content`."""

    def write(directory):
        for relative in FAKE_VERSION_FILES:
            fs.write_text(fs.join(directory, relative), content)

    return write


def _write_saved_model(value, after=None):
    """A `write(directory)` that saves a real SavedModel whose variable `v` is `value`; then calls `after()`."""

    def write(directory):
        module = tf.Module()
        module.v = tf.Variable(float(value))
        tf.saved_model.save(module, str(directory))
        if after:
            after()

    return write


# --- recording the tree at every call: what a kill at that moment leaves ---


def _tree(root):
    """`{relative path: bytes or None (a directory)}` of everything under `root`, read without the patched gfile."""
    root = str(root).rstrip("/")
    if not file_io.file_exists_v2(root):
        return {}
    tree = {}
    for directory, subdirectories, names in file_io.walk_v2(root):
        relative = directory[len(root) :].strip("/")
        for name in subdirectories:
            tree[f"{relative}/{name}".strip("/")] = None
        for name in names:
            path = f"{directory}/{name}"
            if file_io.file_exists_v2(path) and not file_io.is_directory_v2(path):
                tree[f"{relative}/{name}".strip("/")] = file_io.read_file_to_string(
                    path, binary_mode=True
                )
    return tree


def _restore(tree, root):
    """Write `tree` (from `_tree`) under the fresh directory `root`."""
    file_io.recursive_create_dir_v2(str(root))
    for relative, content in sorted(tree.items()):
        path = f"{str(root).rstrip('/')}/{relative}"
        if content is None:
            file_io.recursive_create_dir_v2(path)
        else:
            file_io.recursive_create_dir_v2(path.rsplit("/", 1)[0])
            file_io.write_string_to_file(path, content)


def _copy_root(kind, tmp_path, index):
    """A fresh directory for the `index`-th recorded tree (on ram://, under its own root: its listing of a
    directory also shows the siblings whose names extend the directory's)."""
    if kind == "ram":
        return f"ram://killed-{secrets.token_hex(4)}/{index}"
    return tmp_path / f"killed-{index}"


@pytest.fixture
def recorded():
    """`record(root)`: a `FaultyFilesystem` recording `_tree(root)` before and after every gfile call.

    Its `.recorder.trees` are the distinct trees, in order.
    """

    class Recorder(Fault):
        def matches(self, call, path):
            return not self.busy

        def strike(self, call, path):
            self.busy = True
            try:
                tree = _tree(self.path_root)
                if not self.trees or self.trees[-1] != tree:
                    self.trees.append(tree)
            finally:
                self.busy = False

    def record(root):
        recorder = Recorder("any")
        recorder.busy, recorder.path_root, recorder.trees = False, root, []
        filesystem = FaultyFilesystem(recorder)
        filesystem.recorder = recorder
        return filesystem

    return record


@pytest.mark.parametrize("kind", ["local", "ram"])
def test_a_kill_at_any_call_of_an_export_leaves_no_version_or_a_complete_one(
    kind, tmp_path, recorded
):
    root = _root(kind, tmp_path)
    publish_version(root, _write_saved_model(1))
    filesystem = recorded(root)
    with (
        filesystem
    ):  # the SavedModel is written by TensorFlow's C++ code: its tree is recorded once it is saved
        publish_version(
            root, _write_saved_model(2, after=lambda: filesystem.recorder.strike("saved", ""))
        )
    trees = filesystem.recorder.trees
    assert len(trees) > 4
    listed_incomplete = 0
    for index, tree in enumerate(trees):
        copy = _copy_root(kind, tmp_path, index)
        _restore(tree, copy)
        for version in list_versions(copy):
            missing = missing_files(fs.join(copy, str(version)))
            if kind == "local":  # one rename: a version is complete or absent
                assert not missing, (index, version, missing)
            elif missing:  # file by file: listed early, but saved_model.pb comes last
                assert "saved_model.pb" in missing, (index, version, missing)
                listed_incomplete += 1
        served = resolve_saved_model(copy)
        assert float(tf.saved_model.load(str(served)).v.numpy()) == float(fs.name(served))
    assert [sorted(name for name in tree if "/" not in name) for tree in (trees[0], trees[-1])] == [
        ["1"],
        ["1", "2"],
    ]
    assert listed_incomplete > 0 if kind == "ram" else listed_incomplete == 0


def _calls(root_kind, tmp_path, run, setup=lambda root: None):
    """The gfile calls `run(root)` makes on a fresh root after `setup(root)` (names only, in order)."""
    root = _root(root_kind, tmp_path / "count")
    setup(root)
    with FaultyFilesystem() as filesystem:
        run(root)
    return [call for call, _ in filesystem.calls]


def _hidden(root):
    return [entry for entry in fs.listdir(root) if entry.startswith(".")]


@pytest.mark.parametrize("kind", ["local", "ram"])
@pytest.mark.parametrize("when", ["before", "after"])
def test_an_error_at_any_call_of_an_export_publishes_nothing_partial(kind, when, tmp_path):
    """A failure at any gfile call: the export raises and leaves only the earlier version (or it had published
    version 2 completely); the only thing a failure may leave is what the failed call itself was removing."""
    calls = _calls(
        kind,
        tmp_path,
        lambda root: publish_version(root, _write_fake("2")),
        setup=lambda root: publish_version(root, _write_fake("1")),
    )
    assert len(calls) > 10
    raised = 0
    for index, call in enumerate(calls):
        root = _root(kind, tmp_path / str(index))
        publish_version(root, _write_fake("1"))
        fault = Fault(
            call, error=tf.errors.UnavailableError, when=when, after=calls[:index].count(call)
        )
        with FaultyFilesystem(fault) as filesystem:
            try:
                publish_version(root, _write_fake("2"))
            except OSError:
                raised += 1
        assert fault.seen > fault.after, (index, call)  # the fault struck
        failed_path = filesystem.calls[index][1]
        assert list_versions(root) in ([1], [1, 2]), (index, call)
        for version in list_versions(root):
            assert not missing_files(fs.join(root, str(version))), (index, call, when)
        for leftover in _hidden(root):
            assert failed_path.rstrip("/").endswith(leftover), (
                index,
                call,
                failed_path,
                _hidden(root),
            )
        # The same command, once the cause is gone: the next version, complete.
        again = publish_version(root, _write_fake("3"))
        assert (
            resolve_saved_model(root) == again
            and fs.read_text(fs.join(again, "saved_model.pb")) == "3"
        )
    assert raised > len(calls) // 2


class _RivalClaim(Fault):
    """At the first listing of the model root, another export's claim on version 2 appears (it claimed just before)."""

    def matches(self, call, path):
        return call == "gfile.listdir" and not self.done

    def strike(self, call, path):
        self.done = True
        fs.write_text(fs.join(self.root, ".2.claim-rival"), "")


@pytest.mark.parametrize("kind", ["local", "ram"])
def test_an_export_leaves_a_number_another_export_claimed_at_the_same_moment(kind, tmp_path):
    root = _root(kind, tmp_path)
    publish_version(root, _write_fake("1"))
    rival = _RivalClaim("gfile.listdir")
    rival.done, rival.root = False, root
    with FaultyFilesystem(rival):
        published = publish_version(root, _write_fake("3"))
    assert fs.name(published) == "3" and fs.listdir(root) == [".2.claim-rival", "1", "3"]
    with pytest.raises(
        FileExistsError,
        match=r"^Version 2 of .* cannot be written: Another writer is publishing "
        r".*/2 \(its claim: .*/\.2\.claim-rival; a claim left by a killed "
        r"process holds the name until it is removed\)\. Versions are never",
    ):
        publish_version(root, _write_fake("2"), version=2)
    with pytest.raises(
        FileExistsError, match=r"^Version 3 of .* cannot be written: .*/3 exists\. "
    ):
        publish_version(root, _write_fake("x"), version=3)
    assert fs.listdir(root) == [".2.claim-rival", "1", "3"]


_WRITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from keras_transformer import fs
from keras_transformer.model_root import publish_version
root, name, ready = sys.argv[1], sys.argv[2], Path(sys.argv[3])
(ready / name).touch()
while len(list(ready.iterdir())) < 2:  # both processes have imported TensorFlow: start together
    time.sleep(0.001)
for index in range({count}):
    def write(directory, content=f"{{name}}-{{index}}"):
        for relative in {files!r}:
            fs.write_text(fs.join(directory, relative), content)
    print(fs.name(publish_version(root, write)), flush=True)
"""


def _check_distinct_versions(root, contents):
    """Each version of `root` complete and written by one writer alone; together, exactly `contents`."""
    found = []
    for version in list_versions(root):
        directory = fs.join(root, str(version))
        assert not missing_files(directory)
        (content,) = {fs.read_text(fs.join(directory, relative)) for relative in FAKE_VERSION_FILES}
        found.append(content)
    assert sorted(found) == sorted(
        contents
    )  # numbers may be skipped: two exports that collided both withdraw
    assert _hidden(root) == []


def test_exports_in_two_processes_at_once_get_distinct_versions(tmp_path):
    root, count = tmp_path / "models", 4
    script = _WRITER.format(repo=str(REPO), count=count, files=FAKE_VERSION_FILES)
    ready = tmp_path / "ready"
    ready.mkdir()
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(root), name, str(ready)],
            env=script_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    outputs = [writer.communicate(timeout=300) for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], outputs
    _check_distinct_versions(
        root, [f"{name}-{index}" for name in ("a", "b") for index in range(count)]
    )


def test_exports_in_threads_on_ram_get_distinct_versions():
    root, count = f"ram://publishing-{secrets.token_hex(4)}/models", 3
    errors = []

    def writer(name):
        try:
            for index in range(count):
                publish_version(root, _write_fake(f"{name}-{index}"))
        except Exception as error:  # reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(name,)) for name in "abcd"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    _check_distinct_versions(root, [f"{name}-{index}" for name in "abcd" for index in range(count)])


_KILLED_EXPORT = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from tests.faulty_fs import install_from_environment
install_from_environment()
import tensorflow as tf
from keras_transformer.model_root import publish_version
def write(directory):
    module = tf.Module()
    module.v = tf.Variable(2.0)
    tf.saved_model.save(module, str(directory))
    if sys.argv[2] == "write":
        os.kill(os.getpid(), signal.SIGKILL)
publish_version(sys.argv[1], write)
"""


@pytest.mark.parametrize("stage", ["claim", "write", "publish", "published"])
def test_a_killed_export_process_leaves_no_version_or_a_complete_one(stage, tmp_path):
    """SIGKILL while claiming the number, after the SavedModel is written, at the publishing rename, right after it."""
    root = tmp_path / "models"
    publish_version(root, _write_saved_model(1))
    faults = {
        # The claim's listing (after next_version's two): the claim file is written, not yet checked.
        "claim": [Fault("gfile.listdir", error=KILL, after=2)],
        "write": [],
        "publish": [Fault("gfile.rename", path=".2.tmp-", error=KILL, when="before")],
        "published": [Fault("gfile.rename", path=".2.tmp-", error=KILL, when="after")],
    }[stage]
    result = subprocess.run(
        [sys.executable, "-c", _KILLED_EXPORT.format(repo=str(REPO)), str(root), stage],
        env=script_environment(**environment(*faults)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == -9, result.stdout + result.stderr[-3000:]
    expected = [1, 2] if stage == "published" else [1]
    assert list_versions(root) == expected
    served = resolve_saved_model(root)
    assert served == root / str(expected[-1]) and not missing_files(served)
    assert float(tf.saved_model.load(str(served)).v.numpy()) == expected[-1]
    leftovers = _hidden(root)  # hidden names, ignored by TF Serving and resolve_saved_model
    assert leftovers and all(entry.startswith((".2.claim-", ".2.tmp-")) for entry in leftovers)
    assert (
        publish_version(root, _write_fake("x")) == root / "3"
    )  # the killed export's claim still holds 2


def test_resolve_saved_model_skips_incomplete_versions_with_a_warning(tmp_path, caplog):
    root = tmp_path / "models"
    _restore({f"1/{relative}": b"1" for relative in FAKE_VERSION_FILES}, root)
    _restore(
        {f"2/{relative}": b"2" for relative in FAKE_VERSION_FILES if relative != "saved_model.pb"},
        root,
    )
    _restore(
        {
            f"3/{relative}": b"3"
            for relative in FAKE_VERSION_FILES
            if relative != "variables/variables.data-00000-of-00001"
        },
        root,
    )
    (root / "3" / "variables" / "variables.data-00000-of-00002").write_bytes(b"3")
    _restore(
        {
            f"4/{relative}": b"4"
            for relative in FAKE_VERSION_FILES
            if relative != "variables/variables.index"
        },
        root,
    )
    (root / "5").mkdir()
    with caplog.at_level(logging.WARNING, logger="absl"):
        assert resolve_saved_model(root) == root / "1"
    assert [record.getMessage() for record in caplog.records] == [
        f"Skipped version 5 of {root}: it lacks saved_model.pb, variables/variables.index, variables/variables.data-*",
        f"Skipped version 4 of {root}: it lacks variables/variables.index",
        f"Skipped version 3 of {root}: it lacks variables/variables.data-00001-of-00002",
        f"Skipped version 2 of {root}: it lacks saved_model.pb",
    ]
    with pytest.raises(
        FileNotFoundError,
        match=f"^{root}/3 is an incomplete SavedModel: it lacks "
        "variables/variables.data-00001-of-00002$",
    ):
        resolve_saved_model(root / "3")
    fs.rmtree(root / "1")
    with pytest.raises(FileNotFoundError, match=f"^No complete version in {root}: "):
        resolve_saved_model(root)


@pytest.mark.parametrize("kind", ["local", "ram"])
def test_version_1_is_published_beside_version_10(kind, tmp_path):
    """On ram://, `gfile.exists("<root>/1")` is true once "<root>/10" exists; publishing goes by the listing."""
    root = _root(kind, tmp_path)
    publish_version(root, _write_fake("10"), version=10)
    assert fs.name(publish_version(root, _write_fake("1"), version=1)) == "1"
    assert (
        list_versions(root) == [1, 10] and fs.read_text(fs.join(root, "1", "saved_model.pb")) == "1"
    )


def test_a_written_version_without_its_variables_is_not_published(tmp_path):
    root = tmp_path / "models"

    def write(directory):
        _write_fake("1")(directory)
        fs.remove(fs.join(directory, "variables", "variables.index"))

    with pytest.raises(
        FileNotFoundError,
        match=rf"^The SavedModel written to {root}/\.1\.tmp-\w+ lacks "
        r"variables/variables\.index$",
    ):
        publish_version(root, write)
    assert fs.listdir(root) == []


# --- a directory published whole (CTranslate2's) and a checkpoint prefix (averaged checkpoints) ---

MODEL_FILES = ("config.json", "model.bin", "shared_vocabulary.json", "spm.model")


def _local_model(tmp_path, content):
    directory = tmp_path / f"model-{content}"
    directory.mkdir()
    for name in MODEL_FILES:
        (directory / name).write_text(content)
    return directory


@pytest.mark.parametrize("kind", ["local", "ram"])
def test_a_replaced_directory_is_old_new_or_marked_incomplete_at_every_call(
    kind, tmp_path, recorded
):
    target = fs.join(_root(kind, tmp_path), "ct2")
    fs.publish_dir(_local_model(tmp_path, "old"), target, last=("model.bin",))
    with pytest.raises(FileExistsError, match=f"^{target} exists$"):
        fs.publish_dir(_local_model(tmp_path, "new"), target, last=("model.bin",))
    filesystem = recorded(fs.parent(target))
    with filesystem:
        fs.publish_dir(tmp_path / "model-new", target, replace=True, last=("model.bin",))
    states = set()
    for tree in filesystem.recorder.trees:
        files = {
            name[len("ct2/") :]: content
            for name, content in tree.items()
            if name.startswith("ct2/")
        }
        if "model.bin" in files:  # whoever sees model.bin sees one whole model
            assert set(files) == set(MODEL_FILES) and len(set(files.values())) == 1, files
            states.add(files["model.bin"].decode())
        else:
            assert kind == "ram" or not files, (
                files
            )  # on a local disk: absent between the two renames
            states.add("incomplete" if files else "absent")
    assert {"old", "new", "absent"} <= states <= {"old", "new", "absent", "incomplete"}
    assert [fs.read_text(fs.join(target, name)) for name in MODEL_FILES] == ["new"] * 4
    assert sorted(fs.listdir(fs.parent(target))) == ["ct2"]


@pytest.mark.parametrize("kind", ["local", "ram"])
def test_a_failed_replace_keeps_the_old_directory(kind, tmp_path):
    target = fs.join(_root(kind, tmp_path), "ct2")
    fs.publish_dir(_local_model(tmp_path, "old"), target, last=("model.bin",))
    new = _local_model(tmp_path, "new")
    calls = _calls(
        kind,
        tmp_path,
        lambda root: (
            fs.publish_dir(new, fs.join(root, "ct2"), last=("model.bin",)),
            fs.publish_dir(new, fs.join(root, "ct2"), replace=True, last=("model.bin",)),
        ),
    )
    renames = calls[len(calls) // 2 :].count("gfile.rename")  # those of the replacing publish
    for index in range(renames):
        fault = Fault("gfile.rename", after=index, when="before")
        with FaultyFilesystem(fault), pytest.raises(OSError):
            fs.publish_dir(new, target, replace=True, last=("model.bin",))
        assert [fs.read_text(fs.join(target, name)) for name in MODEL_FILES] == ["old"] * 4, index
        assert fs.listdir(fs.parent(target)) == ["ct2"]


@pytest.mark.parametrize("kind", ["local", "ram"])
def test_a_replaced_checkpoint_reads_whole_whenever_its_index_exists(kind, tmp_path, recorded):
    directory = fs.join(_root(kind, tmp_path), "averaged")
    prefix = fs.join(directory, "ckpt-4")

    def publish(value):  # each write's own size: an index read with another write's data fails
        with fs.staging(prefix, exist_ok=True) as staged:
            tf.train.Checkpoint(v=tf.Variable([value] * int(value * 1000))).write(
                str(fs.join(staged, "ckpt-4"))
            )
            fs.publish_prefix(fs.join(staged, "ckpt-4"), prefix)

    publish(1.0)
    filesystem = recorded(directory)
    with filesystem:
        publish(2.0)
    seen = set()
    for index, tree in enumerate(filesystem.recorder.trees):
        copy = _copy_root(kind, tmp_path, index)
        _restore(tree, copy)
        if "ckpt-4.index" in tree:
            reader = tf.compat.v1.train.NewCheckpointReader(
                str(fs.join(copy, "ckpt-4"))
            )  # no directory check: ram://
            value = reader.get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE")
            seen.add(tuple(value))
    assert seen == {(1.0,) * 1000, (2.0,) * 2000}
    assert fs.listdir(directory) == ["ckpt-4.data-00000-of-00001", "ckpt-4.index"]
