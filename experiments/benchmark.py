"""Training throughput against a keras-hub peer, measured in the same run, as one table.

    python experiments/benchmark.py --preset=small --data_dir=../shared/data/multi30k

Rows (every ratio compares two measurements taken in this run, on this machine). The peer
is the same-size model built from keras_hub.layers.TransformerEncoder/TransformerDecoder
under the same dtype policy (--precision) and with our dropout placement
(`benchmark.keras_hub_transformer`); both train with the same step function.
  a. training step throughput, ours vs the peer, identical padded batches;
  b1. real target tokens/s, ours vs the peer, both on our length-bucketed batches;
  b2. real target tokens/s, our model on our bucketed batches vs the same model on
      fixed-length padding (every batch padded to --max_length): the bucketing gain;
  c1. model FLOP utilization (MFU) on real tokens: training FLOP/s over the hardware's
      peak for the compute dtype (CPU: cores x FMA units x SIMD lanes x 2 x clock, read
      from the machine and printed with its inputs; GPU: the published dense peak);
  c2. the same FLOP/s as a fraction of the float32 matmul rate measured in this run;
  d. with --model_dir (a run trained on Multi30k): cached beam 4 versus recomputing the
     prefix every step, on the same test sentences, in graph mode and compiled with XLA
     (there the baseline re-runs its whole static output buffer); and the exported
     SavedModel translating the whole test_2016_flickr split with beam 4 (seconds, after
     one warm-up batch).
"""

import tempfile
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

from keras_transformer import cli
from keras_transformer.benchmark import (
    compare_steps,
    hardware_peak,
    keras_hub_transformer,
    make_train_step,
    matmul_flops_per_second,
    training_flops,
)
from keras_transformer.data import Tokenizer, load_multi30k, make_dataset, train_sentencepiece
from keras_transformer.models.transformer import Transformer

cli.define_config_flags("small")
flags.DEFINE_string("data_dir", None, "Local Multi30k directory (default: download).")
flags.DEFINE_string("src_lang", "en", "Source language.")
flags.DEFINE_string("tgt_lang", "de", "Target language.")
flags.DEFINE_integer("steps", 30, "Timed training steps per measurement.")
flags.DEFINE_integer("rounds", 3, "Alternating timing rounds; each side keeps its fastest.")
flags.DEFINE_integer("batch_tokens", 4096, "Token budget per batch (bucketed pipeline).")
flags.DEFINE_integer("padded_length", 32, "Row a: sentences are cut/padded to this length.")
flags.DEFINE_integer("padded_batch", 64, "Row a: sentences per padded batch.")
flags.DEFINE_string("precision", "float32", "Dtype policy of both models.")
flags.DEFINE_bool("jit_compile", False, "Compile both training steps with XLA.")
flags.DEFINE_integer("seed", 0, "Seed.")
flags.DEFINE_string("model_dir", None, "A trained Multi30k run for the decoding rows (d).")
flags.DEFINE_integer("decode_sentences", 128, "Row d: test sentences for cached versus recompute.")
flags.DEFINE_integer("saved_model_sentences", None, "Row d: translate only this many test sentences with the SavedModel (default: all).")
flags.DEFINE_bool("training", True, "Measure the training rows a-c (--notraining: only row d).")
flags.DEFINE_string("plot", None, "Write the ratios as a bar chart to this PNG.")
flags.DEFINE_integer("fma_units", 2, "Row c1 on CPU: FMA units per core (the machine does not expose it).")

FLAGS = flags.FLAGS


def padded_batches(pairs, tokenizer, length, batch_size, count):
    """`count` batches of `batch_size` sentences, each side cut/padded to `length` tokens."""
    batches = []
    for start in range(0, count * batch_size, batch_size):
        chunk = [pairs[(start + i) % len(pairs)] for i in range(batch_size)]
        source = tokenizer.tokenize([s for s, _ in chunk])[:, : length - 1]
        target = tokenizer.tokenize([t for _, t in chunk])[:, : length - 1]
        eos = tf.fill([batch_size, 1], 3)
        bos = tf.fill([batch_size, 1], 2)
        source_ids = tf.concat([source, eos], 1).to_tensor(0, shape=[batch_size, length])
        target_ids = tf.concat([bos, target], 1).to_tensor(0, shape=[batch_size, length])
        labels = tf.concat([target, eos], 1).to_tensor(0, shape=[batch_size, length])
        batches.append(({"source_ids": source_ids, "target_ids": target_ids}, labels))
    return batches


