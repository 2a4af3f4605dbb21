"""OPUS-MT (Marian) checkpoints in Hugging Face `transformers` format: read into a run, written back.

A Marian directory (what `MarianMTModel.save_pretrained` and `MarianTokenizer.save_pretrained`
write, and what the hub's `Helsinki-NLP/opus-mt-*` repositories hold) has `config.json`, the
weights (`model.safetensors` or `pytorch_model.bin`) and the tokenizer: `source.spm`,
`target.spm` and `vocab.json`. Its model is the paper's post-LN Transformer with options our
`TransformerConfig` names: sin||cos positions (`sinusoid_layout="concatenated"`), SiLU
("swish"), a final-logits bias, layer-norm epsilon 1e-5 and one embedding matrix shared by
the encoder, the decoder and the output projection, scaled by sqrt(d_model).

`import_marian(source, model_dir)` writes a run directory (`runs`' layout: `config.json`, the
tokenizer files, `checkpoints/ckpt-0` holding the model's weights and no optimizer state)
that `load_run`, `translate.py`, `evaluate.py`, `export.py` and `train.py` (fine-tuning,
the learning-rate schedule from step 0) use as a trained run. `export_marian(model_dir,
output_dir)` writes a run back as a Marian directory.

Ids: our id space is Marian's plus one row (`data.marian.marian_id_map`): Marian's pad is
our PAD, its unk our UNK, its eos our EOS, and our BOS row, which starts the decoder, is a
copy of Marian's pad row (Marian starts generation from the pad id). `weight_table` maps
each Marian weight to ours, in both directions (`to_ours`, `to_marian`).

What a Marian checkpoint may set that our model cannot represent is refused in one line
naming the option (`MarianFormatError`): pre-LN (`normalize_before`), unscaled embeddings
(`scale_embedding=false`), different encoder and decoder head counts or feed-forward widths,
an activation other than swish/silu or relu, ... Separate source and target vocabularies
(`target_vocab.json`, `share_encoder_decoder_embeddings=false`) are read as our
`share_embeddings=False` with a `target_vocabulary_size` of its own.
"""

import json

import numpy as np

from keras_transformer import fs
from keras_transformer.data.marian import (
    MARIAN_FILES,
    TARGET_VOCAB_FILE,
    TOKENIZER_CONFIG_FILE,
    MarianFilesError,
    marian_id_inverse,
    marian_row_map,
    read_marian_files,
)

MARIAN_CONFIG_FILE = "config.json"  # transformers' names in a Marian directory
GENERATION_CONFIG_FILE = "generation_config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # the first one present is read

LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which Marian's layer norms use
# Marian's activation_function -> ours.
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu"}

# config.json fields our Marian models have at one value: BART-era fields some OPUS-MT files
# still carry, which transformers' Marian ignores (it computes the post-LN model with
# sinusoids, so another value asks for a model it would not compute), and the options it
# honours that our model has no field for (unscaled embeddings, an untied output projection).
_FIXED_FIELDS = {
    "normalize_before": False,
    "add_final_layer_norm": False,
    "normalize_embedding": False,
    "static_position_embeddings": True,
    "scale_embedding": True,
    "tie_word_embeddings": True,
    "add_bias_logits": False,
}


class MarianFormatError(ValueError):
    """A Marian directory we cannot read, or a run Marian cannot express: one line naming why."""


# --- the weight table ---

# (Marian name, our weight path, kind). Kinds:
#   "source_rows", "target_rows": rows in Marian's id order <-> rows in ours (`to_ours`,
#       `to_marian`), by the source or the target side's id map (the same when shared);
#   "input_kernel": torch Linear weight (H * Dk, D) <-> our (D, H, Dk) projection kernel;
#   "input_bias": (H * Dk,) <-> (H, Dk);
#   "output_kernel": torch Linear weight (D, H * Dv) <-> our (H, Dv, D);
#   "dense": torch Linear weight (out, in) <-> Keras Dense kernel (in, out);
#   "same": the same array.
_EMBEDDING = ("model.shared.weight", "token_embedding/embeddings", "source_rows")
_EMBEDDINGS = (  # separate vocabularies: the decoder's is also the output projection
    ("model.encoder.embed_tokens.weight", "token_embedding/embeddings", "source_rows"),
    ("model.decoder.embed_tokens.weight", "target_token_embedding/embeddings", "target_rows"),
)
_LOGITS_BIAS = ("final_logits_bias", "final_logits_bias/bias", "target_rows")


