"""The command line as the docs show it: every flag a documented command uses is in that script's --help."""

import ast
import re
import sys
from pathlib import Path

import pytest

from tests.scripts import REPO, run_sequence, script_environment

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def documented_flags():
    """`{script: {flag: "doc:line"}}` from every `python experiments/<script>.py ...` command in the docs."""
    found = {}
    for doc in DOCS:
        lines = doc.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            match = re.search(r"python (?:-m \S+ )?experiments/(\w+\.py)(.*)", line)
            if not match:
                continue
            command, index = match.group(2), number
            while command.rstrip().endswith("\\") and index + 1 < len(lines):  # continuation lines
                index += 1
                command = command.rstrip()[:-1] + " " + lines[index]
            command = command.split("#", 1)[0].split("|", 1)[0]
            for flag in re.findall(r"(?<![\w-])--([a-z][a-z0-9_]*)", command):
                found.setdefault(match.group(1), {}).setdefault(
                    flag, f"{Path(doc).name}:{number + 1}"
                )
    return found


FLAGS = documented_flags()


def test_the_docs_document_commands():
    assert {"train.py", "translate.py", "evaluate.py", "export.py"} <= set(FLAGS), sorted(FLAGS)
    assert "dataset" in FLAGS["train.py"] and "model_dir" in FLAGS["export.py"]


@pytest.fixture(scope="module")
def help_texts():
    """`({script: its --help output}, stderr)`: every documented script's `--help`, one after
    another in one process (`run_sequence`), in the environment a user has (TensorFlow's log
    level unset, so each script picks its own)."""
    user_environment = {
        k: v for k, v in script_environment().items() if k != "TF_CPP_MIN_LOG_LEVEL"
    }
    result = run_sequence(
        [[script, ["--help"], {"status": 1}] for script in sorted(FLAGS)],  # absl exits with 1
        env=user_environment,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    texts, shown = {}, []
    for line in result.stdout.splitlines():
        ended = re.fullmatch(r"== (\S+) exit 1", line)
        if ended:
            texts[ended.group(1)], shown = "\n".join(shown), []
        else:
            shown.append(line)
    assert sorted(texts) == sorted(FLAGS)
    return texts, result.stderr


def test_help_prints_no_tensorflow_start_up_lines(help_texts):
    # The first script imports TensorFlow (the others find it imported); every script asks
    # for the quiet import the same way (test_every_script_asks_for_a_quiet_import_first).
    noise = [
        line
        for line in help_texts[1].splitlines()
        if "cuda" in line.lower() or "InitializeLog" in line
    ]
    assert not noise, f"`--help` prints TensorFlow's start-up lines: {noise}"


def test_every_script_asks_for_a_quiet_import_first():
    """Each script sets `TF_CPP_MIN_LOG_LEVEL` ("3") and `QUIET_IMPORT` ("1") by default before
    its first import of anything but the standard library's `os` and `sys`."""
    from keras_transformer import QUIET_IMPORT

    wanted = {("TF_CPP_MIN_LOG_LEVEL", "3"), (QUIET_IMPORT, "1")}
    for script in sorted((REPO / "experiments").glob("*.py")):
        found = set()
        for node in ast.parse(script.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = (
                    [node.module]
                    if isinstance(node, ast.ImportFrom)
                    else [alias.name for alias in node.names]
                )
                if set(names) <= {"os", "sys", "__future__"}:
                    continue
                break
            call = node.value if isinstance(node, ast.Expr) else None
            if (
                isinstance(call, ast.Call)
                and ast.unparse(call.func) == "os.environ.setdefault"
                and all(isinstance(arg, ast.Constant) for arg in call.args)
            ):
                found.add(tuple(arg.value for arg in call.args))
        assert wanted <= found, f"{script.name} sets {sorted(found)} before its imports"


@pytest.mark.parametrize("script", sorted(FLAGS))
def test_help_lists_every_documented_flag(help_texts, script):
    shown = help_texts[0][script]
    listed = set(re.findall(r"^  --(?:\[no\])?([a-z][a-z0-9_]*)", shown, flags=re.MULTILINE))
    missing = {
        flag: where
        for flag, where in FLAGS[script].items()
        if flag not in listed and not (flag.startswith("no") and flag[2:] in listed)
    }
    assert not missing, f"documented but not in `{script} --help`: {missing}"


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], (True, 0)),  # the recipe: word positions, window 0
        (["--word_window=2"], (True, 2)),
        # The preset's window goes with its word positions, and the model is the Transformer.
        (["--noword_positions"], (False, None)),
    ],
)
def test_config_flags_override_the_word_window_with_its_positions(argv, expected):
    from absl import flags

    from keras_transformer.cli import config_from_flags, define_config_flags
    from keras_transformer.models import build_model

    flag_values = flags.FlagValues()
    define_config_flags("ptb_sample", flag_values=flag_values)
    flag_values(["train.py", *argv])
    config = config_from_flags(flag_values)
    fields = (getattr(config, "word_positions", False), getattr(config, "word_window", None))
    assert fields == expected
    small = config.replace(num_encoder_layers=1, num_decoder_layers=1)
    assert type(build_model(small)).__name__ == (
        "ParsingTransformer" if expected[0] else "Transformer"
    )


