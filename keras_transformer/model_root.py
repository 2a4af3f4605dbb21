"""A model root: exported SavedModel versions laid out as TF Serving expects.

    saved_models/<name>/        the model root (TF Serving's base path of model <name>)
        1/saved_model.pb        one directory per version, named by its integer
        2/saved_model.pb
        .3.claim-<random>       an export writing version 3 holds the number (`fs.claim`)
        .3.tmp-<random>/        ... and writes the version there before publishing it
        <other entries>         ignored

TF Serving (its `FileSystemStoragePathSource`) lists the base path's children (on `gs://`
every object under it, cut at the first "/") and takes as a version each child whose whole
name `strings::safe_strto64` parses: decimal digits, optionally a leading "-" and
surrounding whitespace, within a signed 64-bit integer. Every other name is ignored, so a
name that starts with "." never becomes a version. The toolkit's own versions are digits
only (`list_versions`).

`publish_version` writes a version: it claims the next free number (two exports at once get
two numbers), writes the SavedModel under the hidden `.<n>.tmp-<random>`, then publishes it
with `fs.publish`, `saved_model.pb` last. On a local disk the version appears complete in
one rename. On an object store (`gs://`, `s3://`) its directory can be listed while its
files are copied, and after a kill during that copy it stays without `saved_model.pb`;
`saved_model.pb` is always the last file to appear, so a version that has it is complete.
`resolve_saved_model` skips a version that lacks any of its files, with a warning.

`export.export_saved_model` writes versions into a root; `decoding.SavedModelTranslator`
and `evaluation.evaluate_saved_model` read a version, or a root's highest complete version.
`<name>` may be any path `keras_transformer.fs` knows (`gs://bucket/saved_models/name`).
"""

import os
import random
import re
import time

from absl import logging

from keras_transformer import fs

SAVED_MODEL_FILE = "saved_model.pb"  # read first by a loader; published last
VARIABLES_PREFIX = "variables/variables"  # the checkpoint files of the SavedModel's variables
_DATA_SHARD = re.compile(r"\.data-\d+-of-(\d+)$")


def list_versions(model_root):
    """The integer versions in `saved_models/<name>`, sorted (other entries are ignored), complete or not."""
    if not fs.isdir(model_root):
        return []
    return sorted(
        int(entry)
        for entry in fs.listdir(model_root)
        if entry.isdigit() and fs.isdir(fs.join(model_root, entry))
    )


def next_version(model_root):
    """The highest version + 1, or 1: above every integer entry and every number an export holds (`fs.claim`)."""
    if not fs.isdir(model_root):
        return 1
    taken = [int(entry) for entry in fs.listdir(model_root) if entry.isdigit()]
    taken += [int(held) for held in fs.claimed_names(model_root) if held.isdigit()]
    return max(taken) + 1 if taken else 1


def missing_checkpoint_files(prefix):
    """What the TensorFlow checkpoint files at `prefix` lack, as suffixes of `prefix`: `.index`,
    then each absent data shard `.data-<i>-of-<n>` (`.data-*` when there is none); [] if
    complete. `prefix`: a `tf.train.Checkpoint` prefix (`runs`), or a SavedModel's
    `variables/variables`; any `fs` path."""
    missing = [] if fs.exists(f"{prefix}.index") else [".index"]
    found = fs.glob(f"{prefix}.data-*")
    shards = [match for match in (_DATA_SHARD.search(os.fspath(path)) for path in found) if match]
    counts = sorted({int(match.group(1)) for match in shards})
    present = {match.group(0) for match in shards}
    missing += [
        shard
        for shard in (f".data-{i:05d}-of-{count:05d}" for count in counts for i in range(count))
        if shard not in present
    ]
    if not found:
        missing.append(".data-*")
    return missing


def missing_files(saved_model_dir):
    """What a SavedModel directory lacks: `saved_model.pb`, the variables' index, a data shard; [] if complete."""
    missing = [] if fs.isfile(fs.join(saved_model_dir, SAVED_MODEL_FILE)) else [SAVED_MODEL_FILE]
    variables = fs.join(saved_model_dir, VARIABLES_PREFIX)
    return missing + [VARIABLES_PREFIX + suffix for suffix in missing_checkpoint_files(variables)]


def claim_version(model_root, version=None, attempts=50):
    """Hold a version number of `model_root` for one export: `(number, claim file)` (see `fs.claim`).

    Without `version`, the next free number (`next_version`); a number another export
    claims at the same moment is left to it and the next one tried.

    Raises:
        FileExistsError: `version` exists or another export holds it.
    """
    for attempt in range(attempts):
        number = version if version is not None else next_version(model_root)
        try:
            return number, fs.claim(fs.join(model_root, str(number)))
        except FileExistsError as error:
            if version is not None:
                raise FileExistsError(
                    f"Version {version} of {model_root} cannot be written: {error}. Versions are never "
                    f"overwritten; choose another version, or none for the next free one."
                ) from None
            time.sleep(
                random.uniform(0, 0.01 * (attempt + 1))
            )  # two exports that collided part ways
    raise RuntimeError(f"Could not claim a version number in {model_root} in {attempts} attempts")


def publish_version(model_root, write, version=None):
    """Write a SavedModel with `write(directory)` and publish it as a version of `model_root`.

    The number is claimed first (`claim_version`); `write` fills a hidden directory beside the
    versions; the version is checked for its files (`missing_files`) and published with
    `saved_model.pb` last (`fs.publish`). On any error the hidden directory and the claim are
    removed and no version appears.

    Returns:
        the version directory (a `Path`, or a URL).
    """
    number, held = claim_version(model_root, version)
    target = fs.join(model_root, str(number))
    with fs.staging(target, claimed=held) as staged:
        write(staged)
        missing = missing_files(staged)
        if missing:
            raise FileNotFoundError(
                f"The SavedModel written to {staged} lacks {', '.join(missing)}"
            )
        return fs.publish(staged, target, last=(SAVED_MODEL_FILE,))


def resolve_saved_model(path):
    """The SavedModel directory `path` names: itself, or the highest complete version of a model root.

    A version that lacks a file (`missing_files`: one being published to an object store,
    or left by a copy that stopped) is skipped with a warning naming it.

    Raises:
        FileNotFoundError: naming `path` when it is neither, or when it or every version is incomplete.
    """
    path = fs.as_path(path)
    if fs.isfile(fs.join(path, SAVED_MODEL_FILE)):
        missing = missing_files(path)
        if missing:
            raise FileNotFoundError(
                f"{path} is an incomplete SavedModel: it lacks {', '.join(missing)}"
            )
        return path
    versions = list_versions(path)
    if not versions:
        raise FileNotFoundError(
            f"{path} is not a SavedModel (no saved_model.pb) nor a model root holding integer versions"
        )
    for version in reversed(versions):
        candidate = fs.join(path, str(version))
        missing = missing_files(candidate)
        if not missing:
            return candidate
        logging.warning("Skipped version %s of %s: it lacks %s", version, path, ", ".join(missing))
    raise FileNotFoundError(
        f"No complete version in {path}: every version lacks saved_model.pb or its variables"
    )
