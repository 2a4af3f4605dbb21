"""Train a translation model end to end: corpus -> tokenizer -> pipeline -> Trainer.

Everything a run needs later (decoding, evaluation, export) is written into its directory
(layout: `keras_transformer.runs`).
"""

import dataclasses
import json
import time

import keras
import tensorflow as tf
from absl import logging

from keras_transformer import fs
from keras_transformer.backends import require_tensorflow
from keras_transformer.data.pipeline import check_bucket_boundaries, make_dataset, padding_fraction
from keras_transformer.data.plan import BatchPlan
from keras_transformer.data.sources import load_pairs, whole_words
from keras_transformer.data.tokenizer import Tokenizer, check_sampling_alpha, train_sentencepiece
from keras_transformer.models.config import TransformerConfig
from keras_transformer.runs import (
    checkpoint_step,
    config_path,
    latest_checkpoint,
    log_dir,
    read_run_config,
    record_start,
    tokenizer_path,
)
from keras_transformer.training.strategy import is_chief
from keras_transformer.training.options import TrainOptions
from keras_transformer.training.progress import TerminationSignal
from keras_transformer.training.trainer import Trainer, write_run_config


def prepare_tokenizer(model_dir, pairs, vocabulary_size, seed=0, chief=True, timeout=600.0, whole_words=(),
                      model_type="unigram"):
    """Load the run's SentencePiece model, or train a joint one (`model_type`: "unigram" or
    "bpe") on `pairs` and save it there.

    Only the chief trains; other workers of a multi-worker run wait for its file.
    """
    path = tokenizer_path(model_dir)
    if not chief:
        deadline = time.time() + timeout
        while not fs.exists(path):
            if time.time() > deadline:
                raise TimeoutError(f"The chief did not write {path} within {timeout:.0f} s")
            time.sleep(0.5)
    if not fs.exists(path):
        sentences = [text for pair in pairs for text in pair]
        logging.info("Training a %d-piece SentencePiece %s model on %d sentences", vocabulary_size, model_type,
                     len(sentences))
        train_sentencepiece(sentences, path, vocabulary_size, model_type=model_type, seed=seed, whole_words=whole_words)
    return Tokenizer(path)


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """Which corpus to train on (see `data.sources.load_pairs`)."""

    dataset: str = "builtin"
    src_lang: str = "en"
    tgt_lang: str = "de"
    data_dir: str = None
    files: dict = None
    max_length: int = None  # defaults to the model's max_length
    bucket_boundaries: tuple = None  # padded lengths (default: data.pipeline.default_bucket_boundaries)
    sampling_alpha: float = None  # subword regularization of the training data (Tokenizer.sampler)

    def __post_init__(self):
        if self.sampling_alpha is not None:
            check_sampling_alpha(self.sampling_alpha)


# The settings a run's data position is planned with (`data.BatchPlan`): a resume that
# changes one of them would continue at another place in the data, so it is refused.
# Replicas, devices and `accum_steps` may change: the position counts global batches of
# one plan, whatever takes them.
POSITION_SETTINGS = {
    "training": ("batch_tokens", "seed"),
    "data": ("dataset", "src_lang", "tgt_lang", "data_dir", "files", "max_length", "bucket_boundaries",
             "sampling_alpha"),
}


def check_resume_settings(model_dir, payload):
    """Raise a one-line `ValueError` if `payload` changes a setting the run's data position depends on.

    `payload` is this start's run config (`{"model", "training", "data"}`); the run's first
    config is in `config.json`.
    """
    _, first = read_run_config(model_dir)
    for section, names in POSITION_SETTINGS.items():
        for name in names:
            if section not in first or name not in first[section]:
                continue
            before, now = first[section][name], json.loads(json.dumps(payload[section][name]))
            if before != now:
                raise ValueError(
                    f"{model_dir} was started with {name}={before!r}, now {name}={now!r}: its data position "
                    f"(in checkpoints) counts batches planned with the first value. Resume with {name}={before!r}, "
                    "or start a new model_dir."
                )


def train_translation(config: TransformerConfig, model_dir, options: TrainOptions, data: DataOptions, strategy=None,
                      termination=None):
    """Train (or resume) a translation run in `model_dir`.

    A run directory that already holds a config must have the same architecture
    (`TransformerConfig.architecture`) and the same data position settings
    (`POSITION_SETTINGS`); training settings such as `train_steps`, `accum_steps`, the
    number of replicas or the precision may change. The first start's config stays in
    `config.json`; every start's settings are appended to `starts.jsonl`. The tokenizer
    is reused; training continues from the latest checkpoint, and its input at the same
    example (`data.BatchPlan`; with `sampling_alpha`, whose segmentations are drawn
    anew, the input is replayed instead).

    SIGTERM during start-up (reading, tokenizing, planning) returns at the next stage
    with `results["preempted"] = True` and `results["step"] = None`, no checkpoint written; during training, see
    `Trainer.train`.

    Args:
        termination: a `training.progress.TerminationSignal` already watching SIGTERM
            (a script installs one first thing); default: one for this call.

    Returns:
        `(trainer, results)`; results as `Trainer.train`, plus the run's paths. The
        trainer is None when start-up was interrupted.
    """
    require_tensorflow("Training (training.train_translation)")
    if termination is not None:
        return _train_translation(config, model_dir, options, data, strategy, termination)
    with TerminationSignal() as termination:
        return _train_translation(config, model_dir, options, data, strategy, termination)


