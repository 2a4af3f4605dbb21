"""How to train: `TrainOptions` and the errors a run stops with."""

import dataclasses

from keras_transformer.layers.checks import check_positive_int

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
ON_NONFINITE = ("stop", "skip")


class DivergenceError(RuntimeError):
    """The training loss or a gradient became NaN or infinite (or too many updates in a row were skipped)."""


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """How to train (the model itself is a `TransformerConfig`).

    The number of updates is the model config's `train_steps` (the schedule decays to it).

    Args:
        batch_tokens: token budget of one batch per replica (source and target each).
        accum_steps: batches whose gradients make one update.
        precision: "float32", "mixed_bfloat16" or "mixed_float16" (with loss scaling).
        jit_compile: compile the gradient computation with XLA.
        checkpoint_every: save a checkpoint every this many updates (and at the end).
        keep_checkpoints: how many recent checkpoints to keep (default: the config's
            `average_checkpoints`, so the recipe's average can be taken).
        log_every: log and write TensorBoard scalars every this many updates.
        eval_every: compute validation loss/perplexity every this many updates (0: only at the end).
        seed: seeds initialization, dropout and data shuffling.
        progress: show the log line behind a bar of the steps done, on stderr, in place on a
            terminal (`training.progress.ProgressMeter`); else log it through absl.
        on_nonfinite: what to do with an update whose loss or gradients are not finite on
            any replica: "stop" (raise `DivergenceError` naming the step; nothing is applied
            or saved) or "skip" (drop the update). Under mixed_float16 an update whose loss
            is finite but whose scaled gradients overflow is always skipped and the loss
            scale halved: that is how loss scaling works. Skipped updates are not steps:
            they are counted (`skipped_steps`), logged and written to TensorBoard.
        max_consecutive_skips: stop with `DivergenceError` (naming the step and the loss
            scale) once this many updates in a row were skipped.
        steps_per_execution: updates run by one call into the compiled step (the host
            reads the results once per call; calls never cross a log, checkpoint,
            validation or scoring step).
        score_every: decode the validation sentences every this many updates and score them
            with the task's metric (BLEU and chrF, or EVALB F1 and tagging accuracy for
            parsing); the best-scoring weights are kept in `<run>/best/` (0: never).
        score_sentences: score only the first this many validation sentences (None: all).
        score_search: the search settings of the scoring decode, `SearchOptions.from_config`
            arguments (`{"method": "greedy"}` when None; e.g. `{"method": "beam",
            "beam_size": 4}`); unset ones come from the model config.
        patience: stop (a normal finish, checkpoint saved) after this many scored evaluations
            in a row without an improvement of the best score by more than `min_delta`
            (0: never; needs `score_every`).
        min_delta: the improvement (in the metric's points) that counts for `patience` and for
            replacing the best checkpoint.
    """

    batch_tokens: int = 4096
    accum_steps: int = 1
    precision: str = "float32"
    jit_compile: bool = False
    checkpoint_every: int = 500
    keep_checkpoints: int = None
    log_every: int = 50
    eval_every: int = 500
    seed: int = 0
    progress: bool = True
    on_nonfinite: str = "stop"
    max_consecutive_skips: int = 20
    steps_per_execution: int = 1
    score_every: int = 0
    score_sentences: int = None
    score_search: dict = None
    patience: int = 0
    min_delta: float = 0.0

    def __post_init__(self):
        for name in (
            "batch_tokens",
            "accum_steps",
            "checkpoint_every",
            "log_every",
            "max_consecutive_skips",
            "steps_per_execution",
        ):
            check_positive_int(name, getattr(self, name))
        if self.keep_checkpoints is not None:
            check_positive_int("keep_checkpoints", self.keep_checkpoints)
        if self.on_nonfinite not in ON_NONFINITE:
            raise ValueError(
                f"on_nonfinite must be one of {ON_NONFINITE}. Received: on_nonfinite={self.on_nonfinite!r}"
            )
        for name in ("eval_every", "score_every", "patience"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(
                    f"{name} must be an integer >= 0. Received: {name}={getattr(self, name)!r}"
                )
        if self.score_sentences is not None:
            check_positive_int("score_sentences", self.score_sentences)
        if not self.min_delta >= 0:
            raise ValueError(f"min_delta must be >= 0. Received: min_delta={self.min_delta!r}")
        if self.patience and not self.score_every:
            raise ValueError(
                f"patience counts scored evaluations: it needs score_every > 0. Received: "
                f"patience={self.patience}, score_every={self.score_every}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"precision must be one of {PRECISIONS}. Received: precision={self.precision!r}"
            )