def _attention(marian, ours):
    rows = []
    for name in ("q", "k", "v"):
        our_name = {"q": "query", "k": "key", "v": "value"}[name]
        rows.append((f"{marian}.{name}_proj.weight", f"{ours}/{our_name}_kernel", "input_kernel"))
        rows.append((f"{marian}.{name}_proj.bias", f"{ours}/{our_name}_bias", "input_bias"))
    rows.append((f"{marian}.out_proj.weight", f"{ours}/output_kernel", "output_kernel"))
    rows.append((f"{marian}.out_proj.bias", f"{ours}/output_bias", "same"))
    return rows


def _norm(marian, ours):
    return [
        (f"{marian}.weight", f"{ours}/gamma", "same"),
        (f"{marian}.bias", f"{ours}/beta", "same"),
    ]


def _feed_forward(marian, ours):
    return [
        (f"{marian}.fc1.weight", f"{ours}/feed_forward/intermediate_dense/kernel", "dense"),
        (f"{marian}.fc1.bias", f"{ours}/feed_forward/intermediate_dense/bias", "same"),
        (f"{marian}.fc2.weight", f"{ours}/feed_forward/output_dense/kernel", "dense"),
        (f"{marian}.fc2.bias", f"{ours}/feed_forward/output_dense/bias", "same"),
        *_norm(f"{marian}.final_layer_norm", f"{ours}/feed_forward_layer_norm"),
    ]


def weight_table(config):
    """`[(Marian name, our weight path, kind)]` for every weight of a Marian model of `config`'s
    shape (its layer counts): the one table both directions use."""
    rows = [_EMBEDDING] if config.share_embeddings else list(_EMBEDDINGS)
    rows.append(_LOGITS_BIAS)
    for i in range(config.num_encoder_layers):
        marian, ours = f"model.encoder.layers.{i}", f"encoder_layer_{i}"
        rows += _attention(f"{marian}.self_attn", f"{ours}/self_attention")
        rows += _norm(f"{marian}.self_attn_layer_norm", f"{ours}/self_attention_layer_norm")
        rows += _feed_forward(marian, ours)
    for i in range(config.num_decoder_layers):
        marian, ours = f"model.decoder.layers.{i}", f"decoder_layer_{i}"
        rows += _attention(f"{marian}.self_attn", f"{ours}/self_attention")
        rows += _norm(f"{marian}.self_attn_layer_norm", f"{ours}/self_attention_layer_norm")
        rows += _attention(f"{marian}.encoder_attn", f"{ours}/cross_attention")
        rows += _norm(f"{marian}.encoder_attn_layer_norm", f"{ours}/cross_attention_layer_norm")
        rows += _feed_forward(marian, ours)
    return rows


# The names a tied embedding is saved under (transformers keeps one of them): the shared
# one's, and the decoder's with separate vocabularies.
_EMBEDDING_ALIASES = {
    "model.shared.weight": (
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
        "lm_head.weight",
    ),
    "model.decoder.embed_tokens.weight": ("lm_head.weight",),
}


def to_ours(kind, value, config, id_maps):
    """A Marian weight `value` (numpy) as our weight of that `kind` (`weight_table`).

    `id_maps`: `(source, target)`, our id of each Marian id of each side
    (`data.marian.marian_id_map`; the same array twice with a shared vocabulary).
    """
    heads = config.num_heads
    if kind in ("source_rows", "target_rows"):  # our BOS row, the start, is Marian's pad row
        rows = value.reshape(-1) if value.shape[0] == 1 else value  # final_logits_bias: (1, V)
        return rows[marian_id_inverse(id_maps[kind == "target_rows"])]
    if kind == "input_kernel":
        return value.T.reshape(value.shape[1], heads, -1)
    if kind == "input_bias":
        return value.reshape(heads, -1)
    if kind == "output_kernel":
        return value.T.reshape(heads, -1, value.shape[0])
    if kind == "dense":
        return value.T
    return value


