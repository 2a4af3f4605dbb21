"""`model.fit` and `evaluate` steps for the Transformer on TensorFlow (`Transformer.train_step`).

Keras' own TensorFlow steps differ from ours in two ways that only show on several replicas:

- **One decision for all replicas.** Keras applies whatever gradients it gets; under
  mixed_float16 its `LossScaleOptimizer` checks them for NaN/Inf, but per replica, before
  the all-reduce, and takes the first replica's answer. Here every replica's "non-finite"
  flag is all-reduced first; the update is applied (by the compiled optimizer, as Keras
  does) only if no replica holds a NaN or Inf, else skipped everywhere, with a loss-scale
  optimizer's scale halved once. A skipped update does not move `optimizer.iterations`.
- **The loss is weighted by real tokens.** Keras reports a replica's loss times the number
  of replicas, averaged with the replicas' sentence counts as weights, and averages the
  batches of an epoch by sentences. With a loss that marks itself `token_weighted`
  (`LabelSmoothedCrossEntropy`), the tracker instead sums each replica's token losses and
  real tokens: the reported number is the global per-token loss for any split of a batch
  (an empty slice on a replica included), and an epoch's loss is weighted by tokens.
"""

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.training.loss import global_token_count


def train_step(model, data):
    """One `fit` step (see the module docstring); returns the metrics' values.

    Raises:
        ValueError: the optimizer accumulates gradients (`gradient_accumulation_steps`)
            on several replicas, which Keras 3.15 cannot run (its accumulation branch
            synchronizes inside a replica's `cond`); `Trainer` accumulates there.
    """
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if optimizer.gradient_accumulation_steps and replicas > 1:
        raise ValueError(
            f"model.fit cannot accumulate gradients on {replicas} replicas (gradient_accumulation_steps="
            f"{optimizer.gradient_accumulation_steps}): Keras' accumulation does not run under tf.distribute. "
            "Use Trainer / experiments/train.py with accum_steps, or one replica."
        )
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        _track_loss(model, loss, x, y)
        scaled = model.optimizer.scale_loss(loss)
    variables = model.trainable_weights
    apply_if_finite(model.optimizer, tape.gradient(scaled, variables), variables)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def test_step(model, data):
    """One `evaluate` step, with the token-weighted loss tracker."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y_pred = model(x, training=False)
    loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
    _track_loss(model, loss, x, y)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def apply_if_finite(optimizer, grads, variables):
    """Apply `grads` on every replica if none of them holds a NaN or Inf, else on none.

    Called in a replica context (Keras' train step). The decision is taken in a
    cross-replica context (`merge_call`), as `LossScaleOptimizer` takes its own, since a
    branch that applies gradients cannot sit in a replica context's `cond`.
    """
    finite = ops.all(ops.stack([ops.all(ops.isfinite(g)) for g in grads if g is not None]))
    bad = 1.0 - ops.cast(finite, "float32")
    context = tf.distribute.get_replica_context()
    if context.num_replicas_in_sync > 1:
        bad = context.all_reduce("sum", bad)

    def decide(distribution, grads, bad):
        bad = distribution.experimental_local_results(bad)[0]  # the same on every replica

        def apply():
            distribution.extended.call_for_each_replica(optimizer.apply, args=(grads, variables))

        def skip():
            if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
                optimizer.step_counter.assign(0)
                optimizer.dynamic_scale.assign(optimizer.dynamic_scale * 0.5)

        ops.cond(bad == 0.0, apply, skip)

    context.merge_call(decide, args=(grads, bad))


def _track_loss(model, loss, x, y):
    loss_fn = getattr(model, "loss", None)
    if getattr(loss_fn, "token_weighted", False):
        tokens = ops.sum(ops.cast(ops.not_equal(y, loss_fn.pad_id), "float32"))  # this replica's
        # The loss is this replica's token-loss sum over the global tokens: times those, its sum.
        loss_sum = loss * global_token_count(tokens)
        model._loss_tracker.update_state(ops.divide_no_nan(loss_sum, tokens), sample_weight=tokens)
    else:  # what Keras does: the replica's value times the replicas, weighted by its sentences
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        model._loss_tracker.update_state(loss * replicas, sample_weight=tf.shape(tf.nest.flatten(x)[0])[0])
