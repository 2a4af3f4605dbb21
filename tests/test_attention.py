"""Scaled dot-product attention (eq. 1) and MultiHeadAttention, with and without a cache."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import (
    MultiHeadAttention,
    attention_weights,
    scaled_dot_product_attention,
)
from tests.layer_test_case import B, D, H, S, T, cases_for, padding, random_floats, run_case

ATOL = 1e-5


def as_numpy(tensor):
    return ops.convert_to_numpy(ops.cast(tensor, "float32"))


def numpy_attention(query, key, value, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V in float64 numpy; masked keys get weight 0."""
    query, key, value = (np.asarray(a, dtype="float64") for a in (query, key, value))
    scores = query @ np.swapaxes(key, -1, -2) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ value, weights


@pytest.mark.parametrize("name", cases_for(MultiHeadAttention))
def test_layer(name):
    run_case(name)


# --- scaled_dot_product_attention ---


def test_scaled_dot_product_attention_equals_equation_1():
    rng = np.random.default_rng(0)
    query, key, value = (
        random_floats(rng, 2, 3, 4, 8),
        random_floats(rng, 2, 3, 6, 8),
        random_floats(rng, 2, 3, 6, 5),
    )
    outputs, weights = scaled_dot_product_attention(query, key, value)
    expected_outputs, expected_weights = numpy_attention(query, key, value)
    assert tuple(outputs.shape) == (2, 3, 4, 5)
    np.testing.assert_allclose(as_numpy(weights), expected_weights, rtol=0, atol=ATOL)
    np.testing.assert_allclose(as_numpy(outputs), expected_outputs, rtol=0, atol=ATOL)


def test_masked_keys_get_zero_weight():
    rng = np.random.default_rng(1)
    query, key, value = (
        random_floats(rng, 2, 4, 8),
        random_floats(rng, 2, 6, 8),
        random_floats(rng, 2, 6, 8),
    )
    mask = np.broadcast_to(padding([6, 2], 6)[:, None, :], (2, 4, 6)).copy()
    mask[0, 1, 0] = False
    outputs, weights = scaled_dot_product_attention(query, key, value, mask=mask)
    weights = as_numpy(weights)
    assert np.all(weights[~mask] == 0.0)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=0, atol=1e-6)
    expected_outputs, expected_weights = numpy_attention(query, key, value, mask)
    np.testing.assert_allclose(weights, expected_weights, rtol=0, atol=ATOL)
    np.testing.assert_allclose(as_numpy(outputs), expected_outputs, rtol=0, atol=ATOL)
    # Values behind masked keys do not matter.
    changed_value = value.copy()
    changed_value[1, 2:] = 100.0
    changed_outputs, _ = scaled_dot_product_attention(query, key, changed_value, mask=mask)
    np.testing.assert_allclose(as_numpy(changed_outputs), as_numpy(outputs), rtol=0, atol=1e-6)


def test_softmax_runs_in_float32_under_bfloat16_inputs():
    rng = np.random.default_rng(2)
    query, key, value = (ops.cast(random_floats(rng, 2, 5, 8), "bfloat16") for _ in range(3))
    outputs, weights = scaled_dot_product_attention(query, key, value)
    assert keras.backend.standardize_dtype(weights.dtype) == "float32"
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(attention_weights(query, key).dtype) == "float32"
    # Rows of a float32 softmax sum to 1 at float32 precision (bfloat16 would be ~1e-2 off).
    np.testing.assert_allclose(as_numpy(weights).sum(axis=-1), 1.0, rtol=0, atol=1e-6)
    _, expected_weights = numpy_attention(as_numpy(query), as_numpy(key), as_numpy(value))
    np.testing.assert_allclose(as_numpy(weights), expected_weights, rtol=0, atol=2e-2)


# --- MultiHeadAttention against keras.layers.MultiHeadAttention ---


def copy_to_keras_attention(layer, reference):
    """Copy our projections into a built `keras.layers.MultiHeadAttention` (same shapes)."""
    pairs = [
        (reference.query_dense, layer.query_kernel, layer.query_bias),
        (reference.key_dense, layer.key_kernel, layer.key_bias),
        (reference.value_dense, layer.value_kernel, layer.value_bias),
        (reference.output_dense, layer.output_kernel, layer.output_bias),
    ]
    for dense, kernel, bias in pairs:
        assert tuple(dense.kernel.shape) == tuple(kernel.shape)
        assert tuple(dense.bias.shape) == tuple(bias.shape)
        dense.kernel.assign(kernel)
        dense.bias.assign(bias)