def to_marian(kind, value, config, id_maps):
    """Our weight `value` (numpy) as the Marian weight of that `kind` (the inverse of `to_ours`)."""
    if kind in ("source_rows", "target_rows"):  # Marian's pad row: our start (BOS) row
        rows = value[marian_row_map(id_maps[kind == "target_rows"])]  # our PAD row is dropped
        return rows[None] if value.ndim == 1 else rows  # final_logits_bias: (1, V)
    if kind == "input_kernel":
        return value.reshape(value.shape[0], -1).T
    if kind == "input_bias":
        return value.reshape(-1)
    if kind == "output_kernel":
        return value.reshape(-1, value.shape[-1]).T
    if kind == "dense":
        return value.T
    return value


def marian_shape(name, kind, marian):
    """The shape `config.json` (`marian`, a dict) gives Marian weight `name`."""
    width = marian["d_model"]
    vocabulary = marian["vocab_size"]
    if kind == "target_rows":
        vocabulary = marian.get("decoder_vocab_size") or vocabulary
    if name == "final_logits_bias":
        return (1, vocabulary)
    if kind in ("source_rows", "target_rows"):
        return (vocabulary, width)
    if ".fc1." in name:
        return (_ffn(name, marian),) if name.endswith("bias") else (_ffn(name, marian), width)
    if ".fc2." in name:
        return (width,) if name.endswith("bias") else (width, _ffn(name, marian))
    if name.endswith("bias") or "layer_norm" in name:
        return (width,)
    return (width, width)  # the attention projections


def _ffn(name, marian):
    return marian["encoder_ffn_dim" if name.startswith("model.encoder") else "decoder_ffn_dim"]


# --- config.json ---


