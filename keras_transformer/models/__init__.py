"""Model configuration and the functional Transformer."""

from keras_transformer.models.config import PRESETS, TransformerConfig, get_preset
from keras_transformer.models.transformer import Transformer

__all__ = ["PRESETS", "Transformer", "TransformerConfig", "get_preset"]
