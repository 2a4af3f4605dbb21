"""absl flag helpers shared by the scripts in `experiments/`.

`define_config_flags()` defines `--preset` and one flag per config field (`models.config.config_fields`)
(`--hidden_dim`, `--num_heads`, `--dropout`, ...), each defaulting to the preset's value.
`run(main)` runs a script's `main` the way `absl.app.run` does, with a user's mistake
reported as one line `error: <message>` (see `USER_ERRORS`).
"""

import logging as python_logging
import os
import sys
import typing

from absl import app, flags, logging

from keras_transformer import streaming
from keras_transformer.backends import require_tensorflow
from keras_transformer.cpu_allocator import use_pooled_cpu_allocator
from keras_transformer.data.sources import DATASETS, LANGUAGE_PAIR_DATASETS, SPLITS
from keras_transformer.decoding.options import METHODS, SearchOptions
from keras_transformer.models.config import PRESETS, config_fields, get_preset
from keras_transformer.training.progress import StatusLine

# What a user's mistake or the user's storage raises (a missing run directory or file, a
# bad value, an export version that exists, a diverged run, an unreadable checkpoint, a full
# disk or an unreachable bucket — every OSError): reported in one line, without a traceback.
USER_ERRORS = (ValueError, OSError, RuntimeError)

# Exit statuses a job scheduler acts on (Kubernetes `podFailurePolicy`, a shell `until` loop;
# docs/distributed.md, "Exit statuses"): 0 finished; FAILED a user error or a fault that needs
# a person; USAGE_ERROR a wrong flag; TRY_AGAIN (sysexits.h's EX_TEMPFAIL) stopped before the
# end through no fault of the run, preempted (SIGTERM, also during start-up) or its run
# directory owned by another live process: the same command, run again, continues.
FAILED, USAGE_ERROR, TRY_AGAIN = 1, 2, 75


def define_config_flags(default_preset="tiny", flag_values=flags.FLAGS):
    """Define `--preset` and an override flag for every config field (in `flag_values`)."""
    define = dict(flag_values=flag_values)
    flags.DEFINE_enum(
        "preset",
        default_preset,
        list(PRESETS),
        "Model preset; other config flags override it.",
        **define,
    )
    for field in config_fields():
        kind = _field_kind(field)
        help_text = f"Override the preset's {field.name}."
        if kind is bool:
            flags.DEFINE_bool(field.name, None, help_text, **define)
        elif kind is int:
            flags.DEFINE_integer(field.name, None, help_text, **define)
        elif kind is float:
            flags.DEFINE_float(field.name, None, help_text, **define)
        else:
            flags.DEFINE_string(field.name, None, help_text, **define)


def define_corpus_flags(split=None):
    """`--dataset`, `--data_dir`, `--src_lang`, `--tgt_lang`, and `--split` when `split` is a default."""
    flags.DEFINE_enum("dataset", "builtin", list(DATASETS), "Corpus.")
    flags.DEFINE_string(
        "data_dir", None, "Local copy of the corpus (Multi30k raw files, or the tfds data dir)."
    )
    flags.DEFINE_string("src_lang", "en", "Source language.")
    flags.DEFINE_string("tgt_lang", "de", "Target language.")
    flags.DEFINE_list(
        "ptb_val_files",
        None,
        "--dataset=ptb, flat directory: val (dev) file names (fnmatch patterns; "
        "default: the tenth of the files before the test files).",
    )
    flags.DEFINE_list(
        "ptb_test_files",
        None,
        "--dataset=ptb, flat directory: test file names (fnmatch patterns; "
        "default: the last tenth of the files by name).",
    )
    if split:
        flags.DEFINE_enum("split", split, list(SPLITS), "Corpus split.")


def define_multi30k_flags():
    """`--data_dir`, `--src_lang`, `--tgt_lang` of the benchmarks, which read Multi30k."""
    flags.DEFINE_string("data_dir", None, "Local Multi30k directory (default: download).")
    flags.DEFINE_string("src_lang", "en", "Source language.")
    flags.DEFINE_string("tgt_lang", "de", "Target language.")


