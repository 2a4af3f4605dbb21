"""A training loop over `tf.distribute` for the Transformer (paper section 5).

Runs under the default strategy, `MirroredStrategy`, `MultiWorkerMirroredStrategy` and
`TPUStrategy`. Each update may accumulate the gradients of several batches (to reach the
paper's ~25,000-token batches on small hardware); the loss is the label-smoothed
cross-entropy summed over real tokens and divided by the number of real tokens in the
whole (accumulated, all-replica) batch, so the update does not depend on how tokens are
split across replicas or micro-batches.

Where to look: `training.update` computes, decides and applies one update (one decision
for every replica and worker); `training.position` is where the input stands and how a
resumed run's input continues; `training.progress` is what the user sees; this file holds
the run's state (model, optimizer, checkpoints) and the loop over logging, checkpoint and
validation points. The checkpoint holds, besides weights and optimizer state, the dropout
seed-generator states (model variables), the input's position (global batches drawn) and
the skipped updates, so a resumed run continues exactly where the interrupted one stopped.
"""

import contextlib
import dataclasses
import math

import keras
import tensorflow as tf
from absl import logging

from keras_transformer import fs, runs
from keras_transformer.backends import require_tensorflow
from keras_transformer.models.config import TransformerConfig
from keras_transformer.models.transformer import build_model
from keras_transformer.training.checkpoints import (
    check_workers_restored_alike,
    checkpoint_manager,
    restore_newest_readable,
    save_best,
    save_checkpoint,
)
from keras_transformer.training.loss import label_smoothed_nll, labels_and_logits
from keras_transformer.training.options import (
    ON_NONFINITE,
    PRECISIONS,
    DivergenceError,
    TrainOptions,
)
from keras_transformer.training.position import resumable
from keras_transformer.training.progress import ProgressMeter, TerminationSignal
from keras_transformer.training.schedule import paper_optimizer
from keras_transformer.training.strategy import is_chief
from keras_transformer.training.update import UpdateStep

__all__ = [
    "ON_NONFINITE",
    "PRECISIONS",
    "DivergenceError",
    "TrainOptions",
    "Trainer",
    "write_run_config",
]


