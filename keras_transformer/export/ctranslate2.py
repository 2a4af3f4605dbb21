"""Export a trained run as a CTranslate2 model directory, and translate with it.

CTranslate2 (https://github.com/OpenNMT/CTranslate2) is a C++ inference engine for
Transformer models. `export_ctranslate2` writes a directory it loads with
`ctranslate2.Translator(path)`: `model.bin` (weights in float32, or int8 with
`quantization="int8"`), `config.json`, `shared_vocabulary.json` (the SentencePiece pieces
in id order; `source_vocabulary.json` and `target_vocabulary.json` for a model with a target
vocabulary of its own) and the run's tokenizer files (`spm.model`, or a Marian pair's)
beside them.

The model is written as a `ctranslate2.specs.TransformerSpec` that represents ours exactly:

* post-LN (`pre_norm=False`, no final norms) by default; pre-LN (`normalize_first=True`)
  as `pre_norm=True` with the final encoder and decoder norms;
* token embeddings multiplied by sqrt(d_model) (`scale_embeddings`), shared between encoder
  and decoder when `share_embeddings`, and the decoder's output projection set to the same
  matrix when `tie_output` (no bias but the final-logits bias, `final_logits_bias`); a
  decoder vocabulary of its own (`target_vocabulary_size`) as CTranslate2's target
  vocabulary (`target_pieces`);
* the position table stored as the model's position encodings
  (`position_encodings/encodings`): our sinusoids (interleaved: sin at even features, cos at
  odd ones; or concatenated, `sinusoid_layout`; positions from 0) are not CTranslate2's
  built-in ones (two halves from position 1, with other frequencies), so the table is written
  out. Learned position embeddings are written as they are. The sinusoidal table has `max_length + max_output_offset` rows (the longest
  decoder input our search builds); CTranslate2 refuses positions beyond it;
* `<s>` starts the decoder, `</s>` ends the source (`add_source_eos`), as in
  `decoding.text.encode_source`.

Settings CTranslate2 cannot express raise a ValueError naming the setting (see
`check_ctranslate2_config`).

Search differences: our search never emits `<pad>` or `<s>` (their log-probabilities are set
to -inf, not renormalized); `translate_ctranslate2` leaves CTranslate2's softmax alone,
which has the same log-probabilities for every other token. Length limits match when each
CTranslate2 call holds sources of one length (`translate_ctranslate2` groups them).
CTranslate2's length penalty divides the log-probability by |Y|^alpha (|Y| counts EOS only
with `return_end_token=True`, as `translate_ctranslate2` sets), where ours divides by the
GNMT ((5 + |Y|) / 6)^alpha, |Y| with EOS: the two rank hypotheses alike only at alpha = 0.
CTranslate2 also bans EOS before `min_decoding_length` (default 1, which renormalizes the
first step's softmax); `translate_ctranslate2` sets 0, as our search allows an empty output.
See docs/ctranslate2.md.

Example:

>>> from keras_transformer.export.ctranslate2 import export_ctranslate2
>>> export_ctranslate2("runs/builtin_tiny", "ct2/builtin_tiny", quantization="int8")
PosixPath('ct2/builtin_tiny')
"""

import contextlib
import dataclasses
import tempfile

import numpy as np

from keras_transformer import fs
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from keras_transformer.decoding.options import SearchOptions
from keras_transformer.models.config import TransformerConfig
from keras_transformer.runs import load_run, read_run_config, tokenizer_files

QUANTIZATIONS = ("float32", "int8")
VMAP_FILE = "vmap.txt"  # CTranslate2's name for a model's vocabulary map
MODEL_FILE = "model.bin"  # the weights; published last, so a directory that has it is complete
# Keras activation name -> name of the `ctranslate2.specs.Activation` member.
ACTIVATIONS = {
    "relu": "RELU",
    "gelu": "GELU",
    "silu": "SWISH",
    "swish": "SWISH",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
}
SPECIAL_PIECES = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}


def _import_ctranslate2():
    try:
        import ctranslate2
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "The CTranslate2 export needs the `ctranslate2` package: pip install 'keras-transformer-toolkit[ctranslate2]'"
        ) from err
    return ctranslate2


