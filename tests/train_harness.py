"""Runs experiments/train.py as a real process, with test-chosen faults.

Environment variables (all optional):
    KT_KILL_ON_COMMIT=N   SIGKILL this process at the moment checkpoint N is being committed:
                          its data and index files are written, the checkpoint state file
                          that would make it the latest is not yet replaced.
    KT_DUMP_WEIGHTS=PATH  after training, save the model's weights to PATH (.npz).
    KT_FAULTS=JSON        calls that fail or kill the process (tests/faulty_fs.py, `environment`).
Arguments are the flags of experiments/train.py.
"""

import os
import runpy
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.faulty_fs import install_from_environment  # noqa: E402

install_from_environment()

kill_on_commit = os.environ.get("KT_KILL_ON_COMMIT")
if kill_on_commit:
    from tensorflow.python.lib.io import file_io

    write_state = file_io.atomic_write_string_to_file

    def atomic_write_string_to_file(filename, contents, overwrite=True):
        if (
            str(filename).endswith("checkpoint")
            and f'model_checkpoint_path: "ckpt-{kill_on_commit}"' in contents
        ):
            print(f"harness: killing during the commit of ckpt-{kill_on_commit}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return write_state(filename, contents, overwrite)

    file_io.atomic_write_string_to_file = atomic_write_string_to_file

dump_path = os.environ.get("KT_DUMP_WEIGHTS")
if dump_path:
    import numpy as np

    import keras_transformer.training as training

    train_translation = training.train_translation

    def train_and_dump(*args, **kwargs):
        trainer, results = train_translation(*args, **kwargs)
        np.savez(dump_path, *trainer.model.get_weights())
        return trainer, results

    training.train_translation = train_and_dump

sys.argv = [str(REPO / "experiments" / "train.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