class Trainer:
    """Builds the model and optimizer under a strategy, and trains with checkpoints.

    Seed Keras (`keras.utils.set_random_seed`) before creating it for reproducible
    initialization; `train_translation` does. Running the same `Trainer` (same `model_dir`) again resumes from the latest complete
    checkpoint: the step count, weights and optimizer state continue.

    Args:
        config: the model's `TransformerConfig` (its `train_steps` is the length of the run).
        model_dir: where checkpoints (`checkpoints/`) and TensorBoard logs (`logs/`) go.
        options: `TrainOptions`.
        strategy: a `tf.distribute.Strategy` (default: the current one).
        optimizer: a function of no arguments that returns the Keras optimizer; called
            in the strategy's scope (default: the paper's Adam with the config's
            learning-rate schedule, loss-scaled under mixed_float16).
        lease: the `training.lease.RunLease` this process holds on `model_dir` (the chief's),
            renewed at every log line and checked and renewed before every save (a process
            that lost it stops with `LeaseLostError` before writing).

    Example (the run in `runs/builtin_tiny` already holds its `train_steps` = 120 updates,
    so `train` restores step 120 and returns at once; a new `model_dir` would train from
    step 0):

    >>> from keras_transformer.data import Tokenizer, builtin_task, make_dataset
    >>> from keras_transformer.runs import read_run_config
    >>> config, _ = read_run_config("runs/builtin_tiny")
    >>> tokenizer = Tokenizer("runs/builtin_tiny/spm.model")
    >>> def train_ds(ctx):
    ...     return make_dataset(builtin_task("train"), tokenizer, batch_tokens=1024,
    ...                         max_length=config.max_length, repeat=True, input_context=ctx)
    >>> trainer = Trainer(config, "runs/builtin_tiny", TrainOptions(batch_tokens=1024, progress=False))
    >>> trainer.train(train_ds)
    {'step': 120, 'skipped_steps': 0}
    """

    def __init__(
        self,
        config: TransformerConfig,
        model_dir,
        options: TrainOptions = TrainOptions(),
        strategy=None,
        optimizer=None,
        lease=None,
    ):
        require_tensorflow("Training (training.Trainer)")
        self.lease = lease
        self.config = config
        self.options = options
        self.strategy = strategy or tf.distribute.get_strategy()
        self.model_dir = fs.as_path(model_dir)
        self.chief = is_chief(self.strategy)
        # Non-chief workers of a multi-worker run write to a private temporary place.
        self.write_dir = (
            self.model_dir
            if self.chief
            else runs.worker_dir(self.model_dir, _task_id(self.strategy))
        )
        with self.strategy.scope():
            self.model = build_model(config, dtype=options.precision)
            if self.model.reads_tokenizer:  # e.g. the parsing model's word-kind table
                self.model.read_tokenizer(_run_tokenizer(self.model_dir, self.model))
            if optimizer is None:
                self.optimizer = paper_optimizer(
                    config.hidden_dim,
                    config.warmup_steps,
                    config.learning_rate_scale,
                    options.precision,
                    decay=config.learning_rate_decay,
                    train_steps=config.train_steps,
                )
            else:
                self.optimizer = optimizer()
            self.optimizer.build(self.model.trainable_variables)
        # Global batches the input has delivered (for applied and skipped updates alike):
        # where a resumed run's input continues (`training.position`).
        self._batches_drawn = tf.Variable(0, dtype=tf.int64, trainable=False, name="batches_drawn")
        self._skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        self.checkpoint = tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            dropout_seeds=_seed_states(self.model),
            batches_drawn=self._batches_drawn,
            skipped_steps=self._skipped_steps,
        )
        self.keep_checkpoints = options.keep_checkpoints or config.average_checkpoints
        if self.keep_checkpoints < config.average_checkpoints:
            logging.warning(
                "keep_checkpoints=%d is fewer than the %d checkpoints the recipe averages (average_checkpoints)",
                self.keep_checkpoints,
                config.average_checkpoints,
            )
        self.manager = checkpoint_manager(
            self.checkpoint,
            runs.checkpoint_dir(self.write_dir),
            max_to_keep=self.keep_checkpoints,
            step_counter=self.optimizer.iterations,
            checkpoint_name=runs.CHECKPOINT_PREFIX,
        )
        self._restored_to_train = (
            False  # restored by `train` (or `restore(repair=True)`), every worker alike
        )
        self._update = UpdateStep(
            self.model,
            self.optimizer,
            self.strategy,
            config.label_smoothing,
            options,
            self._batches_drawn,
            self._skipped_steps,
        )
        self._evaluate_batch = _evaluation_step(self.model, config.label_smoothing)

    # --- state ---

    @property
    def step(self):
        """Updates applied so far (restored with the checkpoint)."""
        return int(self.optimizer.iterations.numpy())

    @property
    def skipped_steps(self):
        """Updates dropped for a non-finite loss or gradient (loss-scale overflows included); not steps."""
        return int(self._skipped_steps.numpy())

    def restore(self, repair=False):
        """Restore the newest readable checkpoint if there is one; returns its path or None.

        Every worker calls it (the workers then check, all together, that they restored the
        same step and weights: `checkpoints.check_workers_restored_alike`). Nothing is moved unless
        `repair` (what `train` passes): then the run's chief sets damaged checkpoints aside
        and rewrites the state file (`checkpoints.restore_newest_readable`). A process that
        only reads a run (an evaluation) never moves its files.
        """
        self._restored_to_train = repair
        path = restore_newest_readable(
            self.checkpoint,
            runs.checkpoint_dir(self.model_dir),
            self.manager if repair and self.chief else None,
            restore=_restore,
        )
        check_workers_restored_alike(
            self.strategy,
            path,
            self.optimizer.iterations,
            [
                *self.model.weights,
                *self.optimizer.variables,
                self._batches_drawn,
                self._skipped_steps,
            ],
        )
        if path:
            logging.info("Restored %s at step %d", path, self.step)
        return path

    def save(self):
        """Write a checkpoint for the current step (every worker takes part; only the chief keeps it).

        Raises:
            DivergenceError: a weight is not finite; nothing is written.
        """
        bad = [
            v.path
            for v in self.model.weights
            if "float" in str(v.dtype) and not bool(tf.reduce_all(tf.math.is_finite(v)))
        ]
        if bad:
            raise DivergenceError(
                f"Not saving step {self.step}: non-finite values in {', '.join(bad[:3])}"
                f"{' and others' if len(bad) > 3 else ''}. The last good checkpoint is {self.manager.latest_checkpoint}."
            )
        if self.lease is not None:
            self.lease.renew()
        path = save_checkpoint(self.manager, self.step)
        if not self.chief:
            tf.io.gfile.rmtree(str(self.write_dir))
        return path

    def evaluate(self, dataset):
        """Validation loss (label-smoothed, as in training) and perplexity (exp of the plain NLL per token)."""
        smoothed = nll = tokens = 0.0
        for inputs, labels in dataset:
            batch_smoothed, batch_nll, batch_tokens = self._evaluate_batch(inputs, labels)
            smoothed += float(batch_smoothed)
            nll += float(batch_nll)
            tokens += float(batch_tokens)
        if not tokens:
            raise ValueError("The validation dataset is empty.")
        return {"val_loss": smoothed / tokens, "val_perplexity": math.exp(min(nll / tokens, 50.0))}

    # --- the loop ---

    def train(
        self,
        train_input,
        validation_dataset=None,
        padding_fraction=None,
        until_step=None,
        termination=None,
        scorer=None,
        callbacks=None,
    ):
        """Train until the config's `train_steps` updates (or `until_step`).

        The first call resumes from the newest readable checkpoint in `model_dir`
        (`restore(repair=True)`: this is the training run, so its chief may set damaged
        checkpoints aside; a read-only `restore()` before is done again with `repair`);
        later calls continue from the weights in memory. The input
        continues where the restored (or last) update left it: a `data.BatchPlan` starts
        at that position directly, whatever the number of updates done; a plain
        `input_context -> dataset` function is replayed up to it (`dataset.skip`), which
        costs time in proportion to the updates done (see `training.position`). SIGTERM
        (preemption) makes every worker finish its step, save a checkpoint and return with
        `results["preempted"] = True`.

        Args:
            train_input: a `data.BatchPlan`, or a function `input_context ->
                tf.data.Dataset` of `(inputs, labels)` batches for one replica, repeating
                indefinitely, whose batches are a deterministic function of its arguments.
            validation_dataset: optional finite dataset for validation loss/perplexity.
            padding_fraction: optional measured padding fraction of the training batches,
                logged to TensorBoard.
            until_step: stop at this step instead of `config.train_steps` (the learning
                rate schedule still decays towards `config.train_steps`).
            termination: a `training.progress.TerminationSignal` already watching SIGTERM
                (default: a new one for the loop).
            scorer: with `options.score_every`, what scores the model every that many
                updates: an `evaluation.scoring.TaskScorer`, or any function `model ->
                TaskScore`. The scores go to the log, TensorBoard (`validation`) and
                `scores.jsonl`; the best-scoring weights to `best/` (`checkpoints.save_best`),
                and `options.patience` stops the run (see `_score`).
            callbacks: Keras callbacks (`keras.callbacks.Callback`), or a
                `keras.callbacks.CallbackList`; see `_callbacks` for when each is called.

        Returns:
            dict with the final step, the last training loss (per token), tokens/s,
            skipped updates, the last validation metrics and scores, `best` (the best
            checkpoint's record, with its `path`) when scoring, and `stopped` (the line
            saying why) when a callback or `patience` ended the run early.

        Raises:
            DivergenceError: the loss or a gradient became NaN or infinite (with
                `on_nonfinite="stop"`), or `max_consecutive_skips` updates in a row were
                skipped; names the step (and the loss scale). That update is not applied
                and the last checkpoint (written before it) is left intact.
        """
        options = self.options
        last_step = until_step or self.config.train_steps
        if not self._restored_to_train:  # a `restore()` that only read is done again, to repair
            self.restore(repair=True)
        results = {"step": self.step, "skipped_steps": self.skipped_steps}
        scoring = scorer is not None and options.score_every > 0
        callbacks = _callbacks(callbacks, self.model)
        self.model.stop_training = False
        if scoring:
            self._load_best()
            if self._patience_spent():
                results.update(best=self._best, stopped=self._early_stop_line(self.step))
                logging.warning(results["stopped"])
                return results
        if self.step >= last_step:
            logging.info("Already trained: step %d >= train_steps %d", self.step, last_step)
            return results
        callbacks.on_train_begin(dict(results))
        dataset_fn = resumable(train_input).dataset_fn(int(self._batches_drawn.numpy()))
        iterator = iter(self.strategy.distribute_datasets_from_function(dataset_fn))
        writers = {
            name: tf.summary.create_file_writer(str(runs.log_dir(self.model_dir, name)))
            if self.chief
            else tf.summary.create_noop_writer()
            for name in (runs.TRAIN_LOG, runs.VALIDATION_LOG)
        }
        meter = ProgressMeter(last_step, options.progress, self.step)
        train_logs = {}  # the latest log window's values, for the callbacks' epoch logs
        validated_at = None
        watcher = contextlib.nullcontext(termination) if termination else TerminationSignal()
        with watcher as signal, meter.line:
            while self.step < last_step and not ("stopped" in results or self.model.stop_training):
                step = self.step
                # One call never crosses a point where the host logs, saves or validates.
                points = [
                    last_step,
                    _next_multiple(step, options.log_every),
                    _next_multiple(step, options.checkpoint_every),
                ]
                if validation_dataset is not None and options.eval_every:
                    points.append(_next_multiple(step, options.eval_every))
                if scoring:
                    points.append(_next_multiple(step, options.score_every))
                call = self._update(
                    iterator, min(options.steps_per_execution, min(points) - step), signal.received
                )
                step = self.step
                meter.add(float(call["loss_sum"]), float(call["tokens"]))
                if call["skipped"]:
                    meter.line.end()
                    self._report_skips(call, step)
                if call["diverged"]:
                    self._diverged(call, step + 1)
                if call["skipped"] and call["last_bad_loss"]:
                    # The loop drops such updates; callbacks that watch the loss (TerminateOnNaN) see it.
                    callbacks.on_train_batch_end(
                        step,
                        {"loss": float(call["last_loss"]), "skipped_steps": self.skipped_steps},
                    )
                if call["applied"] and (step % options.log_every == 0 or step == last_step):
                    train_logs = self._log(meter, writers[runs.TRAIN_LOG], step, padding_fraction)
                    results.update(
                        loss=train_logs["loss"], tokens_per_second=train_logs["tokens_per_second"]
                    )
                    callbacks.on_train_batch_end(step, dict(train_logs))
                if call["stop"]:
                    meter.line.end()
                    path = self.save()
                    message = f"Stopped by SIGTERM at step {step}; saved checkpoint {path}. Run the same command to resume."
                    logging.warning(message)
                    results.update(
                        step=step, preempted=True, checkpoint=path, skipped_steps=self.skipped_steps
                    )
                    return results
                if not call["applied"]:
                    continue
                if step % options.checkpoint_every == 0:
                    self.save()
                scored = scoring and step % options.score_every == 0
                validated = (
                    validation_dataset is not None
                    and options.eval_every
                    and step % options.eval_every == 0
                )
                if validated or scored:
                    meter.line.end()
                if validated or (scored and validation_dataset is not None):
                    results.update(
                        self._validate(
                            validation_dataset, writers[runs.VALIDATION_LOG], step, meter
                        )
                    )
                    validated_at = step
                if scored:
                    results.update(self._score(scorer, writers[runs.VALIDATION_LOG], step, meter))
                if scored or (validated and not scoring):
                    epoch_logs = {**train_logs, **_evaluation_logs(results)}
                    callbacks.on_epoch_end(step, epoch_logs)
        if self.model.stop_training and "stopped" not in results:
            results["stopped"] = f"Stopped at step {self.step}: a callback set model.stop_training."
            logging.warning(results["stopped"])
        if self.manager.latest_checkpoint is None or not self.manager.latest_checkpoint.endswith(
            f"-{self.step}"
        ):
            self.save()
        if validation_dataset is not None and validated_at != self.step:
            results.update(
                self._validate(validation_dataset, writers[runs.VALIDATION_LOG], self.step, meter)
            )
        for writer in writers.values():
            writer.flush()
        results.update(step=self.step, skipped_steps=self.skipped_steps)
        if scoring:
            results["best"] = self._best
        callbacks.on_train_end(dict(results))
        return results

    # --- the task's score, the best checkpoint and patience ---

    def _load_best(self):
        """The best checkpoint's record (`runs.read_best`) and the scored evaluations since it
        (`scores.jsonl`, up to the restored step, with the same signature): what patience counts."""
        self._best = runs.read_best(self.model_dir)
        self._since_best = 0
        if self._best is not None:
            self._best["path"] = runs.resolve_checkpoint(self.model_dir, runs.BEST)
            self._since_best = sum(
                1
                for record in runs.read_scores(self.model_dir)
                if self._best["step"] < record["step"] <= self.step
                and record["signature"] == self._best["signature"]
            )

    def _patience_spent(self):
        return bool(self.options.patience) and self._since_best >= self.options.patience

    def _early_stop_line(self, step):
        best = self._best
        return (
            f"Stopped early at step {step}: {best['metric']} did not improve by more than "
            f"{self.options.min_delta:g} in {self._since_best} scored evaluations (patience "
            f"{self.options.patience}); the best, {best['metric']} {best['score']:.2f} at step "
            f"{best['step']}, is {best['path']}. Run again with a larger --patience to continue."
        )

    def _score(self, scorer, writer, step, meter):
        """Score the model (`scorer`), record it, keep the weights if they are the best, count patience.

        Every worker decodes the same sentences with the same weights; under
        `MultiWorkerMirroredStrategy` they then take the chief's figures (one collective,
        `_chief_values`), so every worker makes the same decisions (best, patience).
        """
        score = scorer(self.model)
        values = _chief_values(self.strategy, score.values)
        value = values[score.metric]
        best = self._best
        if best is not None and best["signature"] != score.signature:
            logging.warning(
                "%s holds a score measured otherwise (%s); this start's scores (%s) replace it",
                best["path"],
                best["signature"],
                score.signature,
            )
            best, self._since_best = None, 0
        improved = best is None or value > best["score"] + self.options.min_delta
        if improved:
            record = {
                "step": step,
                "score": value,
                "metric": score.metric,
                "values": values,
                "signature": score.signature,
            }
            if self.lease is not None:
                self.lease.renew()
            directory = runs.best_dir(self.model_dir if self.chief else self.write_dir)
            path = save_best(self.checkpoint, directory, step, record)
            if not self.chief:
                tf.io.gfile.rmtree(str(self.write_dir))
            self._best, self._since_best = {**record, "path": path}, 0
        else:
            self._since_best += 1
        if self.chief:
            with writer.as_default(step=step):
                for name, figure in values.items():
                    tf.summary.scalar(name, figure)
            runs.record_score(
                self.model_dir,
                {
                    "step": step,
                    "metric": score.metric,
                    "score": value,
                    "values": values,
                    "signature": score.signature,
                    "seconds": score.seconds,
                    "best_step": self._best["step"],
                    "since_best": self._since_best,
                },
            )
        figures = " ".join(f"{name} {figure:.2f}" for name, figure in values.items())
        meter.note(
            "step %d %s (best %.2f at step %d; %d scored evaluations since) in %.1f s",
            step,
            figures,
            self._best["score"],
            self._best["step"],
            self._since_best,
            score.seconds,
        )
        results = {f"val_{name}": figure for name, figure in values.items()}
        if self._patience_spent():
            results["stopped"] = self._early_stop_line(step)
            logging.warning(results["stopped"])
        return results

    def _report_skips(self, call, step):
        """Updates were dropped for a non-finite loss or gradient: a warning (TensorBoard gets the count at each log)."""
        scale = (
            f"; loss scale now {float(call['loss_scale']):g}" if self._update.loss_scaled else ""
        )
        logging.warning(
            "Skipped %d update(s) after step %d: non-finite %s (last loss %s)%s; %d skipped so far",
            int(call["skipped"]),
            step,
            "loss" if call["last_bad_loss"] else "gradients",
            float(call["last_loss"]),
            scale,
            self.skipped_steps,
        )

    def _diverged(self, call, step):
        """Raise for an update the options say to stop on; nothing of it was applied or saved."""
        where = f"The last good checkpoint is {self.manager.latest_checkpoint}."
        consecutive = int(self._update.consecutive_skips.numpy())
        scale = f", loss scale {float(call['loss_scale']):g}" if self._update.loss_scaled else ""
        if consecutive >= self.options.max_consecutive_skips:
            raise DivergenceError(
                f"Training diverged: {consecutive} updates in a row skipped for non-finite values, attempting step "
                f"{step}{scale} (max_consecutive_skips={self.options.max_consecutive_skips}). {where}"
            )
        raise DivergenceError(
            f"Training diverged: non-finite {'loss' if call['last_bad_loss'] else 'gradient'} at step {step} "
            f"(loss {float(call['last_loss'])}{scale}); the update was not applied. {where}"
        )

    def _log(self, meter, writer, step, padding_fraction):
        if self.lease is not None:
            self.lease.renew()
        loss, rate, eta = meter.window(step)
        lr = float(keras.ops.convert_to_numpy(self.optimizer.learning_rate))
        with writer.as_default(step=step):
            tf.summary.scalar("loss", loss)
            tf.summary.scalar("learning_rate", lr)
            tf.summary.scalar("tokens_per_second", rate)
            tf.summary.scalar("skipped_steps", self.skipped_steps)
            if self._update.loss_scaled:
                tf.summary.scalar(
                    "loss_scale", float(keras.ops.convert_to_numpy(self.optimizer.dynamic_scale))
                )
            if padding_fraction is not None:
                tf.summary.scalar("padding_fraction", padding_fraction)
        meter.report(step, loss, lr, rate, self.skipped_steps, eta)
        logs = {
            "loss": loss,
            "learning_rate": lr,
            "tokens_per_second": rate,
            "skipped_steps": self.skipped_steps,
        }
        return logs

    def _validate(self, dataset, writer, step, meter):
        metrics = self.evaluate(dataset)
        if self.chief:
            with writer.as_default(step=step):
                tf.summary.scalar("loss", metrics["val_loss"])
                tf.summary.scalar("perplexity", metrics["val_perplexity"])
        meter.note(
            "step %d validation loss %.4f perplexity %.2f",
            step,
            metrics["val_loss"],
            metrics["val_perplexity"],
        )
        return metrics


