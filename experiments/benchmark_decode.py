r"""Decoding speed: greedy and beam search, cached versus recompute-the-prefix.

    python experiments/benchmark_decode.py --model_dir=runs/builtin_tiny --num_sentences=256

Every configuration decodes the same source sentences of a corpus split with the same
trained model, in the same length-sorted batches; each search function is traced and
warmed up on the first batch before the timed pass. Prints sentences/s and output
tokens/s per configuration, and the cached/recompute speedup of each search.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

from absl import flags

from keras_transformer import cli, cpu_allocator
from keras_transformer.benchmark.decoding import benchmark_decoding, format_speed_table
from keras_transformer.benchmark.peaks import cpu_flags
from keras_transformer.data.sources import load_pairs
from keras_transformer.runs import load_run

flags.DEFINE_string(
    "model_dir", None, "Run directory (config.json, spm.model, checkpoints/).", required=True
)
cli.define_corpus_flags(split="test")
flags.DEFINE_integer("num_sentences", 128, "Sentences decoded by each configuration.")
cli.define_search_flags(batch_size=32, method=False)  # beam settings; unset: the run config's
flags.DEFINE_integer("repeats", 1, "Timed passes over the sentences per configuration (mean time).")
flags.DEFINE_list("methods", ["greedy", "beam"], "Searches to time.")
flags.DEFINE_bool("jit_compile", False, "Compile every search with XLA (compilation is not timed).")

FLAGS = flags.FLAGS


def main(argv):
    del argv

    cli.corpus_of_run(FLAGS.model_dir)
    model, tokenizer, config = load_run(FLAGS.model_dir)
    options = cli.search_options(config, method="beam")  # greedy takes its offset
    pairs = load_pairs(FLAGS.dataset, FLAGS.split, FLAGS.src_lang, FLAGS.tgt_lang, FLAGS.data_dir)
    texts = [source for source, _ in pairs[: FLAGS.num_sentences]]
    results = benchmark_decoding(
        model,
        tokenizer,
        texts,
        beam_size=options.beam_size,
        batch_size=FLAGS.batch_size,
        repeats=FLAGS.repeats,
        methods=FLAGS.methods,
        length_penalty=options.length_penalty,
        max_output_offset=options.max_output_offset,
        jit_compile=FLAGS.jit_compile,
    )
    print(
        f"{len(texts)} sentences of {FLAGS.dataset}/{FLAGS.split}, batch {FLAGS.batch_size}, "
        f"beam {options.beam_size}, length penalty {options.length_penalty}, "
        f"max output = source length + {options.max_output_offset}, XLA {'on' if FLAGS.jit_compile else 'off'}"
    )
    print(format_speed_table(results))
    print(f"CPU flags: {cpu_flags()} ; CPU allocator {cpu_allocator.describe()}")


if __name__ == "__main__":
    cli.run(main)
