"""Label-smoothed cross-entropy over non-padding tokens (paper section 5.4).

Shape letters: B batch, T target length, V vocabulary size.
"""

import keras
from keras import ops


def token_losses(labels, logits, label_smoothing=0.1, pad_id=0):
    """Label-smoothed cross-entropy at every target position, zero at padding.

    The target distribution puts `1 - eps` on the reference token and spreads `eps`
    uniformly over the whole vocabulary (Szegedy et al., 2016, as cited by the paper):
    q = (1 - eps) * onehot(y) + eps / V. The loss at a token is -sum_k q_k log p_k,
    computed from log-softmax without materializing the one-hot matrix.

    Args:
        labels: int `(B, T)`, `pad_id` at padding.
        logits: float `(B, T, V)` (computed in float32).
        label_smoothing: eps in [0, 1).
        pad_id: id whose positions do not count.

    Returns:
        `(losses, weights)`: float32 `(B, T)` each; weights are 1 at real tokens, 0 at padding.
    """
    labels = ops.cast(labels, "int32")
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # (B, T, V)
    reference = ops.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]  # (B, T)
    losses = -(1.0 - label_smoothing) * reference
    if label_smoothing:
        losses = losses - label_smoothing * ops.mean(log_probs, axis=-1)
    weights = ops.cast(ops.not_equal(labels, pad_id), "float32")  # (B, T)
    return losses * weights, weights


def label_smoothed_nll(labels, logits, label_smoothing=0.1, pad_id=0):
    """Summed label-smoothed cross-entropy and the number of real tokens (see `token_losses`).

    Returns:
        `(loss_sum, num_tokens)`: float32 scalars.
    """
    losses, weights = token_losses(labels, logits, label_smoothing, pad_id)
    return ops.sum(losses), ops.sum(weights)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Keras loss for `model.fit`: label-smoothed cross-entropy averaged over real tokens.

    Padding positions (label `pad_id`) contribute nothing and do not count in the mean,
    with or without a Keras mask on the logits.

    Args:
        label_smoothing: eps (0.1 in the paper).
        pad_id: the padding id.

    Example:

    >>> import numpy as np
    >>> loss = LabelSmoothedCrossEntropy(label_smoothing=0.1)
    >>> float(loss(np.array([[1, 0]]), np.zeros((1, 2, 4), "float32")))  # uniform logits
    1.3862943649291992
    """

    def __init__(self, label_smoothing=0.1, pad_id=0, name="label_smoothed_cross_entropy", **kwargs):
        kwargs.setdefault("reduction", "sum")
        super().__init__(name=name, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1). Received: label_smoothing={label_smoothing!r}")
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        # Per-token values already divided by the number of real tokens: their sum is the mean.
        losses, weights = token_losses(y_true, y_pred, self.label_smoothing, self.pad_id)
        return losses / ops.maximum(ops.sum(weights), 1.0)

    def get_config(self):
        config = super().get_config()
        config.update({"label_smoothing": self.label_smoothing, "pad_id": self.pad_id})
        return config
