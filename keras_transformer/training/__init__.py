"""Loss, schedule, strategies, the training loop, checkpoint averaging."""

from keras_transformer.runs import average_checkpoints, checkpoint_paths, load_run, read_run_config
from keras_transformer.training.checkpoints import write_averaged_checkpoint
from keras_transformer.training.loss import LabelSmoothedCrossEntropy, label_smoothed_nll, token_losses
from keras_transformer.training.run import DataOptions, prepare_tokenizer, train_translation
from keras_transformer.training.schedule import TransformerSchedule, paper_optimizer
from keras_transformer.training.strategy import STRATEGIES, create_strategy, is_chief
from keras_transformer.training.options import ON_NONFINITE, PRECISIONS, DivergenceError, TrainOptions
from keras_transformer.training.trainer import Trainer, write_run_config

__all__ = [
    "ON_NONFINITE",
    "PRECISIONS",
    "STRATEGIES",
    "DataOptions",
    "DivergenceError",
    "LabelSmoothedCrossEntropy",
    "TrainOptions",
    "Trainer",
    "TransformerSchedule",
    "average_checkpoints",
    "checkpoint_paths",
    "create_strategy",
    "is_chief",
    "label_smoothed_nll",
    "load_run",
    "paper_optimizer",
    "prepare_tokenizer",
    "read_run_config",
    "token_losses",
    "train_translation",
    "write_averaged_checkpoint",
    "write_run_config",
]
