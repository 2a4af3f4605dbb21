"""What runs on which Keras backend (docs/backends.md).

The layers and `Transformer` run on TensorFlow, JAX and PyTorch. Training, the loss, the
searches, the data pipeline and export are written for TensorFlow; their entry points
call `require_tensorflow`, so that another backend fails with one line naming it.
"""

import keras


def require_tensorflow(feature):
    """Raise `RuntimeError` (one line, naming the backend) unless Keras runs on TensorFlow.

    Example:

    >>> require_tensorflow("beam search")  # on TensorFlow: nothing happens
    """
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise RuntimeError(
            f"{feature} runs on the TensorFlow backend only, not on {backend} "
            f"(KERAS_BACKEND={backend}; see docs/backends.md)"
        )
