r"""Parse tokenized sentences with a run trained on --dataset=ptb: one sentence in, one tree out.

    echo "Ms. Haag plays Elianti ." | python experiments/parse.py --model_dir=runs/ptb_sample
    python experiments/parse.py --model_dir=runs/ptb_sample --input=sentences.txt --output=trees.txt

Input: Penn Treebank tokens, space-separated, one sentence a line, from --input (default:
stdin). Output: one tree a line, `(TOP (S (NP (NNP Ms.) (NNP Haag)) ...))`, to --output
(default: stdout), in input order; every tree has exactly the line's words, in order, with one
POS tag each (`data.trees.sentence_words`: split at whitespace, `(`/`)` written -LRB-/-RRB-).
Sentences are parsed in length-sorted batches (--batch_size), with progress on stderr when
reading a file. Input is read as the exported SavedModel reads it: invalid UTF-8 becomes
U+FFFD, with a warning on stderr naming the line. A blank line, one with a word the
tokenizer does not keep as one word (e.g. a lone U+FFFD or zero-width space, which its
normalisation deletes), or one longer than the model takes stops the run with one line naming
it, before anything is parsed; --output is written only when every sentence is parsed. Search settings not given come from the run's config (ptb presets: beam
21, length penalty 0.3, input length + 300).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for

import sys

from absl import app, flags

from keras_transformer import import_tensorflow_quietly

import_tensorflow_quietly()  # before the imports below import TensorFlow

from keras_transformer import cli, fs  # noqa: E402
from keras_transformer.decoding import Parser, decode_lines  # noqa: E402
from keras_transformer.decoding.parser import check_not_blank  # noqa: E402
from keras_transformer.runs import load_ensemble, read_run_config  # noqa: E402

flags.DEFINE_string("model_dir", None, "Run directory trained with --dataset=ptb.", required=True)
cli.define_checkpoint_flags(ensemble=True)
cli.define_search_flags(batch_size=32)
flags.DEFINE_string("input", None, "Tokenized sentences, one a line (default: stdin).")
flags.DEFINE_string("output", None, "Trees, one a line (default: stdout).")

FLAGS = flags.FLAGS


def main(argv):
    del argv
    if FLAGS.input:
        try:
            data = fs.read_bytes(FLAGS.input)
        except OSError as err:
            raise app.UsageError(f"Cannot read --input={FLAGS.input}: {err.strerror}") from err
        name = FLAGS.input
    else:
        data, name = sys.stdin.buffer.read(), "stdin"
    lines, replaced = decode_lines(data)
    for index in replaced:
        print(
            f"Warning: {name}, line {index + 1}: invalid UTF-8 replaced by U+FFFD", file=sys.stderr
        )
    check_not_blank(lines, name)  # before the model loads
    if FLAGS.method == "sample":
        raise app.UsageError("--method must be greedy or beam for parsing")
    options = cli.search_options(
        read_run_config(FLAGS.model_dir)[0]
    )  # a bad setting fails before loading
    model, tokenizer, _ = load_ensemble(
        [FLAGS.model_dir, *FLAGS.ensemble],
        checkpoint=FLAGS.checkpoint,
        average_last=FLAGS.average_last,
    )
    parser = Parser(
        model, tokenizer, options.method, batch_size=FLAGS.batch_size, **options.kwargs()
    )
    parser.check(lines, name=name)

    def progress(done, total):
        print(
            f"\rparsed {done}/{total} sentences",
            end="\n" if done == total else "",
            file=sys.stderr,
            flush=True,
        )

    trees = parser(lines, progress=progress if FLAGS.input else None)
    text = "".join(f"{tree}\n" for tree in trees)
    if FLAGS.output:
        fs.write_text(FLAGS.output, text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