MASK_SETTINGS = {
    "no_mask": {},
    "attention_mask": {"attention_mask": True},
    "value_mask_and_causal": {"value_mask": True, "use_causal_mask": True},
    "query_and_value_masks": {"query_mask": True, "value_mask": True},
}


@pytest.mark.parametrize("setting", list(MASK_SETTINGS))
def test_equals_keras_multi_head_attention(setting):
    rng = np.random.default_rng(3)
    length = T  # causal masking needs square self-attention shapes here
    query, value = random_floats(rng, B, length, D), random_floats(rng, B, length, D)
    options = MASK_SETTINGS[setting]
    kwargs = {}
    if options.get("attention_mask"):
        attention = rng.random((B, length, length)) < 0.7
        attention[:, :, 0] = True  # every query keeps one key
        kwargs["attention_mask"] = attention
    if options.get("value_mask"):
        kwargs["value_mask"] = padding([length, 3], length)
    query_real = (
        padding([length, 2], length) if options.get("query_mask") else np.ones((B, length), bool)
    )
    if options.get("query_mask"):
        kwargs["query_mask"] = query_real
    if options.get("use_causal_mask"):
        kwargs["use_causal_mask"] = True

    # Random biases: each head's bias must land on that head's columns of the projection.
    layer = MultiHeadAttention(num_heads=H, bias_initializer="random_normal")
    outputs, scores = layer(query, value, return_attention_scores=True, **kwargs)
    reference = keras.layers.MultiHeadAttention(num_heads=H, key_dim=D // H)
    reference(query, value)
    copy_to_keras_attention(layer, reference)
    expected_outputs, expected_scores = reference(
        query, value, return_attention_scores=True, **kwargs
    )

    assert tuple(scores.shape) == (B, H, length, length)
    # Keras also blanks padded query rows; we let them attend (their outputs are ignored),
    # so compare the real query positions.
    np.testing.assert_allclose(
        as_numpy(outputs)[query_real], as_numpy(expected_outputs)[query_real], rtol=0, atol=ATOL
    )
    rows = np.broadcast_to(query_real[:, None, :], scores.shape[:3])
    np.testing.assert_allclose(
        as_numpy(scores)[rows], as_numpy(expected_scores)[rows], rtol=0, atol=ATOL
    )


def test_default_head_width_is_width_over_heads():
    layer = MultiHeadAttention(num_heads=4)
    layer(np.zeros((1, 3, 32), "float32"), np.zeros((1, 2, 32), "float32"))
    assert tuple(layer.query_kernel.shape) == (32, 4, 8)
    assert tuple(layer.value_kernel.shape) == (32, 4, 8)
    assert tuple(layer.output_kernel.shape) == (4, 8, 32)


def test_padded_keys_do_not_change_outputs():
    rng = np.random.default_rng(4)
    query, value = random_floats(rng, B, T, D), random_floats(rng, B, S, D)
    value_mask = padding([S, 3], S)
    layer = MultiHeadAttention(num_heads=H)
    outputs = as_numpy(layer(query, value, value_mask=value_mask))
    changed = value.copy()
    changed[1, 3:] = random_floats(rng, S - 3, D) * 10
    np.testing.assert_allclose(
        as_numpy(layer(query, changed, value_mask=value_mask)), outputs, rtol=0, atol=ATOL
    )
    # Without the mask the padded keys do matter (the check above can fail).
    assert np.abs(as_numpy(layer(query, changed)) - as_numpy(layer(query, value))).max() > 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_packed_rows_equal_the_padded_call(causal):
    """`query_packing` / `key_packing`: the real rows in, the same real rows out as the padded call."""
    from keras_transformer.layers import packing

    rng = np.random.default_rng(5)
    query, value = random_floats(rng, B, T, D), random_floats(rng, B, S, D)
    query_mask, value_mask = padding([T, 2], T), padding([4, S], S)
    query_packing, value_packing = packing.packing(query_mask), packing.packing(value_mask)
    layer = MultiHeadAttention(num_heads=H)
    if causal:  # self-attention
        expected = as_numpy(layer(query, query, key_mask=query_mask, use_causal_mask=True))[
            query_mask
        ]
        rows = packing.pack(query, query_packing)
        outputs = layer(
            rows, rows, use_causal_mask=True, query_packing=query_packing, key_packing=query_packing
        )
    else:  # cross-attention: other keys, other padding
        expected = as_numpy(layer(query, value, key_mask=value_mask))[query_mask]
        outputs = layer(
            packing.pack(query, query_packing),
            packing.pack(value, value_packing),
            query_packing=query_packing,
            key_packing=value_packing,
        )
    assert tuple(outputs.shape) == (int(query_mask.sum()), D)
    np.testing.assert_allclose(as_numpy(outputs), expected, rtol=0, atol=ATOL)


def test_symbolic_calls_return_the_eager_structure():
    rng = np.random.default_rng(9)
    data = [random_floats(rng, B, T, D), random_floats(rng, B, S, D)]
    query, value = keras.Input(shape=(T, D)), keras.Input(shape=(S, D))
    layer = MultiHeadAttention(num_heads=H)
    outputs, scores = layer(query, value, return_attention_scores=True)
    assert tuple(outputs.shape) == (None, T, D)
    assert tuple(scores.shape) == (None, H, T, S)
    assert keras.backend.standardize_dtype(scores.dtype) == "float32"
    model = keras.Model([query, value], [outputs, scores])
    for got, expected in zip(model(data), layer(*data, return_attention_scores=True)):
        np.testing.assert_allclose(as_numpy(got), as_numpy(expected), rtol=0, atol=1e-6)
    # Cached mode: (outputs, cache) symbolically too.
    step, buffer = keras.Input(shape=(1, D)), keras.Input(shape=(H, 4, D // H))
    outputs, cache = layer(
        step, cache={"key": buffer, "value": buffer}, cache_index=0, use_causal_mask=True
    )
    assert tuple(outputs.shape) == (None, 1, D)
    assert {name: tuple(tensor.shape) for name, tensor in cache.items()} == {
        "key": (None, H, 4, D // H),
        "value": (None, H, 4, D // H),
    }


# --- key/value cache ---


def test_self_attention_cache_step_by_step_equals_full_pass():
    rng = np.random.default_rng(5)
    inputs = random_floats(rng, B, T, D)
    layer = MultiHeadAttention(num_heads=H)
    full = as_numpy(layer(inputs, inputs, use_causal_mask=True))
    max_length = T + 2
    cache = layer.init_cache(B, max_length)
    assert set(cache) == {"key", "value"}
    assert tuple(cache["key"].shape) == (B, H, max_length, D // H)
    assert tuple(cache["value"].shape) == (B, H, max_length, D // H)
    steps = []
    for index in range(T):
        result = layer(
            inputs[:, index : index + 1], cache=cache, cache_index=index, use_causal_mask=True
        )
        assert isinstance(result, tuple) and len(result) == 2
        outputs, cache = result
        assert tuple(outputs.shape) == (B, 1, D)
        steps.append(as_numpy(outputs))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=ATOL)
    # The buffer holds the projected keys of every written position, zeros after.
    keys = as_numpy(cache["key"])
    np.testing.assert_allclose(
        keys[:, :, :T], as_numpy(layer.compute_cache(inputs)["key"]), rtol=0, atol=ATOL
    )
    assert np.all(keys[:, :, T:] == 0.0)


def test_self_attention_cache_in_chunks_equals_full_pass():
    rng = np.random.default_rng(6)
    inputs = random_floats(rng, B, T, D)
    layer = MultiHeadAttention(num_heads=H)
    full = as_numpy(layer(inputs, inputs, use_causal_mask=True))
    cache = layer.init_cache(B, T)
    first, cache = layer(inputs[:, :3], cache=cache, cache_index=0, use_causal_mask=True)
    second, cache = layer(inputs[:, 3:], cache=cache, cache_index=3, use_causal_mask=True)
    np.testing.assert_allclose(
        np.concatenate([as_numpy(first), as_numpy(second)], axis=1), full, rtol=0, atol=ATOL
    )


def test_growing_self_attention_cache_equals_full_pass():
    """`init_cache(B, None)`: the cache holds exactly the positions decoded so far, one or several per call."""
    rng = np.random.default_rng(7)
    inputs = random_floats(rng, B, T, D)
    layer = MultiHeadAttention(num_heads=H)
    full = as_numpy(layer(inputs, inputs, use_causal_mask=True))
    cache = layer.init_cache(B, None)
    assert set(cache) == {"past_key", "past_value"} and tuple(cache["past_key"].shape) == (
        B,
        H,
        0,
        D // H,
    )
    steps = []
    for index in range(3):
        outputs, cache = layer(
            inputs[:, index : index + 1], cache=cache, cache_index=index, use_causal_mask=True
        )
        assert tuple(cache["past_key"].shape) == (B, H, index + 1, D // H)
        steps.append(as_numpy(outputs))
    rest, cache = layer(
        inputs[:, 3:], cache=cache, cache_index=3, use_causal_mask=True
    )  # a chunk of T - 3
    np.testing.assert_allclose(
        np.concatenate(steps + [as_numpy(rest)], axis=1), full, rtol=0, atol=ATOL
    )
    projected = layer.compute_cache(inputs)
    np.testing.assert_allclose(
        as_numpy(cache["past_key"]), as_numpy(projected["key"]), rtol=0, atol=ATOL
    )
    np.testing.assert_allclose(
        as_numpy(cache["past_value"]), as_numpy(projected["value"]), rtol=0, atol=ATOL
    )


def test_cross_attention_static_cache_equals_full_pass_with_source_padding():
    rng = np.random.default_rng(7)
    query, memory = random_floats(rng, B, T, D), random_floats(rng, B, S, D)
    memory_mask = padding([S, 4], S)
    layer = MultiHeadAttention(num_heads=H)
    full = as_numpy(layer(query, memory, key_mask=memory_mask))
    cache = layer.compute_cache(memory)
    assert tuple(cache["key"].shape) == (B, H, S, D // H)
    for index in range(T):
        outputs, returned = layer(query[:, index : index + 1], cache=cache, key_mask=memory_mask)
        np.testing.assert_allclose(as_numpy(outputs), full[:, index : index + 1], rtol=0, atol=ATOL)
        # A static cache comes back unchanged.
        np.testing.assert_array_equal(as_numpy(returned["key"]), as_numpy(cache["key"]))


def test_cached_mode_refuses_attention_scores():
    layer = MultiHeadAttention(num_heads=H)
    inputs = np.zeros((1, 2, D), "float32")
    layer(inputs, inputs)
    with pytest.raises(ValueError, match="return_attention_scores"):
        layer(inputs, cache=layer.init_cache(1, 4), cache_index=0, return_attention_scores=True)


def test_value_is_required_without_cache():
    with pytest.raises(ValueError, match="value=None"):
        MultiHeadAttention(num_heads=H)(np.zeros((1, 2, D), "float32"))


# --- dropout ---


def test_training_false_disables_attention_dropout():
    rng = np.random.default_rng(8)
    query, value = random_floats(rng, B, T, D), random_floats(rng, B, S, D)
    layer = MultiHeadAttention(num_heads=H, dropout=0.5)
    inference = as_numpy(layer(query, value, training=False))
    np.testing.assert_array_equal(as_numpy(layer(query, value, training=False)), inference)
    without_dropout = MultiHeadAttention(num_heads=H, dropout=0.0)
    without_dropout(query, value)
    without_dropout.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        as_numpy(without_dropout(query, value)), inference, rtol=0, atol=1e-6
    )
    first, second = (
        as_numpy(layer(query, value, training=True)),
        as_numpy(layer(query, value, training=True)),
    )
    assert np.abs(first - inference).max() > 1e-3
    assert np.abs(first - second).max() > 1e-3


# --- argument errors ---


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=0), "num_heads=0"),
        (dict(num_heads=2, key_dim=-1), "key_dim=-1"),
        (dict(num_heads=2, dropout=1.0), "dropout=1.0"),
        (dict(num_heads=2, dropout=-0.1), "dropout=-0.1"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


def test_heads_must_divide_width():
    layer = MultiHeadAttention(num_heads=3)
    with pytest.raises(ValueError, match="num_heads=3.*16"):
        layer(np.zeros((1, 2, 16), "float32"), np.zeros((1, 2, 16), "float32"))