def corpus_of_run(model_dir, flag_values=flags.FLAGS):
    """Score a run on its own corpus unless told otherwise: sets the corpus flags not given
    (`--dataset`, `--data_dir`, `--src_lang`, `--tgt_lang`, a treebank's `--ptb_*_files`) to the
    run's, from its config.json's data section.

    A script that scores a run's translations calls this before it reads a corpus: an EN→FR
    run scored against the German references of the default `--tgt_lang=de` would print a
    BLEU near 0 as a result. `--dataset` given as another corpus keeps its own `--data_dir`;
    a language given that is not the run's is refused. Does nothing without `model_dir`, or
    for a run that records no corpus (an imported model).

    Raises:
        app.UsageError: `--src_lang` or `--tgt_lang` given, on a corpus of language pairs,
            other than the run's.
    """
    if not model_dir:
        return
    from keras_transformer.runs import read_run_config

    data = read_run_config(model_dir)[1].get("data")
    _take_corpus(data, f"{model_dir} translates {{pair}} (its config.json)", flag_values)


def corpus_of_export(saved_model, flag_values=flags.FLAGS):
    """`corpus_of_run` for an exported SavedModel (a version directory, or a model root: its
    highest complete version): the corpus its `export_info.json` records, that of the run it
    was exported from (`export_saved_model(data=...)`). An export that records none (an
    imported model's, or one exported before exports recorded it) keeps the flags as given.

    Returns:
        the SavedModel directory `saved_model` names (the version whose corpus was taken).

    Raises:
        app.UsageError: as `corpus_of_run`.
        FileNotFoundError: `saved_model` is no SavedModel (`model_root.resolve_saved_model`).
    """
    from keras_transformer.export.serving import EXPORT_INFO_FILE, read_export_info
    from keras_transformer.model_root import resolve_saved_model

    path = resolve_saved_model(saved_model)
    data = read_export_info(path).get("data")
    _take_corpus(data, f"{path} translates {{pair}} (its {EXPORT_INFO_FILE})", flag_values)
    return path


def _take_corpus(data, translates, flag_values):
    """Set the corpus flags not given to `data` (a run's config.json data section, or None:
    nothing to take); `translates`, naming the model and its file with a `{pair}` field, is
    what the refusal of another language says."""
    if data is None:  # an imported model (`pretrained.import_marian`), or an older export
        return

    def given(name):
        return name in flag_values and flag_values[name].present

    if "dataset" in flag_values and not given("dataset"):
        flag_values.dataset = data["dataset"]
    # A script without --dataset (benchmark.py) reads Multi30k.
    dataset = flag_values.dataset if "dataset" in flag_values else "multi30k"
    if dataset in LANGUAGE_PAIR_DATASETS and data["dataset"] in LANGUAGE_PAIR_DATASETS:
        pair = f"{data['src_lang']}→{data['tgt_lang']}"
        for name in ("src_lang", "tgt_lang"):
            if given(name) and flag_values[name].value != data[name]:
                raise app.UsageError(
                    f"--{name}={flag_values[name].value}, but {translates.format(pair=pair)}: "
                    f"leave --{name} out to score it on {data[name]}."
                )
            flag_values[name].value = data[name]
    if dataset != data["dataset"]:
        return
    if not given("data_dir"):
        flag_values["data_dir"].value = data["data_dir"]
    for split in ("val", "test"):
        name = f"ptb_{split}_files"
        if name in flag_values and not given(name) and data["files"]:
            flag_values[name].value = data["files"].get(split)


def define_checkpoint_flags(ensemble=False, every_checkpoint=False):
    """`--checkpoint` and `--average_last`: which weights of a run directory to load; with
    `ensemble`, `--ensemble`: more runs that search with it (`runs.load_ensemble`). With
    `every_checkpoint` (a script that scores each checkpoint in turn), no `--checkpoint`, and
    the other two apply at each checkpoint's step (`evaluation.score_checkpoints`)."""
    if every_checkpoint:
        flags.DEFINE_integer(
            "average_last", None, "At each step, average the last this many checkpoints up to it."
        )
    else:
        flags.DEFINE_string(
            "checkpoint",
            None,
            "Checkpoint prefix to load (default: the latest of the run), or best: the "
            "best-scoring one (trained with --score_every).",
        )
        flags.DEFINE_integer(
            "average_last", None, "Instead, average the last this many checkpoints of the run."
        )
    if ensemble:
        which = (
            "their checkpoints up to each step" if every_checkpoint else "their latest checkpoints"
        )
        flags.DEFINE_list(
            "ensemble",
            [],
            "More run directories, trained with --model_dir's tokenizer: the search averages their "
            f"next-token distributions with --model_dir's at every step ({which}, or --average_last).",
        )


