"""Clean virtual environments holding only a released serving runtime (TensorFlow + TensorFlow Text).

An exported SavedModel is served by the `tensorflow/serving` images, each linking one
TensorFlow and its TensorFlow Text. The test of the export loads it in a fresh process of
such an environment, created here with `python -m venv` and `pip install` (only the two
packages and their own dependencies) and reused from a cache directory:

    ${KERAS_TRANSFORMER_RUNTIME_CACHE:-~/.cache/keras_transformer/runtimes}/tf-<version>/

A finished environment holds `runtime.json` (the installed versions); an environment
without it (an interrupted creation) is removed and created again. A file lock lets
several pytest workers share one cache.

Which runtimes the tests check: `DEFAULT_RUNTIMES` (the newest released model server's),
or the comma-separated list in `KERAS_TRANSFORMER_TEST_RUNTIMES` (e.g. "2.20,2.19,2.18";
"none" checks no clean runtime).
"""

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Runtime -> the pip requirements of its environment (TensorFlow and the TensorFlow Text
# built against it), as inside the tensorflow/serving image of that version.
RUNTIMES = {
    "2.20": ("tensorflow==2.20.*", "tensorflow-text==2.20.*"),
    "2.19": ("tensorflow==2.19.*", "tensorflow-text==2.19.*"),
    "2.18": ("tensorflow==2.18.*", "tensorflow-text==2.18.*"),
}
DEFAULT_RUNTIMES = ("2.20",)
RUNTIMES_ENV = "KERAS_TRANSFORMER_TEST_RUNTIMES"
CACHE_ENV = "KERAS_TRANSFORMER_RUNTIME_CACHE"
RUNTIME_FILE = "runtime.json"

_VERSIONS_SCRIPT = (
    "import json, importlib.metadata as m; "
    "print(json.dumps({p: m.version(p) for p in ('tensorflow', 'tensorflow-text')}))"
)


def selected_runtimes():
    """The runtimes to check: `KERAS_TRANSFORMER_TEST_RUNTIMES`, else `DEFAULT_RUNTIMES`."""
    value = os.environ.get(RUNTIMES_ENV)
    if value is None:
        return list(DEFAULT_RUNTIMES)
    if value.strip().lower() == "none":
        return []
    runtimes = [item.strip() for item in value.split(",") if item.strip()]
    unknown = [item for item in runtimes if item not in RUNTIMES]
    if unknown:
        raise ValueError(
            f"{RUNTIMES_ENV} names unknown runtimes {unknown}; known: {sorted(RUNTIMES)}"
        )
    return runtimes


def cache_dir():
    """Where the environments live (outside the repository)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "keras_transformer" / "runtimes"


def _python(venv):
    return venv / "bin" / "python"


def runtime_python(runtime, timeout=1800):
    """The interpreter of the clean environment for `runtime` ("2.20"), created if missing.

    Returns:
        `(python path, {"tensorflow": "2.20.0", "tensorflow-text": "2.20.1"}, seconds spent creating it)`;
        0.0 seconds when the cached environment was reused.
    """
    requirements = RUNTIMES[runtime]
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"tf-{runtime}"
    with open(root / f"tf-{runtime}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be creating it
        marker = venv / RUNTIME_FILE
        if marker.is_file():
            info = json.loads(marker.read_text())
            if info.get("requirements") == list(requirements) and _python(venv).exists():
                return _python(venv), info["versions"], 0.0
        start = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=timeout)
        env = {
            key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PIP_USER")
        }
        install = subprocess.run(
            [
                str(_python(venv)),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-cache-dir",
                "-q",
                *requirements,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        if install.returncode != 0:
            raise RuntimeError(
                f"pip install {' '.join(requirements)} into {venv} failed:\n{install.stderr[-3000:]}"
            )
        found = subprocess.run(
            [str(_python(venv)), "-c", _VERSIONS_SCRIPT],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=True,
        )
        versions = json.loads(found.stdout)
        marker.write_text(
            json.dumps({"requirements": list(requirements), "versions": versions}, indent=2) + "\n"
        )
        return _python(venv), versions, time.monotonic() - start
