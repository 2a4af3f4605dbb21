"""Training a user steers: Keras callbacks in the loop, the task's score while it trains, the best
checkpoint kept apart, and early stopping (`--score_every`, `--patience`)."""

import csv
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import runs
from keras_transformer.evaluation.scoring import TaskScore
from keras_transformer.training import Trainer, TrainOptions
from tests.test_training import clean_batch, micro_config, single_batch_fn

REPO = Path(__file__).resolve().parents[1]


def validation_set():
    return single_batch_fn([clean_batch(5), clean_batch(6)])(None).take(2)


class Recorder(keras.callbacks.Callback):
    """A user's callback: records every hook it gets, and stops training at `stop_at` (an epoch end)."""

    def __init__(self, stop_at=None):
        super().__init__()
        self.events, self.stop_at = [], stop_at

    def on_train_begin(self, logs=None):
        self.events.append(("begin", None, dict(logs)))

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("batch", batch, dict(logs)))

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch", epoch, dict(logs)))
        if epoch == self.stop_at:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        self.events.append(("end", None, dict(logs)))


def test_callbacks_get_logs_and_evaluations_and_stop_as_a_normal_finish(tmp_path):
    keras.utils.set_random_seed(0)
    options = TrainOptions(checkpoint_every=100, log_every=1, eval_every=2, progress=False)
    trainer = Trainer(micro_config(), tmp_path / "run", options)
    recorder = Recorder(stop_at=4)
    csv_path = tmp_path / "log.csv"
    results = trainer.train(
        single_batch_fn([clean_batch(0), clean_batch(1)]),
        validation_set(),
        until_step=10,
        callbacks=[recorder, keras.callbacks.CSVLogger(str(csv_path))],
    )
    kinds = [(kind, step) for kind, step, _ in recorder.events]
    assert kinds == [
        ("begin", None),
        ("batch", 1),
        ("batch", 2),
        ("epoch", 2),
        ("batch", 3),
        ("batch", 4),
        ("epoch", 4),
        ("end", None),
    ]
    train_keys = {"loss", "learning_rate", "tokens_per_second", "skipped_steps"}
    epochs = [logs for kind, _, logs in recorder.events if kind == "epoch"]
    assert all(set(logs) == train_keys | {"val_loss", "val_perplexity"} for logs in epochs)
    assert all(set(logs) == train_keys for kind, _, logs in recorder.events if kind == "batch")
    # model.stop_training: a normal finish at that step, its checkpoint saved.
    assert results["step"] == trainer.step == 4
    assert "a callback set model.stop_training" in results["stopped"]
    assert runs.latest_checkpoint(tmp_path / "run").endswith("ckpt-4")
    assert recorder.events[-1][2]["step"] == 4
    # Keras' own CSVLogger: one row per epoch (evaluation), the validation columns filled.
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert [row["epoch"] for row in rows] == ["2", "4"]
    for row, logs in zip(rows, epochs):
        assert float(row["val_loss"]) == pytest.approx(logs["val_loss"])
        assert float(row["loss"]) == pytest.approx(logs["loss"])


def nan_loss_nll(labels, logits, label_smoothing=0.1, pad_id=0):
    """`label_smoothed_nll`, NaN on a batch whose labels hold `POISON_LABEL`."""
    from keras_transformer.training.loss import label_smoothed_nll
    from tests.fault_injection import POISON_LABEL

    loss_sum, tokens = label_smoothed_nll(labels, logits, label_smoothing, pad_id)
    marked = tf.reduce_any(tf.equal(labels, POISON_LABEL))
    return tf.where(marked, tf.constant(float("nan")), loss_sum), tokens


