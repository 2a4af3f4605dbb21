r"""Average the last K checkpoints of a run into a new checkpoint (paper section 6.1).

    python experiments/average_checkpoints.py --model_dir=runs/builtin_tiny --last=5

writes `runs/builtin_tiny/averaged/ckpt-<step>` (model weights only), which
`experiments/export.py --checkpoint=...` and the evaluation tools accept. The checkpoint is
written beside it first and published with its `.index` last (`fs.publish_prefix`), so a
reader that finds the `.index` finds its data; a second averaging into the same checkpoint
at the same time is refused in one line.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

from absl import flags

from keras_transformer import cli
from keras_transformer.training.checkpoints import write_averaged_checkpoint

flags.DEFINE_string(
    "model_dir", None, "Run directory written by experiments/train.py.", required=True
)
flags.DEFINE_integer(
    "last",
    None,
    "How many of the latest checkpoints to average (default: the config's average_checkpoints).",
)
flags.DEFINE_string(
    "output_dir", None, "Where to write the averaged checkpoint (default: <model_dir>/averaged)."
)

FLAGS = flags.FLAGS


def main(argv):
    del argv
    path, sources = write_averaged_checkpoint(FLAGS.model_dir, FLAGS.last, FLAGS.output_dir)
    print(f"Averaged {len(sources)} checkpoints:")
    for source in sources:
        print(f"  {source}")
    print(f"Wrote {path}")


if __name__ == "__main__":
    cli.run(main)
