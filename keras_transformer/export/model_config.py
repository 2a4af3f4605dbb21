"""A TF Serving model config file (`--model_config_file`), as a text proto.

Example output for `model_server_config({"numbers": "/models/numbers"})`:

    model_config_list {
      config {
        name: "numbers"
        base_path: "/models/numbers"
        model_platform: "tensorflow"
        model_version_policy {
          latest {
            num_versions: 1
          }
        }
      }
    }
"""

from keras_transformer import fs
from keras_transformer.layers.checks import check_positive_int

MODEL_CONFIG_FILE = "models.config"


def model_server_config(models, num_versions=1):
    """The text of a `ModelServerConfig` that serves `models`.

    Args:
        models: `{name: base_path}`, `base_path` as the server sees it (e.g. the path the
            `saved_models/<name>` directory is mounted at in the container).
        num_versions: serve the latest this many versions of each model.

    Returns:
        the text proto (validated by parsing it with the `tensorflow-serving-api` protos).
    """
    check_positive_int("num_versions", num_versions)
    try:
        from google.protobuf import text_format
        from tensorflow_serving.config import model_server_config_pb2
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "Writing a TF Serving model config needs the `tensorflow-serving-api` package: "
            "pip install 'tensorflow-serving-api>=2.21,<2.22'"
        ) from err
    config = model_server_config_pb2.ModelServerConfig()
    for name, base_path in models.items():
        entry = config.model_config_list.config.add(
            name=name, base_path=str(base_path), model_platform="tensorflow"
        )
        entry.model_version_policy.latest.num_versions = num_versions
    return text_format.MessageToString(config)


def write_model_config(path, models, num_versions=1, overwrite=False):
    """Write `model_server_config(models, num_versions)` to `path` (atomically).

    An existing file is kept unless `overwrite` (it may hold edits). Returns the path.
    """
    if fs.exists(path) and not overwrite:
        return fs.as_path(path)
    return fs.write_text(path, model_server_config(models, num_versions))
