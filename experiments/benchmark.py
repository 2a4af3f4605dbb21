r"""Training throughput against a keras-hub peer, measured in the same run, as one table.

    python experiments/benchmark.py --preset=small --data_dir=../shared/data/multi30k

Every ratio compares two measurements taken in this run, on this machine. The peer
is the same-size model built from keras_hub.layers.TransformerEncoder/TransformerDecoder
under the same dtype policy (--precision) and with our dropout placement
(`benchmark.keras_hub_transformer`); both train with the same step function: the same
label-smoothed loss and optimizer on each model's training output
(`training.loss.labels_and_logits`): ours gives the logits of the real target positions
only (`Transformer.real_target_logits`), the peer, as keras-hub builds it, the (B, T, V) logits.
The rows, by the key that starts each printed name:
  keras_hub_padded: training step throughput, ours vs the peer, identical padded batches;
  keras_hub_whole_pass: real target tokens/s, ours vs the peer, both on our length-bucketed
      batches, each model timed over the whole pass;
  keras_hub_per_batch: the same batches, the two models taking turns on every batch (each
      batch's fastest of --rounds; the peer's time over ours is also printed per batch shape);
  keras_hub_target_rows: keras_hub_per_batch with the peer's logits and loss on the real
      target positions too (`benchmark.peers.PeerTargetRows`): the same training output on
      both sides;
  bucketing: real target tokens/s, our model on our bucketed batches vs the same model on
      fixed-length padding (every batch padded to --max_length): the bucketing gain;
  skip_padding: the same batches, our model skipping the padding (`--skip_padding`, the
      default) against the same weights computing at the padding too, taking turns on every batch;
  mfu: model FLOP utilization (MFU) on real tokens: training FLOP/s over the hardware's
      peak for the compute dtype (CPU: cores x FMA units x SIMD lanes x 2 x clock, read
      from the machine and printed with its inputs; GPU: the published dense peak);
  matmul_fraction: the same FLOP/s as a fraction of the matmul rate of the compute dtype
      measured in this run;
  cached_search_graph, cached_search_xla, saved_model (the decoding rows), with --model_dir
      (a run trained on Multi30k; search settings from its config, paper: beam 4, alpha 0.6,
      offset 50): cached beam search versus recomputing the prefix every step, on the same
      test sentences, in graph mode and compiled with XLA (there the baseline re-runs its
      whole static output buffer); and the exported SavedModel translating the whole
      test_2016_flickr split with them (seconds, after one warm-up batch).
      --saved_model_baseline=DIR adds another export of the run (e.g. written by an earlier
      version): the two translate the split in turn, --rounds passes each, and a row
      (saved_model_vs_baseline) gives the ratio and how many outputs are the same;
  ctranslate2_float32, ctranslate2_int8, ... (the ctranslate2 rows), with --model_dir and
      --ctranslate2: the same weights on the same test sentences with the run's beam size
      and alpha (paper: 4, 0.6), timed in one run: our SavedModel in float32 and int8
      (Keras' model.quantize("int8"), as export.py --quantization=int8), our in-process
      search, CTranslate2 float32 and int8 (sentences/s, target tokens/s and BLEU per engine; each
      engine applies its own length penalty, see docs/ctranslate2.md). Each engine gets its
      fastest of --decode_batch_sizes (a sweep on 256 sentences, printed), then the engines
      alternate over --rounds passes and each keeps its fastest.
      --profile_saved_model adds where the SavedModel's time goes: sentences/s and the op
      time by kind (beam reorder, self-attention, ...) at each batch size, from TensorFlow's
      profiler.
  --profile_training: where a training step's time goes, ours and the peer on the same
     bucketed batches (TensorFlow's profiler: each part's share of the op time and the top
     op types; with --jit_compile, the step time only). Its own table, after the rows:

    python experiments/benchmark.py --preset=small --data_dir=../shared/data/multi30k \
        --notraining --profile_training --steps=6

  attention_scaling, with --attention_scaling: one encoder layer of the preset (forward +
      backward, batch 1) at n = --scaling_lengths, full attention against --scaling_window r,
      timed alternately: milliseconds and peak memory per step, and their growth per doubling
      of n (the paper's Table 1: O(n^2) full, O(r n) windowed). Its own table and plot:

    python experiments/benchmark.py --notraining --attention_scaling \
        --scaling_plot=docs/images/attention_scaling_cpu.png
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

import tempfile
from pathlib import Path

from absl import app, flags

import keras_transformer  # noqa: F401  first: it imports TensorFlow quietly, as asked above

# isort: split
import keras
import tensorflow as tf

from keras_transformer import cli, cpu_allocator
from keras_transformer.benchmark.attention_scaling import (
    attention_scaling,
    format_scaling_table,
    plot_scaling,
)
from keras_transformer.benchmark.flops import MATMUL_SIZE
from keras_transformer.benchmark.peaks import cpu_flags
from keras_transformer.benchmark.peers import keras_hub_transformer
from keras_transformer.benchmark.profile import profile_run, training_profile
from keras_transformer.benchmark.report import format_table, plot_ratios
from keras_transformer.benchmark.rows import ctranslate2_rows, decoding_rows, training_rows
from keras_transformer.data import Tokenizer, load_multi30k, make_dataset, train_sentencepiece
from keras_transformer.models.transformer import Transformer

cli.define_config_flags("small")
cli.define_multi30k_flags()
flags.DEFINE_integer("steps", 30, "Timed training steps per measurement.")
flags.DEFINE_integer("rounds", 3, "Alternating timing rounds; each side keeps its fastest.")
flags.DEFINE_integer("batch_tokens", 4096, "Token budget per batch (bucketed pipeline).")
flags.DEFINE_integer(
    "padded_length", 32, "keras_hub_padded: sentences are cut/padded to this length."
)
flags.DEFINE_integer("padded_batch", 64, "keras_hub_padded: sentences per padded batch.")
flags.DEFINE_string("precision", "float32", "Dtype policy of both models.")
flags.DEFINE_bool("jit_compile", False, "Compile both training steps with XLA.")
flags.DEFINE_integer("seed", 0, "Seed.")
flags.DEFINE_string(
    "model_dir", None, "A trained Multi30k run for the decoding and ctranslate2 rows."
)
flags.DEFINE_integer(
    "decode_sentences", 128, "cached_search: test sentences for cached versus recompute."
)
flags.DEFINE_integer(
    "saved_model_sentences",
    None,
    "saved_model: translate only this many test sentences with the SavedModel (default: all).",
)
flags.DEFINE_string(
    "saved_model_baseline",
    None,
    "saved_model_vs_baseline: another export of the run (e.g. by an earlier version), "
    "timed in turn with ours over the same sentences (--rounds passes each).",
)
flags.DEFINE_bool(
    "training",
    True,
    "Measure the training rows, keras_hub_padded to matmul_fraction (--notraining: only the "
    "decoding, ctranslate2 and attention_scaling rows).",
)
flags.DEFINE_string("plot", None, "Write the ratios as a bar chart to this PNG.")
flags.DEFINE_integer(
    "fma_units", 2, "mfu on CPU: FMA units per core (the machine does not expose it)."
)
flags.DEFINE_integer(
    "matmul_size",
    MATMUL_SIZE,
    lower_bound=1,
    help="matmul_fraction: the side of the square matrices of the measured matmul rate.",
)

flags.DEFINE_bool(
    "ctranslate2",
    False,
    "The ctranslate2 rows (with --model_dir): our SavedModel and search against CTranslate2.",
)
flags.DEFINE_integer(
    "ctranslate2_sentences", 1000, "The ctranslate2 rows: the first this many test sentences."
)
cli.define_vocabulary_map_flag()  # ctranslate2 rows: three more engines over it; the profile: over it
flags.DEFINE_bool(
    "decoding_rows",
    True,
    "With --model_dir: the decoding rows, cached_search and saved_model (--nodecoding_rows: "
    "only the ctranslate2 rows or the SavedModel profile).",
)
flags.DEFINE_alias("row_d", "decoding_rows")  # the name before, in commands of docs/results-log.md
flags.DEFINE_list(
    "decode_batch_sizes",
    ["16", "32", "64", "128"],
    "The ctranslate2 rows and --profile_saved_model: batch sizes tried (the ctranslate2 rows "
    "give each engine its fastest).",
)
flags.register_validator(
    "decode_batch_sizes",
    lambda values: all(value.isdigit() and int(value) > 0 for value in values),
    "--decode_batch_sizes takes positive integers, e.g. 32,64.",
)
flags.DEFINE_bool(
    "profile_saved_model",
    False,
    "With --model_dir: where the exported SavedModel's time goes "
    "(sentences/s and op time by kind at each of --decode_batch_sizes).",
)
flags.DEFINE_bool(
    "profile_training",
    False,
    "Where a training step's time goes, ours and the peer on the same "
    "--steps bucketed batches (op time by part and op type).",
)
flags.DEFINE_integer(
    "threads",
    None,
    "TensorFlow intra/inter-op threads and CTranslate2 intra_threads (default: "
    "TensorFlow's own; CTranslate2 2).",
)

flags.DEFINE_bool(
    "attention_scaling",
    False,
    "The attention_scaling table: one encoder layer's cost against n, full vs windowed attention.",
)
flags.DEFINE_list(
    "scaling_lengths", ["128", "512", "2048", "8192"], "attention_scaling: sequence lengths n."
)
flags.register_validator(
    "scaling_lengths",
    lambda values: all(value.isdigit() and int(value) > 0 for value in values),
    "--scaling_lengths takes positive integers, e.g. 128,512,2048.",
)
flags.DEFINE_integer(
    "scaling_window",
    64,
    lower_bound=1,
    help="attention_scaling: the window r of the windowed layer.",
)
flags.DEFINE_integer(
    "scaling_repeats",
    None,
    lower_bound=1,
    help="attention_scaling: steps per timing (default: about 64k tokens' worth at each n).",
)
flags.DEFINE_bool(
    "scaling_memory",
    True,
    "attention_scaling: also measure peak memory (a fresh process per point).",
)
flags.DEFINE_string(
    "scaling_plot", None, "attention_scaling: write time and memory against n as a PNG."
)

FLAGS = flags.FLAGS


def main(argv):
    del argv
    if not (FLAGS.training or FLAGS.model_dir or FLAGS.attention_scaling or FLAGS.profile_training):
        raise app.UsageError(
            "--notraining leaves the decoding, ctranslate2 and attention_scaling rows: give "
            "--model_dir, --attention_scaling or --profile_training."
        )
    if FLAGS.vocabulary_map and not (
        FLAGS.model_dir and (FLAGS.ctranslate2 or FLAGS.profile_saved_model)
    ):
        raise app.UsageError(
            f"--vocabulary_map={','.join(FLAGS.vocabulary_map)} is used by the ctranslate2 rows (--ctranslate2) and "
            "--profile_saved_model, both with --model_dir: give one of them, or leave it out."
        )
    cli.corpus_of_run(FLAGS.model_dir)  # the run's languages and Multi30k copy
    cli.quiet_info_logs()  # the decoding and ctranslate2 rows export a SavedModel
    lengths = [int(value) for value in FLAGS.scaling_lengths]
    batch_sizes = [int(value) for value in FLAGS.decode_batch_sizes]
    if FLAGS.threads:  # before TensorFlow runs anything
        tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads)
        tf.config.threading.set_inter_op_parallelism_threads(FLAGS.threads)
    keras.utils.set_random_seed(FLAGS.seed)
    rows = []
    if FLAGS.training or FLAGS.profile_training:
        pairs = load_multi30k(FLAGS.src_lang, FLAGS.tgt_lang, "train", data_dir=FLAGS.data_dir)
        config = cli.config_from_flags()
        with tempfile.TemporaryDirectory() as workdir:
            tokenizer = Tokenizer(
                train_sentencepiece(
                    [x for pair in pairs for x in pair],
                    Path(workdir) / "spm.model",
                    config.vocabulary_size,
                )
            )
        print(f"preset: {FLAGS.preset}")
    if FLAGS.training:
        rows.extend(
            training_rows(
                config,
                pairs,
                tokenizer,
                precision=FLAGS.precision,
                steps=FLAGS.steps,
                rounds=FLAGS.rounds,
                batch_tokens=FLAGS.batch_tokens,
                padded_length=FLAGS.padded_length,
                padded_batch=FLAGS.padded_batch,
                jit_compile=FLAGS.jit_compile,
                seed=FLAGS.seed,
                fma_units=FLAGS.fma_units,
                matmul_size=FLAGS.matmul_size,
            )
        )
    vocabulary_map = cli.vocabulary_map(
        FLAGS.model_dir
    )  # for the ctranslate2 rows and the profile (None without the flag)
    if FLAGS.model_dir:
        test = load_multi30k(FLAGS.src_lang, FLAGS.tgt_lang, "test", data_dir=FLAGS.data_dir)
        if FLAGS.decoding_rows:
            cli.step(
                "Decoding rows: cached search against recompute (graph, XLA), then the SavedModel"
            )
            rows.extend(
                decoding_rows(
                    FLAGS.model_dir,
                    [source for source, _ in test],
                    decode_sentences=FLAGS.decode_sentences,
                    saved_model_sentences=FLAGS.saved_model_sentences,
                    baseline_saved_model=FLAGS.saved_model_baseline,
                    rounds=FLAGS.rounds,
                )
            )
        if FLAGS.ctranslate2:
            cli.step(
                "CTranslate2 rows: exporting our float32 and int8 SavedModels and the float32 and "
                "int8 CTranslate2 models, then timing every engine"
            )
            rows.extend(
                ctranslate2_rows(
                    FLAGS.model_dir,
                    test[: FLAGS.ctranslate2_sentences],
                    threads=FLAGS.threads or 2,
                    batch_sizes=batch_sizes,
                    rounds=FLAGS.rounds,
                    vocabulary_map=vocabulary_map,
                )
            )

    if rows:
        print()
        print(format_table(rows))
        print(
            "(mfu, matmul_fraction: ours and base in GFLOP/s; saved_model: seconds, with the target "
            "as an upper bound; the other decoding rows: sentences/s)"
        )
        if FLAGS.plot:
            plot_ratios(rows, FLAGS.plot)
            print(f"plot: {FLAGS.plot}")
    if FLAGS.profile_training:
        models = {
            "ours": Transformer(config, dtype=FLAGS.precision),
            "keras-hub": keras_hub_transformer(config, dtype=FLAGS.precision),
        }
        batches = list(
            make_dataset(
                pairs,
                tokenizer,
                batch_tokens=FLAGS.batch_tokens,
                max_length=config.max_length,
                seed=FLAGS.seed,
            ).take(FLAGS.steps)
        )
        print(f"training step profile, preset {FLAGS.preset}, {FLAGS.precision}:")
        training_profile(models, config, batches, jit_compile=FLAGS.jit_compile)
    if FLAGS.model_dir and FLAGS.profile_saved_model:  # after the table: it needs the most memory
        profile_run(
            FLAGS.model_dir,
            [source for source, _ in test[: FLAGS.ctranslate2_sentences]],
            batch_sizes=batch_sizes,
            rounds=min(FLAGS.rounds, 2),
            vocabulary_map=vocabulary_map,
        )
    if FLAGS.attention_scaling:
        config = cli.config_from_flags()
        print(
            f"attention_scaling: one encoder layer of preset {FLAGS.preset} (d_model {config.hidden_dim}, {config.num_heads} heads, "
            f"d_ff {config.intermediate_dim}, dropout {config.dropout}), forward + backward, batch 1"
        )
        points = attention_scaling(
            lengths,
            FLAGS.scaling_window,
            rounds=FLAGS.rounds,
            repeats=FLAGS.scaling_repeats,
            memory=FLAGS.scaling_memory,
            hidden_dim=config.hidden_dim,
            num_heads=config.num_heads,
            intermediate_dim=config.intermediate_dim,
            dropout=config.dropout,
            jit_compile=FLAGS.jit_compile,
        )
        print(format_scaling_table(points, FLAGS.scaling_window))
        if FLAGS.scaling_plot:
            plot_scaling(points, FLAGS.scaling_window, FLAGS.scaling_plot)
            print(f"plot: {FLAGS.scaling_plot}")
    print(
        f"machine: {tf.config.list_physical_devices()} ; CPU flags: {cpu_flags()} ; precision {FLAGS.precision} ; "
        f"jit_compile {FLAGS.jit_compile} ; CPU allocator {cpu_allocator.describe()}"
    )


if __name__ == "__main__":
    cli.run(main)
