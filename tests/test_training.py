"""Training: loss, schedule, the loop (resume, accumulation, strategies), averaging, model.fit."""

import logging
import math
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.models.config import get_preset
from keras_transformer.training import (
    DataOptions,
    DivergenceError,
    LabelSmoothedCrossEntropy,
    Trainer,
    TrainOptions,
    TransformerSchedule,
    average_checkpoints,
    checkpoint_paths,
    label_smoothed_nll,
    train_translation,
)
from tests.fault_injection import POISON_LABEL, poison, poisoned_nll

REPO = Path(__file__).resolve().parents[1]

MICRO = dict(
    vocabulary_size=64,
    num_encoder_layers=1,
    num_decoder_layers=1,
    hidden_dim=32,
    intermediate_dim=64,
    num_heads=2,
    max_length=32,
)


def micro_config(**changes):
    return get_preset("tiny", **{**MICRO, **changes})


def fixed_batch(seed=0, batch=4, source_length=7, target_length=6, vocabulary_size=64):
    rng = np.random.default_rng(seed)
    source = rng.integers(4, vocabulary_size, (batch, source_length)).astype("int32")
    target = rng.integers(4, vocabulary_size, (batch, target_length)).astype("int32")
    source[0, -2:] = 0  # some padding
    target[1, -3:] = 0
    labels = np.concatenate([target[:, 1:], np.full((batch, 1), 3, "int32")], axis=1)
    labels[target == 0] = 0
    target[:, 0] = 2
    return {"source_ids": source, "target_ids": target}, labels


# --- loss and schedule ---


def test_loss_equals_hand_computed_label_smoothing():
    logits = np.array(
        [[[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4], [1.0, 1.0, 1.0, 1.0]]], "float32"
    )
    labels = np.array([[2, 3, 0]])  # pad_id=0 at position 2: only positions 0 and 1 count
    eps, vocab = 0.1, 4
    expected = 0.0
    for position, label in ((0, 2), (1, 3)):
        row = logits[0, position].astype("float64")
        log_p = row - math.log(np.exp(row).sum())
        target = np.full(vocab, eps / vocab)
        target[label] += 1 - eps
        expected += -(target * log_p).sum()
    loss_sum, tokens = label_smoothed_nll(labels, logits, eps)
    assert float(tokens) == 2.0
    np.testing.assert_allclose(float(loss_sum), expected, rtol=1e-6)
    keras_loss = LabelSmoothedCrossEntropy(label_smoothing=eps)(labels, logits)
    np.testing.assert_allclose(float(keras_loss), expected / 2, rtol=1e-6)


def test_loss_without_smoothing_is_negative_log_likelihood():
    logits = np.random.default_rng(1).normal(size=(2, 3, 5)).astype("float32")
    labels = np.array([[1, 2, 0], [4, 0, 0]])
    loss_sum, tokens = label_smoothed_nll(labels, logits, 0.0)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -(log_p[0, 0, 1] + log_p[0, 1, 2] + log_p[1, 0, 4])
    assert float(tokens) == 3.0
    np.testing.assert_allclose(float(loss_sum), expected, rtol=1e-5)