def write_run_config(model_dir, config: TransformerConfig, options: TrainOptions, extra=None):
    """Write the run's config (model config, training options, data settings) into its directory."""
    runs.write_run_config(
        model_dir,
        {"model": config.to_dict(), "training": dataclasses.asdict(options), **(extra or {})},
    )


def _run_tokenizer(model_dir, model):
    """The tokenizer of the run (`runs.tokenizer_path`), for a model that reads it."""
    from keras_transformer.data.tokenizer import Tokenizer

    path = runs.tokenizer_path(model_dir)
    if not fs.exists(path):
        raise FileNotFoundError(
            f"A {type(model).__name__} reads the run's tokenizer, and there is none at {path}"
        )
    return Tokenizer(path)


def _seed_states(model):
    """The model's seed-generator states (what its dropout layers draw from next).

    Keras keeps them in `model.variables` but not in `model.weights`, and a checkpoint of
    the model alone does not hold them.
    """
    weights = {id(weight) for weight in model.weights}
    return [variable for variable in model.variables if id(variable) not in weights]


def _task_id(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    return getattr(resolver, "task_id", 0) or 0


def _restore(checkpoint, path):
    """Restore `path`. Two checkpoints hold less than a training run writes, and restore what
    they hold: one of the model's weights alone (`pretrained.write_weights_checkpoint`, an
    import), whose step, optimizer and input start anew as a new run's do; and one written
    before the input's position was kept (it counted updates drawn from a stream), whose input
    starts anew with a warning."""
    # The reader of the prefix itself: `tf.train.load_checkpoint` first asks whether the path is a
    # directory, which on `ram://` any prefix of a file name is.
    names = tf.compat.v1.train.NewCheckpointReader(str(path)).get_variable_to_shape_map()
    if "batches_drawn/.ATTRIBUTES/VARIABLE_VALUE" in names:
        checkpoint.restore(path).assert_existing_objects_matched()
        return
    checkpoint.restore(path).expect_partial()
    if not any(name.startswith("optimizer/") for name in names):
        logging.info(
            "%s holds the model's weights only (no optimizer state): the step, the optimizer and "
            "the input start anew",
            path,
        )
        return
    logging.warning(
        "%s holds no input position (an older checkpoint): its input starts from the first batch",
        path,
    )


def _callbacks(callbacks, model):
    """The Keras callbacks of a `train` call, as a `CallbackList` over the model.

    How the loop maps onto Keras' hooks (it has no epochs, and its updates run in compiled
    calls the host does not see one by one):

    - `on_train_begin(logs)` / `on_train_end(logs)`: the call's start (after the restore) and
      end (after the final checkpoint and validation); logs: `train`'s results so far.
    - `on_train_batch_end(step, logs)`: every logging interval (`log_every`), with the logged
      values `loss`, `learning_rate`, `tokens_per_second`, `skipped_steps`; also when updates
      were skipped for a non-finite loss (`on_nonfinite="skip"`), with that `loss`, so
      `TerminateOnNaN` sees it. No batch hook runs at other updates.
    - `on_epoch_end(step, logs)`: an "epoch" ends at each scored evaluation (`score_every`),
      or, without scoring, at each validation (`eval_every`); the index is the update step.
      Logs: the latest log window's values and `val_loss`, `val_perplexity` (measured at
      every scored evaluation too) and the scores (`val_bleu`, `val_chrf`, or `val_f1`,
      `val_tagging_accuracy`), so every epoch has the same keys (what `CSVLogger` needs).
    - `model.stop_training = True`, set by any callback, ends the run after the current
      point as a normal finish: the checkpoint of that step is saved and `train` returns
      with `stopped` saying so.
    """
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks.set_model(model)
        return callbacks
    return keras.callbacks.CallbackList(list(callbacks or []), model=model)


def _evaluation_logs(results):
    """The `val_*` figures of `train`'s results (validation loss, perplexity and scores)."""
    return {name: value for name, value in results.items() if name.startswith("val_")}


def _chief_values(strategy, values):
    """Under `MultiWorkerMirroredStrategy`, the chief's `values` (`{name: float}`) on every
    worker, by one all-gather; else `values`."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return values
    names = sorted(values)
    local = tf.constant([[float(values[name]) for name in names]], tf.float64)
    gathered = strategy.gather(strategy.run(lambda: tf.identity(local)), axis=0).numpy()
    return {name: float(value) for name, value in zip(names, gathered[0])}


def _next_multiple(step, every):
    """The first multiple of `every` after `step`."""
    return (step // every + 1) * every


def _evaluation_step(model, label_smoothing):
    ids = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[{"source_ids": ids, "target_ids": ids}, ids])
    def evaluate_batch(inputs, labels):
        labels, logits = labels_and_logits(model, inputs, labels, training=False)
        smoothed, tokens = label_smoothed_nll(labels, logits, label_smoothing)
        nll, _ = label_smoothed_nll(labels, logits, 0.0)
        return smoothed, nll, tokens

    return evaluate_batch
