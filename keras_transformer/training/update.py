"""The update step: gradients on every replica, one decision for all, applied or skipped.

One call of `UpdateStep` runs up to `n` updates inside one `tf.function` (Keras'
`steps_per_execution`), so the host reads results once per call. Each update:

1. every replica computes its gradients of the summed label-smoothed loss on its batch
   (or accumulates them over `accum_steps` batches), loss-scaled under mixed_float16;
2. every replica packs `[loss sum, real tokens, non-finite gradient, non-finite loss,
   stop]` into one vector, and one all-reduce gives every replica and worker the same
   totals: the same decision everywhere;
3. if no replica holds a NaN or Inf, the gradients divided by the global token count are
   applied (the optimizer's all-reduce sums them); otherwise nothing is applied, the
   step counter does not move, the skip is counted and, under loss scaling, the scale is
   halved once (on every replica alike, in cross-replica context).

The loop of one call ends early on a SIGTERM flag from any worker, or on a non-finite
update the options say to stop on (`on_nonfinite="stop"`, or `max_consecutive_skips`
skips in a row): the host raises after the call with the step and the scale.

The decision's rules are this module's, and `model.fit`'s step (`training.fit.apply_if_finite`)
takes them too: a replica's flag (`nonfinite`), the one sum over the replicas
(`sum_over_replicas`), the decision from it (`finite_everywhere`), what a skipped update does
(`skip_update`), and `Accumulation`, which holds an update's micro-batches and applies or skips
it: an update is applied only when every micro-batch that makes it up is finite on every
replica; otherwise the whole update is skipped (counted once), the accumulators are cleared
and, under loss scaling, the scale is halved once. The loop and `fit` differ only in how an
applied update is normalised (here by the update's real tokens; in `fit` as Keras does, the
mean of the micro-batches' means).
"""

import keras
import tensorflow as tf

from keras_transformer.training.loss import label_smoothed_nll, labels_and_logits

# The packed per-update scalars, in this order.
LOSS, TOKENS, BAD_GRADIENT, BAD_LOSS, STOP = range(5)


def nonfinite(tensors):
    """One replica's flag: 1.0 if any of `tensors` holds a NaN or an Inf, else 0.0 (float32).

    Entries that are None (a variable without a gradient) are left out.
    """
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors if t is not None])
    return 1.0 - tf.cast(finite, tf.float32)


def sum_over_replicas(local):
    """`local` summed over every replica and worker, the same on all of them (replica context).

    The one collective of an update's decision: each replica's flags go in, and every replica
    gets the same totals, so every replica decides alike.
    """
    context = tf.distribute.get_replica_context()
    if context.num_replicas_in_sync == 1:
        return local
    return context.all_reduce("sum", local)


def finite_everywhere(flags):
    """The decision: whether no replica flagged a NaN or an Inf (`flags`: summed `nonfinite` flags)."""
    return tf.reduce_all(tf.equal(flags, 0.0))


