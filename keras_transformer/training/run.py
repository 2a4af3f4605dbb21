"""Train a translation model end to end: corpus -> tokenizer -> pipeline -> Trainer.

Everything a run needs later (decoding, evaluation, export) is written into its directory
(layout: `keras_transformer.runs`).
"""

import dataclasses
import time

import keras
import tensorflow as tf
from absl import logging

from keras_transformer import fs
from keras_transformer.data.pipeline import check_bucket_boundaries, make_dataset, padding_fraction
from keras_transformer.data.sources import load_pairs
from keras_transformer.data.tokenizer import Tokenizer, check_sampling_alpha, train_sentencepiece
from keras_transformer.models.config import TransformerConfig
from keras_transformer.runs import config_path, log_dir, read_run_config, tokenizer_path
from keras_transformer.training.strategy import is_chief
from keras_transformer.training.trainer import Trainer, TrainOptions, write_run_config


def prepare_tokenizer(model_dir, pairs, vocabulary_size, seed=0, chief=True, timeout=600.0):
    """Load the run's SentencePiece model, or train a joint one on `pairs` and save it there.

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
        logging.info("Training a %d-piece SentencePiece model on %d sentences", vocabulary_size, len(sentences))
        train_sentencepiece(sentences, path, vocabulary_size, seed=seed)
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


def train_translation(config: TransformerConfig, model_dir, options: TrainOptions, data: DataOptions, strategy=None):
    """Train (or resume) a translation run in `model_dir`.

    A run directory that already holds a config must have the same architecture
    (`TransformerConfig.architecture`); training settings such as `train_steps` may change.
    The tokenizer is reused; training continues from the latest checkpoint.

    Returns:
        `(trainer, results)`; results as `Trainer.train`, plus the run's paths.
    """
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
    strategy = strategy or tf.distribute.get_strategy()
    chief = is_chief(strategy)
    if chief:
        fs.check_writable(model_dir)  # now, not at the first checkpoint
    train_pairs = load_pairs(data.dataset, "train", data.src_lang, data.tgt_lang, data.data_dir, data.files)
    val_pairs = load_pairs(data.dataset, "val", data.src_lang, data.tgt_lang, data.data_dir, data.files)
    tokenizer = prepare_tokenizer(model_dir, train_pairs, config.vocabulary_size, options.seed, chief=chief)
    if chief:
        write_run_config(model_dir, config, options, {"data": dataclasses.asdict(data)})
    trainer = Trainer(config, model_dir, options, strategy)

    def batches(pairs, **kwargs):
        return make_dataset(
            pairs,
            tokenizer,
            batch_tokens=options.batch_tokens,
            max_length=max_length,
            bucket_boundaries=data.bucket_boundaries,
            **kwargs,
        )

    def train_dataset_fn(input_context):
        # The same seed on every start: `Trainer.train` skips the batches the restored
        # updates drew, so a resumed run continues the interrupted run's input exactly.
        return batches(train_pairs, seed=options.seed, repeat=True, input_context=input_context,
                       sampling_alpha=data.sampling_alpha)

    validation = batches(val_pairs, shuffle=False)
    padding = padding_fraction(batches(train_pairs, seed=options.seed, sampling_alpha=data.sampling_alpha),
                               num_batches=50)
    logging.info("Padding fraction of training batches: %.3f", padding)
    results = trainer.train(train_dataset_fn, validation, padding_fraction=padding)
    results.update(
        padding_fraction=padding,
        model_dir=str(model_dir),
        checkpoint=trainer.manager.latest_checkpoint,
        tokenizer=str(tokenizer_path(model_dir)),
        logs=str(log_dir(model_dir)),
    )
    return trainer, results
