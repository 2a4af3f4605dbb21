r"""Restart cost early and late in a run (keras_transformer.benchmark.restart).

    python experiments/benchmark_restart.py --work_dir=/tmp/restart --pairs=1000000

Trains one update on `--pairs` synthetic sentence pairs, copies the run to steps
--steps (the input's position moved with the step), and times launch -> first update of
`train.py` resuming each, alternating over --rounds. Prints the machine (CPU flags and
peak) and the fastest and every time per step, and the ratio late/early.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

from pathlib import Path

from absl import flags

from keras_transformer import cli
from keras_transformer.benchmark.peaks import hardware_peak
from keras_transformer.benchmark.restart import (
    restart_times,
    time_to_first_update,
    write_synthetic_corpus,
)

flags.DEFINE_string("work_dir", None, "Where the corpus and runs go.", required=True)
flags.DEFINE_integer("pairs", 1_000_000, "Synthetic training sentence pairs.")
flags.DEFINE_list("steps", ["100", "100000"], "Resume positions (updates done).")
flags.DEFINE_integer("rounds", 3, "Alternating launches per position.")
FLAGS = flags.FLAGS

MODEL_FLAGS = [
    "--num_encoder_layers=1",
    "--num_decoder_layers=1",
    "--hidden_dim=32",
    "--intermediate_dim=64",
    "--num_heads=2",
    "--vocabulary_size=256",
    "--max_length=48",
    "--batch_tokens=2048",
    "--eval_every=0",
    "--checkpoint_every=1000000",
]


def main(argv):
    del argv
    work_dir = Path(FLAGS.work_dir)
    corpus = work_dir / "corpus"
    if not (corpus / "train.en").exists():
        write_synthetic_corpus(corpus, FLAGS.pairs)
    train_flags = [
        "--dataset=files",
        *(
            f"--{split}_{side}={corpus}/{split}.{lang}"
            for split in ("train", "val")
            for side, lang in (("src", "en"), ("tgt", "de"))
        ),
        *MODEL_FLAGS,
    ]
    if not (work_dir / "base").exists():
        time_to_first_update(work_dir / "base", train_flags, 0)
    print(hardware_peak().describe())
    timings = restart_times(
        work_dir, train_flags, steps=[int(step) for step in FLAGS.steps], rounds=FLAGS.rounds
    )
    for timing in timings:
        print(
            f"resume at update {timing.step:>7,}: fastest {min(timing.seconds):.1f} s "
            f"(all: {', '.join(f'{s:.1f}' for s in timing.seconds)})"
        )
    print(f"late / early: {min(timings[-1].seconds) / min(timings[0].seconds):.2f}")


if __name__ == "__main__":
    cli.run(main)
