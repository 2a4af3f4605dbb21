r"""Parse tokenized sentences with a run trained on --dataset=ptb: one sentence in, one tree out.

    echo "Ms. Haag plays Elianti ." | python experiments/parse.py --model_dir=runs/ptb_sample
    python experiments/parse.py --model_dir=runs/ptb_sample --input=sentences.txt --output=trees.txt

Input: Penn Treebank tokens, space-separated, one sentence a line, from --input (default:
stdin). Output: one tree a line, `(TOP (S (NP (NNP Ms.) (NNP Haag)) ...))`, to --output
(default: stdout), in input order; every tree has exactly the line's words, in order, with one
POS tag each (`data.trees.sentence_words`: split at whitespace, `(`/`)` written -LRB-/-RRB-).
A file is parsed in length-sorted batches (--batch_size), with progress on stderr; from
stdin each line is answered as it arrives, in a batch with the lines already there
(`keras_transformer.streaming`), stdout flushed after each answer. --nbest=K prints K trees
per sentence, best first, as `index<TAB>score<TAB>tree` (index: the 0-based input line; score:
the length-normalized log-probability).

Input is read as the exported SavedModel reads it: invalid UTF-8 becomes U+FFFD, with a warning on stderr naming the line. A blank line, one with a word the
tokenizer does not keep as one word (e.g. a lone U+FFFD or zero-width space, which its
normalisation deletes), or one longer than the model takes stops the run with one line naming
it, before anything is parsed (from stdin: before that line and the ones read with it; the
lines before are answered); --output is written only when every sentence is parsed. Search settings not given come from the run's config (ptb presets: beam
21, length penalty 0.3, input length + 300).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

import dataclasses
import sys

from absl import app, flags

from keras_transformer import cli, streaming
from keras_transformer.decoding import Parser
from keras_transformer.decoding.parser import check_not_blank
from keras_transformer.runs import load_ensemble, read_run_config

flags.DEFINE_string("model_dir", None, "Run directory trained with --dataset=ptb.", required=True)
cli.define_checkpoint_flags(ensemble=True)
cli.define_search_flags(batch_size=32)
flags.DEFINE_string(
    "input",
    None,
    "Tokenized sentences, one a line (default: stdin, each line answered as it arrives).",
)
flags.DEFINE_string("output", None, "Trees, one a line (default: stdout).")
flags.DEFINE_integer(
    "nbest",
    None,
    "Print this many trees per sentence (beam search, at most --beam_size), best first, as "
    "`index<TAB>score<TAB>tree` lines (index: the 0-based input line).",
    lower_bound=1,
)

FLAGS = flags.FLAGS


def warn_replaced(replaced, name):
    for index in replaced:
        print(
            f"Warning: {name}, line {index + 1}: invalid UTF-8 replaced by U+FFFD",
            file=sys.stderr,
            flush=True,
        )


def search_options(config):
    """The search settings (`cli.search_options`), with `num_return=--nbest`."""
    options = cli.search_options(config)
    if FLAGS.nbest is None:
        return options
    if options.method != "beam":
        raise app.UsageError(f"--nbest={FLAGS.nbest} needs --method=beam (greedy gives one tree)")
    if FLAGS.nbest > options.beam_size:
        raise app.UsageError(
            f"--nbest={FLAGS.nbest} must be at most the beam size ({options.beam_size}): "
            f"give --beam_size={FLAGS.nbest} or more"
        )
    return dataclasses.replace(options, num_return=FLAGS.nbest)


def parse_text(parser, start, lines, progress=None):
    """The output text of `lines` (input lines `start`, `start + 1`, ...)."""
    if FLAGS.nbest is None:
        return "".join(f"{tree}\n" for tree in parser(lines, progress=progress))
    trees, scores = parser.nbest(lines)
    return "".join(
        f"{index}\t{score:.4f}\t{tree}\n"
        for index, (line_trees, line_scores) in enumerate(zip(trees, scores), start=start)
        for tree, score in zip(line_trees, line_scores)
    )


def main(argv):
    del argv
    name = FLAGS.input or streaming.STDIN_NAME
    if FLAGS.input:
        lines, replaced = streaming.read_lines(FLAGS.input)
        warn_replaced(replaced, name)
        check_not_blank(lines, name)  # before the model loads
    if FLAGS.method == "sample":
        raise app.UsageError("--method must be greedy or beam for parsing")
    options = search_options(read_run_config(FLAGS.model_dir)[0])  # fails before loading
    model, tokenizer, _ = load_ensemble(
        [FLAGS.model_dir, *FLAGS.ensemble],
        checkpoint=FLAGS.checkpoint,
        average_last=FLAGS.average_last,
    )
    parser = Parser(
        model, tokenizer, options.method, batch_size=FLAGS.batch_size, **options.kwargs()
    )
    # The whole file, checked first, in length-sorted batches.
    progress = cli.sentence_progress("parsed") if FLAGS.input else None

    def respond(start, chunk, replaced):
        warn_replaced(replaced, name)
        parser.check(chunk, name=name, first_line=start + 1)  # stops at a line it cannot parse
        return parse_text(parser, start, chunk, progress)

    # A file: all of it, in length-sorted batches; stdin: each line as it arrives.
    streaming.answer_lines(
        respond,
        (lines, []) if FLAGS.input else None,  # its invalid UTF-8 was told above
        FLAGS.output,
        streaming.MAX_BATCHES * FLAGS.batch_size,
    )


if __name__ == "__main__":
    cli.run(main)
