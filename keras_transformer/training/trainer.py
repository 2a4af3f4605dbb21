"""A training loop over `tf.distribute` for the Transformer (paper section 5).

Runs under the default strategy, `MirroredStrategy`, `MultiWorkerMirroredStrategy` and
`TPUStrategy`. Each update may accumulate the gradients of several batches (to reach the
paper's ~25,000-token batches on small hardware); the loss is the label-smoothed
cross-entropy summed over real tokens and divided by the number of real tokens in the
whole (accumulated, all-replica) batch, so the update does not depend on how tokens are
split across replicas or micro-batches.

An update is applied only when the loss and every gradient are finite on every replica
(the flag is all-reduced); otherwise training stops, naming the step, or skips the update
(`TrainOptions.on_nonfinite`). The checkpoint holds, besides weights and optimizer state,
the dropout seed-generator states (model variables) and the number of updates drawn from
the input, so a resumed run continues exactly where the interrupted one stopped.
"""

import dataclasses
import math
import signal
import threading
import time

import keras
import tensorflow as tf
from absl import logging

from keras_transformer import fs, runs
from keras_transformer.layers.checks import check_positive_int
from keras_transformer.models.config import TransformerConfig
from keras_transformer.models.transformer import Transformer
from keras_transformer.training.checkpoints import restore_newest_readable, save_checkpoint
from keras_transformer.training.loss import label_smoothed_nll
from keras_transformer.training.schedule import paper_optimizer
from keras_transformer.training.strategy import is_chief

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
ON_NONFINITE = ("stop", "skip")