def define_search_flags(batch_size=64, method=True, flag_values=flags.FLAGS):
    """`--method`, `--beam_size`, `--length_penalty`, `--max_output_offset` (default: the
    run config's values, the paper's 4 / 0.6 / 50) and `--batch_size`.

    Args:
        batch_size: the default of `--batch_size`; None defines no `--batch_size`.
        method: define `--method` (a script that only runs beam search passes False).
        flag_values: where to define them.
    """
    define = dict(flag_values=flag_values)
    if method:
        flags.DEFINE_enum("method", "beam", list(METHODS), "Search method.", **define)
    flags.DEFINE_integer(
        "beam_size", None, "Beam width (default: the run config's, paper: 4).", **define
    )
    flags.DEFINE_float(
        "length_penalty",
        None,
        "GNMT length penalty alpha (default: the config's, paper: 0.6).",
        **define,
    )
    flags.DEFINE_integer(
        "max_output_offset",
        None,
        "At most source length + this many output tokens (paper: 50).",
        **define,
    )
    if batch_size is not None:
        flags.DEFINE_integer(
            "batch_size", batch_size, "Sentences translated together (grouped by length).", **define
        )


def define_sampling_flags(flag_values=flags.FLAGS):
    """`--temperature`, `--top_k`, `--top_p`, `--seed`: the settings of `--method=sample`."""
    define = dict(flag_values=flag_values)
    flags.DEFINE_float("temperature", None, "--method=sample: softmax temperature.", **define)
    flags.DEFINE_integer(
        "top_k", None, "--method=sample: keep the k most probable tokens (0: all).", **define
    )
    flags.DEFINE_float(
        "top_p", None, "--method=sample: nucleus probability mass (1.0: all).", **define
    )
    flags.DEFINE_integer(
        "seed", None, "--method=sample: seed (default: different samples on every run).", **define
    )


def define_vocabulary_map_flag(flag_values=flags.FLAGS):
    """`--vocabulary_map=PER_SOURCE,FREQUENT`: beam search over a per-batch target shortlist."""
    flags.DEFINE_list(
        "vocabulary_map",
        None,
        "An approximate beam search whose output projection covers only each batch's "
        "shortlist (CTranslate2's vocabulary map, docs/decoding.md): PER_SOURCE,FREQUENT target tokens, e.g. 20,500: "
        "per source token the PER_SOURCE that co-occur with it most in the run's training pairs, and the FREQUENT "
        "most frequent. Default: the full vocabulary (exact).",
        flag_values=flag_values,
    )
    flags.register_validator(
        "vocabulary_map",
        lambda values: (
            values is None
            or (len(values) == 2 and all(v.isdigit() for v in values) and int(values[0]) > 0)
        ),
        "--vocabulary_map takes two integers PER_SOURCE,FREQUENT with PER_SOURCE > 0, e.g. 20,500.",
        flag_values=flag_values,
    )


def vocabulary_map(model_dir, flag_values=flags.FLAGS):
    """The `decoding.shortlist.VocabularyMap` that `--vocabulary_map` asks for (None: not given)."""
    if flag_values.vocabulary_map is None:
        return None
    from keras_transformer.decoding.shortlist import run_vocabulary_map

    per_source, frequent = (int(value) for value in flag_values.vocabulary_map)
    return run_vocabulary_map(model_dir, per_source=per_source, frequent=frequent)


SEARCH_FLAGS = (
    "beam_size",
    "length_penalty",
    "max_output_offset",
    "temperature",
    "top_k",
    "top_p",
    "seed",
)
"""The flags of `define_search_flags` and `define_sampling_flags` that are `SearchOptions` fields."""


def search_options(config, flag_values=flags.FLAGS, method=None):
    """A script's `SearchOptions`: the run config's settings, overridden by the search flags given.

    `SearchOptions.from_config(config, method, **flags)`, reading the `SEARCH_FLAGS` the
    script defines (unset ones are None and keep the config's value; a script calling this
    uses `--seed` only as the sampling seed). Every script that searches resolves its
    settings here.

    Args:
        config: the run's model config (`runs.read_run_config`).
        flag_values: the parsed flags.
        method: the search method (default: `--method`, else "beam").

    Raises:
        app.UsageError: naming a bad or inapplicable setting.
    """
    if method is None:
        method = flag_values["method"].value if "method" in flag_values else "beam"
    overrides = {name: flag_values[name].value for name in SEARCH_FLAGS if name in flag_values}
    try:
        return SearchOptions.from_config(config, method, **overrides)
    except ValueError as err:
        raise app.UsageError(str(err)) from err


