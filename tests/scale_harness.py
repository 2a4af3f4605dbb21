"""What only shows at scale, reproduced on two logical CPU replicas: run by tests/test_scale.py.

    python tests/scale_harness.py OUT_DIR CASE [CASE ...]

Writes `OUT_DIR/<case>.json` (and `.npz` of weights) for each case in `CASES`:

- `overflow_<precision>_accum<k>`: a 2-replica `Trainer` sees a clean global batch, one
  whose second replica's loss is multiplied by 1e30 (its loss-scaled float16 gradients
  overflow; under float32/bfloat16 its gradients are NaN through the same marker, see
  tests/fault_injection.py) and another clean one; `reference_<precision>_accum<k>` sees
  the two clean ones only. The record holds steps, skips, loss scale and weights.
- `fit_<kind>_<precision>_accum<k>`: the same by `model.fit` on two replicas (with `k=2`, the
  optimizer's `gradient_accumulation_steps`): an update whose first batch is marked on the
  second replica, or not (`reference`).
- `skip_<path>_<precision>`: the custom loop (`loop`) and `model.fit` (`fit`) on two replicas,
  updates of 2 micro-batches: the second update's second micro-batch is marked on the second
  replica; `skip_reference_float32` (the loop) never sees that update. Every global
  micro-batch holds the same real tokens, so the loop's per-token mean over an update is
  `fit`'s mean of its micro-batches' means: the two paths make the same updates.
- `consecutive_skips`: every second replica's batch overflows; `max_consecutive_skips=3`.
- `dropout`: the model with dropout 0.3 called by two replicas on the same batch, twice
  from the same seed: the replicas' outputs and the reruns'.
- `dropout_masks`: one `ReplicaDropout(0.3)` called by two replicas for `DROPOUT_STEPS` steps,
  as a run calls it: the keep-masks, `(steps, replicas, units)` in `dropout_masks.npy`.
- `resume_<layout>`: `train_translation`-style training on a `data.BatchPlan` (several
  epochs in 6 updates), dropout 0.3, interrupted and resumed (`split`) or not (`once`);
  `resume_changed` trains 3 updates on 2 replicas, then 3 on one replica with
  `accum_steps=2` (dropout 0: the masks of one replica are not two replicas').
"""

import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import keras_transformer.training.update as update_module  # noqa: E402
from keras_transformer import Transformer  # noqa: E402
from keras_transformer.data import Tokenizer, builtin_task, train_sentencepiece  # noqa: E402
from keras_transformer.data.plan import BatchPlan  # noqa: E402
from keras_transformer.layers.dropout import ReplicaDropout  # noqa: E402
from keras_transformer.models.config import get_preset  # noqa: E402
from keras_transformer.training import (  # noqa: E402
    DivergenceError,
    LabelSmoothedCrossEntropy,
    Trainer,
    TrainOptions,
    create_strategy,
    label_smoothed_nll,
)
from tests.equivalence_harness import (  # noqa: E402
    CONFIG,
    HALF,
    dataset_of,
    global_batch,
    half_batch,
    model_label_smoothing,
)
from tests.fault_injection import POISON_LABEL, overflowing_nll, poison, poisoned_nll  # noqa: E402

OVERFLOW_RUNS = (("mixed_float16", 1), ("mixed_float16", 2), ("mixed_bfloat16", 1), ("float32", 2))
OVERFLOW_CASES = tuple(
    f"{kind}_{precision}_accum{accum}"
    for kind in ("overflow", "reference")
    for precision, accum in OVERFLOW_RUNS
)
FIT_OVERFLOW_CASES = tuple(
    f"fit_{kind}_{precision}_accum{accum}"
    for kind in ("overflow", "reference")
    for precision in ("mixed_float16", "float32")
    for accum in (1, 2)
)
SKIP_PRECISIONS = ("float32", "mixed_float16")
SKIP_CASES = tuple(
    f"skip_{path}_{precision}" for path in ("loop", "fit") for precision in SKIP_PRECISIONS
) + ("skip_reference_float32",)
FIT_SPLITS = {
    "fit_split_2_1": 11,
    "fit_split_1_0": 9,
}  # sentences: batches of 8 (4+4) and 3 (2+1) or 1 (1+0)
LOOP_SPLITS = {
    "loop_split_3_5": 3,
    "loop_split_0_8": 0,
    "loop_split_reference": None,
}  # sentences on replica 0
CASES = (
    tuple(LOOP_SPLITS)
    + OVERFLOW_CASES
    + FIT_OVERFLOW_CASES
    + SKIP_CASES
    + tuple(FIT_SPLITS)
    + (
        "fit_accumulation_by_hand",
        "fit_reference_float32_accum2_one_device",
        "consecutive_skips",
        "dropout",
        "dropout_masks",
        "resume_once",
        "resume_split",
        "resume_rerun",
        "resume_changed",
        "resume_changed_reference",
    )
)


