r"""Translate text with a trained run: one input line -> one output line.

    echo "twenty one" | python experiments/translate.py --model_dir=runs/builtin_tiny
    python experiments/translate.py --model_dir=runs/builtin_tiny --input=src.txt \
        --output=hyp.txt --method=beam --beam_size=4 --plot_attention=attention/

Lines come from --input (default: stdin) and go to --output (default: stdout), in order;
blank lines stay blank (score 0.0). Input is read as the exported SavedModel reads text:
invalid UTF-8 becomes U+FFFD, and a line longer than the model's max_length in pieces is cut
(both with a warning on stderr naming the line). Search settings not given come from the run's config (paper:
beam 4, length penalty 0.6, input length + 50). --plot_attention=DIR writes, for every
input line i, `line<i>_{encoder,decoder_self,cross}_layer<l>.png` heatmaps (one grid of
heads per layer and kind).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for

import sys

from absl import app, flags

from keras_transformer import import_tensorflow_quietly

import_tensorflow_quietly()  # before the imports below import TensorFlow

from keras_transformer import cli, fs  # noqa: E402
from keras_transformer.decoding import Translator, decode_lines, translate_lines  # noqa: E402
from keras_transformer.runs import load_ensemble, read_run_config  # noqa: E402

flags.DEFINE_string(
    "model_dir", None, "Run directory (config.json, spm.model, checkpoints/).", required=True
)
cli.define_checkpoint_flags(ensemble=True)
cli.define_search_flags()
cli.define_sampling_flags()
flags.DEFINE_string("input", None, "Source text file, one sentence per line (default: stdin).")
flags.DEFINE_string("output", None, "Translation file, one line per input line (default: stdout).")
flags.DEFINE_bool(
    "scores", False, "Append a tab and the hypothesis score (log-probability) to each line."
)
flags.DEFINE_string("plot_attention", None, "Directory for attention heatmaps of every input line.")

FLAGS = flags.FLAGS


def read_lines(path):
    """`(lines, name)`: the input lines (see `decoding.decode_lines`) and a name for messages."""
    if not path:
        return decode_lines(sys.stdin.buffer.read()), "<stdin>"
    try:
        data = fs.read_bytes(path)
    except OSError as err:
        raise app.UsageError(f"Cannot read --input={path}: {err.strerror}") from err
    return decode_lines(data), path


def main(argv):
    del argv
    if FLAGS.ensemble and FLAGS.plot_attention:
        raise app.UsageError("--plot_attention draws one model's attention: drop --ensemble")
    (lines, replaced), name = read_lines(
        FLAGS.input
    )  # before the model: a bad --input fails at once
    options = cli.search_options(
        read_run_config(FLAGS.model_dir)[0]
    )  # a bad setting fails before loading
    model, tokenizer, _ = load_ensemble(
        [FLAGS.model_dir, *FLAGS.ensemble],
        checkpoint=FLAGS.checkpoint,
        average_last=FLAGS.average_last,
    )
    translator = Translator(
        model, tokenizer, options.method, batch_size=FLAGS.batch_size, **options.kwargs()
    )
    warnings = [(index, "invalid UTF-8 replaced by U+FFFD") for index in replaced]
    limit = translator.max_source_length
    for index, pieces in translator.cut_sources(lines):
        warnings.append(
            (index, f"{pieces} pieces, cut to the first {limit - 1} (max_source_length {limit})")
        )
    for index, warning in sorted(warnings):
        print(f"Warning: {name}, line {index + 1}: {warning}", file=sys.stderr)
    translations, scores = translate_lines(translator, lines)
    if FLAGS.scores:
        translations = [f"{text}\t{score:.4f}" for text, score in zip(translations, scores)]
    output = "".join(f"{text}\n" for text in translations)
    if FLAGS.output:
        fs.write_text(FLAGS.output, output)
    else:
        sys.stdout.buffer.write(output.encode("utf-8"))
        sys.stdout.flush()
    if FLAGS.plot_attention:
        from keras_transformer.visualization import attention_maps, plot_attention

        width = len(str(max(len(lines) - 1, 0)))
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            maps = attention_maps(model, tokenizer, line, translator=translator)
            plot_attention(maps, FLAGS.plot_attention, prefix=f"line{index:0{width}d}")
        print(f"Attention heatmaps: {FLAGS.plot_attention}", file=sys.stderr)


if __name__ == "__main__":
    cli.run(main)
