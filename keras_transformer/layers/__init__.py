"""The Transformer's layers, importable into any functional Keras model."""

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.decoder import DecoderBlock
from keras_transformer.layers.embedding import SharedEmbedding
from keras_transformer.layers.encoder import EncoderBlock
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.masks import causal_mask, merge_masks, padding_mask
from keras_transformer.layers.normalization import LayerNormalization
from keras_transformer.layers.positional import PositionalEncoding, PositionEmbedding
from keras_transformer.layers.scaled_dot_product import (
    attention_weights,
    scaled_dot_product_attention,
)

__all__ = [
    "DecoderBlock",
    "EncoderBlock",
    "LayerNormalization",
    "MultiHeadAttention",
    "PositionEmbedding",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "SharedEmbedding",
    "attention_weights",
    "causal_mask",
    "merge_masks",
    "padding_mask",
    "scaled_dot_product_attention",
]
