"""Model configuration, the functional Transformer, and the parsing model that extends it.

Importing the package defines the parsing model and its config (`models.parsing`), which
registers the parsing presets and the class `build_model` builds for a `ParsingConfig`.
"""

from keras_transformer.models.config import PRESETS, TransformerConfig, get_preset, model_config
from keras_transformer.models.parsing import ParsingConfig, ParsingTransformer
from keras_transformer.models.transformer import Transformer, build_model

__all__ = [
    "PRESETS",
    "ParsingConfig",
    "ParsingTransformer",
    "Transformer",
    "TransformerConfig",
    "build_model",
    "get_preset",
    "model_config",
]