def test_terminate_on_nan_stops_a_run_that_skips_nonfinite_updates(tmp_path, monkeypatch):
    import keras_transformer.training.update as update_module
    from tests.fault_injection import poison

    monkeypatch.setattr(update_module, "label_smoothed_nll", nan_loss_nll)
    keras.utils.set_random_seed(0)
    options = TrainOptions(checkpoint_every=100, log_every=10, on_nonfinite="skip", progress=False)
    trainer = Trainer(micro_config(), tmp_path, options)
    inputs, labels = clean_batch(2)
    batches = [clean_batch(0), clean_batch(1), (inputs, poison(labels)), clean_batch(3)]
    results = trainer.train(
        single_batch_fn(batches), until_step=8, callbacks=[keras.callbacks.TerminateOnNaN()]
    )
    # The third update's loss is NaN: skipped (not a step), TerminateOnNaN sees it and stops the run.
    assert results["skipped_steps"] == 1
    assert results["step"] == 2 and "model.stop_training" in results["stopped"]
    assert runs.latest_checkpoint(tmp_path).endswith("ckpt-2")


class ScriptedScores:
    """Scores each evaluation by the trainer's step from `table` (a run whose score rises, then falls)."""

    def __init__(self, table):
        self.table, self.trainer, self.steps = table, None, []

    def __call__(self, model):
        assert model is self.trainer.model
        self.steps.append(self.trainer.step)
        score = self.table[self.trainer.step]
        return TaskScore("bleu", {"bleu": score, "chrf": 2 * score}, "BLEU:test|sentences:2", 0.0)


SCORES = {2: 10.0, 4: 20.0, 6: 15.0, 8: 20.5, 10: 30.0, 12: 1.0}


def scored_trainer(run_dir, scorer, patience, progress=False):
    keras.utils.set_random_seed(0)
    options = TrainOptions(
        checkpoint_every=2,
        keep_checkpoints=10,
        log_every=2,
        eval_every=0,
        score_every=2,
        patience=patience,
        min_delta=1.0,
        progress=progress,
    )
    scorer.trainer = Trainer(micro_config(), run_dir, options)
    return scorer.trainer


def train_scored(run_dir, patience, until_step, progress=False):
    scorer = ScriptedScores(SCORES)
    trainer = scored_trainer(run_dir, scorer, patience, progress)
    batches = [clean_batch(seed) for seed in range(4)]
    return (
        trainer,
        scorer,
        trainer.train(single_batch_fn(batches), scorer=scorer, until_step=until_step),
    )


def test_best_checkpoint_and_patience_count_scored_evaluations_across_resumes(
    tmp_path, capsys, absl_verbosity
):
    from absl import logging as absl_logging

    run = tmp_path / "run"
    # Scores 10, 20 (best, step 4), 15: one evaluation without an improvement by min_delta=1.
    _, scorer, results = train_scored(run, patience=2, until_step=6)
    assert scorer.steps == [2, 4, 6] and "stopped" not in results
    assert results["best"]["step"] == 4
    # Resumed: 20.5 at step 8 is no improvement by more than 1 over the reloaded best (20), and
    # the second evaluation in a row without one (counted from scores.jsonl): patience 2 stops.
    trainer, scorer, results = train_scored(run, patience=2, until_step=12)
    assert scorer.steps == [8]
    assert results["step"] == trainer.step == 8
    assert results["stopped"].startswith(
        "Stopped early at step 8: bleu did not improve by more than 1"
    )
    assert f"is {run / 'best' / 'ckpt-4'}" in results["stopped"]
    assert runs.latest_checkpoint(run).endswith("ckpt-8")  # a normal finish: saved
    best = runs.read_best(run)
    assert (best["step"], best["score"], best["checkpoint"]) == (4, 20.0, "ckpt-4")
    assert best["signature"] == "BLEU:test|sentences:2" and best["values"]["chrf"] == 40.0
    # The best checkpoint holds the weights of step 4 (the rotation's ckpt-4), not the last ones.
    assert runs.resolve_checkpoint(run, "best") == str(run / "best" / "ckpt-4")
    for name in ("checkpoints/ckpt-4", "checkpoints/ckpt-8"):
        reader = tf.train.load_checkpoint(str(run / name))
        best_reader = tf.train.load_checkpoint(str(run / "best" / "ckpt-4"))
        key = next(k for k in best_reader.get_variable_to_shape_map() if k.startswith("model/"))
        same = np.array_equal(reader.get_tensor(key), best_reader.get_tensor(key))
        assert same == name.endswith("ckpt-4"), name
    records = runs.read_scores(run)
    assert [(r["step"], r["score"], r["best_step"], r["since_best"]) for r in records] == [
        (2, 10.0, 2, 0),
        (4, 20.0, 4, 0),
        (6, 15.0, 4, 1),
        (8, 20.5, 4, 2),
    ]
    # The same patience again: stops at once, nothing trained or scored.
    _, scorer, results = train_scored(run, patience=2, until_step=12)
    assert (
        scorer.steps == []
        and results["step"] == 8
        and "Stopped early at step 8" in results["stopped"]
    )
    # A larger patience resumes: step 10 scores 30, the new best; 12 falls again (one evaluation).
    # Its progress shown as in a notebook (absl's INFO lines hidden): each score below its step.
    absl_verbosity(absl_logging.WARNING)
    capsys.readouterr()
    _, scorer, results = train_scored(run, patience=3, until_step=12, progress=True)
    assert scorer.steps == [10, 12] and results["step"] == 12 and "stopped" not in results
    shown = [line.split(" [")[0].split(" in ")[0] for line in capsys.readouterr().err.splitlines()]
    assert shown == [
        "step 10/12",
        "step 10 bleu 30.00 chrf 60.00 (best 30.00 at step 10; 0 scored evaluations since)",
        "step 12/12",
        "step 12 bleu 1.00 chrf 2.00 (best 30.00 at step 10; 1 scored evaluations since)",
    ]
    assert runs.read_best(run)["step"] == 10 and results["best"]["path"] == str(
        run / "best" / "ckpt-10"
    )
    assert sorted(path.name for path in (run / "best").iterdir()) == [
        "best.json",
        "ckpt-10.data-00000-of-00001",
        "ckpt-10.index",
    ]