def real_lengths(batches):
    source = np.concatenate([np.sum(inputs["source_ids"].numpy() != 0, 1) for inputs, _ in batches])
    target = np.concatenate([np.sum(labels.numpy() != 0, 1) for _, labels in batches])
    return source, target


def main(argv):
    del argv
    if not FLAGS.training and not FLAGS.model_dir:
        raise app.UsageError("--notraining leaves only row d, which needs --model_dir.")
    keras.utils.set_random_seed(FLAGS.seed)
    rows = training_rows() if FLAGS.training else []
    if FLAGS.model_dir:
        rows.extend(decoding_rows(FLAGS.model_dir))

    print()
    print(f"{'measurement':52s} {'ours':>12s} {'peer/base':>12s} {'ratio':>8s} {'target':>8s}")
    for name, ours_value, peer_value, ratio, target in rows:
        if target is None:
            print(f"{name:52s} {ours_value:12.2f} {peer_value:12.2f} {ratio:8.2f} {'-':>8s}")
            continue
        mark = "ok" if ratio >= target else "MISSED"
        print(f"{name:52s} {ours_value:12.2f} {peer_value:12.2f} {ratio:8.2f} {target:8.2f} {mark}")
    print("(c: ours and base in GFLOP/s; d: sentences/s, and seconds with the target as an upper bound)")
    if FLAGS.plot:
        plot_ratios(rows, FLAGS.plot)
        print(f"plot: {FLAGS.plot}")
    print(f"machine: {tf.config.list_physical_devices()} ; precision {FLAGS.precision} ; jit_compile {FLAGS.jit_compile}")


