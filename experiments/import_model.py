r"""Import an OPUS-MT (Marian) checkpoint in Hugging Face `transformers` format as a run.

    python experiments/import_model.py --from=opus-mt-en-de --model_dir=runs/opus_en_de

reads the directory (`config.json`, `model.safetensors` or `pytorch_model.bin`, `source.spm`,
`target.spm`, `vocab.json`) and writes the run directory: its `config.json`, the tokenizer
files, `checkpoints/ckpt-0` (the weights, no optimizer state) and `flags.txt`.
`translate.py`, `evaluate.py` and `export.py` then use it as a trained run, and

    python experiments/train.py --flagfile=runs/opus_en_de/flags.txt --dataset=multi30k \
        --data_dir=../shared/data/multi30k --train_steps=2000

fine-tunes it, the learning-rate schedule starting at step 0. With `huggingface_hub`
installed and the machine online, --from may be a hub name (`Helsinki-NLP/opus-mt-en-de`).
See docs/pretrained.md.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")

from absl import flags

from keras_transformer import cli
from keras_transformer.pretrained import import_marian

flags.DEFINE_string(
    "from",
    None,
    "A Marian directory in transformers format, or a hub name (needs huggingface_hub, online).",
    required=True,
)
flags.DEFINE_string(
    "model_dir", None, "The run directory to write (must not hold a run).", required=True
)

FLAGS = flags.FLAGS


def main(argv):
    del argv
    cli.quiet_info_logs()
    model_dir = import_marian(FLAGS["from"].value, FLAGS.model_dir)
    print(f"Imported {FLAGS['from'].value} into {model_dir}")
    print(f"Fine-tune: python experiments/train.py --flagfile={model_dir}/flags.txt --dataset=...")


if __name__ == "__main__":
    cli.run(main)