def flat(model):
    return np.concatenate(
        [np.asarray(v.numpy(), "float64").ravel() for v in model.trainable_variables]
    )


_STRATEGIES = {}


def strategy(replicas=2):
    if replicas not in _STRATEGIES:
        _STRATEGIES[replicas] = (
            create_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
            if replicas == 2
            else create_strategy("default")
        )
    return _STRATEGIES[replicas]


def _train_two_updates(run_dir, precision, accum, batches):
    """Train the loop for two updates of `accum` micro-batches on `batches` (one pipeline feeding
    the replicas in turn): `(trainer, {"step", "skipped", "loss_scale"})`."""
    trainer = Trainer(
        get_preset("tiny", **{**CONFIG, "train_steps": 2}),
        run_dir,
        # Without loss scaling a non-finite gradient stops by default; skipping must be asked for.
        TrainOptions(
            precision=precision,
            accum_steps=accum,
            log_every=1,
            checkpoint_every=100,
            progress=False,
            on_nonfinite="stop" if precision == "mixed_float16" else "skip",
        ),
        strategy(),
        optimizer=lambda: _optimizer(precision),
    )
    results = trainer.train(lambda context: dataset_of(batches))
    return trainer, {
        "step": results["step"],
        "skipped": trainer.skipped_steps,
        "loss_scale": _scale(trainer),
    }


def overflow_case(case, out_dir):
    kind, rest = case.split("_", 1)
    precision, accum = rest.rsplit("_accum", 1)
    accum = int(accum)
    # One pipeline feeds the replicas in turn: an update takes [replica 0, replica 1] * accum.
    halves = [half_batch(step, half) for step in range(2) for half in (0, 1)]
    per_update = 2 * accum
    updates = [halves[i : i + 2] * accum for i in range(0, len(halves), 2)]
    if kind == "overflow":  # the second replica's first micro-batch overflows
        inputs, labels = updates[0][1]
        updates.insert(1, [updates[0][0], (inputs, poison(labels))] + updates[0][:2] * (accum - 1))
    batches = [half for update in updates for half in update]
    assert all(len(update) == per_update for update in updates)
    keras.utils.set_random_seed(0)
    return _train_two_updates(out_dir / f"run_{case}", precision, accum, batches)


def loop_split_case(case, out_dir):
    """Two updates of the custom loop, each on a global batch of 8 sentences: split 3 + 5 or 0 + 8
    between two replicas, or whole on one device (`loop_split_reference`)."""
    first = LOOP_SPLITS[case]
    batches = []
    for step in range(2):
        inputs, labels = global_batch(step)
        if first is None:
            batches.append((inputs, labels))
        else:
            batches += [
                ({key: value[:first] for key, value in inputs.items()}, labels[:first]),
                ({key: value[first:] for key, value in inputs.items()}, labels[first:]),
            ]
    keras.utils.set_random_seed(0)
    trainer = Trainer(
        get_preset("tiny", **{**CONFIG, "train_steps": 2}),
        out_dir / f"run_{case}",
        TrainOptions(log_every=1, checkpoint_every=100, progress=False),
        strategy(1 if first is None else 2),
        optimizer=lambda: keras.optimizers.SGD(learning_rate=0.5),
    )
    results = trainer.train(lambda context: dataset_of(batches))
    return trainer, {"step": results["step"], "loss": results["loss"]}


def fit_overflow_case(case):
    """`model.fit` on two replicas, or one device with the suffix `_one_device` (with `_accum2`, the
    optimizer's `gradient_accumulation_steps`)."""
    kind, rest = case[len("fit_") :].removesuffix("_one_device").split("_", 1)
    precision, accum = rest.rsplit("_accum", 1)
    accum = int(accum)
    steps = [global_batch(step) for step in range(2 * accum)]
    if kind == "overflow":  # an update whose first batch is marked on the second replica
        steps[accum:accum] = [_marked(steps[0])] + steps[:accum][1:]
    keras.utils.set_random_seed(0)
    with strategy(1 if case.endswith("_one_device") else 2).scope():
        model = Transformer(get_preset("tiny", **CONFIG), dtype=precision)
        model.compile(
            optimizer=_optimizer(precision, accum), loss=MarkedLoss(model_label_smoothing())
        )
    _fit_in_order(model, steps)
    return model, {
        "iterations": int(model.optimizer.iterations.numpy()),
        "loss_scale": _scale(model),
    }


