r"""Evaluate a trained run or an exported SavedModel on a corpus split with sacreBLEU.

    python experiments/evaluate.py --model_dir=runs/builtin_tiny --split=test
    python experiments/evaluate.py --model_dir=runs/multi30k_en_de --dataset=multi30k \
        --data_dir=../shared/data/multi30k --split=test --average_last=5 --output=hyp.de
    python experiments/evaluate.py --saved_model=saved_models/transformer/1 --split=test
    python experiments/evaluate.py --saved_model=saved_models/transformer --split=test   # highest version

Prints BLEU and chrF with their sacreBLEU signatures (and the exact-match rate), and while
it decodes, the sentences done so far on stderr (--noprogress: none). A run, or an export
of one, is scored on its own corpus and language pair (the run's config.json, the export's
export_info.json) unless --dataset, --data_dir, --src_lang or --tgt_lang say otherwise; a
language other than the model's is refused. Search
settings not given come from the run's config (paper: beam 4, length penalty 0.6, input
length + 50); a SavedModel decodes with the settings fixed at export. --tokenize defaults
to 13a, except "char" for the built-in task (one German word per sentence: word BLEU
would be 0 for every system).

A parsing run (--dataset=ptb, see docs/parsing.md) is scored with EVALB's figures instead
(`keras_transformer.evaluation.evalb`, COLLINS.prm's settings; --prm for another file):

    python experiments/evaluate.py --model_dir=runs/ptb_sample --dataset=ptb \
        --data_dir=../shared/data/ptb-sample --split=test --output=test.trees --gold_output=gold.trees
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

from absl import app, flags

from keras_transformer import cli
from keras_transformer.data.sources import LANGUAGE_PAIR_DATASETS, load_pairs
from keras_transformer.evaluation import default_tokenize, evaluate_run, evaluate_saved_model
from keras_transformer.runs import read_run_config

flags.DEFINE_string("model_dir", None, "Run directory to evaluate.")
flags.DEFINE_string(
    "saved_model",
    None,
    "Or an exported SavedModel: a version directory, or a model root (its highest version).",
)
cli.define_corpus_flags(split="test")
cli.define_checkpoint_flags(ensemble=True)
cli.define_search_flags()
flags.DEFINE_string("src_file", None, "--dataset=files: source file of the split.")
flags.DEFINE_string("ref_file", None, "--dataset=files: reference file of the split.")
cli.define_scoring_flags()
flags.DEFINE_string("output", None, "Write the hypotheses to this file, one line each.")
flags.DEFINE_bool("progress", True, "Show the sentences decoded so far on stderr.")
flags.DEFINE_string(
    "prm", None, "--dataset=ptb: an EVALB parameter file (default: COLLINS.prm's settings)."
)
flags.DEFINE_string(
    "gold_output", None, "--dataset=ptb: also write the split's cleaned gold trees, one a line."
)

FLAGS = flags.FLAGS


def main(argv):
    del argv
    if bool(FLAGS.model_dir) == bool(FLAGS.saved_model):
        raise app.UsageError("Give exactly one of --model_dir and --saved_model.")
    model_flags = (
        "method",
        "beam_size",
        "length_penalty",
        "max_output_offset",
        "checkpoint",
        "average_last",
        "ensemble",
    )
    given = [f"--{name}" for name in model_flags if FLAGS[name].present]
    if FLAGS.saved_model and given:
        raise app.UsageError(
            f"A SavedModel decodes with the settings fixed at export; drop {', '.join(given)}."
        )
    options = cli.search_options(read_run_config(FLAGS.model_dir)[0]) if FLAGS.model_dir else None
    if FLAGS.model_dir:
        cli.corpus_of_run(FLAGS.model_dir)
    else:  # the version scored is the one whose corpus is taken
        saved_model = cli.corpus_of_export(FLAGS.saved_model)
    files = {FLAGS.split: (FLAGS.src_file, FLAGS.ref_file)} if FLAGS.dataset == "files" else None
    if FLAGS.dataset == "ptb":
        return evaluate_parsing(options, cli.ptb_files())
    pairs = load_pairs(
        FLAGS.dataset, FLAGS.split, FLAGS.src_lang, FLAGS.tgt_lang, FLAGS.data_dir, files
    )
    if FLAGS.max_sentences:
        pairs = pairs[: FLAGS.max_sentences]
    tokenize = FLAGS.tokenize or default_tokenize(FLAGS.dataset)
    if FLAGS.model_dir:
        result = evaluate_run(
            FLAGS.model_dir,
            dataset=FLAGS.dataset,
            split=FLAGS.split,
            method=options.method,
            **options.kwargs(),
            checkpoint=FLAGS.checkpoint,
            average_last=FLAGS.average_last,
            ensemble=FLAGS.ensemble,
            batch_size=FLAGS.batch_size,
            lowercase=FLAGS.lowercase,
            tokenize=tokenize,
            output=FLAGS.output,
            pairs=pairs,
            progress=progress("translated"),
        )
    else:
        result = evaluate_saved_model(
            saved_model,
            pairs,
            batch_size=FLAGS.batch_size,
            lowercase=FLAGS.lowercase,
            tokenize=tokenize,
            output=FLAGS.output,
            progress=progress("translated"),
        )
    settings = ", ".join(f"{name}={value}" for name, value in result.settings.items())
    pair = f" {FLAGS.src_lang}→{FLAGS.tgt_lang}" if FLAGS.dataset in LANGUAGE_PAIR_DATASETS else ""
    print(
        f"{FLAGS.dataset}/{FLAGS.split}{pair}: {len(result.hypotheses)} sentences translated in {result.seconds:.1f} s "
        f"({result.sentences_per_second:.1f} sentences/s)"
    )
    print(f"settings: {settings}")
    print(result.scores.format())
    print(f"{result.scores.bleu_details}")
    print(f"exact match: {100 * result.scores.exact_match:.1f}%")
    if FLAGS.output:
        print(f"hypotheses: {FLAGS.output}")


def evaluate_parsing(options, files):
    """--dataset=ptb: EVALB's figures of the run's parses of the split."""
    from keras_transformer.evaluation import write_lines
    from keras_transformer.evaluation.evalb import EvalbParams, format_summary
    from keras_transformer.evaluation.parsing import evaluate_parsing_run, gold_trees

    if not FLAGS.model_dir:
        raise app.UsageError("--dataset=ptb evaluates a run: give --model_dir")
    pairs = load_pairs("ptb", FLAGS.split, data_dir=FLAGS.data_dir, files=files)[
        : FLAGS.max_sentences
    ]
    result = evaluate_parsing_run(
        FLAGS.model_dir,
        pairs,
        options.method,
        checkpoint=FLAGS.checkpoint,
        average_last=FLAGS.average_last,
        ensemble=FLAGS.ensemble,
        batch_size=FLAGS.batch_size,
        output=FLAGS.output,
        params=EvalbParams.from_file(FLAGS.prm) if FLAGS.prm else EvalbParams(),
        progress=progress("parsed"),
        **options.kwargs(),
    )
    if FLAGS.gold_output:
        write_lines(FLAGS.gold_output, gold_trees(pairs))
    settings = ", ".join(f"{name}={value}" for name, value in result.settings.items())
    print(
        f"ptb/{FLAGS.split}: {len(result.trees)} sentences parsed in {result.seconds:.1f} s "
        f"({result.sentences_per_second:.1f} sentences/s)"
    )
    print(f"settings: {settings}")
    print(f"-- All --\n{format_summary(result.evalb.all)}\n-- len<={result.evalb.cutoff_len} --")
    print(format_summary(result.evalb.short), end="")
    if FLAGS.output:
        print(f"trees: {FLAGS.output}")


def progress(verb):
    """`cli.sentence_progress(verb)` unless --noprogress."""
    return cli.sentence_progress(verb) if FLAGS.progress else None


if __name__ == "__main__":
    cli.run(main)
