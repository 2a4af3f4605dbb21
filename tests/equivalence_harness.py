"""Trains one tiny model three steps by several paths and records what each did.

Run by tests/test_equivalence.py in fresh processes (the CPU is split into two logical
devices before TensorFlow starts, which a strategy test needs):

    python tests/equivalence_harness.py OUT_DIR PATH [PATH ...]

PATH is one of `PATHS`. The `_skip` paths train with `on_nonfinite="skip"` on the same
input with one more global batch after the first, whose second half (one replica's or one
worker's) has a NaN gradient under a finite loss: dropped, it must leave the same updates
and count one skipped step (`skipped` in the record). `loop_multi_worker` and `fit_multi_worker` run as one worker of
a two-worker `MultiWorkerMirroredStrategy` (`TF_CONFIG` in the environment); only the
chief writes. `fit_multi_worker` exits with status 3 and prints `{"unsupported": error}`
when Keras refuses to `fit` there (as Keras 3.15 does).
For every path and optimizer (SGD and Adam) it writes `OUT_DIR/<path>_<optimizer>.npz`:
`losses` (the loss reported for each step), `weights` (all trainable weights, flattened,
before and after each step: shape (STEPS + 1, P)) and, for `model.fit`, `evaluate` (the
loss `model.evaluate` reports after training); the reference also records `half_tokens`,
the real tokens of each half batch. With `EQUIVALENCE_ATTENTION_WINDOW=r` in the
environment, the model's self-attention is restricted to windows of r positions; with
`EQUIVALENCE_OPTIMIZERS=sgd` (names, comma-separated), only those optimizers run.

Every path sees the same global batches: `STEPS` of them, each made of two halves of four
sentences with different numbers of real tokens. One device takes a whole global batch
per step; two replicas (or workers) take one half each; gradient accumulation takes the
halves as two micro-batches.
"""

import json
import os
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
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from keras_transformer.models.config import get_preset  # noqa: E402
from keras_transformer.training import (  # noqa: E402
    LabelSmoothedCrossEntropy,
    Trainer,
    TrainOptions,
    create_strategy,
    label_smoothed_nll,
)
from tests.fault_injection import POISON_LABEL, poison, poisoned_nll  # noqa: E402

PATHS = (
    "reference",
    "loop_default",
    "loop_mirrored",
    "loop_accumulate",
    "fit_default",
    "fit_mirrored",
    "loop_multi_worker",
    "fit_multi_worker",
    "loop_mirrored_skip",
    "loop_multi_worker_skip",
)
OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(learning_rate=0.5),
    "adam": lambda: keras.optimizers.Adam(1e-2),
}
STEPS = 3
HALF = 4  # sentences per half batch
CONFIG = dict(
    vocabulary_size=64,
    num_encoder_layers=1,
    num_decoder_layers=1,
    hidden_dim=32,
    intermediate_dim=64,
    num_heads=2,
    max_length=32,
    dropout=0.0,
    train_steps=STEPS,
    attention_window=int(os.environ.get("EQUIVALENCE_ATTENTION_WINDOW", 0)) or None,
)


def half_batch(step, half):
    """Four sentence pairs; the second half of every step has far more padding than the first."""
    rng = np.random.default_rng(10 * step + half)
    # Token ids above POISON_LABEL: only a poisoned half holds it.
    source = rng.integers(POISON_LABEL + 1, CONFIG["vocabulary_size"], (HALF, 9)).astype("int32")
    tokens = rng.integers(POISON_LABEL + 1, CONFIG["vocabulary_size"], (HALF, 8)).astype("int32")
    target_lengths = [8, 7, 6, 8] if half == 0 else [2, 5, 1, 3]
    source_lengths = [9, 8, 9, 7] if half == 0 else [3, 9, 2, 4]
    labels = np.zeros((HALF, 8), "int32")
    target = np.zeros((HALF, 8), "int32")
    for row, (source_length, target_length) in enumerate(zip(source_lengths, target_lengths)):
        source[row, source_length:] = PAD_ID
        source[row, source_length - 1] = EOS_ID
        labels[row, :target_length] = tokens[row, :target_length]
        labels[row, target_length - 1] = EOS_ID
        target[row, 0] = BOS_ID
        target[row, 1:target_length] = tokens[row, : target_length - 1]
    return {"source_ids": source, "target_ids": target}, labels


def global_batch(step):
    halves = [half_batch(step, 0), half_batch(step, 1)]
    inputs = {key: np.concatenate([halves[0][0][key], halves[1][0][key]]) for key in halves[0][0]}
    return inputs, np.concatenate([halves[0][1], halves[1][1]])


def dataset_of(batches):
    dataset = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
    return dataset.repeat()


def half_pairs(path):
    """The two halves of every global batch, in order; for a `_skip` path with a poisoned pair inserted."""
    pairs = [[half_batch(step, 0), half_batch(step, 1)] for step in range(STEPS)]
    if path.endswith("_skip"):
        inputs, labels = half_batch(1, 1)
        pairs.insert(1, [half_batch(1, 0), (inputs, poison(labels))])
    return pairs


def loop_input(path):
    """The `input_context -> dataset` function of a custom-loop path."""
    pairs = half_pairs(path)
    if path == "loop_default":
        return lambda context: dataset_of([global_batch(step) for step in range(STEPS)])
    if path.startswith("loop_multi_worker"):  # one input pipeline per worker, one half each
        return lambda context: dataset_of([pair[context.input_pipeline_id] for pair in pairs])
    # One pipeline feeding two replicas in turn, or two micro-batches in turn: the halves in order.
    return lambda context: dataset_of([half for pair in pairs for half in pair])