def _train_translation(config, model_dir, options, data, strategy, termination):
    # Seed first: it also clears TensorFlow's kernel caches, which would drop the
    # tokenizer's in-graph resources if they were created before.
    keras.utils.set_random_seed(options.seed)
    model_dir = fs.as_path(model_dir)
    if fs.exists(config_path(model_dir)):
        previous, _ = read_run_config(model_dir)
        before, now = previous.architecture(), config.architecture()
        changed = sorted(name for name in now if before[name] != now[name])
        if changed:
            details = ", ".join(f"{name}: {before[name]!r} -> {now[name]!r}" for name in changed)
            raise ValueError(
                f"{model_dir} holds a run with a different architecture ({details}). "
                "Use a new --model_dir, or the same architecture to resume."
            )
    max_length = data.max_length or config.max_length
    if data.bucket_boundaries is not None:  # before anything is loaded or written
        check_bucket_boundaries(data.bucket_boundaries, max_length)
    payload = {"model": config.to_dict(), "training": dataclasses.asdict(options), "data": dataclasses.asdict(data)}
    if fs.exists(config_path(model_dir)):
        check_resume_settings(model_dir, payload)
    strategy = strategy or tf.distribute.get_strategy()
    chief = is_chief(strategy)
    if chief:
        fs.check_writable(model_dir)  # now, not at the first checkpoint
    interrupted = _Interrupted(termination)
    train_pairs = load_pairs(data.dataset, "train", data.src_lang, data.tgt_lang, data.data_dir, data.files)
    val_pairs = load_pairs(data.dataset, "val", data.src_lang, data.tgt_lang, data.data_dir, data.files)
    tokenizer = prepare_tokenizer(model_dir, train_pairs, config.vocabulary_size, options.seed, chief=chief,
                                  model_type=config.tokenizer_type,
                                  whole_words=whole_words(data.dataset, train_pairs))

    def batches(pairs, **kwargs):
        return make_dataset(pairs, tokenizer, batch_tokens=options.batch_tokens, max_length=max_length,
                            bucket_boundaries=data.bucket_boundaries, **kwargs)

    try:
        interrupted.check()
        if data.sampling_alpha is None:
            train_input = BatchPlan(train_pairs, tokenizer, batch_tokens=options.batch_tokens, max_length=max_length,
                                    bucket_boundaries=data.bucket_boundaries, seed=options.seed, interrupted=interrupted)
            padding = padding_fraction(train_input.dataset(0), num_batches=50)
        else:
            def train_input(input_context):  # new segmentations on every pass: not plannable, replayed on resume
                return batches(train_pairs, seed=options.seed, repeat=True, input_context=input_context,
                               sampling_alpha=data.sampling_alpha)

            padding = padding_fraction(batches(train_pairs, seed=options.seed, sampling_alpha=data.sampling_alpha),
                                       num_batches=50)
        interrupted.check()
    except InterruptedError:
        logging.warning("Stopped by SIGTERM during start-up, before any update; no checkpoint was written.")
        return None, {"preempted": True, "step": None, "checkpoint": latest_checkpoint(model_dir)}
    if chief:
        if not fs.exists(config_path(model_dir)):  # the first start's config is kept
            write_run_config(model_dir, config, options, {"data": dataclasses.asdict(data)})
        record_start(model_dir, {**payload, "time": time.time(), "replicas": strategy.num_replicas_in_sync,
                                 "step": _restored_step(model_dir)})
    logging.info("Padding fraction of training batches: %.3f", padding)
    trainer = Trainer(config, model_dir, options, strategy)
    if termination.received:
        logging.warning("Stopped by SIGTERM during start-up, before any update; no checkpoint was written.")
        return None, {"preempted": True, "step": None, "checkpoint": latest_checkpoint(model_dir)}
    results = trainer.train(train_input, batches(val_pairs, shuffle=False), padding_fraction=padding,
                            termination=termination)
    results.update(
        padding_fraction=padding,
        model_dir=str(model_dir),
        checkpoint=trainer.manager.latest_checkpoint,
        tokenizer=str(tokenizer_path(model_dir)),
        logs=str(log_dir(model_dir)),
    )
    return trainer, results


class _Interrupted:
    """Whether SIGTERM arrived during start-up (checked between its stages and tokenization chunks)."""

    def __init__(self, termination):
        self._termination = termination

    def __call__(self):
        return self._termination.received

    def check(self):
        if self._termination.received:
            raise InterruptedError("SIGTERM during start-up")


def _restored_step(model_dir):
    path = latest_checkpoint(model_dir)
    return checkpoint_step(path) if path else 0
