"""Int8 through Keras' `model.quantize("int8")`: every weight matrix, closeness to float32,
saving, cached decoding, bad modes (the export: tests/test_export.py)."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import MultiHeadAttention, SharedEmbedding, Transformer
from keras_transformer.decoding import beam_search, recompute_beam_search
from tests.test_transformer import (
    SOURCE,
    TARGET,
    TINY,
    VARIANTS,
    as_numpy,
    cached_logits,
    logits_of,
    tiny_config,
)

# Relative RMS error of int8 outputs against float32 (||int8 - float|| / ||float||).
# Rounding to int8 moves each weight and each activation by at most half a step, 1/254 of
# its row's abs-max: about 0.7% RMS of a Gaussian row per quantized tensor. The tiny
# model's logits measured 0.7-1.5% over 5 variants x 3 seeds (and its layers alone less);
# 3% leaves that twice over, while a scale that is dropped or applied on the wrong axis
# gives errors of 100% and more.
RELATIVE_TOLERANCE = 0.03
REAL = TARGET != 0  # the target positions that are not padding
SAVE_LOAD_ATOL = 1e-6


def relative_error(actual, expected):
    return float(np.sqrt(np.mean((actual - expected) ** 2) / np.mean(expected**2)))


def quantized_model(variant="post_ln", seed=0, config=None):
    """`(model quantized with model.quantize, its float32 logits before)`, a tiny seeded Transformer."""
    keras.utils.set_random_seed(seed)
    model = Transformer(tiny_config(**VARIANTS[variant]))
    float_logits = logits_of(model)
    model.quantize("int8", config=config)
    return model, float_logits


@pytest.fixture(scope="module")
def quantized():
    return quantized_model()


# --- every weight matrix ---


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_quantize_makes_every_weight_matrix_int8(variant):
    """After model.quantize("int8") no float matrix is left but the learned position table
    (a table added to the embeddings, which keras-hub's PositionEmbedding keeps float too)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = quantized_model(variant)
    # Keras warns about layers without `quantize`: of ours, only about the one holding a matrix.
    unquantized = [
        str(warning.message)
        for warning in caught
        if "does not have a `quantize`" in str(warning.message)
    ]
    learned = variant == "learned_positions"  # a source and a target table
    assert (
        unquantized
        == ["Layer PositionEmbedding does not have a `quantize` method implemented."] * 2 * learned
    )
    matrices = [
        weight for weight in model.weights if weight.path.endswith(("kernel", "embeddings"))
    ]
    left_float = [weight.path for weight in matrices if weight.dtype != "int8"]
    assert left_float == (
        ["source_position_embedding/embeddings", "target_position_embedding/embeddings"]
        if variant == "learned_positions"
        else []
    )
    paths = {weight.path: weight for weight in model.weights}
    for weight in matrices:
        if weight.dtype == "int8":  # each with its float32 scale, one per output channel
            assert paths[weight.path + "_scale"].dtype == "float32"
    attention = [
        layer for layer in model._flatten_layers() if isinstance(layer, MultiHeadAttention)
    ]
    assert len(attention) == TINY["num_encoder_layers"] + 2 * TINY["num_decoder_layers"]
    kernel_layers = [
        layer
        for layer in model._flatten_layers()
        if isinstance(layer, (MultiHeadAttention, SharedEmbedding, keras.layers.Dense))
    ]
    assert {layer.dtype_policy.name for layer in kernel_layers} == {"int8_from_float32"}
    names = {layer.path for layer in kernel_layers}
    assert "token_embedding" in names and "decoder_layer_0/cross_attention" in names
    if variant == "untied_separate":
        assert {"target_token_embedding", "output_projection"} <= names


def test_attention_projections_are_int8_with_one_scale_per_output_channel(quantized):
    model, _ = quantized
    attention = model.decoder_layers[0].cross_attention
    heads, depth, width = (
        TINY["num_heads"],
        TINY["hidden_dim"] // TINY["num_heads"],
        TINY["hidden_dim"],
    )
    for name in ("query", "key", "value"):
        assert tuple(getattr(attention, f"{name}_kernel").shape) == (width, heads, depth)
        assert tuple(getattr(attention, f"{name}_kernel_scale").shape) == (heads, depth)
    assert tuple(attention.output_kernel.shape) == (heads, depth, width)
    assert tuple(attention.output_kernel_scale.shape) == (width,)
    assert tuple(model.source_embedding.embeddings_scale.shape) == (TINY["vocabulary_size"],)
    # Abs-max: every channel uses the full int8 range.
    assert np.all(np.abs(as_numpy(attention.query_kernel)).max(axis=0) == 127)


# --- close to float32 ---


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_int8_logits_are_close_to_float32(variant):
    model, float_logits = quantized_model(variant)
    int8_logits = logits_of(model)
    error = relative_error(int8_logits[REAL], float_logits[REAL])
    assert 0 < error < RELATIVE_TOLERANCE, error
    assert np.array_equal(int8_logits[REAL].argmax(-1), float_logits[REAL].argmax(-1))


def test_quantized_layers_alone_are_close_to_float32():
    """Each layer's own int8 path: attention (and its encoder-decoder cache), the embedding
    lookup and the tied output projection."""
    rng = np.random.default_rng(0)
    query, memory = (
        rng.standard_normal((2, 5, 16)).astype("float32"),
        rng.standard_normal((2, 7, 16)).astype("float32"),
    )
    attention = MultiHeadAttention(num_heads=2)
    attention(query, memory)
    float_outputs, float_cache = as_numpy(attention(query, memory)), attention.compute_cache(memory)
    attention.quantize("int8")
    assert relative_error(as_numpy(attention(query, memory)), float_outputs) < RELATIVE_TOLERANCE
    for name, tensor in attention.compute_cache(memory).items():
        assert relative_error(as_numpy(tensor), as_numpy(float_cache[name])) < RELATIVE_TOLERANCE

    ids = rng.integers(1, 23, size=(2, 5)).astype("int32")
    embedding = SharedEmbedding(vocabulary_size=23, embedding_dim=16)
    float_rows, float_logits = as_numpy(embedding(ids)), as_numpy(embedding(query, reverse=True))
    embedding.quantize("int8")
    assert relative_error(as_numpy(embedding(ids)), float_rows) < RELATIVE_TOLERANCE
    logits = embedding(query, reverse=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert relative_error(as_numpy(logits), float_logits) < RELATIVE_TOLERANCE


def test_gradients_pass_the_int8_projections_as_the_float_ones():
    """Keras' custom gradient: the float weights (norms, biases) get the float model's
    gradients up to quantization. Measured: 15% and 1.2% relative error over all of them for
    seeds 0 and 1; without the custom gradient (no gradient through an int8 matmul) 120%."""
    keras.utils.set_random_seed(0)
    model = Transformer(tiny_config())

    def gradients():
        with tf.GradientTape() as tape:
            log_probs = tf.nn.log_softmax(model({"source_ids": SOURCE, "target_ids": TARGET}))
            loss = -tf.reduce_sum(tf.gather(log_probs[:, :-1], TARGET[:, 1:], batch_dims=2))
        variables = [
            weight
            for weight in model.trainable_weights
            if not weight.path.endswith(("kernel", "embeddings"))
        ]
        return np.concatenate(
            [as_numpy(gradient).ravel() for gradient in tape.gradient(loss, variables)]
        )

    float_gradients = gradients()
    model.quantize("int8")
    assert relative_error(gradients(), float_gradients) < 0.3


# --- saving ---


def test_keras_file_round_trip_gives_identical_outputs(quantized, tmp_path):
    model, _ = quantized
    model.save(tmp_path / "int8.keras")
    loaded = keras.saving.load_model(tmp_path / "int8.keras")
    np.testing.assert_allclose(logits_of(loaded), logits_of(model), rtol=0, atol=SAVE_LOAD_ATOL)
    assert [(weight.path, weight.dtype) for weight in loaded.weights] == [
        (w.path, w.dtype) for w in model.weights
    ]
    for saved, restored in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(as_numpy(restored), as_numpy(saved))


def test_get_config_round_trip_rebuilds_the_int8_layers(quantized):
    model, _ = quantized
    config = model.get_config()
    revived = Transformer.from_config(config)
    assert revived.get_config() == config
    assert revived.decoder_layers[1].self_attention.quantization_mode == "int8"
    revived.set_weights(model.get_weights())
    np.testing.assert_allclose(logits_of(revived), logits_of(model), rtol=0, atol=SAVE_LOAD_ATOL)


def test_a_float_model_config_is_unchanged():
    keras.utils.set_random_seed(0)
    config = Transformer(tiny_config()).get_config()
    assert config["dtype"]["class_name"] == "DTypePolicy" and config["quantization_config"] is None


def test_weight_only_config_is_kept_by_keras_files(tmp_path):
    """`Int8QuantizationConfig(activation_quantizer=None)` (int8 weights, float activations)
    computes differently from the default, and a `.keras` file keeps it."""
    weight_only = keras.quantizers.Int8QuantizationConfig(activation_quantizer=None)
    model, float_logits = quantized_model(config=weight_only)
    default, _ = quantized_model()
    logits = logits_of(model)
    assert relative_error(logits[REAL], float_logits[REAL]) < RELATIVE_TOLERANCE
    assert not np.allclose(logits, logits_of(default), rtol=0, atol=1e-4)
    model.save(tmp_path / "weight_only.keras")
    loaded = keras.saving.load_model(tmp_path / "weight_only.keras")
    assert loaded.decoder_layers[0].self_attention.inputs_quantizer is None
    np.testing.assert_allclose(logits_of(loaded), logits, rtol=0, atol=SAVE_LOAD_ATOL)


# --- cached decoding ---


@pytest.mark.parametrize("variant", ["post_ln", "untied_separate", "windowed"])
def test_cached_decoding_equals_the_full_model_after_quantization(variant):
    """Inputs are quantized per position, so one step at a time quantizes as the full pass does."""
    model, _ = quantized_model(variant)
    full = logits_of(model)
    for max_length in (8, None):  # a preallocated buffer; a growing cache (a ring with a window)
        stepwise = cached_logits(model, model.decode_step, max_length=max_length)
        np.testing.assert_allclose(stepwise[REAL], full[REAL], rtol=0, atol=1e-5)


def test_cached_beam_search_equals_recomputing_the_prefix_after_quantization(quantized):
    model, _ = quantized
    cached_ids, cached_scores = beam_search(model, SOURCE, beam_size=3, max_output_offset=4)
    ids, scores = recompute_beam_search(model, SOURCE, beam_size=3, max_output_offset=4)
    np.testing.assert_array_equal(as_numpy(cached_ids), as_numpy(ids))
    np.testing.assert_allclose(as_numpy(cached_scores), as_numpy(scores), rtol=0, atol=1e-4)


# --- bad modes ---


@pytest.mark.parametrize("mode", ["int4", "float8"])
def test_a_mode_our_layers_lack_is_a_one_line_error_and_changes_nothing(mode):
    keras.utils.set_random_seed(0)
    model = Transformer(tiny_config())
    expected = (
        f"Invalid quantization mode. Expected one of ('int8',). Received: quantization_mode={mode}"
    )
    for filters in (
        None,
        lambda layer: not isinstance(layer, MultiHeadAttention),
    ):  # also when no attention layer
        with pytest.raises(
            NotImplementedError
        ) as error:  # would raise first (Keras would quantize the Dense layers)
            model.quantize(mode, filters=filters)
        assert str(error.value) == expected
    assert {weight.dtype for weight in model.weights} == {"float32"}
    attention = model.encoder_layers[0].self_attention
    embedding = model.source_embedding
    for layer in (attention, embedding):
        with pytest.raises(NotImplementedError) as error:
            layer.quantize(mode)
        assert str(error.value) == expected
        assert layer.quantization_mode is None


def test_a_mode_keras_does_not_know_is_keras_error():
    keras.utils.set_random_seed(0)
    model = Transformer(tiny_config())
    with pytest.raises(ValueError, match="Invalid quantization mode. .*Received: mode=int3$"):
        model.quantize("int3")
    assert {weight.dtype for weight in model.weights} == {"float32"}


def test_quantizing_collects_the_heap_once_and_leaves_the_collector_as_it_found_it():
    """Keras runs a full collection for every float kernel it removes; `Transformer.quantize`
    (and `MultiHeadAttention.quantize` alone) freezes the objects that existed before, so
    only its last collection walks them. It unfreezes them after; objects a process froze
    itself stay frozen."""
    import gc

    full_collections = []  # per full collection: the number of frozen objects it skipped

    def record(phase, info):
        if phase == "start" and info["generation"] == 2:
            full_collections.append(gc.get_freeze_count())

    keras.utils.set_random_seed(0)
    model = Transformer(tiny_config())
    gc.callbacks.append(record)
    try:
        model.quantize("int8")
        attention = MultiHeadAttention(num_heads=2, key_dim=4)
        attention(np.ones((1, 3, 8), "float32"), np.ones((1, 3, 8), "float32"))
        collections_before = len(full_collections)
        attention.quantize("int8")
    finally:
        gc.callbacks.remove(record)
    model_collections, layer_collections = (
        full_collections[:collections_before],
        full_collections[collections_before:],
    )
    assert len(model_collections) > 20  # Keras' own, one per float kernel removed
    assert sum(skipped == 0 for skipped in model_collections) == 1, (
        model_collections
    )  # the last one
    assert (
        len(layer_collections) == 5 and sum(skipped == 0 for skipped in layer_collections) == 1
    ), layer_collections
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        quantized_model()
        # Frozen objects that reference counting frees leave the count; none was unfrozen.
        assert frozen * 0.99 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
