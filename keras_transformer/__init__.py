"""keras_transformer: Transformer layers and models after "Attention Is All You Need"."""

import os
import sys


def _import_tensorflow_silently():
    """Import TensorFlow (and TensorFlow Text) with native stderr closed, when asked to be silent.

    TensorFlow's native libraries write start-up lines (CUDA probing on a machine without
    GPUs) before `TF_CPP_MIN_LOG_LEVEL` takes effect. When that variable asks for silence
    ("3", as the scripts in experiments/ set it by default), those lines are hidden too;
    otherwise, when TensorFlow is already imported, or when `KERAS_BACKEND` names another
    backend (the layers and models import no TensorFlow there), nothing changes.
    """
    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "3":
        return
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        return
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401
        import tensorflow_text  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)


_import_tensorflow_silently()

from keras_transformer import layers  # noqa: E402
from keras_transformer.layers import (  # noqa: E402
    DecoderBlock,
    EncoderBlock,
    LayerNormalization,
    MultiHeadAttention,
    PositionalEncoding,
    PositionEmbedding,
    PositionwiseFeedForward,
    SharedEmbedding,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from keras_transformer.models import PRESETS, Transformer, TransformerConfig, get_preset  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "DecoderBlock",
    "EncoderBlock",
    "LayerNormalization",
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
