"""Paths on any filesystem TensorFlow knows: local, `file://`, `gs://`, `s3://`, `hdfs://`, `ram://`.

Every file the toolkit reads or writes on a path a user gave (run directories, data files,
exports, evaluation outputs) goes through this module, which speaks `tf.io.gfile`.
`gs://` is built into TensorFlow; `s3://` and `hdfs://` need the `tensorflow-io` package,
imported here the first time a path names one of its schemes.

A path is either local (a `str` or `pathlib.Path`) or a URL (`<scheme>://...`). Functions
that make paths keep that distinction: a local path comes back as a `Path`, a URL as a
`str` joined with "/" — a URL is never passed through `pathlib` or `os.path`, which would
collapse `gs://bucket` into the local directory `gs:/bucket`.

Errors come back as `OSError`s (`FileNotFoundError`, `PermissionError`,
`FileExistsError`, ...) whose message names the path, whatever the filesystem.

Libraries that can only use a local file (CTranslate2) get one from `local_copy`; whole
files are written atomically with `write_bytes` / `write_text` (a temporary name beside
the target, then a rename). Directories and checkpoints are published under a claim
(`claim`, `staging`, `publish`, `publish_dir`, `publish_prefix`): atomically on a local
disk, and on object stores in an order that puts the file marking them complete last
(see "How publishing works" below).

Example:

>>> join("gs://bucket/runs/demo", "checkpoints")
'gs://bucket/runs/demo/checkpoints'
>>> join("runs/demo", "checkpoints")
PosixPath('runs/demo/checkpoints')
"""

import contextlib
import errno
import io
import os
import pathlib
import posixpath
import secrets
import socket
import tempfile
import time

import tensorflow as tf

gfile = tf.io.gfile


def is_url(path):
    """Whether `path` names a filesystem by a scheme (`gs://`, `file://`, `ram://`, ...)."""
    return "://" in str(path)


# Schemes TensorFlow itself does not register; `tensorflow_io` does, once imported.
_TENSORFLOW_IO_SCHEMES = ("s3", "hdfs", "viewfs", "har", "az", "http", "https")
_tensorflow_io_tried = False


def _register_filesystem(path):
    """Import `tensorflow_io` (when installed) the first time a path names one of its schemes."""
    global _tensorflow_io_tried
    if _tensorflow_io_tried or os.fspath(path).split("://", 1)[0] not in _TENSORFLOW_IO_SCHEMES:
        return
    _tensorflow_io_tried = True
    try:
        import tensorflow_io  # noqa: F401  (registers s3://, hdfs://, ...)
    except ImportError:
        pass  # TensorFlow's error then names the unknown scheme


def as_path(path):
    """`path` as the toolkit keeps it: a `pathlib.Path` when local, the unchanged `str` when a URL."""
    path = os.fspath(path)
    return path if is_url(path) else pathlib.Path(path)


def join(base, *parts):
    """`base` followed by `parts` (a `Path` for a local `base`, a "/"-joined `str` for a URL)."""
    if not is_url(base):
        return pathlib.Path(base).joinpath(*map(str, parts))
    _register_filesystem(base)
    path = os.fspath(base)
    for part in parts:
        path = f"{path.rstrip('/')}/{str(part).lstrip('/')}"
    return path


def name(path):
    """The last component of `path` (of the resolved directory for a local path such as ".")."""
    if is_url(path):
        return os.fspath(path).rstrip("/").rsplit("/", 1)[-1]
    return pathlib.Path(path).resolve().name


def parent(path):
    """The directory that holds `path`."""
    if is_url(path):
        scheme, rest = os.fspath(path).rstrip("/").split("://", 1)
        return f"{scheme}://{posixpath.dirname(rest)}"
    return pathlib.Path(path).parent


def resolve(path):
    """An absolute local path, or the URL unchanged (for messages and commands run elsewhere)."""
    return path if is_url(path) else pathlib.Path(path).resolve()


