"""The command line as the docs show it: every flag a documented command uses is in that script's --help."""

import re
from pathlib import Path

import pytest

from tests.scripts import REPO, run_script, script_environment

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


@pytest.mark.parametrize("script", sorted(FLAGS))
def test_help_lists_every_documented_flag(script):
    # The environment a user has: TensorFlow's log level unset, so the script picks its own.
    user_environment = {
        k: v for k, v in script_environment().items() if k != "TF_CPP_MIN_LOG_LEVEL"
    }
    result = run_script(
        script, "--help", check=False, env=user_environment
    )  # absl exits with 1 after --help
    noise = [
        line
        for line in result.stderr.splitlines()
        if "cuda" in line.lower() or "InitializeLog" in line
    ]
    assert not noise, f"`{script} --help` prints TensorFlow's start-up lines: {noise}"
    shown = result.stdout
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