def flat(model):
    return np.concatenate(
        [np.asarray(v.numpy(), "float64").ravel() for v in model.trainable_variables]
    )


def new_model():
    keras.utils.set_random_seed(0)
    return Transformer(get_preset("tiny", **CONFIG))


def run_reference(make_optimizer):
    """A plain GradientTape step on the whole global batch: the definition of the update."""
    model = new_model()
    optimizer = make_optimizer()
    losses, weights = [], [flat(model)]
    for step in range(STEPS):
        inputs, labels = global_batch(step)
        with tf.GradientTape() as tape:
            loss_sum, tokens = label_smoothed_nll(
                labels, model(inputs, training=True), model_label_smoothing()
            )
            loss = loss_sum / tokens
        optimizer.apply_gradients(
            zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        )
        losses.append(float(loss))
        weights.append(flat(model))
    inputs, labels = global_batch(0)
    loss_sum, tokens = label_smoothed_nll(
        labels, model(inputs, training=False), model_label_smoothing()
    )
    half_tokens = [
        [int(np.count_nonzero(half_batch(step, half)[1])) for half in (0, 1)]
        for step in range(STEPS)
    ]
    return {
        "losses": losses,
        "weights": weights,
        "evaluate": float(loss_sum / tokens),
        "half_tokens": half_tokens,
    }


def model_label_smoothing():
    return get_preset("tiny", **CONFIG).label_smoothing


_STRATEGIES = {}


def strategy_of(path):
    """The strategy a path runs under (one per process and kind: a process joins its cluster once)."""
    kind = (
        "multi_worker"
        if "multi_worker" in path
        else "mirrored"
        if "mirrored" in path
        else "default"
    )
    if kind not in _STRATEGIES:
        _STRATEGIES[kind] = create_strategy(
            kind, devices=["/cpu:0", "/cpu:1"] if kind == "mirrored" else None
        )
    return _STRATEGIES[kind]


def run_loop(path, make_optimizer, out_dir, name):
    strategy = strategy_of(path)
    accum_steps = 2 if path == "loop_accumulate" else 1
    skip = path.endswith("_skip")
    keras.utils.set_random_seed(0)
    trainer = Trainer(
        get_preset("tiny", **CONFIG),
        out_dir / f"run_{name}",
        TrainOptions(
            accum_steps=accum_steps,
            log_every=1,
            checkpoint_every=100,
            progress=False,
            on_nonfinite="skip" if skip else "stop",
        ),
        strategy,
        optimizer=make_optimizer,
    )
    trainer_loss = update_module.label_smoothed_nll
    if skip:  # traced at the first step
        update_module.label_smoothed_nll = poisoned_nll
    losses, weights = [], [flat(trainer.model)]
    for step in range(1, STEPS + 1):  # each call resumes the input where the last one stopped
        results = trainer.train(loop_input(path), until_step=step)
        losses.append(results["loss"])
        weights.append(flat(trainer.model))
    update_module.label_smoothed_nll = trainer_loss
    return {
        "losses": losses,
        "weights": weights,
        "skipped": trainer.skipped_steps,
        "chief": trainer.chief,
    }


def run_fit(path, make_optimizer):
    with strategy_of(path).scope():
        model = new_model()
        model.compile(
            optimizer=make_optimizer(), loss=LabelSmoothedCrossEntropy(model_label_smoothing())
        )
    losses, weights = [], [flat(model)]
    for step in range(STEPS):
        inputs, labels = global_batch(step)
        # Keras splits each global batch of 8 into 4 + 4 sentences, in order, across the replicas.
        history = model.fit(inputs, labels, batch_size=2 * HALF, epochs=1, shuffle=False, verbose=0)
        losses.append(history.history["loss"][0])
        weights.append(flat(model))
    inputs, labels = global_batch(0)
    evaluate = model.evaluate(inputs, labels, batch_size=2 * HALF, verbose=0)
    return {"losses": losses, "weights": weights, "evaluate": evaluate}


def main(out_dir, paths):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    optimizers = os.environ.get("EQUIVALENCE_OPTIMIZERS", ",".join(OPTIMIZERS)).split(",")
    for path in paths:
        for optimizer_name in optimizers:
            make_optimizer = OPTIMIZERS[optimizer_name]
            name = f"{path}_{optimizer_name}"
            if path == "reference":
                record = run_reference(make_optimizer)
            elif path == "fit_multi_worker":
                try:
                    record = run_fit(path, make_optimizer)
                except ValueError as error:  # Keras 3.15; see docs/distributed.md
                    print(json.dumps({"unsupported": str(error).splitlines()[0][:300]}))
                    sys.exit(3)
            elif path.startswith("fit_"):
                record = run_fit(path, make_optimizer)
            else:
                record = run_loop(path, make_optimizer, out_dir, name)
            if record.pop("chief", True):
                np.savez(out_dir / f"{name}.npz", **{k: np.asarray(v) for k, v in record.items()})
    print(json.dumps({"done": paths, "pid": os.getpid()}))


if __name__ == "__main__":
    unknown = [path for path in sys.argv[2:] if path not in PATHS]
    if unknown:
        sys.exit(f"Unknown paths {unknown}. Valid paths: {', '.join(PATHS)}")
    main(sys.argv[1], sys.argv[2:])