def test_score_options_are_checked():
    with pytest.raises(
        ValueError, match="patience counts scored evaluations: it needs score_every > 0"
    ):
        TrainOptions(patience=3)
    with pytest.raises(ValueError, match="min_delta must be >= 0. Received: min_delta=-1"):
        TrainOptions(score_every=5, min_delta=-1)
    with pytest.raises(ValueError, match="score_every must be an integer >= 0"):
        TrainOptions(score_every=-5)


def test_best_names_the_flag_when_a_run_kept_none(tmp_path):
    with pytest.raises(
        ValueError, match=rf"No best checkpoint in {tmp_path / 'best'}: .*--score_every"
    ):
        runs.resolve_checkpoint(tmp_path, "best")


# --- real decodes (slow tier) ---


def test_a_run_scored_by_decoding_keeps_the_best_and_best_reproduces_its_score(tmp_path):
    from keras_transformer.data.sources import load_pairs
    from keras_transformer.evaluation import evaluate_run
    from keras_transformer.models.config import get_preset
    from keras_transformer.training import DataOptions, train_translation
    from keras_transformer.visualization import read_scalars
    from tests.conftest import TRAINED_RUN_CONFIG

    run = tmp_path / "run"
    config = get_preset("tiny", **TRAINED_RUN_CONFIG, train_steps=90)
    options = TrainOptions(
        batch_tokens=1024,
        checkpoint_every=90,
        eval_every=0,
        log_every=30,
        score_every=30,
        score_sentences=16,
        progress=False,
    )
    _, results = train_translation(config, run, options, DataOptions("builtin"))
    records = runs.read_scores(run)
    assert [record["step"] for record in records] == [30, 60, 90]
    signature = records[0]["signature"]
    assert "tok:char" in signature and "method=greedy" in signature
    assert signature.endswith("sentences:16")
    first_best = max(records, key=lambda record: (record["score"], -record["step"]))
    best = runs.read_best(run)
    assert (best["step"], best["score"]) == (first_best["step"], first_best["score"])
    assert results["best"]["path"] == str(run / "best" / f"ckpt-{best['step']}")
    scalars = read_scalars(run / "logs" / "validation")
    for name in ("bleu", "chrf"):
        assert scalars[name].steps.tolist() == [30, 60, 90]
        assert scalars[name].values.tolist() == pytest.approx(
            [record["values"][name] for record in records]
        )
    # The best checkpoint, decoded again as evaluate.py --checkpoint=best does, scores what was recorded.
    again = evaluate_run(
        run,
        checkpoint="best",
        method="greedy",
        pairs=load_pairs("builtin", "val")[:16],
        tokenize="char",
    )
    assert again.scores.bleu == pytest.approx(best["score"])
    assert again.scores.chrf == pytest.approx(best["values"]["chrf"])