def test_config_flags_keep_an_explicit_window_without_positions_an_error():
    from absl import flags

    from keras_transformer.cli import config_from_flags, define_config_flags

    flag_values = flags.FlagValues()
    define_config_flags("ptb_sample", flag_values=flag_values)
    flag_values(["train.py", "--noword_positions", "--word_window=1"])
    with pytest.raises(
        ValueError, match="^word_window needs word_positions=True. Received: word_window=1$"
    ):
        config_from_flags(flag_values)


def test_sentence_progress_rewrites_one_stderr_line_and_ends_it_at_the_last_sentence(
    capsys, monkeypatch
):
    """In place on a terminal; a line per batch in a log file (not a terminal)."""
    import io

    from keras_transformer.cli import sentence_progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream in (None, Terminal()):
        if stream is not None:
            monkeypatch.setattr(sys, "stderr", stream)
        progress = sentence_progress("parsed")
        for done in (2, 4, 10, 12):
            progress(done, 12)
    assert capsys.readouterr() == (
        "",
        "parsed 2/12 sentences\nparsed 4/12 sentences\nparsed 10/12 sentences\n"
        "parsed 12/12 sentences\n",
    )
    assert stream.getvalue() == (
        "\rparsed 2/12 sentences\rparsed 4/12 sentences\rparsed 10/12 sentences"
        "\rparsed 12/12 sentences\n"
    )


def test_scripts_log_tensorflows_info_lines_only_when_asked_for_a_verbosity():
    import logging
    import os

    import tensorflow as tf
    from absl import flags

    from keras_transformer import cli

    tensorflow = os.path.join(os.path.dirname(tf.__file__), "python", "checkpoint", "saver.py")
    # A checkout in a folder named tensorflow is still the toolkit's.
    ours = os.path.join(os.sep, "src", "tensorflow", "keras_transformer", "training", "trainer.py")

    def record(level, path):
        return logging.LogRecord("absl", level, path, 1, "a line", None, None)

    keep = cli._from_the_toolkit_or_a_warning
    assert not keep(record(logging.INFO, tensorflow))
    assert keep(record(logging.WARNING, tensorflow)) and keep(record(logging.INFO, ours))
    absl_logger = logging.getLogger("absl")
    try:  # scripts one after another in one process (tests/script_sequence.py): each its own
        for argv, filtered in (
            (["script"], True),
            (["script"], True),
            (["script", "--verbosity=0"], False),
            (["script"], True),
        ):
            flag_values = flags.FlagValues()
            flags.DEFINE_integer("verbosity", -1, "absl's flag", flag_values=flag_values)
            flag_values(argv)
            cli.quiet_tensorflow_info(flag_values)
            assert absl_logger.filters.count(keep) == int(filtered), argv
    finally:
        absl_logger.removeFilter(keep)


