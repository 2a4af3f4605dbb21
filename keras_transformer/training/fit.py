"""`model.fit` and `evaluate` steps for the Transformer on TensorFlow (`Transformer.train_step`).

Keras' own TensorFlow steps differ from ours in four ways, three of which show only on several replicas:

- **One decision for all replicas.** Keras applies whatever gradients it gets; under
  mixed_float16 its `LossScaleOptimizer` checks them for NaN/Inf, but per replica, before
  the all-reduce, and takes the first replica's answer. Here every replica's "non-finite"
  flag is all-reduced first; the update is applied (by the compiled optimizer, as Keras
  does) only if no replica holds a NaN or Inf, else skipped everywhere, with a loss-scale
  optimizer's scale halved once. A skipped update does not move `optimizer.iterations`.
- **Gradient accumulation on any number of replicas.** Keras' own accumulation
  (`gradient_accumulation_steps=k` on the optimizer) takes its update-or-accumulate branch
  inside a replica's `cond`, which tf.distribute cannot run. Here the same semantics are
  taken in the cross-replica decision: each replica adds its batch's gradients to its own
  accumulators, and every k-th finite batch the optimizer applies the mean of the k
  batches' gradients (all-reduced once, as Keras does on one device). A batch with a NaN or
  Inf on any replica is dropped on every replica and not counted; under loss scaling the
  halved scale also halves what was accumulated, so every batch of an update is unscaled by
  the same factor.
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
    finite_everywhere,
    nonfinite,
    skip_update,
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
    """Apply `grads` on every replica if none of them holds a NaN or Inf, else on none.

    Called in a replica context (Keras' train step). The decision is taken in a
    cross-replica context (`merge_call`), as `LossScaleOptimizer` takes its own, since a
    branch that applies gradients cannot sit in a replica context's `cond`. With
    `gradient_accumulation_steps=k` the gradients are accumulated and every k-th finite batch
    makes the update (the module docstring). The decision's rules are `training.update`'s,
    the custom loop's.
    """
    bad = sum_over_replicas(nonfinite(grads))
    if (
        not optimizer.built
    ):  # as `optimizer.apply` does: Keras builds it at the first step on one device
        with keras.name_scope(optimizer.name, caller=optimizer):
            optimizer.build(variables)
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    steps = inner.gradient_accumulation_steps

    def decide(distribution, grads, bad):
        bad = distribution.experimental_local_results(bad)[0]  # the same on every replica
        accumulators = (
            [inner._accumulated_gradients[inner._get_variable_index(v)] for v in variables]
            if steps
            else []
        )

        def apply():
            distribution.extended.call_for_each_replica(optimizer.apply, args=(grads, variables))

        def accumulate():
            for grad, accumulator in zip(grads, accumulators):  # each replica into its own copy
                if grad is not None:
                    distribution.extended.update(accumulator.value, _add, args=(grad,), group=False)
            inner._iterations.assign_add(1)

        def update():
            # This is Keras' update branch: its own is off while the replicas' calls are traced.
            inner.gradient_accumulation_steps = None
            try:
                distribution.extended.call_for_each_replica(
                    _apply_accumulated, args=(optimizer, grads, variables, accumulators, steps)
                )
            finally:
                inner.gradient_accumulation_steps = steps
            for accumulator in accumulators:
                accumulator.assign(ops.zeros_like(accumulator))

        def skip():
            skip_update(optimizer)
            if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
                for accumulator in accumulators:  # accumulated at the old scale
                    distribution.extended.update(accumulator.value, _halve, group=False)

        if steps:
            apply = lambda: ops.cond((inner._iterations + 1) % steps == 0, update, accumulate)  # noqa: E731
        ops.cond(finite_everywhere(bad), apply, skip)

    tf.distribute.get_replica_context().merge_call(decide, args=(grads, bad))


def _add(accumulator, grad):
    return accumulator.assign_add(grad)


def _halve(accumulator):
    return accumulator.assign(accumulator * 0.5)


def _apply_accumulated(optimizer, grads, variables, accumulators, steps):
    """In one replica: the optimizer applies the mean of this batch's and the accumulated gradients."""
    mean = [
        None if grad is None else (grad + accumulator.value) / steps
        for grad, accumulator in zip(grads, accumulators)
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
