"""What runs on which Keras backend (docs/backends.md).

The layers, `Transformer`, the loss, `model.fit` and greedy and beam search run on
TensorFlow, JAX and PyTorch; `keras.distribution` (e.g. `DataParallel`) with
`Transformer.fit` on JAX only. The training loop, sampling, the data pipeline's tokenizer and export are
written for TensorFlow; their entry points call `require_tensorflow`, so that another
backend fails with one line naming it.
"""

import keras

_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}


def require_backend(feature, backend, hint=None):
    """Raise `RuntimeError` (one line, naming the backend) unless Keras runs on `backend`.

    Args:
        feature: what needs it, as the message names it.
        backend: "tensorflow", "jax" or "torch".
        hint: what to use instead, added to the message.

    Example:

    >>> require_backend("keras.distribution", "jax")  # on TensorFlow: RuntimeError
    Traceback (most recent call last):
    ...
    RuntimeError: keras.distribution runs on the JAX backend only, not on tensorflow (KERAS_BACKEND=tensorflow; ...)
    """
    current = keras.backend.backend()
    if current != backend:
        hint = f"; {hint}" if hint else ""
        raise RuntimeError(
            f"{feature} runs on the {_NAMES.get(backend, backend)} backend only, not on {current} "
            f"(KERAS_BACKEND={current}{hint}; see docs/backends.md)"
        )


def require_tensorflow(feature, hint=None):
    """Raise `RuntimeError` (one line, naming the backend) unless Keras runs on TensorFlow.

    Example:

    >>> require_tensorflow("Sampling")  # on TensorFlow: nothing happens
    """
    require_backend(feature, "tensorflow", hint)