@contextlib.contextmanager
def os_errors(path):
    """Turn TensorFlow filesystem errors inside the block into `OSError`s naming `path`."""
    if is_url(path):
        _register_filesystem(path)
    try:
        yield
    except tf.errors.OpError as error:
        raise _os_error(error, path) from error


_OS_ERRORS = {
    tf.errors.NotFoundError: (FileNotFoundError, errno.ENOENT),
    tf.errors.PermissionDeniedError: (PermissionError, errno.EACCES),
    tf.errors.AlreadyExistsError: (FileExistsError, errno.EEXIST),
    tf.errors.ResourceExhaustedError: (OSError, errno.ENOSPC),
}


def _os_error(error, path):
    kind, number = _OS_ERRORS.get(type(error), (OSError, errno.EIO))
    reason = (error.message or type(error).__name__).splitlines()[0]
    return kind(number, reason, os.fspath(path))


def exists(path):
    with os_errors(path):
        return gfile.exists(os.fspath(path))


def isdir(path):
    with os_errors(path):
        return gfile.isdir(os.fspath(path))


def isfile(path):
    return exists(path) and not isdir(path)


def makedirs(path):
    """Create `path` and its parents (nothing happens when it exists)."""
    with os_errors(path):
        gfile.makedirs(os.fspath(path))
    return as_path(path)


def listdir(path):
    """The names in directory `path` (without a trailing "/"), sorted."""
    with os_errors(path):
        return sorted(entry.rstrip("/") for entry in gfile.listdir(os.fspath(path)))


def glob(pattern):
    """The paths matching `pattern` (a `Path` each when local), sorted."""
    with os_errors(pattern):
        return [as_path(path) for path in sorted(gfile.glob(os.fspath(pattern)))]


def mtime(path):
    """The modification time of `path` in seconds since the epoch."""
    with os_errors(path):
        return gfile.stat(os.fspath(path)).mtime_nsec / 1e9


def remove(path):
    with os_errors(path):
        gfile.remove(os.fspath(path))


def rmtree(path):
    with os_errors(path):
        gfile.rmtree(os.fspath(path))


# Filesystems whose rename moves a file but not a directory's contents: there a directory
# is copied, then the source removed.
_NO_DIRECTORY_RENAME = ("ram://",)


def rename(source, target, overwrite=False):
    """Rename a file or directory (atomic on local disks; `FileExistsError` if `target` exists)."""
    source, target = os.fspath(source), os.fspath(target)
    with os_errors(target):
        if source.startswith(_NO_DIRECTORY_RENAME) and gfile.isdir(source):
            if gfile.exists(target) and not overwrite:
                raise FileExistsError(errno.EEXIST, "already exists", target)
            copy_tree(source, target)
            for directory, _, files in gfile.walk(
                source, topdown=False
            ):  # gfile.rmtree trips on "a/.b"
                for file_name in files:
                    if gfile.exists(join(directory, file_name)):
                        gfile.remove(join(directory, file_name))
                gfile.remove(directory)
        else:
            gfile.rename(source, target, overwrite=overwrite)
    return as_path(target)


def read_bytes(path):
    with os_errors(path):
        with gfile.GFile(os.fspath(path), "rb") as f:
            return f.read()


def read_text(path):
    return read_bytes(path).decode("utf-8")


def temporary_name(path, kind="tmp"):
    """A fresh name beside `path`, hidden and marked as `kind`: `<dir>/.<name>.<kind>-<random>`."""
    base = os.fspath(path).rstrip("/")
    return join(parent(base), f".{posixpath.basename(base)}.{kind}-{secrets.token_hex(4)}")


def write_bytes(path, data):
    """Write `data` to `path` atomically (a temporary file beside it, then a rename); creates the directory.

    On any error `path` keeps its previous content and the temporary file is removed.
    """
    makedirs(parent(path))
    temporary = temporary_name(path)
    try:
        with os_errors(path):
            with gfile.GFile(os.fspath(temporary), "wb") as f:
                f.write(data)
        rename(temporary, path, overwrite=True)
    except BaseException:
        discard(temporary)
        raise
    return as_path(path)


