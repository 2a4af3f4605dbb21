"""Runs every public layer and two tiny Transformers under one Keras backend and records what they compute.

Run by tests/test_backends.py: in the test process for TensorFlow (the reference), and
in ONE fresh process per other backend, the backend chosen by `KERAS_BACKEND`:

    KERAS_BACKEND=jax python tests/backend_harness.py OUT_DIR REFERENCE_DIR

Without REFERENCE_DIR (the reference run) the layers keep the weights they were built
with and write them to `OUT_DIR/weights/<case>.npz`, and each model is saved as
`OUT_DIR/<model>.keras`, `OUT_DIR/<model>.weights.h5` and `OUT_DIR/<model>.get_weights.npz`.
With it, every layer takes the reference's weights (`set_weights`) and each model is
loaded from the reference's `.keras` file (and, rebuilt from its config, from its
`.weights.h5` and its `get_weights()` list), so that every output can be compared with
TensorFlow's on the same weights.

It writes:

* `OUT_DIR/outputs.npz`: one array per name of `OUTPUT_NAMES`, computed on this backend
  with dropout off (inference), or with `training=True` and every dropout rate 0.
* `OUT_DIR/checks.json`: `{"backend", "checks", "seconds"}`; `checks` holds `{name: {"ok":
  bool, "detail": str}}` for each name of `CHECK_NAMES`, properties checked within this
  backend: `.keras` save and load, the `get_config` (and JSON) round trip, cached
  decoding equal to a full pass, implicit masks equal to explicit ones, dropout (see
  `check_dropout`; masks are drawn by each backend's own generator, so they are not
  compared across backends), that `import keras_transformer` imported no TensorFlow, and
  that what runs on TensorFlow only fails elsewhere in one line naming the backend
  (`check_tensorflow_only`); `seconds` the time of each case.

A case that raises records the error under `error/<case>` instead of stopping the run.

Shape letters: B batch, S source length, T target length, D width, H heads, F FFN width,
V vocabulary size.
"""

import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
        dict(num_heads=H, intermediate_dim=F, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1),
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
        MODEL_CONFIG, attention_window=2, normalize_first=True, positional="learned", tie_output=False
    ),
}
SOURCE_LENGTHS, TARGET_LENGTHS = [7, 4], [6, 3]
SOURCE_LENGTH, TARGET_LENGTH = 7, 6
MODEL_OUTPUTS = ("logits", "encoder", "decode", "steps", "steps_growing", "training_rate0")

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

