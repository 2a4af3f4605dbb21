"""Run several experiments/ scripts one after another in this one process, each as `python <script> <args>` would.

    python tests/script_sequence.py '[["train.py", ["--model_dir=..."]], ["translate.py", [...], {...}]]'

TensorFlow is imported once, so a sequence costs one process start-up, not one per
script. Each script starts with only absl's own flags defined (the previous script's
are removed) and nothing parsed. After each, `== <script> exit <status>` is printed;
the sequence stops at the first script whose status is not the expected one. A step's
optional third element may hold `"status"` (the expected exit status, default 0) and
`"file_size_limit"` (bytes: the step runs with RLIMIT_FSIZE lowered to it, SIGXFSZ
ignored, so a write past it fails as on a full disk; the limit is lifted afterwards).
"""

import json
import resource
import runpy
import signal
import sys
from pathlib import Path

from absl import app, flags, logging  # noqa: F401  (their flags are the baseline)

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def main():
    app.define_help_flags()  # absl defines --help once per process, at the first app.run
    baseline = set(flags.FLAGS)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    for script, args, *options in json.loads(sys.argv[1]):
        options = options[0] if options else {}
        for name in set(flags.FLAGS) - baseline:
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
        sys.argv = [str(EXPERIMENTS / script), *args]
        resource.setrlimit(resource.RLIMIT_FSIZE, (options.get("file_size_limit", hard), hard))
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
            status = 0
        except SystemExit as exit:
            status = exit.code or 0
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        print(f"== {script} exit {status}", flush=True)
        if status != options.get("status", 0):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