def _activation_name(activation):
    name = (
        activation
        if isinstance(activation, str)
        else getattr(activation, "__name__", str(activation))
    )
    return name.lower()


def check_ctranslate2_config(config):
    """Raise a ValueError naming the first setting of `config` CTranslate2 cannot express.

    CTranslate2 derives the head width as hidden_dim / num_heads, so `key_dim` and
    `value_dim` must be unset or equal to it; its self-attention is never restricted to a
    window (`attention_window`); it converts the Transformer only, not a model that extends it
    (a config with more fields, `models.parsing.ParsingConfig`: the first one set is named); the
    feed-forward activation must be one of `ACTIVATIONS`.
    """
    head_dim = config.hidden_dim // config.num_heads
    for name in ("key_dim", "value_dim"):
        value = getattr(config, name)
        if value is not None and (value != head_dim or config.hidden_dim % config.num_heads):
            raise ValueError(
                f"CTranslate2 cannot express {name}={value}: its attention heads are hidden_dim / num_heads wide. "
                f"Received: {name}={value}, hidden_dim={config.hidden_dim}, num_heads={config.num_heads}"
            )
    if getattr(config, "attention_window", None) is not None:
        raise ValueError(
            f"CTranslate2 cannot express attention_window={config.attention_window}: its self-attention "
            f"attends to every position. Received: attention_window={config.attention_window}"
        )
    core = {field.name for field in dataclasses.fields(TransformerConfig)}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name not in core and value not in (None, False):
            raise ValueError(
                f"CTranslate2 cannot express {field.name}={value!r}: it converts the Transformer, and "
                f"{field.name} belongs to a {type(config).__name__}. Received: {field.name}={value!r}"
            )
    name = _activation_name(config.activation)
    if name not in ACTIVATIONS:
        raise ValueError(
            f"CTranslate2 cannot express activation={config.activation!r}; supported: {sorted(ACTIVATIONS)}. "
            f"Received: activation={config.activation!r}"
        )


def sinusoid_table(num_positions, depth, max_wavelength=10000.0, layout="interleaved"):
    """Our sinusoidal encoding as a float32 `(num_positions, depth)` table, computed by the
    model's own `PositionalEncoding` layer (positions 0 .. num_positions - 1, in `layout`)."""
    from keras_transformer.layers.positional import PositionalEncoding

    layer = PositionalEncoding(max_wavelength=max_wavelength, layout=layout, dtype="float32")
    return np.asarray(layer(np.zeros((1, num_positions, depth), np.float32))[0])


def _numpy(variable):
    return np.asarray(variable.numpy(), dtype=np.float32)


def _set_linear(spec, kernel, bias=None):
    """Set a `LinearSpec` from a `(in, out)` kernel: CTranslate2 stores `(out, in)`."""
    spec.weight = np.ascontiguousarray(kernel.T)
    if bias is not None:
        spec.bias = bias


def _set_layer_norm(spec, layer):
    spec.gamma = _numpy(layer.gamma)
    spec.beta = _numpy(layer.beta)


def _heads(kernel):
    """`(D, H, Dk)` -> `(D, H * Dk)`, heads outermost (CTranslate2's split of the features)."""
    return kernel.reshape(kernel.shape[0], -1)


def _set_attention(spec, attention, norm, self_attention):
    query = _heads(_numpy(attention.query_kernel))
    key = _heads(_numpy(attention.key_kernel))
    value = _heads(_numpy(attention.value_kernel))
    biases = [
        _numpy(getattr(attention, f"{name}_bias")).reshape(-1) for name in ("query", "key", "value")
    ]
    if self_attention:  # one fused (3D, D) projection
        _set_linear(
            spec.linear[0], np.concatenate([query, key, value], axis=1), np.concatenate(biases)
        )
    else:  # queries from the decoder, fused keys and values from the encoder outputs
        _set_linear(spec.linear[0], query, biases[0])
        _set_linear(
            spec.linear[1], np.concatenate([key, value], axis=1), np.concatenate(biases[1:])
        )
    output = _numpy(attention.output_kernel)  # (H, Dv, D)
    _set_linear(
        spec.linear[-1], output.reshape(-1, output.shape[-1]), _numpy(attention.output_bias)
    )
    _set_layer_norm(spec.layer_norm, norm)


