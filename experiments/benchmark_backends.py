r"""Speed per Keras backend (keras_transformer.benchmark.backends).

    python experiments/benchmark_backends.py --model_dir=runs/builtin_tiny --work_dir=/tmp/backends

Writes the run's weights, tokenizer, training batches and validation sources to
--work_dir, then runs --rounds rounds of one fresh process per backend (TensorFlow, JAX,
PyTorch; the order rotates), each timing `model.fit` over the same batches, beam search
over the same sources, and keras-hub's generation (`BeamSampler` driving the same model) as
the anchor on that backend. Prints the machine (CPU flags and peak), every round, and each
backend's fastest round against TensorFlow's and against keras-hub's on the same backend.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

from absl import flags

from keras_transformer import cli
from keras_transformer.benchmark.backends import (
    BACKENDS,
    PASSES,
    format_summary,
    prepare,
    run_rounds,
    summarize,
)
from keras_transformer.benchmark.peaks import hardware_peak

flags.DEFINE_string(
    "model_dir",
    None,
    "A trained run directory (config.json, spm.model, checkpoints/).",
    required=True,
)
flags.DEFINE_string(
    "work_dir", None, "Where the shared batches, weights and results go.", required=True
)
flags.DEFINE_list("backends", list(BACKENDS), "Backends to time.")
flags.DEFINE_integer("rounds", 3, "Rounds of one process per backend.")
flags.DEFINE_integer("num_batches", 20, "Training batches (one update each).")
flags.DEFINE_integer("batch_tokens", 2048, "Tokens per training batch.")
flags.DEFINE_integer("num_sentences", 500, "Validation sentences decoded.")
flags.DEFINE_integer("batch_size", 32, "Sentences per decoding batch.")
flags.DEFINE_integer(
    "passes",
    PASSES,
    lower_bound=1,
    help="Timed passes per process over the training and the source batches; each keeps its fastest.",
)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    settings = prepare(
        FLAGS.work_dir,
        FLAGS.model_dir,
        num_batches=FLAGS.num_batches,
        batch_tokens=FLAGS.batch_tokens,
        num_sentences=FLAGS.num_sentences,
        batch_size=FLAGS.batch_size,
        passes=FLAGS.passes,
    )
    search = settings["search"]
    print(hardware_peak().describe())
    print(
        f"training: {settings['num_batches']} batches of {FLAGS.batch_tokens} tokens, dropout "
        f"{settings['config']['dropout']}, float32; decoding: {settings['num_sentences']} sentences in batches of "
        f"{FLAGS.batch_size}, beam {search['beam_size']}, alpha {search['length_penalty']}, "
        f"source length + {search['max_output_offset']}"
    )
    results = run_rounds(FLAGS.work_dir, backends=tuple(FLAGS.backends), rounds=FLAGS.rounds)
    print(format_summary(summarize(results)))


if __name__ == "__main__":
    cli.run(main)