def write_text(path, text):
    return write_bytes(path, text.encode("utf-8"))


def write_from(path, write):
    """Write `path` atomically from `write(file)`, which writes bytes to a file object (e.g. `figure.savefig`)."""
    buffer = io.BytesIO()
    write(buffer)
    return write_bytes(path, buffer.getvalue())


def discard(path):
    """Remove the file or directory tree `path` if it exists, ignoring errors (cleanup after a failure)."""
    try:
        if gfile.isdir(os.fspath(path)):
            gfile.rmtree(os.fspath(path))
        elif gfile.exists(os.fspath(path)):
            gfile.remove(os.fspath(path))
    except tf.errors.OpError:
        pass


def check_writable(directory):
    """Create `directory` if needed and prove it takes a file (written, then removed).

    Raises:
        OSError: one line naming `directory` when it cannot be created or written.
    """
    try:
        makedirs(directory)
        probe = temporary_name(join(directory, "write_check"))
        with os_errors(probe):
            with gfile.GFile(os.fspath(probe), "wb") as f:
                f.write(b"ok")
        remove(probe)
    except OSError as error:
        raise type(error)(f"Cannot write to {directory}: {error.strerror or error}") from error
    return as_path(directory)


@contextlib.contextmanager
def local_copy(path):
    """A local path holding `path`'s content (a file or a directory tree), for libraries without gfile.

    A local `path` is used as it is; a URL is copied into a temporary directory, removed
    when the block ends.
    """
    if not is_url(path):
        yield pathlib.Path(path)
        return
    with tempfile.TemporaryDirectory() as scratch:
        local = pathlib.Path(scratch) / name(path)
        copy_tree(path, local) if isdir(path) else _copy_file(path, local)
        yield local


def _copy_file(source, target):
    with os_errors(source):
        gfile.copy(os.fspath(source), os.fspath(target), overwrite=True)


def copy_tree(source, target):
    """Copy the files under directory `source` into `target` (created), on any filesystems."""
    source = os.fspath(source).rstrip("/")
    for directory, _, files in gfile.walk(source):
        relative = directory[len(source) :].strip("/")
        destination = join(target, relative) if relative else as_path(target)
        makedirs(destination)
        for file_name in files:
            if gfile.exists(join(directory, file_name)):  # ram:// also lists "a.b/c" as "a/.b/c"
                _copy_file(join(directory, file_name), join(destination, file_name))
    return as_path(target)


# How publishing works (`claim`, `staging`, `publish`, `publish_dir`, `publish_prefix`).
#
# A writer first claims the name it will publish (`claim`): it writes its own claim file
# `.<name>.claim-<random>` beside it, then lists the directory; if another writer's claim for
# the same name is there (or the name exists), it withdraws. Of two writers that claim one
# name at once, the one that lists second sees the other's claim, so at most one goes on
# (both may withdraw). This needs a listing that shows every file whose write has returned:
# true of local disks, `gs://` and `s3://` (strongly consistent listing) and `ram://`.
# `tf.io.gfile` has no exclusive create (`gfile.mkdir` accepts an existing directory).
#
# The content is then written into a hidden directory beside the target
# (`.<name>.tmp-<random>`) and published. On a local disk (a path or `file://`) publishing
# is one rename(2): atomic, the target appears complete or not at all. Everywhere else
# (`gs://`, `s3://`, `hdfs://`, `ram://`), where a directory rename may copy object by
# object, files move one by one in a fixed order: the
# `last` files (the one that marks the content complete: `saved_model.pb`, `model.bin`, a
# checkpoint's `.index`) after every other file. There the target's name can be listed
# before it is complete (during the publish, or for good after a kill during it), but
# whoever sees the `last` file sees every other file.

