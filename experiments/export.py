r"""Export a trained run as a SavedModel for TF Serving (text in, text out), or for CTranslate2.

    python experiments/export.py --model_dir=runs/builtin_tiny --name=numbers

writes `saved_models/numbers/<next version>/` (see docs/serving.md), then prints the path,
the signatures and a translation made by the exported model, loaded back from disk.
Decoding settings are fixed in the export: beam size, length penalty, output length (the
run config's unless --beam_size, --length_penalty, --max_output_offset are given).
With --quantization=int8 the model is first quantized with Keras' `model.quantize("int8")`
(int8 weights, int8 matmuls; docs/serving.md).

    python experiments/export.py --model_dir=runs/builtin_tiny --format=ctranslate2 --quantization=int8

writes the CTranslate2 model directory `ctranslate2_models/builtin_tiny/` (see
docs/ctranslate2.md) and prints a translation made with it (the run config's beam size and
offset unless given, no length penalty). Its decoding settings are chosen when translating.

    python experiments/export.py --model_dir=runs/opus_en_de --format=transformers

writes `transformers_models/opus_en_de/`, which `MarianMTModel.from_pretrained` and
`MarianTokenizer.from_pretrained` load: a run imported from OPUS-MT (experiments/import_model.py),
fine-tuned or not (docs/pretrained.md). A run whose options Marian cannot express is refused
in one line naming the option.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ log lines only when asked for
# The package imports TensorFlow with its start-up lines hidden (keras_transformer.QUIET_IMPORT).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET_IMPORT", "1")


from absl import app, flags

import keras_transformer  # noqa: F401  first: it imports TensorFlow quietly, as asked above

# isort: split
import tensorflow as tf

from keras_transformer import cli, fs
from keras_transformer.decoding.translator import load_export
from keras_transformer.export import (
    DEFAULT_WARMUP_SENTENCES,
    TranslationModule,
    export_saved_model,
    format_signatures,
    serving_commands,
    validation_sample,
)
from keras_transformer.export.parser import ParsingModule, is_parsing_run
from keras_transformer.runs import read_run_config, run_tokenizer

FORMATS = ("saved_model", "ctranslate2", "transformers")
DEFAULT_EXPORT_DIRS = {
    "saved_model": "saved_models",
    "ctranslate2": "ctranslate2_models",
    "transformers": "transformers_models",
}

flags.DEFINE_string(
    "model_dir", None, "Run directory written by experiments/train.py.", required=True
)
cli.define_checkpoint_flags()
flags.DEFINE_enum(
    "format",
    "saved_model",
    list(FORMATS),
    "A SavedModel for TF Serving, a CTranslate2 model directory, or a transformers MarianMTModel "
    "directory (a run imported from OPUS-MT, docs/pretrained.md).",
)
flags.DEFINE_enum(
    "quantization",
    "float32",
    ["float32", "int8"],
    "Weight type: int8 quantizes a SavedModel's model with Keras' model.quantize('int8') (docs/serving.md), or "
    "writes CTranslate2's int8 weights (docs/ctranslate2.md).",
)
flags.DEFINE_bool(
    "overwrite", False, "Replace an existing CTranslate2 or transformers model directory."
)
flags.DEFINE_string(
    "export_dir",
    None,
    "Root of the exported models (default: saved_models, ctranslate2_models for CTranslate2, "
    "transformers_models for transformers).",
)
flags.DEFINE_string(
    "name",
    None,
    "Model name, the directory under --export_dir (default: the run directory's name).",
)
flags.DEFINE_integer(
    "version",
    None,
    "Version number (default: the next free one, above every version and every number another export holds). "
    "An existing version, or one another export is writing, is refused.",
)
cli.define_search_flags(batch_size=None, method=False)  # beam search; unset: the run config's
flags.DEFINE_integer(
    "max_output_length",
    None,
    "A static output buffer length L for every call (the width of translate_ids' token_ids). Default: none, each "
    "call's buffer is its padded source width + --max_output_offset, so the offset alone limits outputs.",
)
flags.DEFINE_integer(
    "max_source_length",
    None,
    "Sources are cut to this many tokens, EOS included (default: the model's max_length).",
)
flags.DEFINE_multi_string(
    "warmup_sentences",
    list(DEFAULT_WARMUP_SENTENCES),
    "Source texts of the TF Serving warmup requests (repeat the flag).",
)
cli.define_vocabulary_map_flag()
flags.DEFINE_bool(
    "check_ops",
    True,
    "Refuse to publish a SavedModel with ops the stock TF Serving model server lacks.",
)
flags.DEFINE_string(
    "sample",
    None,
    "Text to translate with the loaded export (default: the first sentence of the run's validation split).",
)

FLAGS = flags.FLAGS


def main(argv):
    del argv
    cli.quiet_info_logs()
    if FLAGS.checkpoint and FLAGS.average_last:
        raise app.UsageError("Pass --checkpoint or --average_last, not both.")
    export_dir = FLAGS.export_dir or DEFAULT_EXPORT_DIRS[FLAGS.format]
    config, run = read_run_config(FLAGS.model_dir)
    options = cli.search_options(config, method="beam")
    if FLAGS.format == "ctranslate2":
        export_for_ctranslate2(export_dir, options)
        return
    if FLAGS.format == "transformers":
        export_for_transformers(export_dir, options)
        return
    cli.step(f"Loading {FLAGS.model_dir}")
    module = (
        ParsingModule if is_parsing_run(FLAGS.model_dir) else TranslationModule
    )  # --dataset=ptb: trees out
    if module is ParsingModule and FLAGS.vocabulary_map:
        raise app.UsageError(
            "--vocabulary_map applies to translation runs: a parse's tree constraint needs the full "
            "vocabulary."
        )
    translator = module.from_run(
        FLAGS.model_dir,
        checkpoint=FLAGS.checkpoint,
        average_last=FLAGS.average_last,
        quantization=None if FLAGS.quantization == "float32" else FLAGS.quantization,
        beam_size=options.beam_size,
        length_penalty=options.length_penalty,
        max_output_offset=options.max_output_offset,
        max_output_length=FLAGS.max_output_length,
        max_source_length=FLAGS.max_source_length,
        vocabulary_map=cli.vocabulary_map(FLAGS.model_dir),
    )
    name = FLAGS.name or fs.name(FLAGS.model_dir)
    result = export_saved_model(
        translator,
        export_dir,
        name=name,
        version=FLAGS.version,
        warmup_sentences=FLAGS.warmup_sentences,
        check_ops=FLAGS.check_ops,
        data=run.get("data"),  # evaluate.py --saved_model scores the export on it
        progress=cli.step,
    )
    print(
        f"Exported {result.path}"
        + (" (int8 weights: model.quantize('int8'))" if FLAGS.quantization == "int8" else "")
    )
    print(f"Settings: {', '.join(f'{key}={value}' for key, value in translator.settings.items())}")
    print("Signatures:")
    for line in format_signatures(result.signatures).splitlines():
        print(f"  {line}")
    if result.ops is not None:
        print(
            f"Ops: {len(result.ops.origins)} types, all TensorFlow core or TensorFlow Text (SentencePiece)."
        )
    print(f"TF Serving model config: {result.model_config}")

    loaded = load_export(result.path)
    sample = _sample()
    outputs = loaded.signatures["serving_default"](text=tf.constant([sample]))
    translation = outputs["translation"].numpy()[0].decode("utf-8")
    print(
        f"Sample (loaded export): {sample!r} -> {translation!r} (score {float(outputs['score'].numpy()[0]):.4f})"
    )
    docker_run, curl = serving_commands(fs.parent(result.path), name, sample)
    print("Serve it with TF Serving, then ask it (docs/serving.md):")
    print(f"  {docker_run}")
    print(f"  {curl}")


def export_for_ctranslate2(export_dir, options):
    """`--format=ctranslate2`: write the model directory, translate the sample with it.

    The sample is decoded with `options`' beam size and offset (the run config's unless
    given) and no length penalty (CTranslate2's |Y|^alpha is not the GNMT penalty).
    """
    if FLAGS["length_penalty"].present:
        raise app.UsageError(
            "--length_penalty applies to --format=saved_model (the CTranslate2 sample uses none)."
        )
    import ctranslate2

    from keras_transformer.export.ctranslate2 import export_ctranslate2, translate_ctranslate2

    name = FLAGS.name or fs.name(FLAGS.model_dir)
    path = export_ctranslate2(
        FLAGS.model_dir,
        fs.join(export_dir, name),
        quantization=FLAGS.quantization,
        checkpoint=FLAGS.checkpoint,
        average_last=FLAGS.average_last,
        overwrite=FLAGS.overwrite,
        vocabulary_map=cli.vocabulary_map(FLAGS.model_dir),
    )
    print(
        f"Exported {path} (CTranslate2, {FLAGS.quantization}"
        + (", vmap.txt: translate with use_vmap=True)" if FLAGS.vocabulary_map else ")")
    )
    config, _ = read_run_config(FLAGS.model_dir)
    sample = _sample()
    tokenizer = run_tokenizer(path)  # the copy beside the model: spm.model or a Marian pair
    with fs.local_copy(path) as local:  # CTranslate2 reads local files only
        translator = ctranslate2.Translator(str(local), device="cpu")
        outputs, scores = translate_ctranslate2(
            translator,
            tokenizer,
            [sample],
            beam_size=options.beam_size,
            max_output_offset=options.max_output_offset,  # and translate_ctranslate2's length_penalty=0
            max_source_length=FLAGS.max_source_length or config.max_length,
            use_vmap=bool(FLAGS.vocabulary_map),
        )
    translation = tokenizer.detokenize([outputs[0]]).numpy()[0].decode("utf-8")
    print(
        f"Sample (loaded export): {sample!r} -> {translation!r} (log-probability {scores[0]:.4f})"
    )


def _sample():
    """The sentence an export translates once loaded: --sample, else a validation sentence of
    the run, else the first warmup sentence."""
    if FLAGS.sample is not None:
        return FLAGS.sample
    try:
        return validation_sample(FLAGS.model_dir)
    except (OSError, ValueError) as err:  # e.g. a corpus directory that moved since training
        cli.step(
            f"No sentence of the run's validation split ({err}); the sample is the first warmup sentence"
        )
        return FLAGS.warmup_sentences[0]


def export_for_transformers(export_dir, options):
    """`--format=transformers`: write the MarianMTModel directory, translate the sample with it
    (`MarianMTModel.generate` with `options`' beam size, greedy at 1; its own length penalty)."""
    from keras_transformer.pretrained import export_marian

    name = FLAGS.name or fs.name(FLAGS.model_dir)
    path = fs.join(export_dir, name)
    if fs.exists(path) and not FLAGS.overwrite:
        raise app.UsageError(f"{path} exists: pass --overwrite to replace it")
    export_marian(FLAGS.model_dir, path, FLAGS.checkpoint, FLAGS.average_last)
    print(f"Exported {path} (transformers: MarianMTModel, MarianTokenizer)")
    from transformers import MarianMTModel, MarianTokenizer

    model = MarianMTModel.from_pretrained(str(path)).eval()
    tokenizer = MarianTokenizer.from_pretrained(str(path))
    sample = _sample()
    inputs = tokenizer([sample], return_tensors="pt")
    generated = model.generate(
        **inputs,
        num_beams=options.beam_size,
        max_new_tokens=inputs["input_ids"].shape[1] + options.max_output_offset,
    )
    translation = tokenizer.decode(generated[0], skip_special_tokens=True)
    print(f"Sample (loaded export): {sample!r} -> {translation!r}")


if __name__ == "__main__":
    cli.run(main)
