"""Runs every public layer, two tiny Transformers, the loss and `model.fit` under one Keras backend; records the results.

Run by tests/test_backends.py: in the test process for TensorFlow (the reference), and
in ONE fresh process per other backend, the backend chosen by `KERAS_BACKEND`:

    KERAS_BACKEND=jax python tests/backend_harness.py OUT_DIR REFERENCE_DIR

Without REFERENCE_DIR (the reference run) the layers keep the weights they were built
with and write them to `OUT_DIR/weights/<case>.npz`, and each model is saved as
`OUT_DIR/<model>.keras`, `OUT_DIR/<model>.weights.h5` and `OUT_DIR/<model>.get_weights.npz`.
With it, every layer takes the reference's weights (`set_weights`) and each model is
loaded from the reference's `.keras` file (and, rebuilt from its config, from its
`.weights.h5` and its `get_weights()` list), so that every output can be compared with
TensorFlow's on the same weights. Likewise the reference trains a SentencePiece tokenizer
on the built-in task, batches its first pairs with `data.make_dataset`, builds the model
that `check_fit` trains, and writes the batches and the initial weights to
`OUT_DIR/fit_data.npz` (the tokenizer to `OUT_DIR/fit_spm.model`); every backend fits on
those. Under `KERAS_BACKEND=jax` the harness makes JAX's CPU two devices (`XLA_FLAGS`, set
before Keras imports JAX) for `keras.distribution.DataParallel`.

It writes:

* `OUT_DIR/outputs.npz`: one array per name of `OUTPUT_NAMES`, computed on this backend
  with dropout off (inference), or with `training=True` and every dropout rate 0; greedy
  and beam search's token ids and scores (`check_search`); the
  loss's values and gradients (`check_loss`); the losses `model.fit` reports at each step
  and `evaluate`'s after the last (`check_fit`).
* `OUT_DIR/checks.json`: `{"backend", "checks", "seconds"}`; `checks` holds `{name: {"ok":
  bool, "detail": str}}` for each name of `CHECK_NAMES` (and of this backend's
  `BACKEND_CHECK_NAMES`), properties checked within this backend: `.keras` save and load,
  the `get_config` (and JSON) round trip, cached decoding equal to a full pass, implicit
  masks equal to explicit ones, dropout (see `check_dropout`; masks are drawn by each
  backend's own generator, so they are not compared across backends), that `import
  keras_transformer` imported no TensorFlow, that what runs on TensorFlow only fails
  elsewhere in one line naming the backend (`check_tensorflow_only`), the loss and its
  gradient against the formula in float64 NumPy, fit's first loss against the loss of the
  initial model, and on JAX fit under `DataParallel` on two devices against fit on one;
  `seconds` the time of each case.

A case that raises records the error under `error/<case>` instead of stopping the run.

Shape letters: B batch, S source length, T target length, D width, H heads, F FFN width,
V vocabulary size.
"""

import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# JAX's CPU platform as two devices, for `keras.distribution.DataParallel` (`check_fit`). XLA
# reads the flag when JAX starts, so it is set before Keras imports JAX; every other check
# runs on the first device, as it would with one.
JAX_DEVICES = 2
_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")
if (
    os.environ.get("KERAS_BACKEND") == "jax"
    and "xla_force_host_platform_device_count" not in _XLA_FLAGS
):
    os.environ["XLA_FLAGS"] = (
        f"{_XLA_FLAGS} --xla_force_host_platform_device_count={JAX_DEVICES}".strip()
    )

import keras  # noqa: E402
from keras import ops  # noqa: E402

import keras_transformer  # noqa: E402,F401  (the top-level import must work on every backend)
from keras_transformer import Transformer, get_preset  # noqa: E402
from keras_transformer.layers import (  # noqa: E402
    DecoderBlock,
    EncoderBlock,
    MultiHeadAttention,
    PositionalEncoding,
    SharedEmbedding,
    attention_weights,
    causal_mask,
    merge_masks,
    padding_mask,
    scaled_dot_product_attention,
)
from keras_transformer.layers.dropout import ReplicaDropout  # noqa: E402

# Importing the toolkit (its layers and models) imports no TensorFlow on JAX and PyTorch.
# (Keras itself imports it later, where installed, to serialize configs.)
TENSORFLOW_IMPORTED_BY_THE_TOOLKIT = "tensorflow" in sys.modules

from tests.layer_test_case import (  # noqa: E402
    LAYER_CASES,
    B,
    D,
    F,
    H,
    LayerCase,
    S,
    T,
    V,
    call_layer,
    functional_model,
    padding,
    random_floats,
    random_ids,
)
from tests.scripts import TINY_MODEL  # noqa: E402

# Outputs of one backend and TensorFlow's on the same weights (float32).
MAX_ABS_DIFF = 1e-5
# Outputs within one backend that must be the same computation (save/load, config round
# trip, implicit mask, rate-0 dropout).
SAME_ATOL = 1e-6


def _self_attention_inputs(rng, masked):
    sequence = random_floats(rng, B, T, D)
    inputs = {"query": sequence, "value": sequence}
    if masked:
        inputs["value_mask"] = padding([T, 3], T)
    return inputs


# Cases beyond LAYER_CASES: windowed attention (the blocked computation, with and without
# a padding mask, causal or not) and blocks with every padding mask given.
EXTRA_CASES = {
    "multi_head_attention_windowed_masked": LayerCase(
        MultiHeadAttention,
        dict(num_heads=H, attention_window=2),
        lambda rng: _self_attention_inputs(rng, masked=True),
        (B, T, D),
        8,
    ),
    "multi_head_attention_windowed_causal": LayerCase(
        MultiHeadAttention,
        dict(num_heads=H, attention_window=2, dropout=0.1),
        lambda rng: _self_attention_inputs(rng, masked=False),
        (B, T, D),
        8,
        call_kwargs=dict(use_causal_mask=True),
    ),
    "encoder_block_windowed": LayerCase(
        EncoderBlock,
        dict(num_heads=H, intermediate_dim=F, attention_window=2),
        lambda rng: {"inputs": random_floats(rng, B, S, D), "padding_mask": padding([S, 4], S)},
        (B, S, D),
        8 + 4 + 2 * 2,
    ),
    "decoder_block_padded": LayerCase(
        DecoderBlock,
        dict(
            num_heads=H,
            intermediate_dim=F,
            dropout=0.1,
            attention_dropout=0.1,
            activation_dropout=0.1,
        ),
        lambda rng: {
            "decoder_sequence": random_floats(rng, B, T, D),
            "encoder_sequence": random_floats(rng, B, S, D),
            "decoder_padding_mask": padding([T, 2], T),
            "encoder_padding_mask": padding([S, 4], S),
        },
        (B, T, D),
        2 * 8 + 4 + 3 * 2,
    ),
    "decoder_block_windowed": LayerCase(
        DecoderBlock,
        dict(num_heads=H, intermediate_dim=F, attention_window=2),
        lambda rng: {
            "decoder_sequence": random_floats(rng, B, T, D),
            "encoder_sequence": random_floats(rng, B, S, D),
            "decoder_padding_mask": padding([T, 3], T),
            "encoder_padding_mask": padding([S, 4], S),
        },
        (B, T, D),
        2 * 8 + 4 + 3 * 2,
    ),
}
CASES = {**LAYER_CASES, **EXTRA_CASES}

