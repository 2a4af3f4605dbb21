"""A NaN gradient under a finite loss, on the batches a test marks, for the trainer's loss.

`poisoned_nll` has the signature of `training.loss.label_smoothed_nll` and the same value;
on a batch whose labels hold `POISON_LABEL` its gradient is NaN. Tests install it in place
of the update step's loss (`keras_transformer.training.update.label_smoothed_nll`) before the
trainer's first step traces it.
"""

import tensorflow as tf

from keras_transformer.training.loss import label_smoothed_nll

POISON_LABEL = 5


def poison(labels):
    """A copy of `labels` (a numpy array) marked as poisoned."""
    labels = labels.copy()
    labels[0, 0] = POISON_LABEL
    return labels


def poisoned_nll(labels, logits, label_smoothing=0.1, pad_id=0):
    loss_sum, tokens = label_smoothed_nll(labels, logits, label_smoothing, pad_id)
    clean = 1.0 - tf.cast(tf.reduce_any(tf.equal(labels, POISON_LABEL)), tf.float32)
    # sqrt(0 * x + clean) - clean is 0; its gradient is 0 when clean, 0 * inf = NaN when not.
    return loss_sum + tf.sqrt(0.0 * tf.reduce_sum(logits) + clean) - clean, tokens


def overflowing_nll(labels, logits, label_smoothing=0.1, pad_id=0):
    """`label_smoothed_nll`, times 1e30 on a marked batch: finite in float32, but its loss-scaled
    gradients overflow float16 on the way back through a mixed_float16 model."""
    loss_sum, tokens = label_smoothed_nll(labels, logits, label_smoothing, pad_id)
    marked = tf.cast(tf.reduce_any(tf.equal(labels, POISON_LABEL)), tf.float32)
    return loss_sum * (1.0 + marked * 1e30), tokens