def skip_update(optimizer):
    """What a skipped update does instead, once for all replicas (cross-replica context).

    Nothing is applied and the optimizer's iterations stay; under loss scaling, what
    `LossScaleOptimizer` does with non-finite gradients, decided once for all replicas: its
    step counter starts again and the scale is halved.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer.step_counter.assign(0)
        optimizer.dynamic_scale.assign(optimizer.dynamic_scale * 0.5)


class Accumulation:
    """One update made of `steps` micro-batches, applied or skipped as a whole: the custom loop's
    (`UpdateStep`) and `fit`'s (`training.fit`), whose rule is the one below.

    Each replica adds each micro-batch's gradients to its own accumulators (`add`). At the
    update's end (`due`), one decision for every replica (`finish`): the update is applied only
    if every micro-batch that makes it up is finite on every replica; otherwise the whole update
    is skipped (`skip_update`: nothing applied, the loss scale halved once). The accumulators are
    cleared either way. A NaN or an Inf of any micro-batch stays one in the sum, so a replica's
    accumulators carry its flag (`nonfinite`). Under loss scaling every micro-batch of an update
    is scaled alike: the scale moves only at an update's end, after which the sums start again
    from zero.

    Args:
        optimizer: what applies the update (a `LossScaleOptimizer`'s scale is halved on a skip).
        steps: micro-batches per update.
        accumulators: with `steps > 1`, one float32 variable per trainable variable, each
            replica's own copy: `SyncOnRead` sums (the loop) or Keras' `gradient_accumulator`
            variables (`fit`).
    """

    def __init__(self, optimizer, steps=1, accumulators=()):
        self.optimizer, self.steps, self.accumulators = optimizer, steps, list(accumulators)

    def due(self, taken):
        """Whether the micro-batch after `taken` earlier ones ends an update."""
        return (taken + 1) % self.steps == 0

    def add(self, strategy, grads):
        """Cross-replica context: each replica's micro-batch gradients (`grads`, per replica)
        into its own accumulators."""
        for accumulator, grad in zip(self.accumulators, grads):
            if grad is not None:
                strategy.extended.update(accumulator, _add, args=(grad,), group=False)

    def sums(self):
        """Replica context: this replica's accumulated gradients."""
        return [tf.convert_to_tensor(accumulator) for accumulator in self.accumulators]

    def nonfinite(self, grads=()):
        """Replica context: this replica's flag for the update so far: its accumulators and
        `grads` (a micro-batch not added yet; all of it without accumulation)."""
        return nonfinite(self.sums() + list(grads))

    def finish(self, strategy, finite, apply, skip=None):
        """Cross-replica context: the update's end under the one decision `finite`
        (`finite_everywhere` of the replicas' summed flags): `apply()`, or else `skip_update` and
        `skip()`; then the accumulators are cleared."""

        def applied():
            apply()

        def skipped():
            skip_update(self.optimizer)
            if skip is not None:
                skip()

        tf.cond(finite, applied, skipped)
        for accumulator in self.accumulators:
            strategy.extended.update(accumulator, _clear, group=False)


def _add(accumulator, grad):
    return accumulator.assign_add(grad)


def _clear(accumulator):
    return accumulator.assign(tf.zeros_like(accumulator))


class UpdateStep:
    """Builds and runs the compiled update loop of a `Trainer` (see the module docstring).

    Args:
        model, optimizer: built under `strategy`'s scope.
        strategy: the `tf.distribute.Strategy`.
        label_smoothing: of the training loss.
        options: `TrainOptions` (accum_steps, jit_compile, on_nonfinite, max_consecutive_skips).
        batches_drawn: int64 variable counting the global batches the input has delivered
            (applied or skipped updates alike): the input's position.
        skipped_steps: int64 variable counting skipped updates.
    """

    def __init__(
        self, model, optimizer, strategy, label_smoothing, options, batches_drawn, skipped_steps
    ):
        self.model, self.optimizer, self.strategy, self.options = (
            model,
            optimizer,
            strategy,
            options,
        )
        self.loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self.batches_drawn, self.skipped_steps = batches_drawn, skipped_steps
        self.consecutive_skips = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="consecutive_skips"
        )
        accumulators = []
        if options.accum_steps > 1:
            with strategy.scope():
                accumulators = [
                    self._local_sum(tf.zeros(v.shape, "float32")) for v in model.trainable_variables
                ]
                # The update's loss, tokens and non-finite loss flags, summed over its micro-batches.
                self._accumulated = self._local_sum(tf.zeros([3], "float32"))
        self._accumulation = Accumulation(optimizer, options.accum_steps, accumulators)
        variables = model.trainable_variables

        @tf.function(jit_compile=options.jit_compile or None, reduce_retracing=True)
        def gradients(inputs, labels):
            with tf.GradientTape() as tape:
                labels, logits = labels_and_logits(
                    model, inputs, labels, training=True
                )  # (N, V) float32
                loss_sum, tokens = label_smoothed_nll(labels, logits, label_smoothing)
                scaled = optimizer.scale_loss(loss_sum) if self.loss_scaled else loss_sum
            return tape.gradient(scaled, variables), loss_sum, tokens

        self._gradients = gradients
        self._function = tf.function(self._run)

    @staticmethod
    def _local_sum(value):
        return tf.Variable(
            value,
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )

    def __call__(self, iterator, num_updates, stop_flag):
        """Run up to `num_updates` updates; returns a dict of numpy scalars (see `_run`)."""
        results = self._function(
            iterator, tf.constant(num_updates, tf.int64), tf.constant(float(stop_flag))
        )
        return {name: value.numpy() for name, value in results.items()}

    # --- replica functions ---

    def _replica_gradients(self, batch, stop_flag):
        """One batch's gradients and the update's packed totals (no accumulation)."""
        inputs, labels = batch
        grads, loss_sum, tokens = self._gradients(inputs, labels)
        local = tf.stack(
            [loss_sum, tokens, self._accumulation.nonfinite(grads), nonfinite([loss_sum])]
        )
        return grads, self._all_reduce(local, stop_flag)

    def _replica_accumulate(self, batch):
        """One micro-batch's gradients (added by `Accumulation.add`); its loss, tokens and
        non-finite loss flag added here, so that a NaN loss of one micro-batch is not lost."""
        inputs, labels = batch
        grads, loss_sum, tokens = self._gradients(inputs, labels)
        self._accumulated.assign_add(tf.stack([loss_sum, tokens, nonfinite([loss_sum])]))
        return grads

    def _replica_accumulated(self, stop_flag):
        """The accumulated gradients and the update's packed totals."""
        loss_sum, tokens, bad_loss = tf.unstack(self._accumulated.read_value())
        local = tf.stack(
            [loss_sum, tokens, self._accumulation.nonfinite(), tf.minimum(bad_loss, 1.0)]
        )
        return self._accumulation.sums(), self._all_reduce(local, stop_flag)

    @staticmethod
    def _all_reduce(local, stop_flag):
        """The one collective of an update: every replica's scalars summed, the same on all of them."""
        return sum_over_replicas(tf.concat([local, tf.reshape(stop_flag, [1])], axis=0))

    def _replica_apply(self, grads, tokens):
        # Sum over the replicas' gradients (done by the optimizer) / all real tokens.
        self.optimizer.apply_gradients(
            zip([g / tf.maximum(tokens, 1.0) for g in grads], self.model.trainable_variables)
        )

    def _replica_reset(self):
        self._accumulated.assign(tf.zeros_like(self._accumulated))

    # --- the compiled loop ---

    def _one_update(self, iterator, stop_flag):
        strategy, accumulation = self.strategy, self._accumulation
        if accumulation.steps == 1:
            grads, totals = strategy.run(self._replica_gradients, args=(next(iterator), stop_flag))
        else:
            for _ in range(accumulation.steps):
                accumulation.add(
                    strategy, strategy.run(self._replica_accumulate, args=(next(iterator),))
                )
            grads, totals = strategy.run(self._replica_accumulated, args=(stop_flag,))
            strategy.run(self._replica_reset)
        totals = strategy.experimental_local_results(totals)[0]  # equal on every replica
        self.batches_drawn.assign_add(accumulation.steps * strategy.num_replicas_in_sync)
        applied = finite_everywhere(totals[BAD_GRADIENT:STOP])
        accumulation.finish(
            strategy,
            applied,
            lambda: strategy.run(self._replica_apply, args=(grads, totals[TOKENS])),
        )
        if applied:
            self.consecutive_skips.assign(0)
        else:
            self.skipped_steps.assign_add(1)
            self.consecutive_skips.assign_add(1)
        return totals, applied

    def _must_stop(self, totals, applied):
        """Whether the host must raise after this update (the options' limits on non-finite updates)."""
        if applied:
            return tf.constant(False)
        scale_skip = tf.logical_and(tf.constant(self.loss_scaled), totals[BAD_LOSS] == 0.0)
        stop_now = tf.logical_and(
            tf.constant(self.options.on_nonfinite == "stop"), tf.logical_not(scale_skip)
        )
        return tf.logical_or(stop_now, self.consecutive_skips >= self.options.max_consecutive_skips)

    def _run(self, iterator, num_updates, stop_flag):
        """Up to `num_updates` updates. Returns the sums over the applied updates of the loss
        and real tokens, the number applied and skipped, the last update's totals, whether it
        must stop the run (`diverged`) and the SIGTERM flag of any worker (`stop`)."""
        loss_sum, tokens = tf.constant(0.0), tf.constant(0.0)
        applied_count, skipped_count = tf.constant(0, tf.int64), tf.constant(0, tf.int64)
        last = tf.zeros([STOP + 1])
        diverged, stop = tf.constant(False), tf.constant(False)
        for _ in tf.range(num_updates):
            totals, applied = self._one_update(iterator, stop_flag)
            last = totals
            if applied:
                loss_sum += totals[LOSS]
                tokens += totals[TOKENS]
                applied_count += 1
            else:
                skipped_count += 1
            diverged = self._must_stop(totals, applied)
            stop = totals[STOP] > 0.0
            if tf.logical_or(diverged, stop):
                break
        scale = self.optimizer.dynamic_scale if self.loss_scaled else tf.constant(1.0)
        return {
            "loss_sum": loss_sum,
            "tokens": tokens,
            "applied": applied_count,
            "skipped": skipped_count,
            "last_loss": last[LOSS],
            "last_bad_gradient": last[BAD_GRADIENT],
            "last_bad_loss": last[BAD_LOSS],
            "diverged": diverged,
            "stop": stop,
            "loss_scale": tf.cast(scale, tf.float32),
        }