def _fit_in_order(model, batches):
    """One `fit` epoch over `batches` (global batches of `2 * HALF` sentences, one shape), in
    order: one batch per update step, as a `fit` call per batch would take them."""
    inputs = {key: np.concatenate([batch[0][key] for batch in batches]) for key in batches[0][0]}
    labels = np.concatenate([batch[1] for batch in batches])
    model.fit(inputs, labels, batch_size=2 * HALF, epochs=1, shuffle=False, verbose=0)


def _marked(batch):
    """A global batch whose second half (the second replica's) is marked."""
    inputs, labels = batch
    labels = labels.copy()
    labels[HALF:] = poison(labels[HALF:])
    return inputs, labels


def skip_case(case, out_dir):
    """Three updates of two global micro-batches (two replicas), the second update's second
    micro-batch marked on the second replica, by the loop or `fit`; the loop without that
    update (`skip_reference_*`)."""
    path, precision = case[len("skip_") :].split("_", 1)
    updates = [
        [global_batch(0), global_batch(1)],
        [global_batch(0), _marked(global_batch(1))],
        [global_batch(2), global_batch(3)],
    ]
    if path == "reference":
        del updates[1]
    micro_batches = [batch for update in updates for batch in update]
    keras.utils.set_random_seed(0)
    if path == "fit":
        with strategy().scope():
            model = Transformer(get_preset("tiny", **CONFIG), dtype=precision)
            model.compile(
                optimizer=_optimizer(precision, 2), loss=MarkedLoss(model_label_smoothing())
            )
        _fit_in_order(model, micro_batches)
        return model, {
            "iterations": int(model.optimizer.iterations.numpy()),
            "loss_scale": _scale(model),
        }
    halves = []
    for inputs, labels in micro_batches:  # one pipeline feeds the replicas in turn
        for part in (slice(None, HALF), slice(HALF, None)):
            halves.append(({key: value[part] for key, value in inputs.items()}, labels[part]))
    return _train_two_updates(out_dir / f"run_{case}", precision, 2, halves)


def accumulation_by_hand():
    """What `fit_reference_float32_accum2` must equal: Keras' accumulation on one device, written
    out: each update is SGD with the mean of two batches' gradients of their per-token losses."""
    keras.utils.set_random_seed(0)
    model = Transformer(get_preset("tiny", **CONFIG))
    optimizer = keras.optimizers.SGD(learning_rate=0.5)
    grads = []
    for step in range(4):
        inputs, labels = global_batch(step)
        with tf.GradientTape() as tape:
            loss_sum, tokens = label_smoothed_nll(
                labels, model(inputs, training=True), model_label_smoothing()
            )
            loss = loss_sum / tokens
        grads.append(tape.gradient(loss, model.trainable_variables))
        if len(grads) == 2:
            optimizer.apply_gradients(
                zip([(a + b) / 2 for a, b in zip(*grads)], model.trainable_variables)
            )
            grads = []
    return model, {}


