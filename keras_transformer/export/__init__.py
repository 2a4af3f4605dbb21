"""Export a trained translator as a SavedModel that TF Serving answers text-in, text-out.

Example:

>>> from keras_transformer.export import TranslationModule, export_saved_model
>>> translator = TranslationModule.from_run("runs/builtin_tiny", beam_size=4)
>>> result = export_saved_model(translator, "saved_models", name="numbers")
>>> result.path
PosixPath('saved_models/numbers/1')

See docs/serving.md for the signatures, the TF Serving setup and request examples.
"""

from keras_transformer.export.model_config import (
    MODEL_CONFIG_FILE,
    model_server_config,
    write_model_config,
)
from keras_transformer.export.ops_check import (
    DENIED_OPS,
    OpsReport,
    assert_servable_ops,
    check_saved_model_ops,
    op_origins,
    saved_model_ops,
)
from keras_transformer.export.serving import (
    SERVING_IMAGE,
    ExportError,
    ExportResult,
    ServingModule,
    export_saved_model,
    format_signatures,
    serving_commands,
    signature_specs,
    validation_sample,
)
from keras_transformer.export.translator import SIGNATURES, TranslationModule
from keras_transformer.export.warmup import (
    DEFAULT_WARMUP_SENTENCES,
    read_warmup_requests,
    replay_warmup_requests,
    warmup_requests,
    write_warmup_requests,
)
from keras_transformer.model_root import list_versions, next_version

__all__ = [
    "DEFAULT_WARMUP_SENTENCES",
    "DENIED_OPS",
    "MODEL_CONFIG_FILE",
    "SERVING_IMAGE",
    "SIGNATURES",
    "ExportError",
    "ExportResult",
    "OpsReport",
    "ServingModule",
    "TranslationModule",
    "assert_servable_ops",
    "check_saved_model_ops",
    "export_saved_model",
    "format_signatures",
    "list_versions",
    "model_server_config",
    "next_version",
    "op_origins",
    "read_warmup_requests",
    "replay_warmup_requests",
    "saved_model_ops",
    "serving_commands",
    "signature_specs",
    "validation_sample",
    "warmup_requests",
    "write_model_config",
    "write_warmup_requests",
]