def corpus_flags(argv, dataset_flag=True):
    """Fresh flag values of a script that scores a run: evaluate.py's corpus flags
    (`cli.define_corpus_flags`), or with `dataset_flag=False` benchmark.py's Multi30k ones."""
    from absl import flags

    values = flags.FlagValues()
    if dataset_flag:
        flags.DEFINE_enum(
            "dataset",
            "builtin",
            ["builtin", "multi30k", "wmt14", "files", "ptb"],
            "",
            flag_values=values,
        )
        flags.DEFINE_list("ptb_val_files", None, "", flag_values=values)
        flags.DEFINE_list("ptb_test_files", None, "", flag_values=values)
    flags.DEFINE_string("data_dir", None, "", flag_values=values)
    flags.DEFINE_string("src_lang", "en", "", flag_values=values)
    flags.DEFINE_string("tgt_lang", "de", "", flag_values=values)
    values(["script", *argv])
    return values


def run_of(directory, **data):
    import dataclasses

    from keras_transformer.models.config import get_preset
    from keras_transformer.runs import write_run_config
    from keras_transformer.training import DataOptions

    payload = {
        "model": get_preset("tiny").to_dict(),
        "data": dataclasses.asdict(DataOptions(**data)),
    }
    write_run_config(directory, payload)
    return str(directory)


def corpus(values):
    names = ("dataset", "data_dir", "src_lang", "tgt_lang", "ptb_val_files", "ptb_test_files")
    return {name: values[name].value for name in names if name in values}


def test_a_run_is_scored_on_its_own_corpus_and_language_pair_unless_told_otherwise(tmp_path):
    from absl import app

    from keras_transformer.cli import corpus_of_run
    from keras_transformer.models.config import get_preset
    from keras_transformer.runs import write_run_config

    en_fr = run_of(
        tmp_path / "en_fr", dataset="multi30k", src_lang="en", tgt_lang="fr", data_dir="m30k"
    )
    own = {"dataset": "multi30k", "data_dir": "m30k", "src_lang": "en", "tgt_lang": "fr"}
    for argv, expected in (
        ([], own),
        (["--tgt_lang=fr", "--src_lang=en"], own),  # the run's own, given
        (["--data_dir=elsewhere"], {**own, "data_dir": "elsewhere"}),
        # another corpus: its own copy; a corpus of language pairs: the run's languages
        (
            ["--dataset=builtin"],
            {**own, "dataset": "builtin", "data_dir": None, "src_lang": "en", "tgt_lang": "de"},
        ),
        (["--dataset=wmt14"], {**own, "dataset": "wmt14", "data_dir": None}),
    ):
        values = corpus_flags(argv)
        corpus_of_run(en_fr, values)
        assert {k: v for k, v in corpus(values).items() if k in own} == expected, argv
    values = corpus_flags([], dataset_flag=False)  # benchmark.py: Multi30k, no --dataset
    corpus_of_run(en_fr, values)
    assert corpus(values) == {"data_dir": "m30k", "src_lang": "en", "tgt_lang": "fr"}
    for argv in (["--tgt_lang=de"], ["--dataset=wmt14", "--tgt_lang=de"]):
        with pytest.raises(app.UsageError) as refused:
            corpus_of_run(en_fr, corpus_flags(argv))
        assert str(refused.value) == (
            f"--tgt_lang=de, but {en_fr} translates en→fr (its config.json): leave --tgt_lang out "
            "to score it on fr."
        )
    with pytest.raises(app.UsageError, match="--src_lang=de, but"):
        corpus_of_run(en_fr, corpus_flags(["--src_lang=de"], dataset_flag=False))

    values = corpus_flags(["--tgt_lang=de"])
    corpus_of_run(None, values)  # a SavedModel: the flags as given
    assert corpus(values)["dataset"] == "builtin" and corpus(values)["tgt_lang"] == "de"
    imported = tmp_path / "imported"  # an imported model's run records no corpus
    write_run_config(imported, {"model": get_preset("tiny").to_dict(), "pretrained": {}})
    values = corpus_flags(["--dataset=multi30k"])
    corpus_of_run(str(imported), values)
    assert corpus(values)["tgt_lang"] == "de" and corpus(values)["data_dir"] is None
    # The languages of a corpus that has none are no reason to refuse.
    builtin = run_of(tmp_path / "builtin")
    values = corpus_flags(["--tgt_lang=fr", "--dataset=multi30k"])
    corpus_of_run(builtin, values)
    assert corpus(values)["tgt_lang"] == "fr" and corpus(values)["data_dir"] is None

    files = {"val": ["wsj_01*.mrg"], "test": ["wsj_02*.mrg"]}
    ptb = run_of(tmp_path / "ptb", dataset="ptb", data_dir="trees", files=files)
    values = corpus_flags(["--ptb_test_files=wsj_03*.mrg"])
    corpus_of_run(ptb, values)
    assert corpus(values) == {
        "dataset": "ptb",
        "data_dir": "trees",
        "src_lang": "en",
        "tgt_lang": "de",
        "ptb_val_files": ["wsj_01*.mrg"],
        "ptb_test_files": ["wsj_03*.mrg"],
    }


