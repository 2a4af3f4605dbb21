r"""Score every kept checkpoint of a run on a corpus split, for BLEU-over-time curves.

    python experiments/score_checkpoints.py --model_dir=runs/multi30k_en_de \
        --dataset=multi30k --data_dir=../shared/data/multi30k --split=val \
        --plot=runs/multi30k_en_de/curves.png

Decodes greedily by default (cheap, and enough to follow progress) and prints each point's
minutes since the run began, the origin `--plot` draws from (`--skip_pauses`: less the
pauses between a stop and its resumption). Writes BLEU and chrF as TensorBoard scalars to
`<run>/logs/checkpoints`, stamped with each checkpoint's save time, so TensorBoard and
`--plot` show validation BLEU against step and wall-clock time. Train with
`--keep_checkpoints` large enough to keep the checkpoints you want scored.

With `--average_last` and `--ensemble`, each step is scored as `evaluate.py` would have
scored the runs had they stopped there: each run's last N checkpoints up to the step,
averaged, the runs searching as one (the scores go to the first run's logs):

    python experiments/score_checkpoints.py --model_dir=runs/a --ensemble=runs/b \
        --dataset=multi30k --data_dir=../shared/data/multi30k --split=val --every=2 \
        --average_last=5 --method=beam --beam_size=5 --length_penalty=1.5
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

from absl import flags

from keras_transformer import cli, runs
from keras_transformer.data.sources import load_pairs
from keras_transformer.evaluation import default_tokenize, score_checkpoints
from keras_transformer.visualization import (
    plot_training_curves,
    read_run_scalars,
    run_pauses,
    run_start,
    without_pauses,
    write_scalar_events,
)

flags.DEFINE_string("model_dir", None, "Run directory whose checkpoints to score.", required=True)
cli.define_corpus_flags(split="val")
cli.define_search_flags()
flags.FLAGS.set_default("method", "greedy")
flags.DEFINE_integer("every", 1, "Score every this-many-th checkpoint (the latest always).")
cli.define_checkpoint_flags(ensemble=True, every_checkpoint=True)
cli.define_scoring_flags()
flags.DEFINE_string(
    "plot", None, "Also write the run's training curves (with the BLEU panel) to this PNG."
)
flags.DEFINE_bool(
    "skip_pauses",
    False,
    "Minutes, printed and plotted, leave out the time between a stop of the run "
    "and its resumption (training time).",
)

FLAGS = flags.FLAGS


def main(argv):
    del argv
    cli.corpus_of_run(FLAGS.model_dir)
    options = cli.search_options(runs.read_run_config(FLAGS.model_dir)[0])
    pairs = load_pairs(FLAGS.dataset, FLAGS.split, FLAGS.src_lang, FLAGS.tgt_lang, FLAGS.data_dir)
    if FLAGS.max_sentences:
        pairs = pairs[: FLAGS.max_sentences]
    results = score_checkpoints(
        FLAGS.model_dir,
        pairs,
        method=options.method,
        batch_size=FLAGS.batch_size,
        lowercase=FLAGS.lowercase,
        tokenize=FLAGS.tokenize or default_tokenize(FLAGS.dataset),
        every=FLAGS.every,
        average_last=FLAGS.average_last,
        ensemble=FLAGS.ensemble,
        **options.kwargs(),
    )
    records = [
        (r.step, r.wall_time, {"bleu": r.scores.bleu, "chrf": r.scores.chrf}) for r in results
    ]
    events = write_scalar_events(runs.log_dir(FLAGS.model_dir, runs.CHECKPOINT_SCORES_LOG), records)
    scalars = (
        read_run_scalars(FLAGS.model_dir) if FLAGS.skip_pauses or FLAGS.plot else None
    )  # read once, if at all
    pauses = run_pauses(FLAGS.model_dir, scalars) if FLAGS.skip_pauses else []
    minutes = (
        without_pauses([r.wall_time for r in results], pauses) - run_start(FLAGS.model_dir, scalars)
    ) / 60
    scored = " + ".join([FLAGS.model_dir, *FLAGS.ensemble])
    averaged = (
        f", each the average of its last {FLAGS.average_last} checkpoints"
        if FLAGS.average_last
        else ""
    )
    print(
        f"{FLAGS.dataset}/{FLAGS.split}, {len(pairs)} sentences, {options.method} search: {scored}{averaged}"
    )
    print(
        f"{'step':>7} {'minutes':>8} {'BLEU':>6} {'chrF':>6}"
        + ("  (minutes: pauses left out)" if pauses else "")
    )
    for r, minute in zip(results, minutes):
        print(f"{r.step:>7d} {minute:>8.1f} {r.scores.bleu:>6.2f} {r.scores.chrf:>6.2f}")
    print(results[-1].scores.bleu_signature)
    print(f"TensorBoard scalars: {events}")
    if FLAGS.plot:
        path = plot_training_curves(
            FLAGS.model_dir, FLAGS.plot, skip_pauses=FLAGS.skip_pauses, scalars=scalars
        )
        print(f"Curves: {path}")


if __name__ == "__main__":
    cli.run(main)
