"""docs/distributed.md's `model.fit` under `MirroredStrategy` example runs as written."""

import re
import subprocess
import sys
from pathlib import Path

from tests.scripts import script_environment

DOC = Path(__file__).resolve().parents[1] / "docs" / "distributed.md"


def section(title):
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_fit_under_mirrored_strategy_example_trains(tmp_path):
    text = section("`model.fit` and which path to take")
    code, printed = re.findall(r"```(?:python)?\n(.*?)```", text, flags=re.DOTALL)[:2]
    (tmp_path / "example.py").write_text(code)
    # A fresh process: the example splits the CPU before TensorFlow starts.
    result = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=script_environment(),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith(("Epoch", "40/40"))]
    documented = printed.strip().splitlines()
    shape = re.compile(r"\d+(\.\d+)?m?s")  # times vary from run to run
    assert [shape.sub("T", line.rsplit("loss:", 1)[0]) for line in lines] == [
        shape.sub("T", line.rsplit("loss:", 1)[0]) for line in documented
    ], lines
    losses = [float(line.rsplit("loss:", 1)[1]) for line in lines if "loss:" in line]
    assert len(losses) == 2 and losses[1] < 0.8 * losses[0], losses