CLAIM_KIND = "claim"  # `.<name>.claim-<random>`: a writer holds <name>
STAGING_KIND = "tmp"  # `.<name>.tmp-<random>`: the content, while it is written


def has_atomic_rename(path):
    """Whether renaming a directory at `path` is one atomic step (a local disk: a path or `file://`)."""
    return not is_url(path) or os.fspath(path).startswith("file://")


def _listed(path):
    """Whether `path` is an entry of its directory (`exists` on `ram://` also says yes for "a/1" when only "a/10" is)."""
    return isdir(parent(path)) and posixpath.basename(os.fspath(path).rstrip("/")) in listdir(
        parent(path)
    )


def claim(path, exist_ok=False):
    """Hold the name `path` for this writer alone; returns the claim file (pass it to `release`).

    Raises:
        FileExistsError: naming `path`, when another writer's claim holds it, or when it
            exists and not `exist_ok`. This writer's claim is then removed.
    """
    directory, base = parent(path), posixpath.basename(os.fspath(path).rstrip("/"))
    makedirs(directory)
    mine = temporary_name(path, CLAIM_KIND)
    with os_errors(mine):
        with gfile.GFile(os.fspath(mine), "wb") as f:
            f.write(f"{socket.gethostname()} {os.getpid()} {time.time():.0f}\n".encode())
    try:
        others = [
            entry
            for entry in listdir(directory)
            if entry.startswith(f".{base}.{CLAIM_KIND}-")
            and entry != posixpath.basename(os.fspath(mine))
        ]
        if others:
            raise FileExistsError(
                f"Another writer is publishing {path} (its claim: {join(directory, others[0])}; a claim left by a "
                "killed process holds the name until it is removed)"
            )
        if not exist_ok and _listed(path):
            raise FileExistsError(f"{path} exists")
    except BaseException:
        discard(mine)
        raise
    return mine


def release(claim_file):
    """Give up a claim made by `claim` (the name may be claimed again)."""
    discard(claim_file)


def claimed_names(directory):
    """The names in `directory` that a writer's claim holds (published or not)."""
    marker = f".{CLAIM_KIND}-"
    return (
        {
            entry[1:].rsplit(marker, 1)[0]
            for entry in listdir(directory)
            if entry.startswith(".") and marker in entry
        }
        if isdir(directory)
        else set()
    )


@contextlib.contextmanager
def staging(path, exist_ok=False, claimed=None):
    """Claim `path` and yield a fresh hidden directory beside it to write its content in.

    When the block ends (normally or not) the directory, whatever is left of it, and the
    claim are removed; publish from inside the block (`publish`, `publish_prefix`). A
    process killed inside the block leaves both behind (hidden names, which nothing reads);
    the claim then holds `path` until removed by hand.

    Args:
        path: the name to publish.
        exist_ok: see `claim`.
        claimed: a claim on `path` already made with `claim` (then not claimed again).

    Raises:
        FileExistsError: see `claim`.
    """
    held = claimed or claim(path, exist_ok=exist_ok)
    directory = temporary_name(path, STAGING_KIND)
    try:
        makedirs(directory)
        yield directory
    finally:
        discard(directory)
        release(held)


def _files(directory):
    """The files under `directory`, as "/"-joined paths relative to it, sorted."""
    directory = os.fspath(directory).rstrip("/")
    found = []
    with os_errors(directory):
        for walked, _, names in gfile.walk(directory):
            relative = walked[len(directory) :].strip("/")
            for file_name in names:
                if gfile.exists(
                    os.fspath(join(walked, file_name))
                ):  # ram:// also lists "a.b/c" as "a/.b/c"
                    found.append(f"{relative}/{file_name}" if relative else file_name)
    return sorted(found)


