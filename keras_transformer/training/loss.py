"""Label-smoothed cross-entropy over non-padding tokens (paper section 5.4).

Written in `keras.ops`: it runs on TensorFlow, JAX and PyTorch. Only the cross-replica
token count of a `tf.distribute` step is TensorFlow's (`global_token_count`); TensorFlow is
imported there, on its backend only.

Shape letters: B batch, T target length, V vocabulary size.
"""

import keras
from keras import ops


def token_losses(labels, logits, label_smoothing=0.1, pad_id=0):
    """Label-smoothed cross-entropy at every target position, zero at padding.

    The target distribution puts `1 - eps` on the reference token and spreads `eps`
    uniformly over the whole vocabulary (Szegedy et al., 2016, as cited by the paper):
    q = (1 - eps) * onehot(y) + eps / V. The loss at a token is -sum_k q_k log p_k, which
    is `logsumexp(z) - (1 - eps) * z_y - eps * mean(z)` for logits z: computed so, without
    a log-softmax of the vocabulary, and with its gradient `softmax(z) - q` written out
    (autodiff would also differentiate the gather of z_y, a scatter into a zero tensor the
    size of the logits, and the mean, a broadcast of the same size).

    Args:
        labels: int `(B, T)`, `pad_id` at padding (or any leading shape: `(N,)`).
        logits: float `(B, T, V)` (computed in float32), `(N, V)` with `(N,)` labels.
        label_smoothing: eps in [0, 1).
        pad_id: id whose positions do not count.

    Returns:
        `(losses, weights)`: float32 `(B, T)` each; weights are 1 at real tokens, 0 at padding.
    """
    labels = ops.cast(labels, "int32")
    losses = _smoothed_cross_entropy(ops.cast(logits, "float32"), labels, label_smoothing)
    weights = ops.cast(ops.not_equal(labels, pad_id), "float32")  # (B, T)
    return losses * weights, weights


def _smoothed_cross_entropy(logits, labels, label_smoothing):
    """`(B, T)` losses of `token_losses` (no padding weights), with the gradient `softmax(z) - q`.

    The vocabulary-sized work is a few passes over the logits: the maximum, `exp(z - max)`
    (kept for the gradient), its sum and the mean of z forward; backward, one product and
    one difference, and the reference's `1 - eps` taken off its entry by a scatter of one
    value per position, with no one-hot of the vocabulary.
    """

    @ops.custom_gradient
    def losses_of(logits):
        shift = ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True))  # (B, T, 1)
        exponentials = ops.exp(logits - shift)  # (B, T, V)
        normalizer = ops.sum(exponentials, axis=-1)  # (B, T)
        reference = ops.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]  # (B, T)
        losses = ops.log(normalizer) + shift[..., 0] - (1.0 - label_smoothing) * reference
        if label_smoothing:
            losses = losses - label_smoothing * ops.mean(logits, axis=-1)

        def gradient(*args, upstream=None):
            # TensorFlow and JAX pass the upstream gradient as the one argument; PyTorch
            # passes the function's inputs (the logits) as arguments and it as `upstream`.
            if upstream is None:
                upstream = args[0]
            vocabulary = ops.shape(exponentials)[-1]
            # softmax(z) * u - (eps / V) * u everywhere ...
            grads = exponentials * (upstream / normalizer)[..., None]
            if label_smoothing:
                grads = (
                    grads
                    - (label_smoothing / ops.cast(vocabulary, "float32")) * upstream[..., None]
                )
            # ... and - (1 - eps) * u at the reference: one entry per position, in place of a one-hot.
            rows = ops.reshape(grads, (-1, vocabulary))  # (B * T, V)
            references = ops.reshape(labels, (-1, 1))  # (B * T, 1)
            at_reference = ops.take_along_axis(rows, references, axis=-1)[:, 0]
            at_reference = at_reference - (1.0 - label_smoothing) * ops.reshape(upstream, (-1,))
            positions = ops.arange(ops.shape(references)[0], dtype="int32")[:, None]
            rows = ops.scatter_update(
                rows, ops.concatenate([positions, references], axis=-1), at_reference
            )
            return ops.reshape(rows, ops.shape(exponentials))

        return losses, gradient

    return losses_of(logits)


