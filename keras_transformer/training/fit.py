"""`model.fit` and `evaluate` steps for the Transformer on TensorFlow (`Transformer.train_step`).

Keras' own TensorFlow steps differ from ours in four ways, three of which show only on several replicas:

- **One decision for all replicas.** Keras applies whatever gradients it gets; under
  mixed_float16 its `LossScaleOptimizer` checks them for NaN/Inf, but per replica, before
  the all-reduce, and takes the first replica's answer. Here every replica's "non-finite"
  flag is all-reduced first; the update is applied (by the compiled optimizer, as Keras
  does) only if no replica holds a NaN or Inf, else skipped everywhere, with a loss-scale
  optimizer's scale halved once. A skipped update does not move `optimizer.iterations`.
- **Gradient accumulation on any number of replicas, by the custom loop's rule.** Keras'
  own accumulation (`gradient_accumulation_steps=k` on the optimizer) takes its
  update-or-accumulate branch inside a replica's `cond`, which tf.distribute cannot run.
  Here `training.update.Accumulation` takes the decision in a cross-replica context, as the
  custom loop does: each replica adds its batch's gradients to its own accumulators (Keras'
  own), and every k-th batch the optimizer applies the mean of the k batches' gradients
  (all-reduced once, as Keras does on one device) only if all k were finite on every
  replica; otherwise the whole update is skipped (the k batches not counted in
  `optimizer.iterations`, the loss scale halved once) and the accumulators are cleared.
- **The loss is computed on the real target positions.** With `LabelSmoothedCrossEntropy`,
  and no sample weights or compiled metrics (which see the `(B, T)` layout), the loss takes
  the model's logits at the real target positions only (`Transformer.real_target_logits`):
  the same loss and gradients as on `model(x)`, without the padding's output projection.
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

from keras_transformer.training.loss import global_token_count, labels_and_logits
from keras_transformer.training.update import (
    Accumulation,
    finite_everywhere,
    sum_over_replicas,
)


def train_step(model, data):
    """One `fit` step (see the module docstring); returns the metrics' values."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        y, y_pred = _loss_output(model, x, y, sample_weight, training=True)
        loss = model.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
        )
        _track_loss(model, loss, x, y)
        scaled = model.optimizer.scale_loss(loss)
    variables = model.trainable_weights
    apply_if_finite(model.optimizer, tape.gradient(scaled, variables), variables)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def test_step(model, data):
    """One `evaluate` step, with the token-weighted loss tracker."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y, y_pred = _loss_output(model, x, y, sample_weight, training=False)
    loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
    _track_loss(model, loss, x, y)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def apply_if_finite(optimizer, grads, variables):
    """Take one batch's `grads` into the update; apply the update on every replica if it is due
    and finite on all of them, else skip it on all of them (`training.update.Accumulation`).

    Called in a replica context (Keras' train step). The decision is taken in a
    cross-replica context (`merge_call`), as `LossScaleOptimizer` takes its own, since a
    branch that applies gradients cannot sit in a replica context's `cond`. With
    `gradient_accumulation_steps=k` an update is made of k batches (the module docstring).
    """
    if (
        not optimizer.built
    ):  # as `optimizer.apply` does: Keras builds it at the first step on one device
        with keras.name_scope(optimizer.name, caller=optimizer):
            optimizer.build(variables)
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    steps = inner.gradient_accumulation_steps or 1
    accumulation = Accumulation(
        optimizer,
        steps,
        [inner._accumulated_gradients[inner._get_variable_index(v)].value for v in variables]
        if steps > 1
        else (),
    )
    bad = sum_over_replicas(accumulation.nonfinite(grads))

    def decide(distribution, grads, bad):
        bad = distribution.experimental_local_results(bad)[0]  # the same on every replica
        if steps == 1:

            def apply():
                distribution.extended.call_for_each_replica(
                    optimizer.apply, args=(grads, variables)
                )

            accumulation.finish(distribution, finite_everywhere(bad), apply)
            return
        accumulation.add(distribution, grads)

        def apply():
            # Keras' own update branch is off while the replicas' calls are traced.
            inner.gradient_accumulation_steps = None
            try:
                distribution.extended.call_for_each_replica(
                    _apply_mean, args=(optimizer, accumulation, grads, variables)
                )
            finally:
                inner.gradient_accumulation_steps = steps

        def rewind():  # the update's earlier batches were counted as they came
            inner._iterations.assign_sub(steps - 1)

        def finish():
            accumulation.finish(distribution, finite_everywhere(bad), apply, rewind)

        def count():
            inner._iterations.assign_add(1)

        ops.cond(accumulation.due(inner._iterations), finish, count)

    tf.distribute.get_replica_context().merge_call(decide, args=(grads, bad))


def _apply_mean(optimizer, accumulation, grads, variables):
    """In one replica: the optimizer applies the mean of the update's accumulated gradients (none
    for a variable without a gradient, as Keras leaves it)."""
    mean = [
        None if grad is None else total / accumulation.steps
        for grad, total in zip(grads, accumulation.sums())
    ]
    optimizer.apply(mean, variables)


def _loss_output(model, x, y, sample_weight, training):
    """`(y, y_pred)` for the loss and metrics: the real target positions' labels and logits
    (`training.loss.labels_and_logits`) with a token-weighted loss and nothing that reads the
    `(B, T)` layout (no sample weights, no compiled metrics); else `y` and `model(x)`."""
    token_weighted = getattr(getattr(model, "loss", None), "token_weighted", False)
    if (
        token_weighted
        and sample_weight is None
        and getattr(model, "_compile_metrics", None) is None
    ):
        return labels_and_logits(model, x, y, training=training)
    return y, model(x, training=training)


def _track_loss(model, loss, x, y):
    loss_fn = getattr(model, "loss", None)
    if getattr(loss_fn, "token_weighted", False):
        tokens = ops.sum(ops.cast(ops.not_equal(y, loss_fn.pad_id), "float32"))  # this replica's
        # The loss is this replica's token-loss sum over the global tokens: times those, its sum.
        loss_sum = loss * global_token_count(tokens)
        model._loss_tracker.update_state(ops.divide_no_nan(loss_sum, tokens), sample_weight=tokens)
    else:  # what Keras does: the replica's value times the replicas, weighted by its sentences
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        model._loss_tracker.update_state(
            loss * replicas, sample_weight=tf.shape(tf.nest.flatten(x)[0])[0]
        )