def export_of(model_root, version, info):
    """The files `model_root.resolve_saved_model` looks for in `<model_root>/<version>`, and
    `assets.extra/export_info.json` holding `info` (None: no such file)."""
    import json

    directory = model_root / str(version)
    (directory / "variables").mkdir(parents=True)
    for name in ("saved_model.pb", "variables/variables.index"):
        (directory / name).write_bytes(b"")
    (directory / "variables" / "variables.data-00000-of-00001").write_bytes(b"")
    if info is not None:
        (directory / "assets.extra").mkdir()
        (directory / "assets.extra" / "export_info.json").write_text(json.dumps(info))
    return directory


def test_an_export_is_scored_on_the_corpus_of_its_run_unless_told_otherwise(tmp_path):
    import dataclasses

    from absl import app

    from keras_transformer.cli import corpus_of_export
    from keras_transformer.training import DataOptions

    data = dataclasses.asdict(
        DataOptions(dataset="multi30k", src_lang="en", tgt_lang="fr", data_dir="m30k")
    )
    root = tmp_path / "en_fr"
    export_of(root, 1, {"name": "en_fr"})  # an older export: no corpus recorded
    newest = export_of(root, 2, {"name": "en_fr", "data": data})
    values = corpus_flags([])
    # A model root: its highest version's corpus, and that version, the one to score.
    assert corpus_of_export(str(root), values) == newest
    assert corpus(values) == {
        "dataset": "multi30k",
        "data_dir": "m30k",
        "src_lang": "en",
        "tgt_lang": "fr",
        "ptb_val_files": None,
        "ptb_test_files": None,
    }
    with pytest.raises(app.UsageError) as refused:
        corpus_of_export(str(root), corpus_flags(["--tgt_lang=de"]))
    assert str(refused.value) == (
        f"--tgt_lang=de, but {newest} translates en→fr (its export_info.json): leave --tgt_lang "
        "out to score it on fr."
    )
    for version in (1, 3):  # no corpus recorded; no export_info.json: the flags as given
        if version == 3:
            export_of(root, 3, None)
        values = corpus_flags(["--tgt_lang=de"])
        corpus_of_export(str(root / str(version)), values)
        assert corpus(values)["dataset"] == "builtin" and corpus(values)["tgt_lang"] == "de"
    with pytest.raises(FileNotFoundError, match="is not a SavedModel"):
        corpus_of_export(str(tmp_path), corpus_flags([]))
    broken = export_of(root, 4, None)
    (broken / "assets.extra").mkdir()
    (broken / "assets.extra" / "export_info.json").write_text('{"data": ')
    with pytest.raises(
        ValueError, match=f"^{broken}/assets.extra/export_info.json is not valid JSON"
    ):
        corpus_of_export(str(broken), corpus_flags([]))