def _set_feed_forward(spec, block):
    ffn = block.feed_forward
    _set_linear(
        spec.linear_0, _numpy(ffn.intermediate_dense.kernel), _numpy(ffn.intermediate_dense.bias)
    )
    _set_linear(spec.linear_1, _numpy(ffn.output_dense.kernel), _numpy(ffn.output_dense.bias))
    _set_layer_norm(spec.layer_norm, block.feed_forward_layer_norm)


def _position_table(model, side, num_positions):
    config = model.config
    if config.positional == "learned":
        layer = model.source_position if side == "encoder" else model.target_position
        return _numpy(layer.position_embeddings)
    layer = model.source_position if side == "encoder" else model.target_position
    return sinusoid_table(num_positions, config.hidden_dim, layer.max_wavelength, layer.layout)


def _check_pieces(pieces, size, name):
    if len(pieces) != size:
        raise ValueError(
            "The tokenizer's vocabulary must have the model's vocabulary_size pieces. "
            f"Received: {len(pieces)} pieces, {name}={size}"
        )


def transformer_spec(model, pieces, num_positions=None, target_pieces=None):
    """A `ctranslate2.specs.TransformerSpec` holding `model`'s float32 weights.

    Args:
        model: a float32 `Transformer`.
        pieces: the tokens in id order (the SentencePiece pieces).
        num_positions: rows of the sinusoidal position table (default:
            `max_length + max_output_offset` of the model's config).
        target_pieces: the decoder's tokens in id order, for a model with a target vocabulary
            of its own (`config.target_vocabulary_size`); None: `pieces`, shared.

    Returns:
        the spec, validated by CTranslate2 when saved.
    """
    _import_ctranslate2()
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as specs

    config = model.config
    check_ctranslate2_config(config)
    target_pieces = pieces if target_pieces is None else target_pieces
    _check_pieces(pieces, config.vocabulary_size, "vocabulary_size")
    if config.target_vocabulary_size is not None:
        _check_pieces(target_pieces, config.decoder_vocabulary_size, "target_vocabulary_size")
    else:
        _check_pieces(target_pieces, config.vocabulary_size, "vocabulary_size")
    if num_positions is None:
        num_positions = config.max_length + config.max_output_offset
    spec = specs.TransformerSpec.from_config(
        (config.num_encoder_layers, config.num_decoder_layers),
        config.num_heads,
        pre_norm=config.normalize_first,
        activation=common_spec.Activation[ACTIVATIONS[_activation_name(config.activation)]],
    )
    encoder, decoder = spec.encoder, spec.decoder
    encoder.scale_embeddings = True  # sqrt(d_model), as SharedEmbedding
    decoder.scale_embeddings = True
    encoder.embeddings[0].weight = _numpy(model.source_embedding.embeddings)
    decoder.embeddings.weight = _numpy(model.target_embedding.embeddings)
    encoder.position_encodings.encodings = _position_table(model, "encoder", num_positions)
    decoder.position_encodings.encodings = _position_table(model, "decoder", num_positions)
    for layer_spec, block in zip(encoder.layer, model.encoder_layers):
        _set_attention(
            layer_spec.self_attention, block.self_attention, block.self_attention_layer_norm, True
        )
        _set_feed_forward(layer_spec.ffn, block)
    for layer_spec, block in zip(decoder.layer, model.decoder_layers):
        _set_attention(
            layer_spec.self_attention, block.self_attention, block.self_attention_layer_norm, True
        )
        _set_attention(
            layer_spec.attention, block.cross_attention, block.cross_attention_layer_norm, False
        )
        _set_feed_forward(layer_spec.ffn, block)
    if config.normalize_first:
        _set_layer_norm(encoder.layer_norm, model.final_norms["encoder"])
        _set_layer_norm(decoder.layer_norm, model.final_norms["decoder"])
    bias = None if model.logits_bias is None else _numpy(model.logits_bias.bias)
    if model.output_projection is None:  # tied: logits = hidden @ E^T (+ the final bias)
        decoder.projection.weight = decoder.embeddings.weight
        if bias is not None:
            decoder.projection.bias = bias
    else:
        projection_bias = _numpy(model.output_projection.bias)
        _set_linear(
            decoder.projection,
            _numpy(model.output_projection.kernel),
            projection_bias if bias is None else projection_bias + bias,
        )

    spec.config.layer_norm_epsilon = config.layer_norm_epsilon
    spec.config.unk_token = SPECIAL_PIECES[UNK_ID]
    spec.config.bos_token = SPECIAL_PIECES[BOS_ID]
    spec.config.eos_token = SPECIAL_PIECES[EOS_ID]
    spec.config.decoder_start_token = SPECIAL_PIECES[BOS_ID]
    spec.config.add_source_eos = True
    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(target_pieces))
    return spec