OUTPUT_NAMES = (
    *CASES,
    *FUNCTION_OUTPUTS,
    *(f"{name}/{kind}" for name in CACHED_DECODER_CASES for kind in ("full", "steps", "chunks")),
    *(f"{model}/{kind}" for model in MODELS for kind in MODEL_OUTPUTS),
)
CHECK_NAMES = (
    *(f"{name}/{check}" for name in CASES for check in ("get_config", "keras_file")),
    "implicit_mask_encoder/explicit",
    *(f"{name}/{kind}" for name in CACHED_DECODER_CASES for kind in ("steps_equal_full", "chunks_equal_full")),
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
    *(f"tensorflow_only/{feature}" for feature in ("search", "loss")),
)


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
            self.checks[f"error/{name}"] = {"ok": False, "detail": f"{lines[-1].strip()}\n{traceback.format_exc()}"}
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
    query, key, value = random_floats(rng, B, H, T, 4), random_floats(rng, B, H, S, 4), random_floats(rng, B, H, S, 6)
    mask = rng.random((B, 1, T, S)) < 0.7
    mask[..., 0] = True  # every query sees one key at least
    outputs, weights = scaled_dot_product_attention(query, key, value, mask)
    recorder.output("functions/scaled_dot_product_attention", outputs)
    recorder.output("functions/attention_weights", attention_weights(query, key, mask))
    ids = random_ids(rng, [S, 3], S)
    recorder.output("functions/padding_mask", ops.cast(padding_mask(ids), "int32"))
    recorder.output("functions/causal_mask", ops.cast(causal_mask(4, 6, offset=2), "int32"))
    merged = merge_masks(
        T, S, key_padding_mask=padding([S, 4], S), attention_mask=rng.random((B, T, S)) < 0.8, causal=True, causal_offset=1
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
                decoder_sequence[:, start : start + size], encoder_padding_mask=encoder_mask, cache=cache, cache_index=index
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
        logits, cache = model.decode_step(inputs["target_ids"][:, position : position + 1], cache, index, source_mask)
        steps.append(numpy(logits))
    return np.concatenate(steps, axis=1)


def check_model(recorder, out_dir, name):
    """A tiny Transformer on TensorFlow's weights: every view, `.keras`, `get_config`, dropout."""
    config = get_preset("tiny", **MODELS[name])
    inputs = _model_inputs()
    if recorder.reference_dir is None:
        model = Transformer(config)
        model(inputs)
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
    recorder.output(f"{name}/logits", logits)
    encoder_outputs, source_mask = model.encode(inputs["source_ids"])
    recorder.output(f"{name}/encoder", encoder_outputs)
    decoded = model.decode(inputs["target_ids"], encoder_outputs, source_mask)
    recorder.output(f"{name}/decode", decoded)
    steps = _cached_logits(model, inputs, TARGET_LENGTH)
    recorder.output(f"{name}/steps", steps)
    recorder.output(f"{name}/steps_growing", _cached_logits(model, inputs, None))
    real = padding(TARGET_LENGTHS, TARGET_LENGTH)  # padded positions are not decoded one by one
    diff = max_diff(steps[real], numpy(decoded)[real])
    recorder.check(f"{name}/steps_equal_decode", diff <= MAX_ABS_DIFF, f"max |diff| {diff:.3g} at real positions")

    # .keras file written and read on this backend; get_config and JSON round trip.
    path = out_dir / f"{name}.{keras.backend.backend()}.keras"
    model.save(path)
    recorder.same(f"{name}/keras_file", keras.saving.load_model(path)(inputs), logits)
    revived = Transformer.from_config(model.get_config())
    deserialized = keras.saving.deserialize_keras_object(json.loads(json.dumps(keras.saving.serialize_keras_object(model))))
    revived(inputs)
    revived.set_weights(model.get_weights())
    diff = max_diff(numpy(revived(inputs)), numpy(logits))
    same_config = revived.get_config() == model.get_config() == deserialized.get_config()
    recorder.check(
        f"{name}/get_config", same_config and diff <= SAME_ATOL, f"config equal: {same_config}; max |diff| {diff:.3g}"
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
    recorder.check(f"{name}/dropout_active", diff > 1e-3, f"training=True vs inference max |diff| {diff:.3g}")
    no_dropout = config.replace(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    rate0 = trained_call(no_dropout, 12)
    recorder.output(f"{name}/training_rate0", rate0)
    recorder.same(f"{name}/rate0_equals_inference", rate0, logits)


def check_dropout(recorder, out_dir):
    """`ReplicaDropout` (every dropout of the toolkit) on this backend's generator."""
    rate, ones = 0.3, np.ones((64, 256), "float32")
    layer = ReplicaDropout(rate, seed=7)
    dropped = numpy(layer(ones, training=True))
    fraction = float(np.mean(dropped == 0))
    recorder.check("dropout/fraction", abs(fraction - rate) < 0.02, f"{fraction:.4f} of {ones.size} units dropped, rate {rate}")
    kept = dropped[dropped != 0]
    recorder.same("dropout/scale", kept, np.full_like(kept, 1 / (1 - rate)))
    again = numpy(ReplicaDropout(rate, seed=7)(ones, training=True))
    recorder.same("dropout/reproducible", dropped, again, atol=0.0)
    following = numpy(layer(ones, training=True))
    recorder.check("dropout/advances", not np.array_equal(following, dropped), "a second call draws a new mask")
    recorder.same("dropout/inference", layer(ones, training=False), ones, atol=0.0)


def check_tensorflow_only(recorder, out_dir):
    """What runs on TensorFlow only: it runs there, and fails elsewhere with one line naming the backend."""
    from keras_transformer.decoding import greedy_search  # imports TensorFlow (and TensorFlow Text)
    from keras_transformer.training import LabelSmoothedCrossEntropy

    backend = keras.backend.backend()
    model = Transformer(get_preset("tiny", **MODEL_CONFIG))
    features = {
        "search": lambda: greedy_search(model, _model_inputs()["source_ids"], max_length=4),
        "loss": LabelSmoothedCrossEntropy,
    }
    for name, feature in features.items():
        try:
            feature()
        except RuntimeError as error:
            message = str(error)
            one_line = "\n" not in message and f"not on {backend}" in message
            recorder.check(f"tensorflow_only/{name}", backend != "tensorflow" and one_line, message)
        else:
            recorder.check(f"tensorflow_only/{name}", backend == "tensorflow", f"ran on {backend}")


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
    np.savez(out_dir / "outputs.npz", **recorder.outputs)
    imported = TENSORFLOW_IMPORTED_BY_THE_TOOLKIT
    recorder.check(
        "imports/no_tensorflow",
        keras.backend.backend() == "tensorflow" or not imported,
        f"TensorFlow {'imported' if imported else 'not imported'} by `import keras_transformer`",
    )
    recorder.run("tensorflow_only", check_tensorflow_only, out_dir)  # last: it imports TensorFlow
    (out_dir / "checks.json").write_text(
        json.dumps({"backend": keras.backend.backend(), "checks": recorder.checks, "seconds": recorder.seconds})
    )
    return recorder


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