def label_smoothed_nll(labels, logits, label_smoothing=0.1, pad_id=0):
    """Summed label-smoothed cross-entropy and the number of real tokens (see `token_losses`).

    Returns:
        `(loss_sum, num_tokens)`: float32 scalars.
    """
    losses, weights = token_losses(labels, logits, label_smoothing, pad_id)
    return ops.sum(losses), ops.sum(weights)


def labels_and_logits(model, inputs, labels, training=False):
    """`(labels, logits)` for the loss of `model` on a batch: on the target's real positions
    where the model gives them (`Transformer.real_target_logits`: `(N,)` and `(N, V)`), else
    `labels` and `model(inputs)`'s `(B, T, V)` logits. `label_smoothed_nll` takes either.
    """
    real_rows = getattr(model, "real_target_logits", None)
    if real_rows is None:
        return labels, model(inputs, training=training)
    return real_rows(inputs, labels, training=training)


def global_token_count(num_tokens):
    """`num_tokens` summed over every replica of the current `tf.distribute` replica context.

    Under the default strategy, or outside a replica context, it is `num_tokens` itself.
    On JAX and PyTorch it is `num_tokens` too: there a step sees the whole global batch (a
    `keras.distribution.DataParallel` step on JAX computes on global arrays sharded across
    the devices, so a sum over the batch already runs over every replica's tokens). No
    gradient flows through the count.
    """
    num_tokens = ops.stop_gradient(ops.cast(num_tokens, "float32"))
    if keras.backend.backend() != "tensorflow":
        return num_tokens
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return num_tokens
    return context.all_reduce("sum", num_tokens)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Keras loss for `model.fit`: label-smoothed cross-entropy averaged over real tokens.

    Padding positions (label `pad_id`) contribute nothing and do not count in the mean,
    with or without a Keras mask on the logits.

    The mean is the paper's per-token normalisation over the whole global batch: the sum
    of the token losses over the real tokens of every replica, divided by the number of
    real tokens of every replica. Under a `tf.distribute` strategy each replica returns
    its own sum divided by that global count (all-reduced across replicas and workers);
    Keras sums the replicas' gradients, so the update equals the one a single device
    makes on the same global batch, whatever the number of replicas and however the
    tokens are split between them. On JAX and PyTorch a step computes on the whole global
    batch (under `keras.distribution.DataParallel` on JAX, on arrays sharded across the
    devices), so the sum and the count run over it already. On TensorFlow,
    `Transformer`'s fit and evaluate steps (which look for `token_weighted`) report the
    loss as the global token-loss sum over the global real tokens, for any split of a
    batch across replicas, and weight an epoch's batches by their tokens (`training.fit`);
    on JAX and PyTorch Keras' own steps report each batch's value, and weight an epoch's
    batches by their sentences. The reduction is always `"sum"`: a mean-type reduction
    would divide by the number of positions, padding included, and by the number of
    replicas.

    Args:
        label_smoothing: eps (0.1 in the paper).
        pad_id: the padding id.

    Example:

    >>> import numpy as np
    >>> loss = LabelSmoothedCrossEntropy(label_smoothing=0.1)
    >>> float(loss(np.array([[1, 0]]), np.zeros((1, 2, 4), "float32")))  # uniform logits
    1.3862943649291992
    """

    token_weighted = (
        True  # `Transformer`'s fit and evaluate steps report it weighted by real tokens
    )

    def __init__(
        self, label_smoothing=0.1, pad_id=0, name="label_smoothed_cross_entropy", **kwargs
    ):
        reduction = kwargs.pop("reduction", "sum")
        if reduction != "sum":
            raise ValueError(
                "LabelSmoothedCrossEntropy divides by the global number of real tokens itself; "
                f"its reduction must be 'sum'. Received: reduction={reduction!r}"
            )
        super().__init__(name=name, reduction=reduction, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                f"label_smoothing must be in [0, 1). Received: label_smoothing={label_smoothing!r}"
            )
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        # Per-token values divided by the global number of real tokens: summed over the
        # positions (reduction "sum") and the replicas (Keras sums their gradients), they
        # give the global per-token mean.
        losses, weights = token_losses(y_true, y_pred, self.label_smoothing, self.pad_id)
        return losses / ops.maximum(global_token_count(ops.sum(weights)), 1.0)

    def get_config(self):
        config = super().get_config()
        config.update({"label_smoothing": self.label_smoothing, "pad_id": self.pad_id})
        return config
