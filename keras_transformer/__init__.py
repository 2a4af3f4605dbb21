"""keras_transformer: Transformer layers and models after "Attention Is All You Need".

Importing the package changes nothing in the process (file descriptors, `os.environ`):
the layers and the model, and with them Keras and TensorFlow, are imported when one of
their names is first used (`keras_transformer.MultiHeadAttention`,
`from keras_transformer import Transformer`) or a submodule is imported. A `.keras` file
of these layers therefore loads once one of them has been imported, e.g. after
`from keras_transformer import layers`.
"""

import os
import sys

from keras_transformer.lazy import lazy_attributes

__version__ = "0.1.0"

_LAYERS = (
    "DecoderBlock",
    "EncoderBlock",
    "LayerNormalization",
    "MultiHeadAttention",
    "PositionalEncoding",
    "PositionEmbedding",
    "PositionwiseFeedForward",
    "SharedEmbedding",
    "causal_mask",
    "padding_mask",
    "scaled_dot_product_attention",
)
_MODELS = ("PRESETS", "Transformer", "TransformerConfig", "get_preset")

__getattr__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(_LAYERS, "keras_transformer.layers"),
        **dict.fromkeys(_MODELS, "keras_transformer.models"),
    },
)


def import_tensorflow_quietly():
    """Import TensorFlow (and TensorFlow Text) with native stderr closed, when asked to be silent.

    The scripts in `experiments/` call this first, before importing anything that imports
    TensorFlow. TensorFlow's native libraries write start-up lines (CUDA probing on a
    machine without GPUs) before `TF_CPP_MIN_LOG_LEVEL` takes effect. When that variable
    asks for silence ("3", as the scripts set it by default), those lines are hidden too;
    otherwise, when TensorFlow is already imported, or when `KERAS_BACKEND` names another
    backend (the layers and models import no TensorFlow there), nothing changes. File
    descriptor 2 is the same file again when this returns.
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
    "import_tensorflow_quietly",
    "layers",
    "padding_mask",
    "scaled_dot_product_attention",
]
