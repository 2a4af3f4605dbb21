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
the target, then a rename), and directories with `publish_dir`.

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
import tempfile

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
            for directory, _, files in gfile.walk(source, topdown=False):  # gfile.rmtree trips on "a/.b"
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
        relative = directory[len(source):].strip("/")
        destination = join(target, relative) if relative else as_path(target)
        makedirs(destination)
        for file_name in files:
            if gfile.exists(join(directory, file_name)):  # ram:// also lists "a.b/c" as "a/.b/c"
                _copy_file(join(directory, file_name), join(destination, file_name))
    return as_path(target)


def publish_dir(local_dir, target, replace=False):
    """Move the finished local directory `local_dir` to `target` in one rename.

    The tree is first copied beside `target` under a temporary name, so `target` never
    holds half a tree; with `replace`, an existing `target` is removed just before the
    rename. On any error the temporary copy is removed.
    """
    makedirs(parent(target))
    temporary = temporary_name(target)
    try:
        copy_tree(local_dir, temporary)
        if replace and exists(target):
            rmtree(target)
        rename(temporary, target)
    except BaseException:
        discard(temporary)
        raise
    return as_path(target)