def publish(staged, target, last=(), replace=False):
    """Make the finished directory `staged` (beside `target`, from `staging`) appear as `target`.

    On a local disk: one rename, atomic; with `replace`, the old `target` is first renamed
    aside (`.<name>.old-<random>`) and removed after, so between the two renames `target`
    is absent, never a mix. Elsewhere (`gs://`, `s3://`, `ram://`, ...): the files move one
    by one, the `last` ones (paths relative to `staged`) after all others; with `replace`
    the old `target` first moves aside the same way, its `last` files first. There a reader
    that finds `target` without its `last` files must treat it as incomplete. On an error the
    files moved so far are removed and an old `target` moved back.

    Raises:
        FileExistsError: if `target` exists and not `replace`.
    """
    last = tuple(last)
    if _listed(target) and not replace:
        raise FileExistsError(f"{target} exists")
    if has_atomic_rename(target):
        old = temporary_name(target, "old") if _listed(target) else None
        if old is not None:
            rename(target, old)
        try:
            rename(staged, target)
        except BaseException:
            if old is not None:
                rename(old, target)  # the old one back
            raise
        if old is not None:
            discard(old)
        return as_path(target)
    old = temporary_name(target, "old") if _listed(target) else None
    if old is not None:
        try:
            _move_files(target, old, last, last_first=True)
        except BaseException:
            _move_files(old, target, last)  # what had moved, back
            raise
    try:
        _move_files(staged, target, last)
    except BaseException:
        _discard_tree(target, last)  # what was moved: never a partial target left behind
        if old is not None:
            _move_files(old, target, last)
        raise
    if old is not None:
        discard(old)
    return as_path(target)


def _move_files(source, target, last=(), last_first=False):
    """Rename each file under `source` to the same place under `target`, the `last` files last
    (or first, with `last_first`); then remove `source`."""
    files = _files(source) if exists(source) else []
    marking = [relative for relative in last if relative in files]
    others = [relative for relative in files if relative not in last]
    ordered = marking + others if last_first else others + marking
    makedirs(target)
    for relative in ordered:
        makedirs(parent(join(target, relative)))
        rename(join(source, relative), join(target, relative))
    discard(source)


def _discard_tree(path, last=()):
    """`discard` the tree `path`, its `last` files first (so it never looks complete while removed)."""
    for relative in last:
        discard(join(path, relative))
    discard(path)


def publish_dir(local_dir, target, replace=False, last=()):
    """Publish a copy of the finished local directory `local_dir` as `target` (see `publish`).

    The tree is copied into a hidden directory beside `target` under a claim on `target`
    (`staging`), then published: `target` never holds half a tree on a local disk, and
    elsewhere its `last` files appear after every other file. On any error the copy is
    removed and an existing `target` is untouched.

    Raises:
        FileExistsError: `target` exists and not `replace`, or another writer is publishing it.
    """
    with staging(target, exist_ok=replace) as staged:
        copy_tree(local_dir, staged)
        return publish(staged, target, last=last, replace=replace)


def publish_prefix(staged_prefix, prefix, last_suffix=".index"):
    """Publish the files `<staged_prefix>.*` as `<prefix>.*` (a TensorFlow checkpoint and the like).

    The file ending in `last_suffix` moves after every other one; existing `<prefix>.*` files
    are replaced, the one ending in `last_suffix` removed first. Each move is a rename (atomic
    for each file on a local disk, a copy elsewhere), so a reader that finds
    `<prefix><last_suffix>` finds every other file of the same write.
    """
    staged_name, target_dir = posixpath.basename(os.fspath(staged_prefix)), parent(prefix)
    new = [os.fspath(path) for path in glob(f"{staged_prefix}.*")]
    old = [os.fspath(path) for path in glob(f"{prefix}.*")]
    for path in sorted(old, key=lambda path: not path.endswith(last_suffix)):
        remove(path)
    for path in sorted(new, key=lambda path: path.endswith(last_suffix)):
        suffix = posixpath.basename(path)[len(staged_name) :]
        rename(
            path,
            join(target_dir, f"{posixpath.basename(os.fspath(prefix))}{suffix}"),
            overwrite=True,
        )
    return as_path(prefix)
