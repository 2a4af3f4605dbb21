r"""keras_hub_accelerator: ours against the keras-hub peer on JAX or PyTorch, e.g. on a GPU (keras_transformer.benchmark.accelerator).

    python experiments/benchmark_accelerator.py --work_dir=/tmp/gpu_batches --preset=base --vocabulary_size=8000 \
        --data_dir=../shared/data/multi30k --batch_tokens=25000 --precision=mixed_bfloat16

Writes the work directory (the config and Multi30k batches from our bucketed pipeline, the
--num_shapes most common batch shapes, up to --per_shape batches each), then, unless
--noworkers, runs one process per backend in --backends here, each timing both models
over the batches (`python -m keras_transformer.benchmark.accelerator WORK_DIR`, which is
also the command for a machine with JAX or PyTorch and no TensorFlow). Prints the machine
and, per backend, both models' real target tokens/s, TFLOP/s and MFU against the device's
peak, and their ratio.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

import subprocess
import sys
import tempfile
from pathlib import Path

from absl import flags

from keras_transformer import cli
from keras_transformer.benchmark.accelerator import prepare
from keras_transformer.benchmark.peaks import cpu_flags
from keras_transformer.data import Tokenizer, load_multi30k, train_sentencepiece

cli.define_config_flags("base")
flags.DEFINE_string("work_dir", None, "Where the batches, settings and results go.", required=True)
cli.define_multi30k_flags()
flags.DEFINE_integer("batch_tokens", 25000, "Token budget per batch (the paper's ~25,000).")
flags.DEFINE_integer(
    "num_shapes", 3, "The most common batch shapes timed (each compiles once per model)."
)
flags.DEFINE_integer("per_shape", 3, "Batches of each shape.")
flags.DEFINE_integer(
    "rounds", 3, "Alternating rounds; each batch keeps its fastest time per model."
)
flags.DEFINE_string("precision", "mixed_bfloat16", "Dtype policy of both models.")
flags.DEFINE_list("backends", ["jax"], "Backends to time here, one process each (jax, torch).")
flags.DEFINE_bool(
    "workers", True, "Time here after writing the work directory (--noworkers: only write it)."
)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    config = cli.config_from_flags()
    pairs = load_multi30k(FLAGS.src_lang, FLAGS.tgt_lang, "train", data_dir=FLAGS.data_dir)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = Tokenizer(
            train_sentencepiece(
                [text for pair in pairs for text in pair],
                Path(scratch) / "spm.model",
                config.vocabulary_size,
            )
        )
    settings = prepare(
        FLAGS.work_dir,
        config,
        pairs,
        tokenizer,
        FLAGS.precision,
        FLAGS.batch_tokens,
        num_shapes=FLAGS.num_shapes,
        per_shape=FLAGS.per_shape,
        rounds=FLAGS.rounds,
    )
    print(
        f"preset {FLAGS.preset} ({config.vocabulary_size} pieces), {len(settings['shapes'])} batches written to "
        f"{FLAGS.work_dir}; this machine's CPU flags: {cpu_flags()}"
    )
    if not FLAGS.workers:
        return
    for backend in FLAGS.backends:
        env = dict(os.environ, KERAS_BACKEND=backend)
        completed = subprocess.run(
            [sys.executable, "-m", "keras_transformer.benchmark.accelerator", FLAGS.work_dir],
            env=env,
            capture_output=True,
            text=True,
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"the {backend} process failed: {completed.stderr.strip().splitlines()[-1:]}"
            )
        print(completed.stdout.strip())


if __name__ == "__main__":
    cli.run(main)