# The layer-level cache API (as `Transformer.decode_step` uses it): `init_cache(encoder
# outputs, max_length)`, then calls with `cache=` and `cache_index=`. One position per
# call, and positions 0-1 in one call then one at a time (`CHUNKS`).
CACHED_DECODER_CASES = {
    "decoder_cached": (dict(), T),
    "decoder_cached_growing": (dict(), None),
    "decoder_cached_windowed": (dict(attention_window=2), T),
    "decoder_cached_windowed_ring": (dict(attention_window=2), None),
}
CHUNKS = (2, 1, 1, 1)

# Two tiny Transformers: the paper's arrangement, and a windowed pre-LN one with learned
# positions and an untied output projection. Every dropout is on (rate 0.1).
MODEL_CONFIG = dict(
    vocabulary_size=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
    hidden_dim=D,
    intermediate_dim=F,
    num_heads=H,
    max_length=16,
    dropout=0.1,
    attention_dropout=0.1,
    activation_dropout=0.1,
)
MODELS = {
    "transformer": MODEL_CONFIG,
    "transformer_windowed": dict(
        MODEL_CONFIG,
        attention_window=2,
        normalize_first=True,
        positional="learned",
        tie_output=False,
    ),
    # OPUS-MT's (Marian's) options: sin || cos positions, SiLU, a final-logits bias (set to
    # random values by the reference) and a target vocabulary of its own.
    "transformer_marian": dict(
        MODEL_CONFIG,
        vocabulary_size=40,
        share_embeddings=False,
        target_vocabulary_size=MODEL_CONFIG["vocabulary_size"],
        sinusoid_layout="concatenated",
        activation="silu",
        final_logits_bias=True,
        layer_norm_epsilon=1e-5,
    ),
}
# A tiny parsing model (`check_parsing`): word positions, encoder-decoder attention within
# the current word, and every search under the tree constraint over a vocabulary of tree
# symbols: PAD, UNK, BOS, EOS (3), six "(LABEL" (4-9), ")" (10), six tags (11-16), pieces
# that start a source word (17-24) and pieces that continue one (25-31).
PARSING_MODEL = "parsing"
PARSING_CONFIG = dict(MODEL_CONFIG, word_positions=True, word_window=0)
PARSING_WORD_STARTS = tuple(4 <= token < 25 for token in range(32))
PARSING_SOURCE = ((17, 25, 18, 19, 3, 0, 0), (20, 26, 27, 21, 22, 23, 3))  # 3 and 4 words
SEARCHED_MODELS = (*MODELS, PARSING_MODEL)
# The reference builds each model from a fixed seed: random weights this small mostly repeat
# one token, and these seeds give searches that differ from step to step (and, windowed,
# hypotheses that end with EOS at different lengths), see `check_search`.
MODEL_SEEDS = {
    "transformer": 3,
    "transformer_windowed": 1,
    "transformer_marian": 3,
    PARSING_MODEL: 1,
}
SOURCE_LENGTHS, TARGET_LENGTHS = [7, 4], [6, 3]
SOURCE_LENGTH, TARGET_LENGTH = 7, 6
MODEL_OUTPUTS = ("logits", "encoder", "decode", "steps", "steps_growing", "training_rate0")
# The searches (`check_search`): greedy, and beam 4 with alpha 0.6 returning 3 hypotheses,
# up to source length + 8 tokens: the same `keras.ops` code on every backend. Token ids must
# be equal; scores are sums of float32 log-probabilities.
SEARCH = dict(max_output_offset=8)
BEAM = dict(beam_size=4, length_penalty=0.6, num_return=3)
SEARCH_OUTPUTS = ("greedy_ids", "greedy_scores", "beam_ids", "beam_scores")

FUNCTION_OUTPUTS = (
    "functions/scaled_dot_product_attention",
    "functions/attention_weights",
    "functions/padding_mask",
    "functions/causal_mask",
    "functions/merge_masks",
    "multi_head_attention_scores",
    "shared_embedding_mask",
    "implicit_mask_encoder",
    "implicit_mask_encoder_predict",
)

# The loss (`check_loss`): `LabelSmoothedCrossEntropy` on fixed logits `(B, T, V)` and labels
# with padding, smoothed as in the paper and not at all; its value and gradient.
LOSS_SHAPE = (3, 5, 11)
LOSS_LENGTHS = [5, 3, 1]  # real tokens per row
LOSS_CASES = {"smoothed": 0.1, "unsmoothed": 0.0}
# A value or gradient against TensorFlow's, and against the float64 formula: token losses
# of about 2.4 (logits of unit scale, 11 classes) are float32 to 2.4e-7, gradients to 1e-8.
LOSS_ATOL = 1e-6