def vocabulary(tokenizer, target=False):
    """The tokenizer's pieces in id order, checked against our special ids; with `target`, its
    target side's (a tokenizer pair, `data.marian.MarianTokenizer`; the one vocabulary of a
    `data.Tokenizer`)."""
    if target and hasattr(tokenizer, "target_vocabulary_size"):
        size = tokenizer.target_vocabulary_size
        pieces = [tokenizer.id_to_piece(i, target=True) for i in range(size)]
    else:
        pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocabulary_size)]
    for piece_id, piece in SPECIAL_PIECES.items():
        if pieces[piece_id] != piece:
            raise ValueError(
                f"Piece {piece_id} must be {piece!r} for CTranslate2. Received: {pieces[piece_id]!r}"
            )
    return pieces


def save_ctranslate2(
    model,
    pieces,
    output_dir,
    quantization="float32",
    files=(),
    vocabulary_map=None,
    replace=True,
    target_pieces=None,
):
    """Write `model` (float32) as a CTranslate2 model directory.

    Args:
        model: a float32 `Transformer`.
        pieces: the vocabulary, tokens in id order (see `vocabulary`).
        target_pieces: the decoder's vocabulary when it is its own
            (`config.target_vocabulary_size`); None: `pieces`.
        output_dir: the directory to write, published when complete (`fs.publish_dir`): on a
            local disk with one rename; elsewhere (`gs://`) file by file, `model.bin` last,
            so a directory that has `model.bin` is complete.
        quantization: "float32" or "int8".
        files: paths of files to copy into the directory (e.g. the SentencePiece model).
        vocabulary_map: None, or a `decoding.shortlist.VocabularyMap`, written as the
            model's `vmap.txt` (translate with `use_vmap=True`): source tokens named by
            `pieces`, target tokens by `target_pieces`.
        replace: replace an existing `output_dir` (on a local disk it is renamed aside and
            removed once the new one is in place; elsewhere its `model.bin` is removed first).

    Returns:
        `output_dir` (a `Path`, or the URL as given).

    Raises:
        FileExistsError: `output_dir` exists and not `replace`, or another export is writing it.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization must be one of {QUANTIZATIONS}. Received: quantization={quantization!r}"
        )
    spec = transformer_spec(model, pieces, target_pieces=target_pieces)
    for path in files:
        spec.register_file(str(path))
    with (
        tempfile.TemporaryDirectory() as maps,
        tempfile.TemporaryDirectory() as scratch,
    ):  # local files only
        if vocabulary_map is not None:
            vmap = f"{maps}/{VMAP_FILE}"
            vocabulary_map.write_ctranslate2(vmap, pieces, target_pieces)
            spec.register_vocabulary_mapping(vmap)
        spec.validate()
        spec.optimize(quantization=quantization)
        spec.save(scratch)
        return fs.publish_dir(scratch, output_dir, replace=replace, last=(MODEL_FILE,))


def export_ctranslate2(
    model_dir,
    output_dir,
    quantization="float32",
    checkpoint=None,
    average_last=None,
    overwrite=False,
    vocabulary_map=None,
):
    """Convert a run directory's weights into a CTranslate2 model directory.

    Args:
        model_dir: a run directory (`config.json`, `spm.model`, `checkpoints/`).
        output_dir: the CTranslate2 model directory to write.
        quantization: "float32" or "int8" (int8 weights, int8 compute on CPU).
        checkpoint: a checkpoint prefix (default: the latest).
        average_last: instead, average the last this many checkpoints.
        overwrite: replace an existing `output_dir` (refused otherwise).
        vocabulary_map: None, or a `decoding.shortlist.VocabularyMap` (`vmap.txt`).

    Returns:
        the output directory (a `Path`, or the URL as given). It holds `model.bin`, `config.json`,
        `shared_vocabulary.json` (`source_vocabulary.json` and `target_vocabulary.json` for a
        model with a target vocabulary of its own) and the run's tokenizer files (`spm.model`,
        or a Marian pair's `source.spm`, `target.spm`, `vocab.json`, ...), and `vmap.txt` with
        a map.
    """

    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization must be one of {QUANTIZATIONS}. Received: quantization={quantization!r}"
        )
    if fs.exists(output_dir) and not overwrite:
        raise FileExistsError(
            f"{output_dir} exists; pass overwrite=True (--overwrite) to replace it"
        )
    check_ctranslate2_config(read_run_config(model_dir)[0])  # before reading any weights
    model, tokenizer, _ = load_run(
        model_dir, checkpoint=checkpoint, average_last=average_last, dtype="float32"
    )
    separate = model.config.target_vocabulary_size is not None
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(fs.local_copy(path)) for path in tokenizer_files(model_dir)]
        return save_ctranslate2(
            model,
            vocabulary(tokenizer),
            output_dir,
            quantization=quantization,
            files=files,
            vocabulary_map=vocabulary_map,
            replace=overwrite,
            target_pieces=vocabulary(tokenizer, target=True) if separate else None,
        )


def translate_ctranslate2(
    translator,
    tokenizer,
    texts,
    beam_size=SearchOptions.beam_size,
    length_penalty=0.0,
    max_output_offset=SearchOptions.max_output_offset,
    max_source_length=256,
    max_batch_size=64,
    use_vmap=False,
):
    """Translate `texts` with a `ctranslate2.Translator` under our length limits.

    Sources are cut to `max_source_length - 1` pieces (CTranslate2 appends `</s>`), as
    `decoding.text.encode_source`. A sentence produces at most source length (with EOS)
    + `max_output_offset` tokens, EOS included, as in our search: sentences are grouped
    by source length, so that one `max_decoding_length` holds for a whole call.
    `length_penalty` is CTranslate2's (|Y|^alpha, see the module docstring); its default 0
    gives our search's outputs. Pass a run's `SearchOptions.from_config(config).kwargs()` for
    its beam size and offset (the defaults are `SearchOptions`', the paper's). `use_vmap`:
    search over the model's vocabulary map (`export_ctranslate2(..., vocabulary_map=...)`).

    Returns:
        `(output_ids: list of int lists (EOS appended when produced), scores: list of float)`,
        the scores being CTranslate2's (log-probabilities when `length_penalty=0`).
    """
    pieces = [
        [tokenizer.id_to_piece(int(i)) for i in ids]
        for ids in tokenizer.tokenize(list(texts)).to_list()
    ]
    pieces = [tokens[: max_source_length - 1] for tokens in pieces]
    ids_of = {piece: i for i, piece in enumerate(vocabulary(tokenizer, target=True))}
    outputs, scores = [None] * len(pieces), [None] * len(pieces)
    by_length = {}
    for index, tokens in enumerate(pieces):
        by_length.setdefault(len(tokens), []).append(index)
    for length, indices in sorted(by_length.items()):
        for start in range(0, len(indices), max_batch_size):
            chunk = indices[start : start + max_batch_size]
            results = translator.translate_batch(
                [pieces[i] for i in chunk],
                beam_size=beam_size,
                length_penalty=length_penalty,
                max_decoding_length=length + 1 + max_output_offset,
                max_input_length=0,
                min_decoding_length=0,
                return_scores=True,
                return_end_token=True,
                use_vmap=use_vmap,
            )
            for index, result in zip(chunk, results):
                outputs[index] = [ids_of[piece] for piece in result.hypotheses[0]]
                scores[index] = float(result.scores[0])
    return outputs, scores