def test_train_script_scores_under_mirrored_replicas_and_translate_reads_best(
    tmp_path, tiny_tokenizer
):
    from tests.scripts import TINY_TRAIN_FLAGS, run_script, seed_tokenizer

    run = seed_tokenizer(tmp_path / "run", tiny_tokenizer)
    result = run_script(
        "train.py",
        f"--model_dir={run}",
        *TINY_TRAIN_FLAGS,
        "--strategy=mirrored",
        "--cpu_devices=2",
        "--train_steps=12",
        "--checkpoint_every=6",
        "--log_every=3",
        "--score_every=3",
        "--score_sentences=8",
        "--score_method=beam",
        "--patience=1",
        "--min_delta=100",
    )
    # min_delta=100: no later score counts as an improvement; patience 1 stops at the second.
    assert result.returncode == 0
    assert (
        "Stopped early at step 6: bleu did not improve by more than 100 in 1 scored"
        in result.stdout
    )
    assert (
        f"Best:        bleu {runs.read_best(run)['score']:.2f} at step 3, {run / 'best' / 'ckpt-3'}"
        in result.stdout
    )
    records = runs.read_scores(run)
    assert [record["step"] for record in records] == [3, 6]
    assert "method=beam beam_size=4" in records[0]["signature"]
    translated = run_script(
        "translate.py", f"--model_dir={run}", "--checkpoint=best", stdin="twenty one\n"
    )
    assert len(translated.stdout.splitlines()) == 1


def test_a_parsing_run_is_scored_with_evalb_f1_and_tagging_accuracy(tmp_path, ptb_sample_dir):
    from keras_transformer.data.tokenizer import Tokenizer, train_sentencepiece
    from keras_transformer.data.treebank import load_ptb_pairs
    from keras_transformer.data.trees import tree_symbols
    from keras_transformer.decoding import Parser
    from keras_transformer.evaluation.evalb import evalb
    from keras_transformer.evaluation.parsing import gold_trees
    from keras_transformer.evaluation.scoring import TaskScorer
    from keras_transformer.models.config import get_preset
    from keras_transformer.models.transformer import Transformer

    keras.utils.set_random_seed(0)
    pairs = load_ptb_pairs(ptb_sample_dir, "train", test_files="wsj_001*,wsj_01[1-6]*")[:400]
    train_sentencepiece(
        [text for pair in pairs for text in pair],
        tmp_path / "spm.model",
        600,
        whole_words=tree_symbols(target for _, target in pairs),
    )
    tokenizer = Tokenizer(tmp_path / "spm.model")
    model = Transformer(get_preset("tiny", **{**TINY_PARSER, "vocabulary_size": 600}))
    gold = sorted(pairs, key=lambda pair: len(pair[0]))[:6]
    score = TaskScorer(tokenizer, gold, parsing=True)(model)
    assert score.metric == "f1" and set(score.values) == {"f1", "tagging_accuracy"}
    assert score.signature.startswith("EVALB:COLLINS.prm|method=greedy max_output_offset=50|")
    # The figures are EVALB's over the trees the run's greedy Parser gives (an untrained model's
    # trees tag the final "?" as a word, so EVALB counts each sentence as an error: F1 is NaN).
    trees = Parser(model, tokenizer, "greedy", max_output_offset=50)([words for words, _ in gold])
    summary = evalb(gold_trees(gold), trees).all
    assert score.values["tagging_accuracy"] == summary.tagging_accuracy
    assert score.values["f1"] == summary.f_measure or (
        np.isnan(score.values["f1"]) and np.isnan(summary.f_measure)
    )


TINY_PARSER = dict(
    num_encoder_layers=1, num_decoder_layers=1, hidden_dim=32, intermediate_dim=64, num_heads=2
)