def fit_split_case(case, out_dir):
    """`model.fit` of one epoch over batches of 8 and 3 (or 1) sentences on two replicas, and the
    definition written out on one device: SGD on each batch's per-token mean, the epoch's loss all
    token losses (before each update) over all real tokens, `evaluate` the same after training.
    The definition's weights go to `<case>.by_hand.npy`."""
    inputs, labels = global_batch(0)
    extra_inputs, extra_labels = global_batch(1)
    count = FIT_SPLITS[case]
    inputs = {key: np.concatenate([inputs[key], extra_inputs[key]])[:count] for key in inputs}
    labels = np.concatenate([labels, extra_labels])[:count]
    keras.utils.set_random_seed(0)
    with strategy().scope():
        model = Transformer(get_preset("tiny", **CONFIG))
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate=0.5),
            loss=LabelSmoothedCrossEntropy(model_label_smoothing()),
        )
    history = model.fit(inputs, labels, batch_size=2 * HALF, epochs=1, shuffle=False, verbose=0)
    keras.utils.set_random_seed(0)
    reference = Transformer(get_preset("tiny", **CONFIG))
    optimizer = keras.optimizers.SGD(learning_rate=0.5)
    starts = range(0, count, 2 * HALF)

    def batch_at(start):
        return (
            {key: value[start : start + 2 * HALF] for key, value in inputs.items()},
            labels[start : start + 2 * HALF],
        )

    loss_sum = tokens = 0.0
    for start in starts:
        batch, batch_labels = batch_at(start)
        with tf.GradientTape() as tape:
            batch_sum, batch_tokens = label_smoothed_nll(
                batch_labels, reference(batch, training=True), model_label_smoothing()
            )
            mean = batch_sum / batch_tokens
        grads = tape.gradient(mean, reference.trainable_variables)
        optimizer.apply_gradients(zip(grads, reference.trainable_variables))
        loss_sum, tokens = loss_sum + float(batch_sum), tokens + float(batch_tokens)
    evaluated = [
        label_smoothed_nll(batch_labels, reference(batch, training=False), model_label_smoothing())
        for batch, batch_labels in map(batch_at, starts)
    ]
    np.save(out_dir / f"{case}.by_hand.npy", flat(reference))
    return model, {
        "loss": history.history["loss"][0],
        "expected_loss": loss_sum / tokens,
        "evaluate": model.evaluate(inputs, labels, batch_size=2 * HALF, verbose=0),
        "expected_evaluate": sum(float(s) for s, _ in evaluated)
        / sum(float(t) for _, t in evaluated),
    }


class MarkedLoss(LabelSmoothedCrossEntropy):
    """`LabelSmoothedCrossEntropy` with tests/fault_injection.py's marks: on a marked replica, the loss
    times 1e30 (mixed_float16: an overflow) or a NaN gradient under a finite loss."""

    overflow = False

    def call(self, y_true, y_pred):
        marked = tf.cast(tf.reduce_any(tf.equal(y_true, POISON_LABEL)), tf.float32)
        losses = super().call(y_true, y_pred)
        if self.overflow:
            return losses * (1.0 + marked * 1e30)
        return losses + tf.sqrt(0.0 * tf.reduce_sum(y_pred) + 1.0 - marked) - (1.0 - marked)


def _optimizer(precision, accum=None):
    sgd = keras.optimizers.SGD(
        learning_rate=0.5, gradient_accumulation_steps=accum if accum and accum > 1 else None
    )
    # A scale at which the clean batches do not overflow (Keras' 2**15 does here, at the first step).
    return (
        keras.optimizers.LossScaleOptimizer(sgd, initial_scale=2.0**8)
        if precision == "mixed_float16"
        else sgd
    )


def _scale(trainer):
    optimizer = trainer.optimizer
    return float(optimizer.dynamic_scale.numpy()) if hasattr(optimizer, "dynamic_scale") else None


def consecutive_skips_case(out_dir):
    inputs, labels = half_batch(0, 1)
    batches = [half_batch(0, 0), (inputs, poison(labels))]
    keras.utils.set_random_seed(0)
    trainer = Trainer(
        get_preset("tiny", **{**CONFIG, "train_steps": 5}),
        out_dir / "run_skips",
        TrainOptions(
            precision="mixed_float16", max_consecutive_skips=3, checkpoint_every=100, progress=False
        ),
        strategy(),
        optimizer=lambda: _optimizer("mixed_float16"),
    )
    try:
        trainer.train(lambda context: dataset_of(batches))
    except DivergenceError as error:
        return trainer, {
            "error": str(error),
            "step": trainer.step,
            "skipped": trainer.skipped_steps,
            "loss_scale": _scale(trainer),
            "finite": bool(np.isfinite(flat(trainer.model)).all()),
        }
    return trainer, {"error": None}


def dropout_case():
    outputs = []
    for _ in range(2):  # two runs from the same seed
        keras.utils.set_random_seed(7)
        with strategy().scope():
            model = Transformer(get_preset("tiny", **{**CONFIG, "dropout": 0.3}))
        inputs, _ = half_batch(0, 0)

        @tf.function
        def forward(model=model, inputs=inputs):
            return strategy().run(lambda: model(inputs, training=True))

        outputs.append(
            [np.asarray(value) for value in strategy().experimental_local_results(forward())]
        )
    return {
        "replicas_max_diff": float(np.abs(outputs[0][0] - outputs[0][1]).max()),
        "rerun_max_diff": max(float(np.abs(a - b).max()) for a, b in zip(outputs[0], outputs[1])),
    }


