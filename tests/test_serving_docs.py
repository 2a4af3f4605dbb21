"""docs/serving.md's export command prints what the docs show (settings, signatures, op count)."""

import re
import shlex
import subprocess
import sys

from tests.scripts import REPO, script_environment

DOC = REPO / "docs" / "serving.md"


def documented_export():
    """The "## Export" section's command (argv) and its sample output (lines)."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Export\n")
    section = text[start : text.index("\n## ", start + 1)]
    command = re.search(r"```bash\n(python experiments/export\.py [^\n]*)\n```", section).group(1)
    output = re.search(r"```\n(\.\.\. .*?)\n```", section, flags=re.DOTALL).group(1)
    return shlex.split(command), output.splitlines()


def comparable(line):
    """A printed line with what differs between machines and trainings masked: the absolute
    model root in `docker run`, and the sample's translation and score."""
    line = re.sub(r"source=[^,]+,", "source=<model root>,", line)
    return re.sub(r" -> '.*' \(score -?\d+\.\d+\)$", " -> <translation> (score <score>)", line)


def test_documented_export_prints_what_the_docs_show(trained_run, tmp_path):
    argv, documented = documented_export()
    model_dir = next(arg.split("=", 1)[1] for arg in argv if arg.startswith("--model_dir="))
    assert model_dir == "runs/builtin_tiny"  # the tests' tiny run stands in for it
    (tmp_path / "runs").mkdir()
    (tmp_path / model_dir).symlink_to(trained_run, target_is_directory=True)
    result = subprocess.run(
        [sys.executable, str(REPO / argv[1]), *argv[2:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=script_environment(),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    progress = [line for line in result.stderr.splitlines() if line.startswith("... ")]
    printed = progress + result.stdout.splitlines()
    assert [comparable(line) for line in printed] == [comparable(line) for line in documented], (
        result.stdout
    )
    # Not masked: the settings, the signatures and the op count, line for line.
    for key in ("Settings: ", "Ops: ", "  translate_nbest(", "  translate_ids("):
        assert [line for line in printed if line.startswith(key)] == [
            line for line in documented if line.startswith(key)
        ]
    # The op check command of the "## Op allowlist" section, on the same export.
    text = DOC.read_text(encoding="utf-8")
    command, listing = re.search(
        r"```bash\n(python -m keras_transformer\.export\.ops_check [^\n]*)\n```\n\n```\n(.*?)\n```",
        text,
        flags=re.DOTALL,
    ).groups()
    checked = subprocess.run(
        [sys.executable, *shlex.split(command)[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=script_environment(),
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert checked.stdout.splitlines() == listing.splitlines()
