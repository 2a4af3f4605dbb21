"""A model root: exported SavedModel versions laid out as TF Serving expects.

    saved_models/<name>/        the model root (TF Serving's base path of model <name>)
        1/saved_model.pb        one directory per version, named by its integer
        2/saved_model.pb
        <other entries>         ignored: not an integer name (e.g. a hidden `.tmp-<random>`)

`export.export_saved_model` writes versions into a root; `decoding.SavedModelTranslator`
and `evaluation.evaluate_saved_model` read a version, or a root's highest version.
`<name>` may be any path `keras_transformer.fs` knows (`gs://bucket/saved_models/name`).
"""

from keras_transformer import fs


def list_versions(model_root):
    """The integer versions in `saved_models/<name>`, sorted (other entries are ignored)."""
    if not fs.isdir(model_root):
        return []
    return sorted(int(entry) for entry in fs.listdir(model_root) if entry.isdigit() and fs.isdir(fs.join(model_root, entry)))


def next_version(model_root):
    """The highest existing version + 1, or 1 (any entry with an integer name counts)."""
    taken = [int(entry) for entry in fs.listdir(model_root) if entry.isdigit()] if fs.isdir(model_root) else []
    return max(taken) + 1 if taken else 1


def resolve_saved_model(path):
    """The SavedModel directory `path` names: itself, or the highest version of a model root.

    Raises:
        FileNotFoundError: naming `path` when it is neither.
    """
    path = fs.as_path(path)
    if fs.isfile(fs.join(path, "saved_model.pb")):
        return path
    versions = list_versions(path)
    if not versions:
        raise FileNotFoundError(
            f"{path} is not a SavedModel (no saved_model.pb) nor a model root holding integer versions"
        )
    latest = fs.join(path, str(versions[-1]))
    if not fs.isfile(fs.join(latest, "saved_model.pb")):
        raise FileNotFoundError(f"{latest}, the highest version of {path}, is not a SavedModel (no saved_model.pb)")
    return latest