@pytest.mark.parametrize("eps,scale", [(0.1, 3.0), (0.0, 3.0), (0.1, 100.0)])
def test_loss_gradient_is_softmax_minus_the_smoothed_target(eps, scale):
    # scale 100: logits far beyond exp's float32 range, where only a shifted exp is finite
    rng = np.random.default_rng(2)
    logits = tf.constant(rng.normal(size=(2, 3, 7)).astype("float32") * scale)
    labels = np.array([[1, 6, 0], [4, 0, 0]])  # padding (0) gets no gradient
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss_sum, _ = label_smoothed_nll(labels, logits, eps)
    gradient = tape.gradient(loss_sum, logits).numpy()
    z = logits.numpy().astype("float64")
    softmax = np.exp(z - z.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    target = np.full(z.shape, eps / 7)
    target[np.arange(2)[:, None], np.arange(3)[None, :], labels] += 1 - eps
    expected = (softmax - target) * (labels != 0)[..., None]
    np.testing.assert_allclose(gradient, expected, rtol=0, atol=1e-6)
    # the same in a graph whose batch and length are unknown until it runs (a training step's)
    spec = (tf.TensorSpec((None, None), tf.int32), tf.TensorSpec((None, None, 7), tf.float32))

    @tf.function(input_signature=spec)
    def graph_gradient(labels, logits):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss_sum, _ = label_smoothed_nll(labels, logits, eps)
        return tape.gradient(loss_sum, logits)

    np.testing.assert_allclose(
        graph_gradient(labels.astype("int32"), logits).numpy(), expected, rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("step", [1, 100, 3999, 4000, 4001, 10000, 100000])
def test_schedule_equals_paper_formula(step):
    schedule = TransformerSchedule(hidden_dim=512, warmup_steps=4000)
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    # The optimizer's iteration counter starts at 0 for update number 1.
    np.testing.assert_allclose(float(schedule(step - 1)), expected, rtol=1e-6)


@pytest.mark.parametrize(
    "decay, remaining",
    [
        ("linear", lambda done: 1.0 - done),
        ("cosine", lambda done: 0.5 * (1.0 + math.cos(math.pi * done))),
    ],
)
def test_fixed_budget_decays_fall_from_the_paper_peak_to_zero(decay, remaining):
    paper = TransformerSchedule(hidden_dim=128, warmup_steps=100, scale=2.0)
    schedule = TransformerSchedule(
        hidden_dim=128, warmup_steps=100, scale=2.0, decay=decay, train_steps=500
    )
    peak = 2.0 * 128**-0.5 * 100**-0.5
    for step in (1, 50, 100):  # the paper's warmup
        np.testing.assert_allclose(float(schedule(step - 1)), float(paper(step - 1)), rtol=1e-6)
    for step in (100, 200, 300, 499, 500, 600):
        expected = peak * remaining(min((step - 100) / 400, 1.0))
        np.testing.assert_allclose(float(schedule(step - 1)), expected, rtol=1e-5, atol=1e-9)
    assert float(schedule(499)) == 0.0 and float(schedule(700)) == 0.0


def test_schedule_rejects_a_decay_without_a_budget():
    with pytest.raises(ValueError, match="decay='step'"):
        TransformerSchedule(hidden_dim=128, decay="step", train_steps=500)
    with pytest.raises(ValueError, match="train_steps=None"):
        TransformerSchedule(hidden_dim=128, decay="linear")
    with pytest.raises(
        ValueError, match="learning_rate_decay='cosine' needs train_steps > warmup_steps"
    ):
        get_preset("tiny", learning_rate_decay="cosine", train_steps=100, warmup_steps=200)
    with pytest.raises(ValueError, match="learning_rate_decay='exp'"):
        get_preset("tiny", learning_rate_decay="exp")


@pytest.mark.parametrize("decay", ["rsqrt", "cosine"])
def test_schedule_is_serializable(decay):
    schedule = TransformerSchedule(
        hidden_dim=256, warmup_steps=100, scale=2.0, decay=decay, train_steps=300
    )
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert float(restored(50)) == pytest.approx(float(schedule(50)))
    assert float(restored(200)) == pytest.approx(float(schedule(200)))
    optimizer = keras.optimizers.Adam(learning_rate=schedule)
    restored_optimizer = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    restored_optimizer.iterations.assign(50)
    assert float(restored_optimizer.learning_rate) == pytest.approx(float(schedule(50)))


def test_bad_options_name_the_value():
    with pytest.raises(ValueError, match="accum_steps=0"):
        TrainOptions(accum_steps=0)
    with pytest.raises(ValueError, match="precision='float64'"):
        TrainOptions(precision="float64")


# --- the loop ---


def single_batch_fn(batches):
    """`input_context -> dataset` repeating the given list of (inputs, labels) batches."""

    def dataset_fn(input_context):
        del input_context
        dataset = tf.data.Dataset.from_generator(
            lambda: iter(batches),
            output_signature=(
                {
                    "source_ids": tf.TensorSpec([None, None], tf.int32),
                    "target_ids": tf.TensorSpec([None, None], tf.int32),
                },
                tf.TensorSpec([None, None], tf.int32),
            ),
        )
        return dataset.repeat()

    return dataset_fn


def test_nan_loss_stops_with_step_and_keeps_last_checkpoint(tmp_path):
    config = micro_config()
    inputs, labels = fixed_batch(0)
    dataset_fn = single_batch_fn([(inputs, labels)])
    keras.utils.set_random_seed(0)
    trainer = Trainer(config, tmp_path, TrainOptions(checkpoint_every=1, progress=False))
    trainer.train(dataset_fn, until_step=2)
    saved = trainer.model.get_weights()
    embeddings = trainer.model.source_embedding.embeddings
    embeddings.assign(
        np.where(np.arange(embeddings.shape[0])[:, None] == 5, np.nan, embeddings.numpy())
    )
    inputs["source_ids"][0, 0] = 5  # the poisoned token is in the batch
    with pytest.raises(DivergenceError, match="at step 3"):
        trainer.train(single_batch_fn([(inputs, labels)]), until_step=5)
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-2")
    fresh = Trainer(config, tmp_path, TrainOptions(progress=False))
    fresh.restore()
    assert fresh.step == 2
    for restored, good in zip(fresh.model.get_weights(), saved):
        np.testing.assert_array_equal(restored, good)


def clean_batch(seed):
    inputs, labels = fixed_batch(seed)
    labels[labels == POISON_LABEL] = POISON_LABEL + 1
    return inputs, labels


def poisoned_batch(seed):
    inputs, labels = clean_batch(seed)
    return inputs, poison(labels)


@pytest.fixture
def nan_gradient_on_poisoned_batches(monkeypatch):
    """The trainer's loss gets a term that is 0 but has a NaN gradient on poisoned batches."""
    import keras_transformer.training.update as update_module

    monkeypatch.setattr(update_module, "label_smoothed_nll", poisoned_nll)


def test_nonfinite_gradient_under_finite_loss_stops_before_the_update(
    tmp_path, nan_gradient_on_poisoned_batches
):
    keras.utils.set_random_seed(0)
    trainer = Trainer(micro_config(), tmp_path, TrainOptions(checkpoint_every=1, progress=False))
    batches = [clean_batch(0), clean_batch(1), poisoned_batch(2)]
    trainer.train(single_batch_fn(batches[:2]), until_step=2)
    good = trainer.model.get_weights()
    with pytest.raises(
        DivergenceError,
        match=r"non-finite gradient at step 3 \(loss [0-9.]+\); the update was not applied",
    ):
        trainer.train(
            single_batch_fn(batches), until_step=5
        )  # resumes the input at its third batch
    assert trainer.step == 2
    for weight, before in zip(trainer.model.get_weights(), good):
        np.testing.assert_array_equal(weight, before)
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-2")


def test_skipped_nonfinite_update_changes_nothing_and_is_counted(
    tmp_path, nan_gradient_on_poisoned_batches
):
    options = TrainOptions(checkpoint_every=10, log_every=1, on_nonfinite="skip", progress=False)
    keras.utils.set_random_seed(0)
    config = micro_config(dropout=0.0)  # the skipped step's forward pass drew dropout masks too
    skipping = Trainer(config, tmp_path / "skipping", options)
    results = skipping.train(
        single_batch_fn([clean_batch(0), poisoned_batch(1), clean_batch(2)]), until_step=2
    )
    keras.utils.set_random_seed(0)
    clean = Trainer(config, tmp_path / "clean", options)
    clean.train(single_batch_fn([clean_batch(0), clean_batch(2)]), until_step=2)
    assert results["step"] == 2 and results["skipped_steps"] == skipping.skipped_steps == 1
    for a, b in zip(skipping.model.get_weights(), clean.model.get_weights()):
        np.testing.assert_array_equal(a, b)  # as if the poisoned batch had never been there
    from keras_transformer.visualization import read_scalars

    skipped = read_scalars(tmp_path / "skipping" / "logs" / "train")["skipped_steps"]
    assert skipped.steps.tolist() == [1, 2] and skipped.values.tolist() == [
        0.0,
        1.0,
    ]  # skips are not steps
    # The count is part of the run: a restarted trainer reads it back.
    restarted = Trainer(config, tmp_path / "skipping", options)
    restarted.restore()
    assert restarted.skipped_steps == 1


def test_a_checkpoint_with_nonfinite_weights_is_never_written(tmp_path):
    keras.utils.set_random_seed(0)
    trainer = Trainer(micro_config(), tmp_path, TrainOptions(checkpoint_every=1, progress=False))
    trainer.train(single_batch_fn([fixed_batch(0)]), until_step=1)
    kernel = trainer.model.trainable_variables[3]
    kernel.assign(np.full(kernel.shape, np.inf, "float32"))
    with pytest.raises(
        DivergenceError, match=rf"Not saving step 1: non-finite values in {kernel.path}"
    ):
        trainer.save()
    assert [Path(p).name for p in checkpoint_paths(tmp_path / "checkpoints")] == ["ckpt-1"]


def test_interrupted_run_with_dropout_equals_uninterrupted_run(tmp_path):
    """Restarts (new Trainer, reseeded like a new process) restore dropout seeds and the input position."""
    config = micro_config(dropout=0.3, attention_dropout=0.1, train_steps=6)
    batches = [fixed_batch(seed) for seed in range(4)]  # the input repeats after 4 updates

    def train(run_dir, stops):
        for stop in stops:
            keras.utils.set_random_seed(0)  # what a new process does first
            trainer = Trainer(config, run_dir, TrainOptions(checkpoint_every=100, progress=False))
            trainer.train(single_batch_fn(batches), until_step=stop)
        return trainer.model.get_weights()

    uninterrupted = train(tmp_path / "once", [6])
    for a, b in zip(train(tmp_path / "twice", [2, 5, 6]), uninterrupted):
        np.testing.assert_array_equal(a, b)


def test_several_updates_per_call_equal_one_per_call(tmp_path, capsys, absl_verbosity):
    """steps_per_execution=4 makes the same updates, with dropout, as one update per call.

    The second run shows its progress as a notebook shows it (absl's INFO lines hidden): a
    line per log step on stderr (not a terminal here), each validation's line after its
    step's, nothing on stdout."""
    from absl import logging as absl_logging

    absl_verbosity(absl_logging.WARNING)
    config = micro_config(dropout=0.3, train_steps=7)
    batches = [fixed_batch(seed) for seed in range(5)]
    weights, logged = [], []
    for steps_per_execution in (1, 4):
        keras.utils.set_random_seed(0)
        options = TrainOptions(
            checkpoint_every=5,
            log_every=3,
            eval_every=6,
            steps_per_execution=steps_per_execution,
            progress=steps_per_execution == 4,
        )
        trainer = Trainer(config, tmp_path / str(steps_per_execution), options)
        capsys.readouterr()
        results = trainer.train(single_batch_fn(batches), validation_dataset=[fixed_batch(9)])
        assert results["step"] == 7 and trainer.skipped_steps == 0
        shown = capsys.readouterr()
        if options.progress:
            lines = shown.err.splitlines()
            assert [line.split(" [")[0].split(" loss")[0] for line in lines] == [
                "step 3/7",
                "step 6/7",
                "step 6 validation",
                "step 7/7",
                "step 7 validation",
            ]
            assert f"] loss {results['loss']:.4f} lr " in lines[-2] and shown.out == ""
            assert lines[-1] == (
                f"step 7 validation loss {results['val_loss']:.4f} "
                f"perplexity {results['val_perplexity']:.2f}"
            )
        else:
            assert "step 3/7" not in shown.err + shown.out
        weights.append(trainer.model.get_weights())
        logged.append(results["loss"])
        # Calls stop at the log and checkpoint steps: both were written.
        assert [
            Path(p).name
            for p in checkpoint_paths(tmp_path / str(steps_per_execution) / "checkpoints")
        ] == ["ckpt-5", "ckpt-7"]
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)
    assert logged[0] == pytest.approx(logged[1], rel=1e-6)


def test_averaging_more_checkpoints_than_kept_names_both_numbers(tmp_path):
    keras.utils.set_random_seed(0)
    trainer = Trainer(micro_config(), tmp_path, TrainOptions(checkpoint_every=1, progress=False))
    trainer.train(single_batch_fn([fixed_batch(0)]), until_step=3)
    assert len(checkpoint_paths(tmp_path / "checkpoints", last=3)) == 3
    with pytest.raises(ValueError, match=r"Asked for the last 5 checkpoints, but .* holds 3\."):
        checkpoint_paths(tmp_path / "checkpoints", last=5)


def test_recipes_keep_the_checkpoints_they_average(tmp_path):
    big = get_preset("big", **{**MICRO, "hidden_dim": 32, "intermediate_dim": 64, "num_heads": 2})
    assert big.average_checkpoints == 20
    assert Trainer(big, tmp_path / "big", TrainOptions(progress=False)).keep_checkpoints == 20
    assert (
        Trainer(micro_config(), tmp_path / "tiny", TrainOptions(progress=False)).keep_checkpoints
        == 5
    )
    kept = Trainer(big, tmp_path / "asked", TrainOptions(keep_checkpoints=30, progress=False))
    assert kept.keep_checkpoints == 30


def test_rerun_resumes_step_count(tmp_path):
    config = micro_config()
    dataset_fn = single_batch_fn([fixed_batch(0)])
    keras.utils.set_random_seed(0)
    first = Trainer(config, tmp_path, TrainOptions(checkpoint_every=2, progress=False))
    assert first.train(dataset_fn, until_step=3)["step"] == 3
    weights = first.model.get_weights()
    second = Trainer(config, tmp_path, TrainOptions(checkpoint_every=2, progress=False))
    assert second.restore().endswith("ckpt-3")
    assert second.step == 3
    for a, b in zip(second.model.get_weights(), weights):
        np.testing.assert_array_equal(a, b)
    assert second.train(dataset_fn, until_step=5)["step"] == 5
    assert [Path(p).name for p in checkpoint_paths(tmp_path / "checkpoints")] == [
        "ckpt-2",
        "ckpt-3",
        "ckpt-4",
        "ckpt-5",
    ]


def test_a_checkpoint_that_holds_less_says_truly_what_starts_anew(tmp_path, caplog):
    """The model's weights alone (an import's ckpt-0): no warning, step 0; the model and the
    optimizer without the input's position (an older checkpoint): the warning, the step kept."""
    from keras_transformer.pretrained import write_weights_checkpoint
    from keras_transformer.training.checkpoints import checkpoint_manager, save_checkpoint

    config = micro_config()
    source = Trainer(config, tmp_path / "source", TrainOptions(progress=False))
    source.optimizer.iterations.assign(3)
    imported = write_weights_checkpoint(source.model, tmp_path / "import")
    older = save_checkpoint(
        checkpoint_manager(
            tf.train.Checkpoint(model=source.model, optimizer=source.optimizer),
            tmp_path / "older" / "checkpoints",
            max_to_keep=None,
        ),
        3,
    )
    for run, path, step, message in (
        (
            "import",
            imported,
            0,
            (
                "INFO",
                f"{imported} holds the model's weights only (no optimizer state): the step, "
                "the optimizer and the input start anew",
            ),
        ),
        (
            "older",
            older,
            3,
            (
                "WARNING",
                f"{older} holds no input position (an older checkpoint): its input "
                "starts from the first batch",
            ),
        ),
    ):
        trainer = Trainer(config, tmp_path / run, TrainOptions(progress=False))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="absl"):
            assert trainer.restore() == path
        holds = [
            (r.levelname, r.getMessage()) for r in caplog.records if " holds " in r.getMessage()
        ]
        assert holds == [message]
        assert trainer.step == step
        for restored, written in zip(trainer.model.get_weights(), source.model.get_weights()):
            np.testing.assert_array_equal(restored, written)


