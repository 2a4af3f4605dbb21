r"""Translate text with a trained run: one input line -> one output line.

    echo "twenty one" | python experiments/translate.py --model_dir=runs/builtin_tiny
    python experiments/translate.py --model_dir=runs/builtin_tiny --input=src.txt \
        --output=hyp.txt --method=beam --beam_size=4 --plot_attention=attention/

Lines come from --input (default: stdin) and go to --output (default: stdout), in order;
blank lines stay blank (score 0.0). A file is translated in length-sorted batches of
--batch_size; from stdin each line is answered as it arrives, in a batch with the lines
already there (`keras_transformer.streaming`), and stdout is flushed after each answer, so
the command works interactively and behind a pipe that waits for answers. --nbest=K prints
K hypotheses per input line, best first, as `index<TAB>score<TAB>hypothesis` (index: the
0-based input line; score: as --scores; a blank line gives K empty hypotheses of score 0.0).

Input is read as the exported SavedModel reads text: invalid UTF-8 becomes U+FFFD, and a line
longer than the model's max_length in pieces is cut (both with a warning on stderr naming the
line). Search settings not given come from the run's config (paper: beam 4, length penalty
0.6, input length + 50). --plot_attention=DIR writes, for every
input line i, `line<i>_{encoder,decoder_self,cross}_layer<l>.png` heatmaps (one grid of
heads per layer and kind).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

import dataclasses
import sys

from absl import app, flags

from keras_transformer import cli, streaming
from keras_transformer.decoding import Translator, translate_lines
from keras_transformer.runs import load_ensemble, read_run_config

flags.DEFINE_string(
    "model_dir", None, "Run directory (config.json, spm.model, checkpoints/).", required=True
)
cli.define_checkpoint_flags(ensemble=True)
cli.define_search_flags()
cli.define_sampling_flags()
flags.DEFINE_string(
    "input",
    None,
    "Source text file, one sentence per line (default: stdin, each line answered as it arrives).",
)
flags.DEFINE_string("output", None, "Translation file, one line per input line (default: stdout).")
flags.DEFINE_bool(
    "scores", False, "Append a tab and the hypothesis score (log-probability) to each line."
)
flags.DEFINE_integer(
    "nbest",
    None,
    "Print this many hypotheses per input line (beam search, at most --beam_size), best first, "
    "as `index<TAB>score<TAB>hypothesis` lines (index: the 0-based input line).",
    lower_bound=1,
)
flags.DEFINE_string("plot_attention", None, "Directory for attention heatmaps of every input line.")

FLAGS = flags.FLAGS


def search_options(config):
    """The search settings (`cli.search_options`), with `num_return=--nbest`."""
    options = cli.search_options(config)
    if FLAGS.nbest is None:
        return options
    if options.method != "beam":
        raise app.UsageError(
            f"--nbest={FLAGS.nbest} needs --method=beam ({options.method} gives one hypothesis)"
        )
    if FLAGS.nbest > options.beam_size:
        raise app.UsageError(
            f"--nbest={FLAGS.nbest} must be at most the beam size ({options.beam_size}): "
            f"give --beam_size={FLAGS.nbest} or more"
        )
    return dataclasses.replace(options, num_return=FLAGS.nbest)


def translate_chunk(translator, start, lines, replaced, name):
    """The output text of `lines` (input lines `start`, `start + 1`, ...), after printing the
    warnings about them (invalid UTF-8 in the lines `replaced`, sources cut) on stderr."""
    warnings = [(index, "invalid UTF-8 replaced by U+FFFD") for index in replaced]
    limit = translator.max_source_length
    for index, pieces in translator.cut_sources(lines):
        warnings.append(
            (
                start + index,
                f"{pieces} pieces, cut to the first {limit - 1} (max_source_length {limit})",
            )
        )
    for index, warning in sorted(warnings):
        print(f"Warning: {name}, line {index + 1}: {warning}", file=sys.stderr, flush=True)
    if FLAGS.nbest is None:
        translations, scores = translate_lines(translator, lines)
        if FLAGS.scores:
            translations = [f"{text}\t{score:.4f}" for text, score in zip(translations, scores)]
        return "".join(f"{text}\n" for text in translations)
    hypotheses, scores = translate_lines(translator.nbest, lines)
    rows = []
    for index, (texts, text_scores) in enumerate(zip(hypotheses, scores), start=start):
        if isinstance(texts, str):  # a blank line: not decoded, K empty hypotheses
            texts, text_scores = [texts] * FLAGS.nbest, [text_scores] * FLAGS.nbest
        rows += [f"{index}\t{score:.4f}\t{text}\n" for text, score in zip(texts, text_scores)]
    return "".join(rows)


def main(argv):
    del argv
    if FLAGS.ensemble and FLAGS.plot_attention:
        raise app.UsageError("--plot_attention draws one model's attention: drop --ensemble")
    source = streaming.read_lines(FLAGS.input) if FLAGS.input else None  # before the model
    options = search_options(read_run_config(FLAGS.model_dir)[0])  # fails before loading
    model, tokenizer, _ = load_ensemble(
        [FLAGS.model_dir, *FLAGS.ensemble],
        checkpoint=FLAGS.checkpoint,
        average_last=FLAGS.average_last,
    )
    translator = Translator(
        model, tokenizer, options.method, batch_size=FLAGS.batch_size, **options.kwargs()
    )
    name = FLAGS.input or streaming.STDIN_NAME
    lines = []  # the input, for --plot_attention

    def respond(start, chunk, replaced):
        if FLAGS.plot_attention:
            lines.extend(chunk)
        return translate_chunk(translator, start, chunk, replaced, name)

    # A file: all of it, in length-sorted batches; stdin: each line as it arrives.
    streaming.answer_lines(respond, source, FLAGS.output, streaming.MAX_BATCHES * FLAGS.batch_size)
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
