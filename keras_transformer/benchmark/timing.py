"""Timing a training step the same way for any model with our inputs and outputs."""

import functools
import time

from keras_transformer.training.loss import label_smoothed_nll, labels_and_logits
from keras_transformer.training.schedule import paper_optimizer


def make_train_step(model, config, jit_compile=False):
    """A compiled update (label-smoothed loss, the paper's Adam) for `model`; returns its loss sum.

    The loss is computed on the model's training output (`training.loss.labels_and_logits`):
    ours gives the logits of the real target positions only, a model without that output
    (the keras-hub peer) its `(B, T, V)` logits.

    TensorFlow's (`tf.function`); the timing helpers below take any step and run on every backend.
    """
    import tensorflow as tf

    optimizer = paper_optimizer(config.hidden_dim, config.warmup_steps)
    optimizer.build(model.trainable_variables)

    @tf.function(jit_compile=jit_compile or None, reduce_retracing=True)
    def step(inputs, labels):
        with tf.GradientTape() as tape:
            targets, logits = labels_and_logits(model, inputs, labels, training=True)
            loss_sum, tokens = label_smoothed_nll(targets, logits, config.label_smoothing)
            loss = loss_sum / tf.maximum(tokens, 1.0)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss_sum

    return step


def warm_up(step, batches, log=None):
    """Run `step` once on each distinct batch shape of `batches` (tracing it), untimed.

    With `log`, says how long each shape's first step took (compilation included).
    """
    seen = set()
    for inputs, labels in batches:
        shape = (tuple(inputs["source_ids"].shape), tuple(inputs["target_ids"].shape))
        if shape not in seen:
            seen.add(shape)
            start = time.perf_counter()
            float(step(inputs, labels))
            if log:
                (batch, source), (_, target) = shape
                log(
                    f"first step on {batch}x{source}/{target} in {time.perf_counter() - start:.1f} s"
                )


def run_steps(step, batches):
    """Run `step` over `batches` (a list) and wait for the last step; returns its result."""
    for inputs, labels in batches:
        result = step(inputs, labels)
    return float(result)


def compare_steps(first, second, rounds=3):
    """Best-of-`rounds` seconds of two `(step, batches)` workloads, timed alternately.

    Alternating the two and keeping each one's fastest round makes the ratio robust to
    other load on the machine that comes and goes during the measurement. Each workload is
    first warmed up once on every distinct batch shape it holds (tracing), so the rounds
    measure steady-state execution only.
    """
    for step, batches in (first, second):
        warm_up(step, batches)
    fastest = fastest_of_alternating(
        {
            index: functools.partial(run_steps, *workload)
            for index, workload in enumerate((first, second))
        },
        rounds,
    )
    return fastest[0][0], fastest[1][0]


def compare_steps_per_batch(first, second, batches, rounds=3, warmed=False):
    """Best-of-`rounds` seconds of two steps on each batch of `batches`, alternating per batch.

    Finer than `compare_steps`: the two steps take turns on every batch (which goes first
    alternates between rounds), each step waited for before the next starts, so load that
    comes and goes on the machine lands on both sides of every comparison rather than on
    one side's whole pass.

    Args:
        first, second: steps `(inputs, labels) -> tensor`.
        batches: a list of `(inputs, labels)`.
        rounds: passes over the batches.
        warmed: both steps already ran on every batch shape (`warm_up`): no warm-up here.

    Returns:
        `(first_seconds, second_seconds)`: lists with each batch's fastest time.
    """
    if not warmed:
        warm_up(first, batches)
        warm_up(second, batches)
    best = [[float("inf")] * len(batches), [float("inf")] * len(batches)]
    for round_ in range(rounds):
        order = ((0, first), (1, second)) if round_ % 2 == 0 else ((1, second), (0, first))
        for index, (inputs, labels) in enumerate(batches):
            for side, step in order:
                start = time.perf_counter()
                float(step(inputs, labels))
                best[side][index] = min(best[side][index], time.perf_counter() - start)
    return best[0], best[1]


def fastest_of_alternating(workloads, rounds=3):
    """Time several workloads in turn, `rounds` times; each keeps its fastest round. The order
    reverses every other round, so that no workload always runs first (or right after another).

    Args:
        workloads: `{name: run}`, `run()` doing one timed unit of work and returning its result.
        rounds: passes over all the workloads.

    Returns:
        `{name: (fastest seconds, result of the last round)}`, in the order of `workloads`.

    >>> fastest = fastest_of_alternating({"a": lambda: 1, "b": lambda: 2}, rounds=2)
    >>> list(fastest), fastest["b"][1]
    (['a', 'b'], 2)
    """
    best = {name: (float("inf"), None) for name in workloads}
    for round_index in range(rounds):
        order = list(workloads.items())
        for name, run in order if round_index % 2 == 0 else reversed(order):
            start = time.perf_counter()
            result = run()
            best[name] = (min(best[name][0], time.perf_counter() - start), result)
    return best