DROPOUT_STEPS, DROPOUT_SHAPE = 40, (4, 25, 32)


def dropout_masks_case(out_dir):
    with strategy().scope():
        layer = ReplicaDropout(0.3, seed=13)
    ones = tf.ones(DROPOUT_SHAPE)

    @tf.function
    def step():
        return strategy().run(lambda: tf.reshape(layer(ones, training=True) != 0, [-1]))

    masks = np.stack(
        [
            np.stack([np.asarray(value) for value in strategy().experimental_local_results(step())])
            for _ in range(DROPOUT_STEPS)
        ]
    )  # (steps, replicas, units)
    np.save(out_dir / "dropout_masks.npy", masks)
    return {"shape": list(masks.shape)}


_PLAN = {}


def plan(out_dir):
    """A BatchPlan of 24 pairs of the built-in task: a few batches an epoch at 128 tokens a batch."""
    if not _PLAN:
        pairs = builtin_task("train")[:24]
        path = train_sentencepiece(
            [s for pair in builtin_task("train")[:2000] for s in pair],
            out_dir / "spm.model",
            vocabulary_size=CONFIG["vocabulary_size"],
        )
        _PLAN["plan"] = BatchPlan(pairs, Tokenizer(path), batch_tokens=128, max_length=32)
    return _PLAN["plan"]


def resume_case(case, out_dir):
    dropout = 0.0 if case.startswith("resume_changed") else 0.3
    config = get_preset("tiny", **{**CONFIG, "dropout": dropout, "train_steps": 6})
    stops = {
        "resume_split": [(2, 2, 1), (4, 2, 1), (6, 2, 1)],
        "resume_changed": [(3, 2, 1), (6, 1, 2)],
    }.get(case, [(6, 2, 1)])
    run_dir = out_dir / f"run_{case}"
    for stop, replicas, accum in stops:
        keras.utils.set_random_seed(0)  # what a new process does first
        trainer = Trainer(
            config,
            run_dir,
            TrainOptions(accum_steps=accum, checkpoint_every=100, progress=False),
            strategy(replicas),
            optimizer=lambda: keras.optimizers.SGD(learning_rate=0.5),
        )
        trainer.train(plan(out_dir), until_step=stop)
    drawn = int(trainer._batches_drawn.numpy())
    return trainer, {
        "step": trainer.step,
        "batches_drawn": drawn,
        "epochs": drawn / plan(out_dir).batches_per_epoch,
    }


def main(out_dir, cases):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for case in cases:
        trainer = None
        update_loss = update_module.label_smoothed_nll
        # The same value on unmarked batches; on marked ones, a real float16 overflow of the
        # loss-scaled gradients, or (without loss scaling) a NaN gradient under a finite loss.
        update_module.label_smoothed_nll = (
            poisoned_nll if "float32" in case or "bfloat16" in case else overflowing_nll
        )
        try:
            if case in LOOP_SPLITS:
                trainer, record = loop_split_case(case, out_dir)
            elif case in OVERFLOW_CASES:
                trainer, record = overflow_case(case, out_dir)
            elif case in FIT_OVERFLOW_CASES or case.endswith("_one_device"):
                MarkedLoss.overflow = "float16" in case
                trainer, record = fit_overflow_case(case)
            elif case in SKIP_CASES:
                MarkedLoss.overflow = "float16" in case
                trainer, record = skip_case(case, out_dir)
            elif case == "fit_accumulation_by_hand":
                trainer, record = accumulation_by_hand()
            elif case.startswith("fit_split"):
                trainer, record = fit_split_case(case, out_dir)
            elif case == "consecutive_skips":
                trainer, record = consecutive_skips_case(out_dir)
            elif case == "dropout":
                record = dropout_case()
            elif case == "dropout_masks":
                record = dropout_masks_case(out_dir)
            else:
                trainer, record = resume_case(case, out_dir)
        finally:
            update_module.label_smoothed_nll = update_loss
        if trainer is not None:  # a Trainer, or a model trained by fit
            np.save(out_dir / f"{case}.npy", flat(getattr(trainer, "model", trainer)))
        (out_dir / f"{case}.json").write_text(json.dumps(record))
    print(json.dumps({"done": cases}))


if __name__ == "__main__":
    unknown = [case for case in sys.argv[2:] if case not in CASES]
    if unknown:
        sys.exit(f"Unknown cases {unknown}. Valid cases: {', '.join(CASES)}")
    main(sys.argv[1], sys.argv[2:])
