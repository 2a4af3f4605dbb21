"""keras_transformer: Transformer layers and models after "Attention Is All You Need".

Importing the package imports its layers and model (so that a `.keras` file of them loads
after `import keras_transformer`) and changes nothing else in the process: no file
descriptor and no `os.environ` variable. A script that wants TensorFlow's start-up lines
hidden asks for it before the import, by setting `KERAS_TRANSFORMER_QUIET_IMPORT=1`
(`QUIET_IMPORT`), as the scripts in `experiments/` do.
"""

import os
import sys

__version__ = "0.1.0"

# The environment variable a script sets to "1" to have the package import TensorFlow with
# its start-up lines hidden (`import_tensorflow_quietly`).
QUIET_IMPORT = "KERAS_TRANSFORMER_QUIET_IMPORT"


def import_tensorflow_quietly():
    """Import TensorFlow (and TensorFlow Text) with native stderr closed, when asked to be silent.

    Called by the package's import when `QUIET_IMPORT` is set to "1". TensorFlow's native libraries write start-up lines (CUDA probing on a
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


if os.environ.get(QUIET_IMPORT) == "1":
    import_tensorflow_quietly()

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
from keras_transformer.models import (  # noqa: E402
    PRESETS,
    Transformer,
    TransformerConfig,
    get_preset,
)

__all__ = [
    "PRESETS",
    "QUIET_IMPORT",
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
