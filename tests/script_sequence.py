"""Run several experiments/ scripts one after another in this one process, each as `python <script> <args>` would.

    python tests/script_sequence.py '[["train.py", ["--model_dir=..."]], ["translate.py", [...]]]'

TensorFlow is imported once, so a sequence costs one process start-up, not one per
script. Each script starts with only absl's own flags defined (the previous script's
are removed) and nothing parsed. After each, `== <script> exit <status>` is printed;
the sequence stops at the first script that fails.
"""

import json
import runpy
import sys
from pathlib import Path

from absl import app, flags, logging  # noqa: F401  (their flags are the baseline)

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def main():
    baseline = set(flags.FLAGS)
    for script, args in json.loads(sys.argv[1]):
        for name in set(flags.FLAGS) - baseline:
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
        sys.argv = [str(EXPERIMENTS / script), *args]
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
            status = 0
        except SystemExit as exit:
            status = exit.code or 0
        print(f"== {script} exit {status}", flush=True)
        if status:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
