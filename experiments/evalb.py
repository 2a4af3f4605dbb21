r"""EVALB's bracket scores of a test file of trees against a gold file, one tree a line.

    python experiments/evalb.py gold.txt test.txt                  # COLLINS.prm's settings
    python experiments/evalb.py gold.txt test.txt --prm=sample.prm --sentences
    python experiments/evalb.py gold.txt test.txt --right_branching   # the baseline

Prints EVALB's summary with its own labels (`Bracketing FMeasure       =  91.30`), for all
sentences and for length <= 40 (CUTOFF_LEN); --sentences adds EVALB's per-sentence table, so the
output is EVALB's report. EVALB's messages (`12 : Words unmatch (is|was)`) go to stderr as
EVALB prints them, after warnings about the parameter file. --right_branching scores, instead
of TEST, the right-branching trees over TEST's words with TEST's tags (the baseline of
docs/results-log.md, "Constituency parsing on the Penn Treebank sample").
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

import sys

from absl import app, flags

from keras_transformer import cli
from keras_transformer.data.trees import read_trees, right_branching
from keras_transformer.evaluation.evalb import EvalbParams, evalb, format_report, read_lines

flags.DEFINE_string("prm", None, "An EVALB parameter file (default: COLLINS.prm's settings).")
flags.DEFINE_bool("sentences", False, "Print the per-sentence table before the summary.")
flags.DEFINE_bool(
    "right_branching", False, "Score right-branching trees over TEST's words and tags instead."
)

FLAGS = flags.FLAGS


def _read(path, role):
    try:
        return read_lines(path)
    except OSError as err:
        raise app.UsageError(f"Cannot read the {role} file {path}: {err.strerror}") from err


def main(argv):
    if len(argv) != 3:
        raise app.UsageError("Give two files: GOLD TEST")
    gold, test = _read(argv[1], "gold"), _read(argv[2], "test")
    params = EvalbParams.from_file(FLAGS.prm) if FLAGS.prm else EvalbParams()
    if FLAGS.right_branching:
        baseline = []
        for line in test:
            tagged = (
                [pair for _, tree in read_trees(line) for pair in tree.tagged_words()]
                if line.strip()
                else []
            )
            baseline.append(
                str(right_branching([w for _, w in tagged], [t for t, _ in tagged]))
                if tagged
                else ""
            )
        test = baseline
    result = evalb(gold, test, params)
    for message in result.messages:
        print(message, file=sys.stderr)
    print(format_report(result, sentences=FLAGS.sentences), end="")


if __name__ == "__main__":
    cli.run(main, tensorflow_only=False)
