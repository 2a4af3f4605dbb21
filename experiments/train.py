r"""Train a translation Transformer.

With no flags: the `tiny` preset on the embedded English -> German number-words task,
on the CPU, in a few minutes. Real data:

    python experiments/train.py --dataset=multi30k --data_dir=../shared/data/multi30k \
        --preset=small --model_dir=runs/multi30k_en_de

Running the same command again resumes from the latest checkpoint. The run directory keeps
the flags of its latest start in `flags.txt` (`--flagfile=RUN/flags.txt` runs it again; a
`--model_dir` given after it trains elsewhere).

Exit status: 0 trained to the end; 75 (`cli.TRY_AGAIN`) stopped by SIGTERM (preempted), or the
run directory is in use by another live process: run the same command again; 1 an error
(one line), 2 a wrong flag.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

from absl import app, flags, logging

from keras_transformer import cli, cpu_allocator
from keras_transformer.training import (
    ON_NONFINITE,
    PRECISIONS,
    STRATEGIES,
    DataOptions,
    TrainOptions,
    create_strategy,
    train_translation,
)
from keras_transformer.training.lease import DEFAULT_LEASE_TIMEOUT, RunDirectoryBusyError
from keras_transformer.training.progress import TerminationSignal
from keras_transformer.training.run import DEFAULT_TOKENIZER_WAIT

cli.define_config_flags("tiny")
cli.define_corpus_flags()
flags.DEFINE_string("train_src", None, "--dataset=files: training source file (plain or .gz).")
flags.DEFINE_string("train_tgt", None, "--dataset=files: training target file.")
flags.DEFINE_string("val_src", None, "--dataset=files: validation source file.")
flags.DEFINE_string("val_tgt", None, "--dataset=files: validation target file.")
flags.DEFINE_enum("strategy", "default", list(STRATEGIES), "tf.distribute strategy.")
flags.DEFINE_list(
    "devices", None, "Devices for --strategy=mirrored (default: all GPUs, else the CPU)."
)
flags.DEFINE_integer(
    "cpu_devices",
    0,
    "Split the CPU into this many logical devices (to try MirroredStrategy without GPUs).",
)
flags.DEFINE_integer(
    "batch_tokens", 2048, "Token budget of one batch per replica (source and target each)."
)
flags.DEFINE_list(
    "bucket_boundaries",
    None,
    "Padded lengths of the length buckets, e.g. 8,12,16,20,24 (default: 8, 12, 16, 24, 32, ...).",
)
flags.DEFINE_float(
    "sampling_alpha",
    None,
    "Subword regularization: sample each training sentence's segmentation anew on every "
    "pass, with this smoothing exponent in (0, 1] (smaller: more varied; off by default).",
)
flags.DEFINE_integer(
    "accum_steps", 1, "Batches accumulated into one update (paper: ~25k tokens per update)."
)
flags.DEFINE_enum("precision", "float32", list(PRECISIONS), "Numeric precision.")
flags.DEFINE_bool("jit_compile", False, "Compile the training step with XLA.")
flags.DEFINE_string("model_dir", None, "Run directory (default: runs/<dataset>_<preset>).")
flags.DEFINE_integer("seed", 0, "Random seed (initialization, dropout, shuffling).")
flags.DEFINE_integer("checkpoint_every", 500, "Save a checkpoint every this many steps.")
flags.DEFINE_integer(
    "keep_checkpoints",
    None,
    "Checkpoints to keep (default: the preset's average_checkpoints, e.g. 20 for big).",
)
flags.DEFINE_integer("log_every", 50, "Log and write TensorBoard scalars every this many steps.")
flags.DEFINE_integer(
    "eval_every", 500, "Validation loss every this many steps (0: at the end only)."
)
flags.DEFINE_enum(
    "on_nonfinite",
    "stop",
    list(ON_NONFINITE),
    "An update whose loss or gradients are NaN/Inf: stop with an error naming the step, or skip it (counted).",
)
flags.DEFINE_integer(
    "max_consecutive_skips",
    20,
    "Stop with an error naming the step and loss scale after this many skipped updates in a row.",
)
flags.DEFINE_integer(
    "steps_per_execution",
    1,
    "Updates per call into the compiled step: the host reads results once per call "
    "(calls stop at log, checkpoint and validation steps).",
)
flags.DEFINE_integer(
    "score_every",
    0,
    "Decode the validation set every this many steps and log its BLEU and chrF (EVALB F1 and "
    "tagging accuracy for --dataset=ptb); the best-scoring checkpoint is kept in RUN/best/ "
    "(--checkpoint=best in translate, evaluate, parse and export). 0: never.",
)
flags.DEFINE_integer(
    "score_sentences", None, "--score_every: score the first this many validation sentences."
)
flags.DEFINE_enum(
    "score_method",
    "greedy",
    ["greedy", "beam"],
    "--score_every: the search (beam: the run's --beam_size and --length_penalty).",
)
flags.DEFINE_integer(
    "patience",
    0,
    "Stop (exit 0, checkpoint saved) after this many scored evaluations without an improvement "
    "of the best score by more than --min_delta (needs --score_every; 0: never). A larger "
    "--patience resumes the run.",
)
flags.DEFINE_float("min_delta", 0.0, "--patience: the improvement that counts (BLEU or F1 points).")
flags.DEFINE_bool(
    "progress",
    True,
    "Show the log line (loss, lr, tok/s, ETA) behind a bar, in place on a terminal; else log it.",
)
flags.DEFINE_bool(
    "allow_changed_data",
    False,
    "Resume although the corpus differs from the one the run recorded (config.json's "
    "data_fingerprint); the input continues at the same position in the new data.",
)
flags.DEFINE_float(
    "tokenizer_wait",
    DEFAULT_TOKENIZER_WAIT,
    "Multi-worker: seconds a non-chief worker waits for the chief to "
    "train and write the tokenizer.",
)
flags.DEFINE_float(
    "lease_timeout",
    DEFAULT_LEASE_TIMEOUT,
    "Seconds without a heartbeat (renewed at each log line and save) after "
    "which another process may take the run directory over from its owner, e.g. a killed one's restart.",
)
flags.declare_key_flag("flagfile")  # in --help: RUN/flags.txt trains a run again

FLAGS = flags.FLAGS


def main(argv):
    del argv
    with (
        TerminationSignal() as termination
    ):  # from the start: SIGTERM during start-up stops cleanly too
        try:
            return _train(termination)
        except RunDirectoryBusyError as error:
            return cli.report_error(error, cli.TRY_AGAIN)


def _train(termination):
    if FLAGS.cpu_devices:
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * FLAGS.cpu_devices
        )
    config = cli.config_from_flags(**cli.corpus_defaults(FLAGS.preset, FLAGS.dataset))
    files = None
    if FLAGS.dataset == "files":
        missing = [
            f"--{name}"
            for name in ("train_src", "train_tgt", "val_src", "val_tgt")
            if not FLAGS[name].value
        ]
        if missing:
            raise app.UsageError(f"--dataset=files needs {', '.join(missing)}.")
        files = {"train": (FLAGS.train_src, FLAGS.train_tgt), "val": (FLAGS.val_src, FLAGS.val_tgt)}
    elif FLAGS.dataset == "ptb":
        files = cli.ptb_files()
    boundaries = None
    if FLAGS.bucket_boundaries:
        try:
            boundaries = tuple(int(value) for value in FLAGS.bucket_boundaries)
        except ValueError:
            raise app.UsageError(
                f"--bucket_boundaries must be integers. Received: {','.join(FLAGS.bucket_boundaries)}"
            ) from None
    try:
        data = DataOptions(
            FLAGS.dataset,
            FLAGS.src_lang,
            FLAGS.tgt_lang,
            FLAGS.data_dir,
            files,
            bucket_boundaries=boundaries,
            sampling_alpha=FLAGS.sampling_alpha,
        )
    except ValueError as err:
        raise app.UsageError(f"--sampling_alpha: {err}") from None
    options = TrainOptions(
        batch_tokens=FLAGS.batch_tokens,
        accum_steps=FLAGS.accum_steps,
        precision=FLAGS.precision,
        jit_compile=FLAGS.jit_compile,
        checkpoint_every=FLAGS.checkpoint_every,
        keep_checkpoints=FLAGS.keep_checkpoints,
        log_every=FLAGS.log_every,
        eval_every=FLAGS.eval_every,
        seed=FLAGS.seed,
        progress=FLAGS.progress,
        on_nonfinite=FLAGS.on_nonfinite,
        max_consecutive_skips=FLAGS.max_consecutive_skips,
        steps_per_execution=FLAGS.steps_per_execution,
        score_every=FLAGS.score_every,
        score_sentences=FLAGS.score_sentences,
        score_search={"method": FLAGS.score_method},
        patience=FLAGS.patience,
        min_delta=FLAGS.min_delta,
    )
    model_dir = FLAGS.model_dir or f"runs/{FLAGS.dataset}_{FLAGS.preset}"
    strategy = create_strategy(FLAGS.strategy, devices=FLAGS.devices)
    logging.info(
        "Training preset %s on dataset %s, strategy %s (%d replicas), CPU allocator %s",
        FLAGS.preset,
        FLAGS.dataset,
        FLAGS.strategy,
        strategy.num_replicas_in_sync,
        cpu_allocator.describe(),
    )
    if FLAGS.tokenizer_wait < 0 or not FLAGS.lease_timeout > 0:
        raise app.UsageError(
            f"--tokenizer_wait must be >= 0 and --lease_timeout > 0. Received: "
            f"{FLAGS.tokenizer_wait}, {FLAGS.lease_timeout}"
        )
    _, results = train_translation(
        config,
        model_dir,
        options,
        data,
        strategy,
        termination=termination,
        allow_changed_data=FLAGS.allow_changed_data,
        tokenizer_wait=FLAGS.tokenizer_wait,
        lease_timeout=FLAGS.lease_timeout,
        flag_file=cli.flag_file(  # the config pinned: a preset changed later runs the same model
            "experiments/train.py", model_dir=model_dir, **config.to_dict()
        ),
    )
    if results.get("preempted") and results["step"] is None:
        print(
            "Stopped by SIGTERM during start-up, before any update. Run the same command to resume."
        )
        return cli.TRY_AGAIN
    if results.get("preempted"):
        print(
            f"Stopped by SIGTERM at step {results['step']}; saved {results['checkpoint']}. "
            "Run the same command to resume."
        )
        return cli.TRY_AGAIN
    print(
        f"Trained to step {results['step']}: loss {results.get('loss', float('nan')):.4f}, "
        f"validation loss {results.get('val_loss', float('nan')):.4f}, "
        f"perplexity {results.get('val_perplexity', float('nan')):.2f}"
    )
    if results.get("stopped"):
        print(results["stopped"])
    best = results.get("best")
    if best:
        print(
            f"Best:        {best['metric']} {best['score']:.2f} at step {best['step']}, {best['path']}"
        )
    print(f"Checkpoints: {results['checkpoint']}")
    print(f"Tokenizer:   {results['tokenizer']}")
    print(f"TensorBoard: tensorboard --logdir {results['logs']}")


if __name__ == "__main__":
    cli.run(main)