def define_scoring_flags():
    """`--max_sentences`, `--lowercase` and `--tokenize`: which sentences and how sacreBLEU scores them."""
    from keras_transformer.evaluation.bleu import TOKENIZERS

    flags.DEFINE_integer(
        "max_sentences", None, "Score only the first this many sentences of the split."
    )
    flags.DEFINE_bool("lowercase", False, "Case-insensitive BLEU and chrF.")
    flags.DEFINE_enum(
        "tokenize", None, list(TOKENIZERS), "sacreBLEU tokenizer (default: 13a; char for builtin)."
    )


# Vocabulary sizes that suit each corpus when neither --vocabulary_size nor a corpus preset gives one.
DEFAULT_VOCABULARY = {"builtin": 256, "multi30k": 8000, "files": 8000, "wmt14": 37000, "ptb": 16000}


def corpus_defaults(preset, dataset):
    """Config defaults for training `preset` on `dataset` (flags still override them).

    The vocabulary size suits the corpus, except for a preset named after a corpus (e.g.
    `multi30k`, or `ptb_sample` for `ptb`): that is the corpus's own recipe and keeps its
    vocabulary size.

    Example:

    >>> corpus_defaults("tiny", "builtin"), corpus_defaults("multi30k", "multi30k")
    ({'vocabulary_size': 256}, {})
    """
    if preset in DATASETS or preset.startswith(f"{dataset}_"):
        return {}
    return {"vocabulary_size": DEFAULT_VOCABULARY[dataset]}


def config_from_flags(flag_values=flags.FLAGS, **defaults):
    """The preset named by `--preset` with `defaults`, then every flag given, applied."""
    overrides = dict(defaults)
    for field in config_fields():
        value = flag_values[field.name].value
        if value is not None:
            overrides[field.name] = value
    # A preset's word window belongs to its word positions: `--noword_positions` drops it too
    # (an explicit `--word_window` stays, and the config rejects it).
    if overrides.get("word_positions") is False and flag_values["word_window"].value is None:
        overrides["word_window"] = None
    return get_preset(flag_values.preset, **overrides)


def _field_kind(field):
    kind = field.type
    if isinstance(kind, str):
        kind = eval(kind, vars(typing))  # annotations as strings
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if args else kind


def flag_file(script, flag_values=flags.FLAGS, **values):
    """An absl flag file that runs `script` again with the flags it runs with now.

    One `--name=value` line per flag that the script (the main module) and
    `keras_transformer` define, sorted by name, given or not (so a later change of a default
    does not change what the file runs); flags whose value is None are left out (None is
    their default). `values` replace flags' values: the values the script resolved, e.g.
    `model_dir=` the directory used, or a preset's config fields, pinned as if given.
    `script --flagfile=FILE` reads it back; flags given after `--flagfile` win.

    Example:

    >>> from absl import flags
    >>> flag_values = flags.FlagValues()
    >>> _ = flags.DEFINE_integer("seed", 0, "Seed.", flag_values=flag_values, module_name=sys.argv[0])
    >>> _ = flags.DEFINE_string("model_dir", None, "Run.", flag_values=flag_values, module_name=sys.argv[0])
    >>> _ = flags.DEFINE_bool("progress", None, "Bar.", flag_values=flag_values, module_name=sys.argv[0])
    >>> _ = flag_values(["train.py", "--seed=3"])
    >>> print(flag_file("train.py", flag_values, model_dir="runs/a", progress=False), end="")
    # train.py --flagfile=<this file> runs it again; flags given after --flagfile win.
    --model_dir=runs/a
    --noprogress
    --seed=3
    """
    lines = {}
    for module, module_flags in flag_values.flags_by_module_dict().items():
        if module != sys.argv[0] and module.split(".")[0] != "keras_transformer":
            continue
        for flag in module_flags:
            value = values.get(flag.name, flag.value)
            if value is None:
                continue
            if flag.name in values and isinstance(value, bool):
                lines[flag.name] = f"--{'' if value else 'no'}{flag.name}"
            elif flag.name in values:
                lines[flag.name] = f"--{flag.name}={value}"
            else:
                lines[flag.name] = flag.serialize()
    header = f"# {script} --flagfile=<this file> runs it again; flags given after --flagfile win."
    return "".join(f"{line}\n" for line in [header, *(lines[name] for name in sorted(lines))])


