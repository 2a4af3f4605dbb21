"""keras_transformer: Transformer layers and models after "Attention Is All You Need"."""

from keras_transformer import layers
from keras_transformer.layers import (
    DecoderBlock,
    EncoderBlock,
    MultiHeadAttention,
    PositionalEncoding,
    PositionEmbedding,
    PositionwiseFeedForward,
    SharedEmbedding,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from keras_transformer.models import PRESETS, Transformer, TransformerConfig, get_preset

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "DecoderBlock",
    "EncoderBlock",
    "MultiHeadAttention",
    "PositionEmbedding",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "SharedEmbedding",
    "Transformer",
    "TransformerConfig",
    "causal_mask",
    "get_preset",
    "layers",
    "padding_mask",
    "scaled_dot_product_attention",
]