def read_marian_config(directory):
    """The dict of a Marian directory's `config.json`.

    Raises:
        MarianFormatError: naming the directory when it has no config.json, or the file when
            it is not a JSON object of a Marian model (`model_type` "marian").
    """
    path = fs.join(directory, MARIAN_CONFIG_FILE)
    if not fs.isdir(directory):
        raise MarianFormatError(f"No such directory: {directory}")
    if not fs.exists(path):
        raise MarianFormatError(
            f"{directory} is not a Marian checkpoint: it has no {MARIAN_CONFIG_FILE}"
        )
    try:
        marian = json.loads(fs.read_text(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MarianFormatError(f"{path} is not JSON: {error}") from None
    if not isinstance(marian, dict) or marian.get("model_type") != "marian":
        found = marian.get("model_type") if isinstance(marian, dict) else None
        raise MarianFormatError(
            f"{path} is not a Marian model's config: model_type={found!r}, expected 'marian'"
        )
    return marian


def _marian_value(marian, name):
    """`marian[name]`, or transformers' `MarianConfig` default when the file leaves it out."""
    if name in marian:
        return marian[name]
    from transformers import MarianConfig

    return getattr(MarianConfig(), name)


def marian_model_config(marian, path=MARIAN_CONFIG_FILE):
    """Our `TransformerConfig` of a Marian `config.json` (a dict; `path` names it in errors).

    Raises:
        MarianFormatError: one line naming the first option our model cannot represent.
    """
    from keras_transformer.models.config import TransformerConfig

    def value(name):
        return _marian_value(marian, name)

    def refuse(name, why):
        raise MarianFormatError(f"{path}: {name}={value(name)!r} is not supported: {why}")

    for name, expected in _FIXED_FIELDS.items():
        if name in marian and marian[name] != expected:
            refuse(name, f"our Marian models have {name}={json.dumps(expected)}")
    shared = value("share_encoder_decoder_embeddings")
    if shared and value("decoder_vocab_size") not in (None, value("vocab_size")):
        refuse("decoder_vocab_size", "it differs from vocab_size, which the embeddings share")
    for encoder, decoder in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if value(encoder) != value(decoder):
            refuse(decoder, f"it differs from {encoder}={value(encoder)!r}")
    if value("activation_function") not in ACTIVATIONS:
        refuse("activation_function", f"the activations we read are {sorted(ACTIVATIONS)}")
    if value("decoder_start_token_id") != value("pad_token_id"):
        refuse(
            "decoder_start_token_id",
            f"decoding must start from the pad id (pad_token_id={value('pad_token_id')!r})",
        )
    if value("d_model") % 2 or value("d_model") % value("encoder_attention_heads"):
        refuse("d_model", "it must be even and a multiple of the attention heads")
    return TransformerConfig(
        vocabulary_size=value("vocab_size") + 1,  # our BOS, the start row, has no Marian id
        num_encoder_layers=value("encoder_layers"),
        num_decoder_layers=value("decoder_layers"),
        hidden_dim=value("d_model"),
        intermediate_dim=value("encoder_ffn_dim"),
        num_heads=value("encoder_attention_heads"),
        dropout=float(value("dropout")),
        attention_dropout=float(value("attention_dropout")),
        activation_dropout=float(value("activation_dropout")),
        activation=ACTIVATIONS[value("activation_function")],
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        normalize_first=False,
        positional="sinusoidal",
        sinusoid_layout="concatenated",
        final_logits_bias=True,
        max_length=value("max_position_embeddings"),
        share_embeddings=bool(shared),
        target_vocabulary_size=None if shared else value("decoder_vocab_size") + 1,
        tie_output=True,
    )


# What a run must hold for Marian to express it: field -> (value, what to say).
_EXPRESSIBLE = {
    "sinusoid_layout": "concatenated",
    "positional": "sinusoidal",
    "normalize_first": False,
    "tie_output": True,
    "final_logits_bias": True,
    "layer_norm_epsilon": LAYER_NORM_EPSILON,
    "key_dim": None,
    "value_dim": None,
    "attention_window": None,
}
_MARIAN_ACTIVATIONS = {"silu": "swish", "relu": "relu"}


def check_marian_expressible(config, name="the run"):
    """Raise `MarianFormatError`, one line naming the option, if `config` is not a Marian model."""
    for field, expected in _EXPRESSIBLE.items():
        if getattr(config, field) != expected:
            raise MarianFormatError(
                f"Marian cannot express {name}: {field}={getattr(config, field)!r} "
                f"(Marian has {field}={expected!r})"
            )
    if config.activation not in _MARIAN_ACTIVATIONS:
        raise MarianFormatError(
            f"Marian cannot express {name}: activation={config.activation!r} "
            f"(Marian's are {sorted(_MARIAN_ACTIVATIONS)})"
        )
    if config.num_encoder_layers < 1 or config.num_decoder_layers < 1:
        raise MarianFormatError(f"Marian cannot express {name}: it has no encoder or decoder layer")


def marian_config_dict(config, files):
    """The `config.json` dict of a Marian model of `config` over the vocabularies of `files`
    (`data.marian.MarianFiles`: each side's size is ours less one)."""
    pad, eos = files.target_vocabulary.pad_id, files.target_vocabulary.eos_id
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": files.source_vocabulary.size,
        "decoder_vocab_size": files.target_vocabulary.size,
        "d_model": config.hidden_dim,
        "encoder_layers": config.num_encoder_layers,
        "decoder_layers": config.num_decoder_layers,
        "encoder_attention_heads": config.num_heads,
        "decoder_attention_heads": config.num_heads,
        "encoder_ffn_dim": config.intermediate_dim,
        "decoder_ffn_dim": config.intermediate_dim,
        "activation_function": _MARIAN_ACTIVATIONS[config.activation],
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": config.activation_dropout,
        "max_position_embeddings": config.max_length,
        "scale_embedding": True,
        "share_encoder_decoder_embeddings": config.share_embeddings,
        "tie_word_embeddings": True,
        "pad_token_id": pad,
        "eos_token_id": eos,
        "decoder_start_token_id": pad,
        "forced_eos_token_id": eos,
        "bad_words_ids": [[pad]],
        "num_beams": config.beam_size,
        "max_length": config.max_length,
        "is_encoder_decoder": True,
    }


# --- weights ---


def read_marian_weights(directory):
    """`(weights, path)`: Marian weight name -> float32 numpy array, read from `path`, the
    first of `WEIGHT_FILES` in `directory`.

    Raises:
        MarianFormatError: naming the directory when it has no weights file, or the file when
            it cannot be read.
    """
    for name in WEIGHT_FILES:
        path = fs.join(directory, name)
        if fs.exists(path):
            break
    else:
        raise MarianFormatError(f"{directory} has no weights: expected {' or '.join(WEIGHT_FILES)}")
    try:
        if name.endswith(".safetensors"):
            from safetensors.numpy import load_file

            weights = load_file(str(path))
        else:
            import torch

            weights = {
                key: tensor.float().numpy()
                for key, tensor in torch.load(
                    str(path), map_location="cpu", weights_only=True
                ).items()
            }
    except Exception as error:  # noqa: BLE001  any reader's error: the file is not weights
        raise MarianFormatError(
            f"Cannot read {path}: {type(error).__name__}: {str(error).splitlines()[0]}"
        ) from None
    return {key: np.asarray(array, np.float32) for key, array in weights.items()}, str(path)


def check_marian_weights(weights, marian, config, path):
    """Each Marian weight `weight_table(config)` names is in `weights` with the shape
    `config.json` gives it (`marian_shape`); the tied embedding under any of its names.

    Raises:
        MarianFormatError: one line naming the first missing weight or the first shape that
            disagrees with the config.
    """
    for name, aliases in _EMBEDDING_ALIASES.items():
        for alias in aliases:
            if name not in weights and alias in weights:
                weights[name] = weights[alias]
    if "final_logits_bias" not in weights:  # transformers' models may leave it out: zeros
        shape = marian_shape("final_logits_bias", _LOGITS_BIAS[2], marian)
        weights["final_logits_bias"] = np.zeros(shape, np.float32)
    for name, _, kind in weight_table(config):
        if name not in weights:
            raise MarianFormatError(f"{path} has no weight {name} (config.json asks for it)")
        expected = marian_shape(name, kind, marian)
        if tuple(weights[name].shape) != expected:
            raise MarianFormatError(
                f"{path}: {name} has shape {tuple(weights[name].shape)}, config.json says {expected}"
            )
    return weights


def marian_to_model(weights, config, id_maps):
    """Our model of `config` with the Marian `weights` (checked by `check_marian_weights`)."""
    from keras_transformer.models.transformer import build_model

    model = build_model(config)
    variables = {variable.path: variable for variable in model.weights}
    for name, ours, kind in weight_table(config):
        variables[ours].assign(to_ours(kind, weights[name], config, id_maps))
    return model


def model_to_marian(model, config, id_maps):
    """Marian weight name -> numpy array of our `model` (`weight_table`, `to_marian`)."""
    variables = {variable.path: variable for variable in model.weights}
    return {
        name: to_marian(kind, np.asarray(variables[ours].numpy()), config, id_maps)
        for name, ours, kind in weight_table(config)
    }


# --- a run directory from a Marian directory, and back ---

# The optional files of a Marian tokenizer directory, fetched from the hub with `MARIAN_FILES`.
_OPTIONAL_TOKENIZER_FILES = (TOKENIZER_CONFIG_FILE, TARGET_VOCAB_FILE)


def marian_directory(source):
    """The local directory of `source`: a directory, or, when `huggingface_hub` is installed
    and the machine online, a hub name (`Helsinki-NLP/opus-mt-en-de`) downloaded to its cache.

    Raises:
        MarianFormatError: `source` is no directory and cannot be fetched (one line saying why).
    """
    if fs.isdir(source):
        return source
    name = str(source)
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or fs.is_url(name):
        raise MarianFormatError(f"No such directory: {source}")  # a path, not a hub name
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise MarianFormatError(
            f"No such directory: {source} (a hub name needs huggingface_hub installed)"
        ) from None
    try:
        return snapshot_download(
            repo_id=str(source),
            allow_patterns=[
                MARIAN_CONFIG_FILE,
                GENERATION_CONFIG_FILE,
                *WEIGHT_FILES,
                *MARIAN_FILES,
                *_OPTIONAL_TOKENIZER_FILES,
            ],
        )
    except Exception as error:  # noqa: BLE001  the hub's errors: not found, offline, ...
        raise MarianFormatError(
            f"No such directory: {source}, and it could not be fetched from the hub: "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from None


def read_marian(source):
    """Read a Marian directory: `(model, config, files, marian)`: our model with its weights,
    its `TransformerConfig`, the tokenizer (`data.marian.MarianFiles`) and `config.json`'s dict.

    Raises:
        MarianFormatError: one line naming the directory, file, option or weight at fault.
    """
    directory = marian_directory(source)
    marian = read_marian_config(directory)
    config_file = fs.join(directory, MARIAN_CONFIG_FILE)
    config = marian_model_config(marian, config_file)
    generation = fs.join(directory, GENERATION_CONFIG_FILE)
    if fs.exists(generation):
        beams = json.loads(fs.read_text(generation)).get("num_beams")
        if isinstance(beams, int) and beams > 0:
            config = config.replace(beam_size=beams)
    try:
        files = read_marian_files(directory)
    except MarianFilesError as error:
        raise MarianFormatError(str(error)) from None
    if files.separate_vocabularies == config.share_embeddings:
        raise MarianFormatError(
            f"{config_file}: share_encoder_decoder_embeddings={config.share_embeddings!r} disagrees "
            f"with the tokenizer ({'separate' if files.separate_vocabularies else 'one'} vocabular"
            f"{'ies' if files.separate_vocabularies else 'y'} in {files.directory})"
        )
    source, target = files.source_vocabulary, files.target_vocabulary
    sizes = (config.vocabulary_size - 1, config.decoder_vocabulary_size - 1)
    for name, marian_value, vocabulary, found in (
        ("vocab_size", sizes[0], source, source.size),
        ("decoder_vocab_size", sizes[1], target, target.size),
        *(
            (name, _marian_value(marian, name), side, getattr(side, attribute))
            for side in (source, target)
            for name, attribute in (("pad_token_id", "pad_id"), ("eos_token_id", "eos_id"))
        ),
    ):
        if marian_value != found:
            raise MarianFormatError(
                f"{config_file}: {name}={marian_value!r} disagrees with {vocabulary.path} ({found})"
            )
    weights, path = read_marian_weights(directory)
    weights = check_marian_weights(weights, marian, config, path)
    model = marian_to_model(weights, config, (source.id_map(), target.id_map()))
    return model, config, files, marian


def write_weights_checkpoint(model, model_dir, step=0):
    """Write `model`'s weights as the run's checkpoint `checkpoints/ckpt-<step>`, listed in the
    state file, with no optimizer state: training from `ckpt-0` starts the schedule at step 0."""
    import tensorflow as tf

    from keras_transformer.runs import checkpoint_dir
    from keras_transformer.training.checkpoints import checkpoint_manager, save_checkpoint

    manager = checkpoint_manager(
        tf.train.Checkpoint(model=model), checkpoint_dir(model_dir), max_to_keep=None
    )
    return save_checkpoint(manager, step)


def fine_tune_flags(config, model_dir):
    """The text of a `flags.txt` that `experiments/train.py --flagfile=` reads: the run's model
    config pinned (every field, as `cli.flag_file` writes them) and its `--model_dir`."""
    from absl import flags

    from keras_transformer import cli

    flag_values = flags.FlagValues()
    cli.define_config_flags(flag_values=flag_values)
    flags.DEFINE_string("model_dir", None, "Run directory.", flag_values=flag_values)
    flag_values(["train.py"])
    return cli.flag_file(
        "experiments/train.py", flag_values, model_dir=str(model_dir), **config.to_dict()
    )


def import_marian(source, model_dir):
    """Write the run directory `model_dir` of the Marian model at `source` (a directory, or a
    hub name: `marian_directory`): `config.json` (the model config and where it came from),
    the tokenizer files, `checkpoints/ckpt-0` and a `flags.txt` to fine-tune it with
    `experiments/train.py --flagfile=<model_dir>/flags.txt`.

    Returns:
        `model_dir`.

    Raises:
        MarianFormatError: one line naming what cannot be read or represented; or naming
            `model_dir` when it already holds a run.
    """
    from keras_transformer import runs

    if fs.exists(runs.config_path(model_dir)):
        raise MarianFormatError(
            f"{model_dir} already holds a run ({runs.config_path(model_dir)}): import into a new directory"
        )
    model, config, files, _ = read_marian(source)
    fs.makedirs(model_dir)
    for path in runs.tokenizer_files(files.directory):
        fs.write_bytes(fs.join(model_dir, fs.name(path)), fs.read_bytes(path))
    write_weights_checkpoint(model, model_dir)
    runs.write_flag_file(model_dir, fine_tune_flags(config, model_dir))
    runs.write_run_config(
        model_dir,
        {"model": config.to_dict(), "pretrained": {"format": "marian", "source": str(source)}},
    )
    return model_dir


def export_marian(model_dir, output_dir, checkpoint=None, average_last=None):
    """Write run `model_dir` as a Marian directory that `MarianMTModel.from_pretrained` and
    `MarianTokenizer.from_pretrained` load: its weights as `runs.load_run` reads them (the
    latest checkpoint, `checkpoint`, or the average of the last `average_last`).

    The run must be one Marian can express (`check_marian_expressible`) and tokenize with a
    Marian pair (a run written by `import_marian`, fine-tuned or not).

    Returns:
        `output_dir`.

    Raises:
        MarianFormatError: one line naming the option Marian cannot express, or saying that
            the run's tokenizer is not a Marian pair.
    """
    from keras_transformer import runs

    config, _ = runs.read_run_config(model_dir)
    check_marian_expressible(config, str(model_dir))
    if not runs.has_marian_tokenizer(model_dir):
        raise MarianFormatError(
            f"Marian cannot express {model_dir}: its tokenizer is {runs.TOKENIZER_FILE}, not a "
            f"Marian pair ({', '.join(MARIAN_FILES)}; a run imported with import_model.py has one)"
        )
    try:
        files = read_marian_files(model_dir)
    except MarianFilesError as error:
        raise MarianFormatError(str(error)) from None
    for name, size, vocabulary in (
        ("vocabulary_size", config.vocabulary_size, files.source_vocabulary),
        ("decoder_vocabulary_size", config.decoder_vocabulary_size, files.target_vocabulary),
    ):
        if vocabulary.size + 1 != size:
            raise MarianFormatError(
                f"Marian cannot express {model_dir}: {name}={size} is not {vocabulary.path}'s "
                f"{vocabulary.size} ids plus our start id"
            )
    model, _, _ = runs.load_run(model_dir, checkpoint=checkpoint, average_last=average_last)
    id_maps = (files.source_vocabulary.id_map(), files.target_vocabulary.id_map())
    weights = model_to_marian(model, config, id_maps)
    _save_marian(weights, marian_config_dict(config, files), files, output_dir)
    return output_dir


def _save_marian(weights, marian, files, output_dir):
    """`save_pretrained` of the `MarianMTModel` with `weights` and of its `MarianTokenizer`."""
    import tempfile

    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    model = MarianMTModel(MarianConfig(**marian))
    state = {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {
        *_EMBEDDING_ALIASES,
        *(alias for names in _EMBEDDING_ALIASES.values() for alias in names),
    }
    missing = [name for name in missing if "embed_positions" not in name and name not in tied]
    if missing or unexpected:  # the table and transformers' Marian disagree: a bug, not input
        raise RuntimeError(f"Marian weights missing {missing}, unexpected {unexpected}")
    model.save_pretrained(str(output_dir))
    from keras_transformer.runs import tokenizer_files

    with tempfile.TemporaryDirectory() as local:
        for path in tokenizer_files(files.directory):
            fs.write_bytes(fs.join(local, fs.name(path)), fs.read_bytes(path))
        MarianTokenizer.from_pretrained(local).save_pretrained(str(output_dir))