def training_rows():
    """Rows a-c: our model and pipeline against the keras-hub peer."""
    pairs = load_multi30k(FLAGS.src_lang, FLAGS.tgt_lang, "train", data_dir=FLAGS.data_dir)
    config = cli.config_from_flags()
    with tempfile.TemporaryDirectory() as workdir:
        tokenizer = Tokenizer(
            train_sentencepiece([x for pair in pairs for x in pair], Path(workdir) / "spm.model", config.vocabulary_size)
        )
    policy = FLAGS.precision
    ours = Transformer(config, dtype=policy)
    peer = keras_hub_transformer(config, dtype=policy)
    print(f"config: {FLAGS.preset} {config.architecture()}")
    print(f"parameters: ours {ours.count_params():,}, keras-hub {peer.count_params():,}")
    rows = []

    # a. identical padded batches
    padded = padded_batches(pairs, tokenizer, FLAGS.padded_length, FLAGS.padded_batch, FLAGS.steps)
    ours_step = make_train_step(ours, config, FLAGS.jit_compile)
    peer_step = make_train_step(peer, config, FLAGS.jit_compile)
    ours_seconds, peer_seconds = compare_steps((ours_step, padded), (peer_step, padded), FLAGS.rounds)
    rows.append(("a. train steps/s, identical padded batches", len(padded) / ours_seconds, len(padded) / peer_seconds,
                 peer_seconds / ours_seconds, 1.25))

    # b1. real target tokens/s, ours vs the peer, both on our bucketed batches
    bucketed = list(make_dataset(pairs, tokenizer, batch_tokens=FLAGS.batch_tokens, max_length=config.max_length,
                                 seed=FLAGS.seed).take(FLAGS.steps))
    bucketed_tokens = sum(real_lengths(bucketed)[1])
    ours_seconds, peer_seconds = compare_steps((ours_step, bucketed), (peer_step, bucketed), FLAGS.rounds)
    rows.append(("b1. real target tokens/s, same bucketed batches", bucketed_tokens / ours_seconds,
                 bucketed_tokens / peer_seconds, peer_seconds / ours_seconds, 1.25))

    # b2. the bucketing gain: our model, bucketed batches vs fixed padding to max_length
    fixed = padded_batches(pairs, tokenizer, config.max_length, FLAGS.batch_tokens // config.max_length, FLAGS.steps)
    fixed_tokens = sum(real_lengths(fixed)[1])
    bucketed_seconds, fixed_seconds = compare_steps((ours_step, bucketed), (ours_step, fixed), FLAGS.rounds)
    bucketed_rate, fixed_rate = bucketed_tokens / bucketed_seconds, fixed_tokens / fixed_seconds
    rows.append(("b2. real target tokens/s, bucketed vs fixed padding, ours", bucketed_rate, fixed_rate,
                 bucketed_rate / fixed_rate, 3.0))

    # c. model FLOP utilization on real tokens: against the hardware peak, and (separately)
    # against the float32 matmul rate measured now
    source_lengths, target_lengths = real_lengths(bucketed)
    achieved = training_flops(config, source_lengths, target_lengths) / ours_seconds
    peak = hardware_peak(keras.dtype_policies.get(policy).compute_dtype, fma_units=FLAGS.fma_units)
    print(f"peak: {peak.describe()}")
    rows.append((f"c1. MFU: training FLOP/s / {peak.dtype} peak", achieved / 1e9, peak.flops_per_second / 1e9,
                 achieved / peak.flops_per_second, None))
    matmul = matmul_flops_per_second()
    rows.append(("c2. training FLOP/s / measured float32 matmul FLOP/s", achieved / 1e9, matmul / 1e9,
                 achieved / matmul, 0.60))
    return rows


def plot_ratios(rows, path):
    """Bar chart of each row's ratio beside its target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name.split(",")[0] for name, *_ in rows]
    ratios = [ratio for _, _, _, ratio, _ in rows]
    targets = [target for *_, target in rows]
    figure, axis = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.5))
    positions = np.arange(len(rows))
    axis.barh(positions, ratios, color="tab:blue", label="measured ratio")
    with_target = [index for index, target in enumerate(targets) if target is not None]
    axis.scatter([targets[i] for i in with_target], positions[with_target], color="tab:red", marker="|", s=400,
                 label="target")
    axis.set_yticks(positions, names)
    axis.invert_yaxis()
    axis.set_xlabel("ratio (ours / peer or base)")
    axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def decoding_rows(model_dir):
    """Rows d: cached vs recompute beam 4, and the SavedModel on the whole test split."""
    from keras_transformer.evaluation.speed import benchmark_decoding
    from keras_transformer.evaluation.translator import SavedModelTranslator
    from keras_transformer.export import Translator, export_saved_model
    from keras_transformer.training import load_run

    test = load_multi30k(FLAGS.src_lang, FLAGS.tgt_lang, "test", data_dir=FLAGS.data_dir)
    sources = [source for source, _ in test]
    model, tokenizer, _ = load_run(model_dir)
    rows = []
    # Graph mode drops finished sentences from the working set; XLA keeps static shapes, so
    # there the recompute baseline re-runs the decoder over its whole output buffer.
    for jit_compile, mode in ((False, "graph"), (True, "XLA")):
        cached, recompute = benchmark_decoding(
            model, tokenizer, sources[: FLAGS.decode_sentences], beam_size=4, methods=("beam",),
            jit_compile=jit_compile,
        )
        rows.append((f"d. beam 4 sentences/s, cached vs recompute, {mode}", cached.sentences_per_second,
                     recompute.sentences_per_second, recompute.seconds / cached.seconds, 10.0))
    sources = sources[: FLAGS.saved_model_sentences] if FLAGS.saved_model_sentences else sources
    with tempfile.TemporaryDirectory() as export_dir:
        result = export_saved_model(Translator(model, tokenizer, beam_size=4), export_dir, name="benchmark",
                                    verify=False, check_ops=False)
        translate = SavedModelTranslator(str(result.path), batch_size=64)
        translate(sources[:64])  # warm-up (the first call loads the graph)
        start = time.perf_counter()
        translate(sources)
        seconds = time.perf_counter() - start
    # Inverted so that "ratio >= target" reads as "within the time budget".
    rows.append((f"d. SavedModel, {len(sources)} test sentences, beam 4 (s)", seconds, 20.0, 20.0 / seconds, 1.0))
    return rows


if __name__ == "__main__":
    app.run(main)