# `model.fit` (`check_fit`): a tiny Transformer without dropout trains FIT_STEPS Adam updates
# on the built-in task (its first FIT_PAIRS training pairs, a SentencePiece tokenizer of
# FIT_VOCABULARY pieces trained on them), one batch of FIT_SENTENCES sentences padded to
# FIT_LENGTH per step: the same initial weights and batches (written by the reference) on
# every backend.
FIT_PAIRS = 1000
FIT_VOCABULARY = 128
FIT_LENGTH = 16
FIT_SENTENCES = 16  # even: DataParallel splits a batch between JAX_DEVICES devices
FIT_STEPS = 20
FIT_LEARNING_RATE = 3e-3
FIT_LABEL_SMOOTHING = 0.1
FIT_MODEL = dict(
    TINY_MODEL,
    vocabulary_size=FIT_VOCABULARY,
    max_length=FIT_LENGTH,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
)
# fit's losses against TensorFlow's, and JAX's fit on JAX_DEVICES devices (DataParallel)
# against its fit on one. The first step reports the loss of the initial weights (no update
# yet): they differ by float32 rounding only (the loss is about 5.7, where an ulp is 4.8e-7;
# measured: 1.4e-6 at most). After it each run's rounding, in its own order of sums, goes
# into the gradients, and Adam carries it into every later update; where a gradient
# component is itself at the level of rounding, Adam's division by the component's running
# scale turns that noise into a step of a good part of the learning rate. Measured over 24
# settings (learning rates 1e-3 to 1e-2, label smoothing 0.05 to 0.2, three or four initial
# weights each): every step within 2.4e-6 of TensorFlow on JAX and PyTorch; DataParallel
# within 1.9e-6 of one device, except once by 1.1e-4 from the 11th step on (a decoder
# feed-forward layer's weights had parted by 1.4e-4 after 10 steps). The bounds are 7 and 9
# times the largest seen, and far below what a wrong loss changes: no label smoothing changes
# the losses by 0.16, padding counted in the mean by 3.4, each replica's own mean by 0.03.
FIT_FIRST_LOSS_ATOL = 1e-5
FIT_LOSS_ATOL = 1e-3
FIT_OUTPUTS = ("fit/first_loss", "fit/losses", "fit/evaluate")
# After fit, each backend fits FIT_MORE_STEPS more updates on the same batches, saves the
# weights (`FIT_WEIGHTS`) and translates the first FIT_TRANSLATE_SENTENCES training sources
# with them (`FIT_TRANSLATIONS`, JSON: sources and the K best texts of each, beam FIT_BEAM);
# tests/test_backends.py exports those weights through the TensorFlow SavedModel and checks
# that its `translate_nbest` serves the same texts.
FIT_MORE_STEPS = 100
FIT_WEIGHTS = "fit.weights.h5"
FIT_TRANSLATIONS = "fit_translations.json"
FIT_TRANSLATE_SENTENCES = 6
FIT_BEAM = dict(beam_size=4, length_penalty=0.6)

OUTPUT_NAMES = (
    *CASES,
    *FUNCTION_OUTPUTS,
    *(f"{name}/{kind}" for name in CACHED_DECODER_CASES for kind in ("full", "steps", "chunks")),
    *(f"{model}/{kind}" for model in MODELS for kind in MODEL_OUTPUTS),
    *(f"{model}/search/{kind}" for model in SEARCHED_MODELS for kind in SEARCH_OUTPUTS),
    *(
        f"loss/{case}/{kind}"
        for case in LOSS_CASES
        for kind in ("token_losses", "value", "gradient")
    ),
    *FIT_OUTPUTS,
)
# Each output's bound against TensorFlow: MAX_ABS_DIFF unless named here.
OUTPUT_ATOL = {
    **{
        f"loss/{case}/{kind}": LOSS_ATOL
        for case in LOSS_CASES
        for kind in ("token_losses", "value", "gradient")
    },
    "fit/first_loss": FIT_FIRST_LOSS_ATOL,
    "fit/losses": FIT_LOSS_ATOL,
    "fit/evaluate": FIT_LOSS_ATOL,
    **{
        f"{model}/search/{kind}": 0
        for model in SEARCHED_MODELS
        for kind in ("greedy_ids", "beam_ids")
    },
}


def output_atol(name):
    """The bound on output `name`'s max |diff| from TensorFlow's."""
    return OUTPUT_ATOL.get(name, MAX_ABS_DIFF)


CHECK_NAMES = (
    *(f"{name}/{check}" for name in CASES for check in ("get_config", "keras_file")),
    "implicit_mask_encoder/explicit",
    *(
        f"{name}/{kind}"
        for name in CACHED_DECODER_CASES
        for kind in ("steps_equal_full", "chunks_equal_full")
    ),
    *(
        f"{model}/{check}"
        for model in MODELS
        for check in (
            "weights_h5",
            "set_weights",
            "get_config",
            "keras_file",
            "steps_equal_decode",
            "dropout_reproducible",
            "dropout_active",
            "rate0_equals_inference",
        )
    ),
    "dropout/fraction",
    "dropout/scale",
    "dropout/reproducible",
    "dropout/advances",
    "dropout/inference",
    "imports/no_tensorflow",
    *(
        f"tensorflow_only/{feature}"
        for feature in ("sampling", "uncached_search", "compiled_search", "trainer", "strategy")
    ),
    "search/bad_source_ids",
    "search/top_k_in_two_stages",
    "jax_only/data_parallel",
    *(f"loss/{case}/{kind}_formula" for case in LOSS_CASES for kind in ("value", "gradient")),
    "fit/first_loss_of_the_initial_weights",
)
# Checks of one backend only.
BACKEND_CHECK_NAMES = {
    "jax": (
        "fit/data_parallel_devices",
        "fit/data_parallel_equals_one_device",
        *(f"{model}/search/jit_equals_eager" for model in SEARCHED_MODELS),
    ),
    # On TensorFlow, XLA's static shapes (a preallocated cache, every sentence in the batch
    # to the end, as on JAX) give the outputs of the eager search (a growing cache, done
    # sentences leaving the batch).
    "tensorflow": tuple(
        f"{model}/search/static_shapes_equal_shrinking_batch" for model in SEARCHED_MODELS
    ),
}


def numpy(tensor):
    return np.asarray(keras.ops.convert_to_numpy(tensor))


def max_diff(a, b):
    a, b = np.asarray(a, "float64"), np.asarray(b, "float64")
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


class Recorder:
    """Collects the outputs and checks of one run; a failing case is recorded, not raised."""

    def __init__(self, reference_dir):
        self.reference_dir = None if reference_dir is None else Path(reference_dir)
        self.outputs = {}
        self.checks = {}
        self.seconds = {}

    def output(self, name, value):
        self.outputs[name] = numpy(value)

    def check(self, name, ok, detail=""):
        self.checks[name] = {"ok": bool(ok), "detail": str(detail)}

    def same(self, name, a, b, atol=SAME_ATOL):
        diff = max_diff(numpy(a), numpy(b))
        self.check(name, diff <= atol, f"max |diff| {diff:.3g} (bound {atol:g})")

    def run(self, name, function, *args):
        started = time.monotonic()
        try:
            function(self, *args)
        except Exception as error:  # noqa: BLE001  (recorded; the test reports it)
            lines = traceback.format_exception_only(type(error), error)
            self.checks[f"error/{name}"] = {
                "ok": False,
                "detail": f"{lines[-1].strip()}\n{traceback.format_exc()}",
            }
        self.seconds[name] = round(time.monotonic() - started, 2)