def quiet_info_logs():
    """Log warnings and errors only, unless the user passed `--verbosity`.

    Writing a SavedModel logs every renamed capture of every signature at INFO (absl's
    default level under `app.run`): dozens of lines a user cannot act on.
    """
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def _from_the_toolkit_or_a_warning(record):
    """A log filter: keep warnings and errors, and INFO lines logged outside TensorFlow's package."""
    tensorflow = sys.modules.get("tensorflow")
    return (
        record.levelno >= python_logging.WARNING
        or tensorflow is None
        or not record.pathname.startswith(os.path.dirname(tensorflow.__file__) + os.sep)
    )


def quiet_tensorflow_info(flag_values=flags.FLAGS):
    """Drop TensorFlow's own INFO lines from a script's log, unless the user passed `--verbosity`.

    TensorFlow logs through absl too, at INFO, lines a user cannot act on (every checkpoint
    save logs its sharding callback's duration, amid the progress bar); the
    toolkit's INFO lines (restored checkpoints, evaluations, ...) stay. The filter follows each
    script's flags, also when several run in one process.
    """
    if flag_values["verbosity"].present:
        logging.get_absl_logger().removeFilter(_from_the_toolkit_or_a_warning)
    else:
        logging.get_absl_logger().addFilter(_from_the_toolkit_or_a_warning)


def step(line):
    """Announce a step of long work on stderr (stdout keeps the results): `... <line>`."""
    print(f"... {line}", file=sys.stderr, flush=True)


def sentence_progress(verb):
    """A `progress(done, total)` for long decoding: `<verb> <done>/<total> sentences` on a
    `training.progress.StatusLine` of stderr (stdout keeps the results), ended once every
    sentence is done.
    """
    line = StatusLine()

    def progress(done, total):
        line.show(f"{verb} {done}/{total} sentences", last=done == total)

    return progress


def run(main, tensorflow_only=True):
    """Run a script's `main(argv)` as `absl.app.run` does, with errors a user can fix in one line.

    A script that trains, searches or exports (`tensorflow_only`) stops with one line
    naming the backend when Keras runs on another one (`backends.require_tensorflow`).

    A `USER_ERRORS` exception prints `error: <message>` on stderr and exits with status
    `FAILED` (1); a usage error (`app.UsageError`) prints `error: <message>` and a pointer to
    `--help`, and exits with `USAGE_ERROR` (2). A `main` that returns a status exits with it
    (`TRY_AGAIN`: run the same command again). `--traceback` shows the Python traceback instead. The
    script's module-level flags (and those defined here, e.g. the config flags) are its
    key flags, so `--help` lists them all.

    TensorFlow's pooled CPU allocator is selected before anything runs (`cpu_allocator`),
    unless `TF_CPU_ALLOCATOR_USE_BFC` in the environment says otherwise, and TensorFlow's own
    INFO lines are left out of the log unless `--verbosity` is given (`quiet_tensorflow_info`).
    """
    use_pooled_cpu_allocator()
    flags.DEFINE_bool(
        "traceback", False, "On an error, show the Python traceback instead of one line."
    )
    # `--help` lists the main module's key flags; absl names that module by sys.argv[0].
    for flag in flags.FLAGS.get_key_flags_for_module(__name__):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)

    def guarded(argv):
        quiet_tensorflow_info()
        try:
            if tensorflow_only:
                require_tensorflow(f"experiments/{os.path.basename(sys.argv[0])}")
            return main(argv)
        except app.UsageError as error:
            if flags.FLAGS.traceback:
                raise
            _fail(f"{error} (see --help)", USAGE_ERROR)
        except USER_ERRORS as error:
            if flags.FLAGS.traceback:
                raise
            _fail(str(error).splitlines()[0] if str(error) else type(error).__name__, FAILED)

    try:
        app.run(guarded)
    except SystemExit as exit:
        if streaming.reading():  # see `streaming.reading`: end without finalizing
            sys.stdout.flush()
            sys.stderr.flush()
            if isinstance(exit.code, str):
                print(exit.code, file=sys.stderr, flush=True)
            os._exit(exit.code if isinstance(exit.code, int) else FAILED if exit.code else 0)
        raise


def _fail(message, status):
    sys.exit(report_error(message, status))


def report_error(message, status=FAILED):
    """Print `error: <message>` on stderr (the one line a script stops with); returns `status`."""
    print(f"error: {message}", file=sys.stderr)
    return status


def ptb_files(flag_values=flags.FLAGS):
    """`load_pairs`'s `files` for `--dataset=ptb`: the held-out file patterns given, or None."""
    return {"val": flag_values.ptb_val_files, "test": flag_values.ptb_test_files}