def test_averaging_two_checkpoints_gives_the_mean(tmp_path):
    config = micro_config()
    keras.utils.set_random_seed(0)
    trainer = Trainer(config, tmp_path, TrainOptions(checkpoint_every=1, progress=False))
    snapshots = []
    dataset_fn = single_batch_fn([fixed_batch(0)])
    for steps in (1, 2):
        trainer.train(dataset_fn, until_step=steps)
        snapshots.append([v.numpy() for v in trainer.model.weights])
    assert not np.allclose(snapshots[0][0], snapshots[1][0])
    keras.utils.set_random_seed(1)
    other = Trainer(config, tmp_path / "other", TrainOptions(progress=False))
    average_checkpoints(other.model, checkpoint_paths(tmp_path / "checkpoints", last=2))
    for variable, a, b in zip(other.model.weights, *snapshots):
        np.testing.assert_allclose(
            variable.numpy(), (a.astype("float64") + b) / 2, rtol=1e-6, atol=1e-7
        )


def test_plain_model_fit_trains(tmp_path):
    from keras_transformer import Transformer
    from keras_transformer.training import paper_optimizer

    config = micro_config(dropout=0.0)
    keras.utils.set_random_seed(0)
    model = Transformer(config)
    model.compile(
        optimizer=paper_optimizer(config.hidden_dim, warmup_steps=10),
        loss=LabelSmoothedCrossEntropy(0.1),
    )
    inputs, labels = fixed_batch(0, batch=8)
    history = model.fit(inputs, labels, epochs=15, batch_size=8, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.8 * losses[0]
    # The Keras loss matches the trainer's loss on the same batch.
    loss_sum, tokens = label_smoothed_nll(labels, model(inputs), 0.1)
    np.testing.assert_allclose(
        float(model.compute_loss(inputs, labels, model(inputs))),
        float(loss_sum / tokens),
        rtol=1e-5,
    )


def test_embedded_task_run_lowers_validation_loss(tmp_path):
    config = micro_config(
        vocabulary_size=96,
        hidden_dim=64,
        intermediate_dim=128,
        warmup_steps=60,
        max_length=48,
        train_steps=120,
    )
    options = TrainOptions(
        batch_tokens=1024, log_every=40, eval_every=0, checkpoint_every=60, progress=False
    )
    trainer, results = train_translation(config, tmp_path, options, DataOptions("builtin"))
    initial = math.log(config.vocabulary_size)  # loss of a uniform prediction
    assert results["step"] == 120
    assert results["val_loss"] < 0.6 * initial, results
    assert (tmp_path / "spm.model").exists() and (tmp_path / "config.json").exists()
    assert list((tmp_path / "logs" / "train").iterdir())
    # Same command again: nothing to do, the step stays.
    _, again = train_translation(config, tmp_path, options, DataOptions("builtin"))
    assert again["step"] == 120


def test_bad_data_options_are_refused_before_anything_is_written(tmp_path):
    options = TrainOptions(batch_tokens=256, progress=False)
    run_dir = tmp_path / "run"
    with pytest.raises(
        ValueError, match=r"strictly increasing. Received: bucket_boundaries=\[16, 8\]"
    ):
        train_translation(
            micro_config(), run_dir, options, DataOptions("builtin", bucket_boundaries=(16, 8))
        )
    with pytest.raises(ValueError, match="largest bucket boundary 64 exceeds max_length=32"):
        train_translation(
            micro_config(), run_dir, options, DataOptions("builtin", bucket_boundaries=(8, 64))
        )
    with pytest.raises(
        ValueError, match=r"sampling alpha must be a number in \(0, 1\]. Received: alpha=1.5"
    ):
        DataOptions("builtin", sampling_alpha=1.5)
    assert not run_dir.exists()


def test_precisions_and_xla_train(tmp_path):
    """Each precision (float16 with loss scaling) and XLA compile and make finite updates."""
    inputs, labels = fixed_batch(0)
    for index, (precision, jit_compile) in enumerate(
        (("mixed_bfloat16", False), ("mixed_float16", False), ("float32", True))
    ):
        keras.utils.set_random_seed(0)
        trainer = Trainer(
            micro_config(train_steps=2),
            tmp_path / str(index),
            TrainOptions(precision=precision, jit_compile=jit_compile, progress=False),
        )
        before = trainer.model.get_weights()
        results = trainer.train(single_batch_fn([(inputs, labels)]))
        assert results["step"] == 2 and math.isfinite(results["loss"]), (precision, results)
        assert trainer.model.compute_dtype == {
            "mixed_bfloat16": "bfloat16",
            "mixed_float16": "float16",
        }.get(precision, "float32")
        assert all(w.dtype == np.float32 for w in trainer.model.get_weights())
        moved = [not np.allclose(a, b) for a, b in zip(trainer.model.get_weights(), before)]
        assert sum(moved) > 10, precision
        if precision == "mixed_float16":
            assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