def _weights(recorder, out_dir, name, layer):
    """The reference's weights of case `name` set on `layer` (built), or this run's written out."""
    if recorder.reference_dir is None:
        (out_dir / "weights").mkdir(parents=True, exist_ok=True)
        np.savez(out_dir / "weights" / f"{name}.npz", *layer.get_weights())
    else:
        stored = np.load(recorder.reference_dir / "weights" / f"{name}.npz")
        layer.set_weights([stored[f"arr_{index}"] for index in range(len(stored.files))])


def check_layer_case(recorder, out_dir, name):
    """Eager outputs on the shared weights; `get_config`/JSON round trip; `.keras` save and load."""
    case = CASES[name]
    inputs = case.inputs()
    layer = case.layer_cls(**case.init_kwargs)
    call_layer(layer, inputs, case.call_kwargs)  # builds
    _weights(recorder, out_dir, name, layer)
    outputs = call_layer(layer, inputs, case.call_kwargs)
    recorder.output(name, outputs)

    config = layer.get_config()
    revived = case.layer_cls.from_config(config)
    text = json.dumps(keras.saving.serialize_keras_object(layer))
    deserialized = keras.saving.deserialize_keras_object(json.loads(text))
    call_layer(revived, inputs, case.call_kwargs)
    revived.set_weights(layer.get_weights())
    diff = max_diff(numpy(call_layer(revived, inputs, case.call_kwargs)), numpy(outputs))
    same_config = revived.get_config() == config and deserialized.get_config() == config
    recorder.check(
        f"{name}/get_config",
        same_config and type(deserialized) is case.layer_cls and diff <= SAME_ATOL,
        f"config round trip equal: {same_config}; outputs max |diff| {diff:.3g}",
    )

    model = functional_model(layer, inputs, case.call_kwargs)
    path = out_dir / "layers" / f"{name}.keras"
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    loaded = keras.saving.load_model(path)
    symbolic, reloaded = numpy(model(inputs)), numpy(loaded(inputs))
    recorder.check(
        f"{name}/keras_file",
        max(max_diff(symbolic, numpy(outputs)), max_diff(reloaded, symbolic)) <= SAME_ATOL
        and any(type(sublayer) is case.layer_cls for sublayer in loaded.layers),
        f"functional vs eager {max_diff(symbolic, numpy(outputs)):.3g}, loaded vs saved {max_diff(reloaded, symbolic):.3g}",
    )


def check_functions(recorder, out_dir):
    """The mask helpers and eq. 1 as functions; attention scores; the embedding's implicit mask."""
    rng = np.random.default_rng(5)
    query, key, value = (
        random_floats(rng, B, H, T, 4),
        random_floats(rng, B, H, S, 4),
        random_floats(rng, B, H, S, 6),
    )
    mask = rng.random((B, 1, T, S)) < 0.7
    mask[..., 0] = True  # every query sees one key at least
    outputs, weights = scaled_dot_product_attention(query, key, value, mask)
    recorder.output("functions/scaled_dot_product_attention", outputs)
    recorder.output("functions/attention_weights", attention_weights(query, key, mask))
    ids = random_ids(rng, [S, 3], S)
    recorder.output("functions/padding_mask", ops.cast(padding_mask(ids), "int32"))
    recorder.output("functions/causal_mask", ops.cast(causal_mask(4, 6, offset=2), "int32"))
    merged = merge_masks(
        T,
        S,
        key_padding_mask=padding([S, 4], S),
        attention_mask=rng.random((B, T, S)) < 0.8,
        causal=True,
        causal_offset=1,
    )
    recorder.output("functions/merge_masks", ops.cast(merged, "int32"))

    case = LAYER_CASES["multi_head_attention_causal_masked"]
    layer = MultiHeadAttention(**case.init_kwargs)
    inputs = case.inputs()
    layer(**inputs, **case.call_kwargs)
    _weights(recorder, out_dir, "multi_head_attention_scores", layer)
    _, scores = layer(**inputs, **case.call_kwargs, return_attention_scores=True)
    recorder.output("multi_head_attention_scores", scores)

    embedding = SharedEmbedding(V, D)
    recorder.output("shared_embedding_mask", ops.cast(embedding.compute_mask(ids), "int32"))


def check_implicit_mask(recorder, out_dir):
    """ids -> SharedEmbedding -> Add(PositionalEncoding) -> EncoderBlock: Keras' implicit mask reaches the block."""
    ids = random_ids(np.random.default_rng(6), [S, 3], S)
    inputs = keras.Input(shape=(None,), dtype="int32")
    embedding = SharedEmbedding(V, D)
    block = EncoderBlock(num_heads=H, intermediate_dim=F)
    hidden = embedding(inputs)
    hidden = keras.layers.Add()([hidden, PositionalEncoding()(hidden)])
    model = keras.Model(inputs, block(hidden))
    _weights(recorder, out_dir, "implicit_mask_encoder", model)
    implicit = model(ids)
    recorder.output("implicit_mask_encoder", implicit)
    # `predict` runs compiled (`jax.jit`, whose traced arrays carry no mask attribute; `tf.function`).
    recorder.output("implicit_mask_encoder_predict", model.predict(ids, batch_size=B, verbose=0))
    embedded = numpy(embedding(ids)) + numpy(PositionalEncoding()(embedding(ids)))
    explicit = block(embedded, padding_mask=padding([S, 3], S))
    recorder.same("implicit_mask_encoder/explicit", implicit, explicit)


def check_cached_decoder(recorder, out_dir, name):
    """`DecoderBlock.init_cache` and cached calls, one position at a time and in `CHUNKS`, against a full pass."""
    kwargs, max_length = CACHED_DECODER_CASES[name]
    rng = np.random.default_rng(7)
    decoder_sequence, encoder_sequence = random_floats(rng, B, T, D), random_floats(rng, B, S, D)
    encoder_mask = padding([S, 4], S)
    block = DecoderBlock(num_heads=H, intermediate_dim=F, dropout=0.1, **kwargs)
    block(decoder_sequence, encoder_sequence, encoder_padding_mask=encoder_mask)  # builds
    _weights(recorder, out_dir, name, block)
    full = block(decoder_sequence, encoder_sequence, encoder_padding_mask=encoder_mask)
    recorder.output(f"{name}/full", full)
    for kind, chunks in (("steps", (1,) * T), ("chunks", CHUNKS)):
        cache = block.init_cache(encoder_sequence, max_length)
        outputs, start = [], 0
        for size in chunks:
            index = ops.convert_to_tensor(start, "int32")
            step, cache = block(
                decoder_sequence[:, start : start + size],
                encoder_padding_mask=encoder_mask,
                cache=cache,
                cache_index=index,
            )
            outputs.append(numpy(step))
            start += size
        stepped = np.concatenate(outputs, axis=1)
        recorder.output(f"{name}/{kind}", stepped)
        recorder.same(f"{name}/{kind}_equal_full", stepped, full, atol=MAX_ABS_DIFF)


