"""Loss, schedule, strategies, the training loop, checkpoint averaging."""

from keras_transformer.lazy import lazy_attributes
from keras_transformer.training.loss import (
    LabelSmoothedCrossEntropy,
    label_smoothed_nll,
    token_losses,
)
from keras_transformer.training.options import (
    ON_NONFINITE,
    PRECISIONS,
    DivergenceError,
    TrainOptions,
)
from keras_transformer.training.schedule import TransformerSchedule, paper_optimizer

# TensorFlow's parts: imported when first asked for, so that the loss and the schedule
# (keras.ops, every backend) import where TensorFlow is not installed.
__getattr__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(
            ("average_checkpoints", "checkpoint_paths", "load_run", "read_run_config"),
            "keras_transformer.runs",
        ),
        "write_averaged_checkpoint": "keras_transformer.training.checkpoints",
        **dict.fromkeys(
            ("DataOptions", "prepare_tokenizer", "train_translation"),
            "keras_transformer.training.run",
        ),
        **dict.fromkeys(
            ("STRATEGIES", "create_strategy", "is_chief"), "keras_transformer.training.strategy"
        ),
        **dict.fromkeys(("Trainer", "write_run_config"), "keras_transformer.training.trainer"),
    },
)

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