class DivergenceError(RuntimeError):
    """The training loss or a gradient became NaN or infinite."""


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
        progress: show a Keras progress bar.
        on_nonfinite: what to do with an update whose loss or gradients are not finite:
            "stop" (raise `DivergenceError` naming the step; nothing is applied or saved)
            or "skip" (drop the update; skipped updates are counted in the logs and in
            TensorBoard's `skipped_steps`). Under mixed_float16 the loss-scale optimizer
            skips non-finite gradients itself (that is how loss scaling works); a
            non-finite loss still counts.
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

    def __post_init__(self):
        for name in ("batch_tokens", "accum_steps", "checkpoint_every", "log_every"):
            check_positive_int(name, getattr(self, name))
        if self.keep_checkpoints is not None:
            check_positive_int("keep_checkpoints", self.keep_checkpoints)
        if self.on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}. Received: on_nonfinite={self.on_nonfinite!r}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0. Received: eval_every={self.eval_every!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}. Received: precision={self.precision!r}")


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

    def __init__(self, config: TransformerConfig, model_dir, options: TrainOptions = TrainOptions(), strategy=None,
                 optimizer=None):
        self.config = config
        self.options = options
        self.strategy = strategy or tf.distribute.get_strategy()
        self.model_dir = fs.as_path(model_dir)
        self.chief = is_chief(self.strategy)
        # Non-chief workers of a multi-worker run write to a private temporary place.
        self.write_dir = self.model_dir if self.chief else fs.join(self.model_dir, f".worker_{_task_id(self.strategy)}")
        with self.strategy.scope():
            self.model = Transformer(config, dtype=options.precision)
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
            self._accumulators = None
            if options.accum_steps > 1:
                self._accumulators = [
                    tf.Variable(
                        tf.zeros(v.shape, "float32"),
                        trainable=False,
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM,
                    )
                    for v in self.model.trainable_variables
                ]
                self._accumulated_tokens = tf.Variable(
                    0.0,
                    trainable=False,
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.SUM,
                )
        # Updates drawn from the input (applied or not): where a resumed run's input continues.
        self._updates_drawn = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates_drawn")
        self._skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        self.checkpoint = tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            dropout_seeds=_seed_states(self.model),
            updates_drawn=self._updates_drawn,
            skipped_steps=self._skipped_steps,
        )
        self.keep_checkpoints = options.keep_checkpoints or config.average_checkpoints
        if self.keep_checkpoints < config.average_checkpoints:
            logging.warning(
                "keep_checkpoints=%d is fewer than the %d checkpoints the recipe averages (average_checkpoints)",
                self.keep_checkpoints, config.average_checkpoints,
            )
        self.manager = tf.train.CheckpointManager(
            self.checkpoint,
            str(runs.checkpoint_dir(self.write_dir)),
            max_to_keep=self.keep_checkpoints,
            step_counter=self.optimizer.iterations,
            checkpoint_name=runs.CHECKPOINT_PREFIX,
        )
        self._restored = False
        self._build_step_functions()

    # --- state ---

    @property
    def step(self):
        """Updates applied so far (restored with the checkpoint)."""
        return int(self.optimizer.iterations.numpy())

    @property
    def skipped_steps(self):
        """Updates dropped for a non-finite loss or gradient (`on_nonfinite="skip"`)."""
        return int(self._skipped_steps.numpy())

    def restore(self):
        """Restore the latest complete checkpoint if there is one; returns its path or None."""
        self._restored = True
        path = restore_newest_readable(self.checkpoint, runs.checkpoint_dir(self.model_dir),
                                       self.manager if self.chief else None)
        if path:
            logging.info("Restored %s at step %d", path, self.step)
        return path

    def save(self):
        """Write a checkpoint for the current step (every worker takes part; only the chief keeps it).

        Raises:
            DivergenceError: a weight is not finite; nothing is written.
        """
        bad = [v.path for v in self.model.weights if "float" in str(v.dtype) and not bool(tf.reduce_all(tf.math.is_finite(v)))]
        if bad:
            raise DivergenceError(
                f"Not saving step {self.step}: non-finite values in {', '.join(bad[:3])}"
                f"{' and others' if len(bad) > 3 else ''}. The last good checkpoint is {self.manager.latest_checkpoint}."
            )
        path = save_checkpoint(self.manager, self.step)
        if not self.chief:
            tf.io.gfile.rmtree(str(self.write_dir))
        return path

    # --- steps ---

    def _build_step_functions(self):
        model, optimizer, options = self.model, self.optimizer, self.options
        label_smoothing = self.config.label_smoothing
        loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        variables = model.trainable_variables
        strategy = self.strategy

        @tf.function(jit_compile=options.jit_compile or None, reduce_retracing=True)
        def gradients(inputs, labels):
            with tf.GradientTape() as tape:
                logits = model(inputs, training=True)  # (B, T, V) float32
                loss_sum, tokens = label_smoothed_nll(labels, logits, label_smoothing)
                scaled = optimizer.scale_loss(loss_sum) if loss_scaled else loss_sum
            return tape.gradient(scaled, variables), loss_sum, tokens

        def replica_gradients(batch):  # one batch per update
            inputs, labels = batch
            return gradients(inputs, labels)

        def replica_accumulate(batch):
            inputs, labels = batch
            grads, loss_sum, tokens = gradients(inputs, labels)
            for accumulator, grad in zip(self._accumulators, grads):
                accumulator.assign_add(grad)
            self._accumulated_tokens.assign_add(tokens)
            return loss_sum, tokens

        def replica_accumulated():
            return [a.read_value() for a in self._accumulators], self._accumulated_tokens.read_value()

        def replica_nonfinite(grads):  # 1.0 where this replica holds a NaN or Inf gradient
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
            return 1.0 - tf.cast(finite, tf.float32)

        def replica_apply(grads, tokens):
            # Sum over the replicas' gradients (done by the optimizer) / all real tokens.
            total = tf.distribute.get_replica_context().all_reduce("sum", tokens)
            optimizer.apply_gradients(zip([g / tf.maximum(total, 1.0) for g in grads], variables))

        def replica_reset():
            for accumulator in self._accumulators:
                accumulator.assign(tf.zeros_like(accumulator))
            self._accumulated_tokens.assign(0.0)

        def reduce(values):
            return [strategy.reduce("sum", v, axis=None) for v in values]

        def replica_stop(flag):
            return tf.distribute.get_replica_context().all_reduce("sum", tf.identity(flag))

        @tf.function
        def update(iterator, stop_flag):
            # `stop_flag` is 1.0 on a worker that received SIGTERM; all workers learn of it
            # in the same step, so they stop (and checkpoint) together.
            stop = strategy.experimental_local_results(strategy.run(replica_stop, args=(stop_flag,)))[0]
            self._updates_drawn.assign_add(1)
            if self._accumulators is None:
                grads, replica_loss, replica_tokens = strategy.run(replica_gradients, args=(next(iterator),))
                loss_sum, tokens = reduce([replica_loss, replica_tokens])
            else:
                loss_sum, tokens = 0.0, 0.0
                for _ in range(options.accum_steps):
                    batch_loss, batch_tokens = reduce(strategy.run(replica_accumulate, args=(next(iterator),)))
                    loss_sum += batch_loss
                    tokens += batch_tokens
                grads, replica_tokens = strategy.run(replica_accumulated)
            # The same decision on every replica and worker: the flags are all-reduced.
            nonfinite = strategy.reduce("sum", strategy.run(replica_nonfinite, args=(grads,)), axis=None)
            # A loss-scale optimizer skips non-finite (scaled) gradients itself and lowers the scale.
            applied = tf.logical_and(tf.math.is_finite(loss_sum), tf.logical_or(nonfinite == 0.0, loss_scaled))
            if applied:
                strategy.run(replica_apply, args=(grads, replica_tokens))
            if self._accumulators is not None:
                strategy.run(replica_reset)
            return loss_sum, tokens, stop, applied

        ids = tf.TensorSpec([None, None], tf.int32)

        @tf.function(input_signature=[{"source_ids": ids, "target_ids": ids}, ids])
        def evaluate_batch(inputs, labels):
            logits = model(inputs, training=False)
            smoothed, tokens = label_smoothed_nll(labels, logits, label_smoothing)
            nll, _ = label_smoothed_nll(labels, logits, 0.0)
            return smoothed, nll, tokens

        self._update = update
        self._evaluate_batch = evaluate_batch

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

    def train(self, train_dataset_fn, validation_dataset=None, padding_fraction=None, until_step=None):
        """Train until the config's `train_steps` updates (or `until_step`).

        The first call resumes from the latest checkpoint in `model_dir` (unless `restore`
        was called already); later calls continue from the weights in memory. Every call
        makes a new input iterator that skips the batches earlier updates drew, so the
        input continues where it stopped: give a `train_dataset_fn` whose batches are a
        deterministic function of its arguments (as `data.make_dataset` without
        `sampling_alpha`), and a resumed run equals the uninterrupted one. SIGTERM
        (preemption) makes every worker finish its step, save a checkpoint and return with
        `results["preempted"] = True`.

        Args:
            train_dataset_fn: `input_context -> tf.data.Dataset` of `(inputs, labels)`
                batches for one replica, repeating indefinitely (see `data.make_dataset`).
            validation_dataset: optional finite dataset for validation loss/perplexity.
            padding_fraction: optional measured padding fraction of the training batches,
                logged to TensorBoard.
            until_step: stop at this step instead of `config.train_steps` (the learning
                rate schedule still decays towards `config.train_steps`).

        Returns:
            dict with the final step, the last training loss (per token), tokens/s,
            skipped updates, and the last validation metrics.

        Raises:
            DivergenceError: the loss or a gradient became NaN or infinite (with
                `on_nonfinite="stop"`); names the step. That update is not applied and
                the last checkpoint (written before it) is left intact.
        """
        options = self.options
        last_step = until_step or self.config.train_steps
        if not self._restored:
            self.restore()
        results = {"step": self.step, "skipped_steps": self.skipped_steps}
        if self.step >= last_step:
            logging.info("Already trained: step %d >= train_steps %d", self.step, last_step)
            return results
        iterator = iter(self.strategy.distribute_datasets_from_function(self._resumed_input(train_dataset_fn)))
        writers = {
            name: tf.summary.create_file_writer(str(runs.log_dir(self.model_dir, name)))
            if self.chief
            else tf.summary.create_noop_writer()
            for name in (runs.TRAIN_LOG, runs.VALIDATION_LOG)
        }
        meter = _ProgressMeter(last_step, options.progress, self.step)
        with _TerminationSignal() as termination:
            while self.step < last_step:
                loss_sum, tokens, stop, applied = self._update(iterator, tf.constant(float(termination.received)))
                loss_sum, tokens, step = float(loss_sum), float(tokens), self.step
                if not bool(applied):
                    self._refuse_nonfinite(step + 1, loss_sum, writers[runs.TRAIN_LOG])
                else:
                    meter.add(loss_sum, tokens)
                    if step % options.log_every == 0 or step == last_step:
                        results.update(self._log(meter, writers[runs.TRAIN_LOG], step, padding_fraction))
                if float(stop) > 0:
                    path = self.save()
                    message = f"Stopped by SIGTERM at step {step}; saved checkpoint {path}. Run the same command to resume."
                    logging.warning(message)
                    results.update(step=step, preempted=True, checkpoint=path, skipped_steps=self.skipped_steps)
                    return results
                if not bool(applied):
                    continue
                if step % options.checkpoint_every == 0:
                    self.save()
                if validation_dataset is not None and options.eval_every and step % options.eval_every == 0:
                    results.update(self._validate(validation_dataset, writers[runs.VALIDATION_LOG], step))
        if self.manager.latest_checkpoint is None or not self.manager.latest_checkpoint.endswith(f"-{self.step}"):
            self.save()
        if validation_dataset is not None and (not options.eval_every or self.step % options.eval_every):
            results.update(self._validate(validation_dataset, writers[runs.VALIDATION_LOG], self.step))
        for writer in writers.values():
            writer.flush()
        results.update(step=self.step, skipped_steps=self.skipped_steps)
        return results

    def _resumed_input(self, train_dataset_fn):
        """`train_dataset_fn`, its batches already drawn by earlier updates skipped."""
        drawn = int(self._updates_drawn.numpy())

        def dataset_fn(input_context):
            # Each update takes `accum_steps` batches for each replica this pipeline feeds.
            per_pipeline = max(input_context.num_replicas_in_sync // input_context.num_input_pipelines, 1)
            consumed = drawn * self.options.accum_steps * per_pipeline
            dataset = train_dataset_fn(input_context)
            if consumed:
                logging.info("Resuming the input after update %d: skipping its first %d batches", drawn, consumed)
                dataset = dataset.skip(consumed)
            return dataset

        return dataset_fn

    def _refuse_nonfinite(self, step, loss_sum, writer):
        """An update was not applied: its loss or a gradient was not finite."""
        if self.options.on_nonfinite == "stop":
            raise DivergenceError(
                f"Training diverged: non-finite loss or gradient at step {step} (loss {loss_sum}); "
                f"the update was not applied. The last good checkpoint is {self.manager.latest_checkpoint}."
            )
        self._skipped_steps.assign_add(1)
        logging.warning(
            "Skipped the update for step %d: non-finite loss or gradient (loss %s); %d skipped so far",
            step, loss_sum, self.skipped_steps,
        )
        with writer.as_default(step=step):
            tf.summary.scalar("skipped_steps", self.skipped_steps)

    def _log(self, meter, writer, step, padding_fraction):
        loss, rate, eta = meter.window(step)
        lr = float(keras.ops.convert_to_numpy(self.optimizer.learning_rate))
        with writer.as_default(step=step):
            tf.summary.scalar("loss", loss)
            tf.summary.scalar("learning_rate", lr)
            tf.summary.scalar("tokens_per_second", rate)
            if padding_fraction is not None:
                tf.summary.scalar("padding_fraction", padding_fraction)
        if self.options.progress:
            meter.progress.update(step, [("loss", loss), ("lr", lr), ("tok/s", rate)])
        else:
            logging.info(
                "step %d/%d loss %.4f lr %.3g %.0f tok/s ETA %s",
                step, meter.train_steps, loss, lr, rate, _format_seconds(eta),
            )
        return {"loss": loss, "tokens_per_second": rate}

    def _validate(self, dataset, writer, step):
        metrics = self.evaluate(dataset)
        if self.chief:
            with writer.as_default(step=step):
                tf.summary.scalar("loss", metrics["val_loss"])
                tf.summary.scalar("perplexity", metrics["val_perplexity"])
        logging.info("step %d validation loss %.4f perplexity %.2f", step, metrics["val_loss"], metrics["val_perplexity"])
        return metrics


class _ProgressMeter:
    """Loss and token rate over the steps since the last log line, and the ETA."""

    def __init__(self, train_steps, progress, start_step):
        self.train_steps = train_steps
        self.start_step = start_step
        self.run_start = time.time()
        self.progress = keras.utils.Progbar(train_steps, stateful_metrics=["loss", "lr", "tok/s"])
        if progress:
            self.progress.update(start_step)
        self._reset()

    def _reset(self):
        self.window_start, self.loss_sum, self.tokens = time.time(), 0.0, 0.0

    def add(self, loss_sum, tokens):
        self.loss_sum += loss_sum
        self.tokens += tokens

    def window(self, step):
        """`(loss per token, tokens/s, ETA seconds)` of the window; starts a new one."""
        loss = self.loss_sum / max(self.tokens, 1.0)
        rate = self.tokens / max(time.time() - self.window_start, 1e-9)
        eta = (time.time() - self.run_start) / max(step - self.start_step, 1) * (self.train_steps - step)
        self._reset()
        return loss, rate, eta


class _TerminationSignal:
    """Records SIGTERM while training runs (main thread only), instead of dying mid-step."""

    def __init__(self):
        self.received = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        del signum, frame
        logging.warning("SIGTERM received: finishing the step and saving a checkpoint.")
        self.received = True

    def __exit__(self, *exc_info):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False


def write_run_config(model_dir, config: TransformerConfig, options: TrainOptions, extra=None):
    """Write the run's config (model config, training options, data settings) into its directory."""
    runs.write_run_config(model_dir, {"model": config.to_dict(), "training": dataclasses.asdict(options), **(extra or {})})


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


def _format_seconds(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