def _model_inputs():
    rng = np.random.default_rng(8)
    source = random_ids(rng, SOURCE_LENGTHS, SOURCE_LENGTH, MODEL_CONFIG["vocabulary_size"])
    target = random_ids(rng, TARGET_LENGTHS, TARGET_LENGTH, MODEL_CONFIG["vocabulary_size"])
    return {"source_ids": source, "target_ids": target}


def _cached_logits(model, inputs, max_length):
    """Teacher-forced decoding one target position per `decode_step`: `(B, T, V)` logits."""
    encoder_outputs, source_mask = model.encode(inputs["source_ids"])
    cache = model.init_cache(encoder_outputs, max_length)
    steps = []
    for position in range(TARGET_LENGTH):
        index = ops.convert_to_tensor(position, "int32")
        logits, cache = model.decode_step(
            inputs["target_ids"][:, position : position + 1], cache, index, source_mask
        )
        steps.append(numpy(logits))
    return np.concatenate(steps, axis=1)


def check_model(recorder, out_dir, name):
    """A tiny Transformer on TensorFlow's weights: every view, `.keras`, `get_config`, dropout."""
    config = get_preset("tiny", **MODELS[name])
    inputs = _model_inputs()
    if recorder.reference_dir is None:
        keras.utils.set_random_seed(MODEL_SEEDS[name])
        model = Transformer(config)
        model(inputs)
        if model.logits_bias is not None:  # zeros at first: a bias that changes the logits
            bias = np.random.default_rng(MODEL_SEEDS[name]).normal(
                0.0, 1.0, (config.decoder_vocabulary_size,)
            )
            model.logits_bias.bias.assign(bias.astype("float32"))
        model.save(out_dir / f"{name}.keras")
        model.save_weights(out_dir / f"{name}.weights.h5")
        np.savez(out_dir / f"{name}.get_weights.npz", *model.get_weights())
        for check in ("weights_h5", "set_weights"):
            recorder.check(f"{name}/{check}", True, "the reference writes the weights")
    else:  # the reference's `.keras` file; its `.weights.h5` and `get_weights()` in models built here
        model = keras.saving.load_model(recorder.reference_dir / f"{name}.keras")
        rebuilt = Transformer(config)
        rebuilt(inputs)
        rebuilt.load_weights(recorder.reference_dir / f"{name}.weights.h5")
        recorder.same(f"{name}/weights_h5", rebuilt(inputs), model(inputs))
        listed = Transformer(config)
        listed(inputs)
        stored = np.load(recorder.reference_dir / f"{name}.get_weights.npz")
        listed.set_weights([stored[f"arr_{index}"] for index in range(len(stored.files))])
        recorder.same(f"{name}/set_weights", listed(inputs), model(inputs))
    logits = model(inputs, training=False)
    # Real positions only: on TensorFlow the model skips the padding (`config.skip_padding`),
    # and its logits there are not computed.
    real = padding(TARGET_LENGTHS, TARGET_LENGTH)
    recorder.output(f"{name}/logits", numpy(logits)[real])
    encoder_outputs, source_mask = model.encode(inputs["source_ids"])
    recorder.output(f"{name}/encoder", encoder_outputs)
    decoded = model.decode(inputs["target_ids"], encoder_outputs, source_mask)
    recorder.output(f"{name}/decode", decoded)
    steps = _cached_logits(model, inputs, TARGET_LENGTH)
    recorder.output(f"{name}/steps", steps)
    recorder.output(f"{name}/steps_growing", _cached_logits(model, inputs, None))
    diff = max_diff(steps[real], numpy(decoded)[real])
    recorder.check(
        f"{name}/steps_equal_decode",
        diff <= MAX_ABS_DIFF,
        f"max |diff| {diff:.3g} at real positions",
    )
    check_search(recorder, name, model)

    # .keras file written and read on this backend; get_config and JSON round trip.
    path = out_dir / f"{name}.{keras.backend.backend()}.keras"
    model.save(path)
    recorder.same(f"{name}/keras_file", keras.saving.load_model(path)(inputs), logits)
    revived = Transformer.from_config(model.get_config())
    deserialized = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(keras.saving.serialize_keras_object(model)))
    )
    revived(inputs)
    revived.set_weights(model.get_weights())
    diff = max_diff(numpy(revived(inputs)), numpy(logits))
    same_config = revived.get_config() == model.get_config() == deserialized.get_config()
    recorder.check(
        f"{name}/get_config",
        same_config and diff <= SAME_ATOL,
        f"config equal: {same_config}; max |diff| {diff:.3g}",
    )

    # Dropout: the same seed draws the same masks; dropout changes the output; rates 0 with
    # training=True compute inference.
    def trained_call(model_config, seed):
        keras.utils.set_random_seed(seed)
        fresh = Transformer(model_config)
        fresh(inputs)
        fresh.set_weights(model.get_weights())
        return numpy(fresh(inputs, training=True))

    first, second = trained_call(config, 11), trained_call(config, 11)
    recorder.same(f"{name}/dropout_reproducible", first, second, atol=0.0)
    diff = max_diff(first, numpy(logits))
    recorder.check(
        f"{name}/dropout_active", diff > 1e-3, f"training=True vs inference max |diff| {diff:.3g}"
    )
    no_dropout = config.replace(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    rate0 = trained_call(no_dropout, 12)
    recorder.output(f"{name}/training_rate0", rate0[real])
    recorder.same(f"{name}/rate0_equals_inference", rate0, logits)


def check_search(recorder, name, model, source=None, constraint=None):
    """Greedy and beam search (`SEARCH`, `BEAM`) on this backend; on TensorFlow, also the
    searches under XLA (static shapes) against the eager ones (shapes that change); on JAX,
    the searches under `jax.jit` against the ones called as they are."""
    from keras_transformer.decoding import beam_search, greedy_search

    source = _model_inputs()["source_ids"] if source is None else np.asarray(source, "int32")
    search = dict(SEARCH, constraint=constraint)
    found = {}
    found["greedy_ids"], found["greedy_scores"] = greedy_search(model, source, **search)
    found["beam_ids"], found["beam_scores"] = beam_search(model, source, **search, **BEAM)
    for kind, value in found.items():
        recorder.output(f"{name}/search/{kind}", value)

    def searches(source):
        return (
            *greedy_search(model, source, **search),
            *beam_search(model, source, **search, **BEAM),
        )

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        check, compiled = (
            "static_shapes_equal_shrinking_batch",
            tf.function(searches, jit_compile=True),
        )
    elif keras.backend.backend() == "jax":
        import jax

        check, compiled = "jit_equals_eager", jax.jit(searches)
    else:
        return
    compiled = dict(zip(SEARCH_OUTPUTS, compiled(keras.ops.convert_to_tensor(source))))
    same_ids = all(
        np.array_equal(numpy(compiled[kind]), numpy(found[kind]))
        for kind in ("greedy_ids", "beam_ids")
    )
    diff = max(
        max_diff(numpy(compiled[kind]), numpy(found[kind]))
        for kind in ("greedy_scores", "beam_scores")
    )
    recorder.check(
        f"{name}/search/{check}",
        same_ids and diff <= MAX_ABS_DIFF,
        f"token ids equal: {same_ids}; scores max |diff| {diff:.3g}",
    )


def check_parsing(recorder, out_dir):
    """A word-position model's greedy and beam search under the tree constraint
    (`PARSING_*`), on TensorFlow's weights."""
    from keras_transformer.decoding import TreeConstraint
    from keras_transformer.decoding.tree_constraint import CLOSING, END, OPEN, OTHER, TAG
    from keras_transformer.models import build_model
    from keras_transformer.models.parsing import word_kinds

    kinds = (OTHER,) * 3 + (END,) + (OPEN,) * 6 + (CLOSING,) + (TAG,) * 6 + (OTHER,) * 15
    constraint = TreeConstraint(kinds, PARSING_WORD_STARTS)
    if recorder.reference_dir is None:
        keras.utils.set_random_seed(MODEL_SEEDS[PARSING_MODEL])
    model = build_model(get_preset("tiny", **PARSING_CONFIG))
    model(_model_inputs())
    model.set_word_kinds(word_kinds(constraint))
    weights = f"{PARSING_MODEL}.weights.h5"
    if recorder.reference_dir is None:
        model.save_weights(out_dir / weights)
    else:
        model.load_weights(recorder.reference_dir / weights)
    check_search(recorder, PARSING_MODEL, model, PARSING_SOURCE, constraint)


def check_dropout(recorder, out_dir):
    """`ReplicaDropout` (every dropout of the toolkit) on this backend's generator."""
    rate, ones = 0.3, np.ones((64, 256), "float32")
    layer = ReplicaDropout(rate, seed=7)
    dropped = numpy(layer(ones, training=True))
    fraction = float(np.mean(dropped == 0))
    recorder.check(
        "dropout/fraction",
        abs(fraction - rate) < 0.02,
        f"{fraction:.4f} of {ones.size} units dropped, rate {rate}",
    )
    kept = dropped[dropped != 0]
    recorder.same("dropout/scale", kept, np.full_like(kept, 1 / (1 - rate)))
    again = numpy(ReplicaDropout(rate, seed=7)(ones, training=True))
    recorder.same("dropout/reproducible", dropped, again, atol=0.0)
    following = numpy(layer(ones, training=True))
    recorder.check(
        "dropout/advances", not np.array_equal(following, dropped), "a second call draws a new mask"
    )
    recorder.same("dropout/inference", layer(ones, training=False), ones, atol=0.0)


def check_only_on(recorder, name, feature, runs_on):
    """Check `name`: `feature()` runs on the backend `runs_on`, and elsewhere raises a
    `RuntimeError` in one line naming the backend."""
    backend = keras.backend.backend()
    try:
        feature()
    except RuntimeError as error:
        message = str(error)
        one_line = "\n" not in message and f"not on {backend}" in message
        recorder.check(name, backend != runs_on and one_line, message)
    else:
        recorder.check(name, backend == runs_on, f"ran on {backend}")


def check_tensorflow_only(recorder, out_dir):
    """What runs on TensorFlow only: it runs there, and fails elsewhere with one line naming the backend."""
    from keras_transformer.decoding import (
        greedy_search,
        make_search_fn,
        sample,
    )  # imports TensorFlow (and TensorFlow Text)
    from keras_transformer.training import Trainer, create_strategy

    config = get_preset("tiny", **MODEL_CONFIG)
    model = Transformer(config)
    source = _model_inputs()["source_ids"]
    features = {
        "sampling": lambda: sample(model, source, seed=1, max_length=4),
        "uncached_search": lambda: greedy_search(model, source, max_length=4, use_cache=False),
        "compiled_search": lambda: make_search_fn(model, "beam", max_length=4)(source),
        "trainer": lambda: Trainer(config, out_dir / "trainer"),
        "strategy": lambda: create_strategy("default"),
    }
    for name, feature in features.items():
        check_only_on(recorder, f"tensorflow_only/{name}", feature, "tensorflow")


def check_search_input(recorder, out_dir):
    """Greedy and beam search refuse source ids that are not integer `(batch, length)` with one
    ValueError naming the dtype or the shape, on every backend."""
    from keras_transformer.decoding import beam_search, greedy_search

    model = Transformer(get_preset("tiny", **MODEL_CONFIG))
    source = _model_inputs()["source_ids"]
    cases = {
        "dtype=float32": source.astype("float32"),
        f"shape={source[:, :, None].shape}": source[:, :, None],
    }
    messages = []
    for search in (greedy_search, beam_search):
        for expected, ids in cases.items():
            try:
                search(model, ids, max_length=4)
                messages.append(f"{search.__name__} took {expected}")
            except ValueError as error:
                if not (str(error).startswith("source_ids must") and str(error).endswith(expected)):
                    messages.append(f"{search.__name__}: {error}")
    recorder.check(
        "search/bad_source_ids",
        not messages,
        "; ".join(messages) or "4 one-line errors naming the value",
    )


def check_two_stage_top_k(recorder, out_dir):
    """`decoding.selection.top_k` on this backend, on rows with many ties and -inf, widths
    that are and are not whole blocks, default and given block sizes: the top-k values
    against numpy's ordering, ties ranked by lower index
    as one `top_k` ranks them on TensorFlow and JAX. PyTorch's `topk` ranks ties in no
    fixed order, so there the indices must only point at the values, each once."""
    from keras_transformer.decoding import selection

    ties_by_index = keras.backend.backend() != "torch"
    rng = np.random.default_rng(0)
    failures = []
    for case in range(80):
        if case % 4 == 0:  # 20 shapes, 4 draws of values each (JAX compiles once per shape)
            rows, width = int(rng.integers(1, 5)), int(rng.integers(2, 400))
            k = int(rng.integers(1, min(width, 40) + 1))
            block = int(rng.integers(1, 17)) if case % 8 else None  # None: `selection.block_size`
            block = None if block == 1 else block
        values = rng.integers(-3, 3, size=(rows, width)).astype("float32")
        values[rng.random((rows, width)) < 0.2] = -np.inf
        order = np.stack(
            [np.lexsort((np.arange(width), -row))[:k] for row in values]
        )  # value desc, index asc
        found_values, found_indices = (
            numpy(x) for x in selection.top_k(ops.convert_to_tensor(values), k, block=block)
        )
        ok = np.array_equal(found_values, np.take_along_axis(values, order, axis=1))
        if ties_by_index:
            ok = ok and np.array_equal(found_indices, order)
        else:
            ok = (
                ok
                and np.array_equal(np.take_along_axis(values, found_indices, axis=1), found_values)
                and all(len(set(row)) == k for row in found_indices.tolist())
            )
        if not ok:
            failures.append(f"rows {rows} width {width} k {k} block {block}")
    detail = "; ".join(failures[:3]) or "80 cases of 20 shapes: the top-k of each row"
    recorder.check("search/top_k_in_two_stages", not failures, detail)


def value_and_gradient(function, x):
    """`function(x)` (a scalar) and its gradient with respect to the float32 array `x`, by this
    backend's own autodiff."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.value_and_grad(function)(jax.numpy.asarray(x))
    if backend == "torch":
        import torch

        x = torch.tensor(x, requires_grad=True)
        value = function(x)
        value.backward()
        return value.detach(), x.grad
    import tensorflow as tf

    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = function(x)
    return value, tape.gradient(value, x)


def expected_loss(labels, logits, label_smoothing):
    """The label-smoothed per-token mean over real tokens and its gradient, in float64 NumPy."""
    logits = np.asarray(logits, "float64")
    vocabulary = logits.shape[-1]
    target = (1 - label_smoothing) * np.eye(vocabulary)[labels] + label_smoothing / vocabulary  # q
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    real = labels != 0
    tokens = real.sum()
    value = -(target * log_probabilities).sum(axis=-1)[real].sum() / tokens
    gradient = (np.exp(log_probabilities) - target) * real[..., None] / tokens
    return value, gradient


def check_loss(recorder, out_dir):
    """`LabelSmoothedCrossEntropy` and `token_losses`: values and gradients on this backend."""
    from keras_transformer.training.loss import LabelSmoothedCrossEntropy, token_losses

    rng = np.random.default_rng(9)
    batch, length, vocabulary = LOSS_SHAPE
    logits = random_floats(rng, batch, length, vocabulary)
    labels = random_ids(rng, LOSS_LENGTHS, length, vocabulary)
    for case, label_smoothing in LOSS_CASES.items():
        loss = LabelSmoothedCrossEntropy(label_smoothing)
        value, gradient = value_and_gradient(lambda z, loss=loss: loss(labels, z), logits)
        recorder.output(f"loss/{case}/value", value)
        recorder.output(f"loss/{case}/gradient", gradient)
        recorder.output(
            f"loss/{case}/token_losses", token_losses(labels, logits, label_smoothing)[0]
        )
        expected_value, expected_gradient = expected_loss(labels, logits, label_smoothing)
        recorder.same(f"loss/{case}/value_formula", value, expected_value, atol=LOSS_ATOL)
        recorder.same(f"loss/{case}/gradient_formula", gradient, expected_gradient, atol=LOSS_ATOL)


def _fit_data(recorder, out_dir):
    """The reference's tokenizer, initial weights and `(source, target, labels)` batches (each
    `(FIT_STEPS, FIT_SENTENCES, FIT_LENGTH)`), made here in the reference run."""
    path = out_dir / "fit_data.npz"
    if recorder.reference_dir is not None:
        with np.load(recorder.reference_dir / path.name) as stored:
            return dict(stored)
    from keras_transformer.data import Tokenizer, builtin_task, make_dataset, train_sentencepiece

    pairs = builtin_task("train")[:FIT_PAIRS]
    spm = train_sentencepiece(
        [text for pair in pairs for text in pair], out_dir / "fit_spm.model", FIT_VOCABULARY
    )
    dataset = make_dataset(
        pairs,
        Tokenizer(spm),
        batch_tokens=FIT_SENTENCES * FIT_LENGTH,
        max_length=FIT_LENGTH,
        bucket_boundaries=[FIT_LENGTH],
        shuffle=False,
        drop_remainder=True,
    )
    batches = list(dataset.take(FIT_STEPS).as_numpy_iterator())
    data = {
        key: np.stack([inputs[key] for inputs, _ in batches])
        for key in ("source_ids", "target_ids")
    }
    data["labels"] = np.stack([labels for _, labels in batches])
    keras.utils.set_random_seed(13)
    model = Transformer(get_preset("tiny", **FIT_MODEL))
    model({key: data[key][0] for key in ("source_ids", "target_ids")})
    for index, weight in enumerate(model.get_weights()):
        data[f"weight_{index}"] = weight
    np.savez(path, **data)
    return data


def _fitted(data):
    """A model on the initial weights of `data`, fit on its batches: `(model, per-step losses,
    evaluate's loss on the first batch after the last update, the first batch)`."""
    import tensorflow as tf

    from keras_transformer.training.loss import LabelSmoothedCrossEntropy

    inputs = {key: data[key] for key in ("source_ids", "target_ids")}
    first = ({key: value[0] for key, value in inputs.items()}, data["labels"][0])
    model = Transformer(get_preset("tiny", **FIT_MODEL))
    model(first[0])
    model.set_weights([data[f"weight_{index}"] for index in range(len(model.weights))])
    model.compile(
        optimizer=keras.optimizers.Adam(FIT_LEARNING_RATE),
        loss=LabelSmoothedCrossEntropy(FIT_LABEL_SMOOTHING),
    )
    # One element per batch; one step per epoch, so that each epoch's loss is one step's
    # (Keras keeps the iterator from epoch to epoch when `steps_per_epoch` is given).
    dataset = tf.data.Dataset.from_tensor_slices((inputs, data["labels"]))
    history = model.fit(dataset, epochs=FIT_STEPS, steps_per_epoch=1, shuffle=False, verbose=0)
    evaluated = model.evaluate(dataset.take(1), verbose=0)
    return model, np.asarray(history.history["loss"], "float32"), np.float32(evaluated), first


def translate_fitted(recorder, out_dir, model, data):
    """Fit on, save the weights and translate with them on this backend (`FIT_TRANSLATIONS`)."""
    import tensorflow as tf

    from keras_transformer.data import Tokenizer, builtin_task
    from keras_transformer.decoding import beam_search
    from keras_transformer.decoding.text import decode_text, encode_source

    inputs = {key: data[key] for key in ("source_ids", "target_ids")}
    dataset = tf.data.Dataset.from_tensor_slices((inputs, data["labels"])).repeat()
    model.fit(dataset, epochs=1, steps_per_epoch=FIT_MORE_STEPS, shuffle=False, verbose=0)
    model.save_weights(out_dir / FIT_WEIGHTS)
    tokenizer = Tokenizer((recorder.reference_dir or out_dir) / "fit_spm.model")
    sources = [source for source, _ in builtin_task("train")[:FIT_TRANSLATE_SENTENCES]]
    source_ids = encode_source(tokenizer, sources, FIT_LENGTH).numpy()
    token_ids, _ = beam_search(model, source_ids, num_return=FIT_BEAM["beam_size"], **FIT_BEAM)
    texts = [
        [text.decode() for text in row] for row in decode_text(tokenizer, numpy(token_ids)).numpy()
    ]
    (out_dir / FIT_TRANSLATIONS).write_text(json.dumps({"sources": sources, "texts": texts}))


def check_fit(recorder, out_dir):
    """`model.fit` with `LabelSmoothedCrossEntropy` on the built-in task's batches; on JAX also
    under `keras.distribution.DataParallel` on JAX_DEVICES devices."""
    from keras_transformer.training.loss import LabelSmoothedCrossEntropy

    data = _fit_data(recorder, out_dir)
    model, losses, evaluated, first = _fitted(data)
    recorder.output("fit/first_loss", losses[0])
    recorder.output("fit/losses", losses)
    recorder.output("fit/evaluate", evaluated)
    # The first step reports the loss of the initial weights on the first batch.
    initial = Transformer(get_preset("tiny", **FIT_MODEL))
    initial(first[0])
    initial.set_weights([data[f"weight_{index}"] for index in range(len(initial.weights))])
    direct = LabelSmoothedCrossEntropy(FIT_LABEL_SMOOTHING)(first[1], initial(first[0]))
    recorder.same(
        "fit/first_loss_of_the_initial_weights", losses[0], direct, atol=FIT_FIRST_LOSS_ATOL
    )
    recorder.run("fit_translate", translate_fitted, out_dir, model, data)
    recorder.run("fit_data_parallel", check_data_parallel, data, losses, evaluated)


def check_data_parallel(recorder, data, losses, evaluated):
    """On JAX, the same fit under `keras.distribution.DataParallel` on JAX_DEVICES CPU devices
    equals the fit on one. Elsewhere `fit` under a `DataParallel` fails in one line."""
    if keras.backend.backend() != "jax":

        def fit_under_data_parallel():
            model = Transformer(get_preset("tiny", **FIT_MODEL))
            model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
            inputs = {key: data[key][0] for key in ("source_ids", "target_ids")}
            with keras.distribution.DataParallel(devices=["cpu:0"]).scope():
                model.fit(inputs, data["labels"][0], verbose=0)

        check_only_on(recorder, "jax_only/data_parallel", fit_under_data_parallel, "jax")
        return
    devices = keras.distribution.list_devices("cpu")
    distribution = keras.distribution.DataParallel(devices=devices)
    with distribution.scope():
        model, parallel_losses, parallel_evaluated, first = _fitted(data)
        layout = distribution.get_data_layout(first[1].shape)
    recorder.check("jax_only/data_parallel", True, "ran on jax (fit/data_parallel_*)")
    variable_devices = {
        len(variable.value.sharding.device_set) for variable in model.trainable_variables
    }
    recorder.check(
        "fit/data_parallel_devices",
        len(devices) == JAX_DEVICES
        and variable_devices == {JAX_DEVICES}
        and tuple(layout.device_mesh.shape) == (JAX_DEVICES,)
        and layout.axes[0] == "batch",
        f"{len(devices)} devices; the variables on {sorted(variable_devices)} devices; batches split along "
        f"{layout.axes} of a mesh {tuple(layout.device_mesh.shape)}",
    )
    first = max_diff(parallel_losses[0], losses[0])
    every = max_diff(np.append(parallel_losses, parallel_evaluated), np.append(losses, evaluated))
    recorder.check(
        "fit/data_parallel_equals_one_device",
        first <= FIT_FIRST_LOSS_ATOL and every <= FIT_LOSS_ATOL,
        f"first loss max |diff| {first:.3g} (bound {FIT_FIRST_LOSS_ATOL:g}), every step and evaluate "
        f"{every:.3g} (bound {FIT_LOSS_ATOL:g})",
    )


def run(out_dir, reference_dir=None):
    """Record every output and check of this backend in `out_dir` (see the module docstring)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(reference_dir)
    for name in CASES:
        recorder.run(name, check_layer_case, out_dir, name)
    recorder.run("functions", check_functions, out_dir)
    recorder.run("implicit_mask_encoder", check_implicit_mask, out_dir)
    for name in CACHED_DECODER_CASES:
        recorder.run(name, check_cached_decoder, out_dir, name)
    for name in MODELS:
        recorder.run(name, check_model, out_dir, name)
    recorder.run("dropout", check_dropout, out_dir)
    imported = TENSORFLOW_IMPORTED_BY_THE_TOOLKIT
    recorder.check(
        "imports/no_tensorflow",
        keras.backend.backend() == "tensorflow" or not imported,
        f"TensorFlow {'imported' if imported else 'not imported'} by `import keras_transformer`",
    )
    recorder.run("tensorflow_only", check_tensorflow_only, out_dir)  # it imports TensorFlow
    recorder.run("parsing", check_parsing, out_dir)
    recorder.run("search_input", check_search_input, out_dir)
    recorder.run("two_stage_top_k", check_two_stage_top_k, out_dir)
    recorder.run("loss", check_loss, out_dir)  # the training package imports TensorFlow
    recorder.run("fit", check_fit, out_dir)  # tf.data
    np.savez(out_dir / "outputs.npz", **recorder.outputs)
    (out_dir / "checks.json").write_text(
        json.dumps(
            {
                "backend": keras.backend.backend(),
                "checks": recorder.checks,
                "seconds": recorder.seconds,
            }
        )
    )
    return recorder


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
