"""The commands of docs/results.md and README.md run as written on a fresh clone.

Every `python experiments/<script>.py ...` in their code blocks names a script that exists and
parses as that script parses its command line (its own flags, those of the `cli` helpers it
calls and absl's own, such as --flagfile and --verbosity; values checked by the flags' types
and validators); every `python -m keras_transformer...` names a module of the repository; every
`../shared/data/...` path is there.
"""

import json
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import SHARED_DIR
from tests.scripts import REPO, script_environment

DOCS = (REPO / "docs" / "results.md", REPO / "README.md")

PYTHON = re.compile(
    r"python (?:-m (?P<module>keras_transformer[\w.]*)|(?P<script>experiments/\w+\.py))(?P<args>[^&|;#<>]*)"
)
ASSIGNMENT = re.compile(r'\s*(\w+)="([^"]*)"\s*')
SHARED_DATA = re.compile(r"\.\./shared/data/[\w./-]*")

# Runs each script's module as `python experiments/<script>.py ARGS` would, up to and including
# the parsing of ARGS (absl's `app.run` is replaced by the parse alone, so no `main` runs), for
# every command of the script; prints `{where: error or null}` as JSON. The flags the module
# defined are removed after each command so that the next module defines its own.
PARSE_COMMANDS = r"""
import json, runpy, sys
from absl import app, flags

class Parsed(Exception):
    pass

def parse_only(main, argv=None, **kwargs):
    flags.FLAGS(sys.argv if argv is None else argv)
    raise Parsed

app.define_help_flags()
app.run = parse_only
absl_flags = set(flags.FLAGS)
results = {}
for where, script, args in json.load(sys.stdin):
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
        results[where] = "the script did not parse its command line (absl.app.run)"
    except Parsed:
        results[where] = None
    except (flags.Error, SystemExit) as error:
        results[where] = str(error).splitlines()[0] if str(error) else repr(error)
    except Exception as error:  # the module itself fails before parsing
        results[where] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
    flags.FLAGS.unparse_flags()
    for name in set(flags.FLAGS) - absl_flags:
        delattr(flags.FLAGS, name)
print(json.dumps(results))
"""


def code_lines(doc):
    """`(line number, line)` of the code blocks of `doc`, continuation lines joined, shell
    variables (`name="..."`) expanded where a later line uses them."""
    lines, in_block, variables = doc.read_text(encoding="utf-8").splitlines(), False, {}
    number = 0
    while number < len(lines):
        start, line = number, lines[number]
        while line.rstrip().endswith("\\") and number + 1 < len(lines):
            number += 1
            line = line.rstrip()[:-1] + " " + lines[number].strip()
        number += 1
        if line.lstrip().startswith("```"):
            in_block, variables = not in_block, {}
            continue
        if not in_block:
            continue
        assignment = ASSIGNMENT.fullmatch(line)
        if assignment:
            variables[assignment.group(1)] = assignment.group(2)
        line = re.sub(
            r"\$(\w+)", lambda m, known=variables: known.get(m.group(1), m.group(0)), line
        )
        yield start + 1, line


def documented_commands(docs=DOCS):
    """`[(where, script or None, module or None, args)]` of every python command in `docs`' code blocks."""
    commands = []
    for doc in docs:
        name = doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc.name
        for number, line in code_lines(doc):
            for match in PYTHON.finditer(line):
                script, module = match.group("script"), match.group("module")
                commands.append(
                    (f"{name}:{number}", script, module, shlex.split(match.group("args")))
                )
    return commands


def parse_errors(commands):
    """`{where: the script's one-line error}` for each script command that does not parse."""
    scripts = [
        (where, script, args)
        for where, script, _, args in commands
        if script and (REPO / script).is_file()
    ]
    completed = subprocess.run(
        [sys.executable, "-c", PARSE_COMMANDS],
        input=json.dumps(scripts),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=script_environment(),
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout.strip().splitlines()[-1])
    return {where: error for where, error in results.items() if error}


@pytest.fixture(scope="module")
def commands():
    return documented_commands()


@pytest.fixture(scope="module")
def misspelled(tmp_path_factory):
    """The commands of a page whose first command misspells a flag in a shell variable's
    continuation line; the second gives the decoding rows' old flag name and absl's --verbosity."""
    page = tmp_path_factory.mktemp("docs") / "page.md"
    page.write_text(
        "```bash\n"
        'common="--notraining \\\n'
        '    --nodecoding_rowz"\n'
        "python experiments/benchmark.py $common \\\n"
        "    --model_dir=runs/x\n"
        "python experiments/benchmark.py --notraining --norow_d --verbosity=1 --model_dir=runs/x\n"
        "```\n",
        encoding="utf-8",
    )
    return documented_commands([page])


@pytest.fixture(scope="module")
def errors(commands, misspelled):
    """`parse_errors` of the pages' commands and the misspelled one, in one process."""
    return parse_errors(commands + misspelled)


def test_the_pages_show_commands(commands):
    scripts = {script for _, script, _, _ in commands}
    assert {
        "experiments/train.py",
        "experiments/evaluate.py",
        "experiments/benchmark.py",
    } <= scripts
    assert any(module for _, _, module, _ in commands)


def test_every_documented_script_and_module_exists(commands):
    missing = [
        f"{where}: {script or module}"
        for where, script, module, _ in commands
        if not (
            (REPO / script).is_file()
            if script
            else (REPO / (module.replace(".", "/") + ".py")).is_file()
        )
    ]
    assert not missing, f"commands naming no file of the repository: {missing}"


def test_every_documented_command_line_parses(errors):
    wrong = {where: error for where, error in errors.items() if not where.startswith("page.md:")}
    assert not wrong, "\n".join(f"{where}: {error}" for where, error in wrong.items())


def test_a_misspelled_flag_fails_naming_its_line(errors):
    mistakes = {where: error for where, error in errors.items() if where.startswith("page.md:")}
    assert list(mistakes) == ["page.md:4"] and "nodecoding_rowz" in mistakes["page.md:4"], mistakes


def test_documented_shared_data_exists():
    if not (SHARED_DIR / "data").is_dir():
        pytest.skip(f"the shared data is not at {SHARED_DIR / 'data'}")
    missing = sorted(
        {
            f"{doc.relative_to(REPO)}:{number}: {path}"
            for doc in DOCS
            for number, line in code_lines(doc)
            for path in SHARED_DATA.findall(line)
            if not (REPO / path).exists()
        }
    )
    assert not missing, f"shared data paths that are not there: {missing}"
