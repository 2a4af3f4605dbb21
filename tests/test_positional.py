"""Positional information: the paper's sinusoids (section 3.5) and learned embeddings (row E)."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import PositionalEncoding, PositionEmbedding
from tests.layer_test_case import cases_for, random_floats, run_case

POSITIONS = [0, 1, 17, 1000]


def as_numpy(tensor):
    return ops.convert_to_numpy(ops.cast(tensor, "float32"))


def paper_encoding(position, dimension, width, base=10000.0):
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)), in float64."""
    angle = position / base ** ((dimension - dimension % 2) / width)
    return math.sin(angle) if dimension % 2 == 0 else math.cos(angle)


def tolerance(position):
    # The angle pos * base^(-2i/d) is formed in float32: its rounding error, and so the
    # error of sin/cos, grows like pos * 2^-24.
    return 1e-6 + 1e-7 * position


@pytest.mark.parametrize("name", cases_for(PositionalEncoding) + cases_for(PositionEmbedding))
def test_layer(name):
    run_case(name)


@pytest.mark.parametrize("width", [32, 512])
@pytest.mark.parametrize("position", POSITIONS)
def test_values_equal_the_paper_formula(width, position):
    encoding = as_numpy(PositionalEncoding()(np.zeros((1, max(POSITIONS) + 1, width), "float32")))[
        0
    ]
    for dimension in [0, 1, 2, 3, width - 2, width - 1]:
        expected = paper_encoding(position, dimension, width)
        assert abs(encoding[position, dimension] - expected) <= tolerance(position), (
            position,
            dimension,
        )


def test_whole_encoding_equals_the_formula():
    width, length = 16, 50
    encoding = as_numpy(PositionalEncoding()(np.zeros((2, length, width), "float32")))
    expected = np.array(
        [[paper_encoding(p, d, width) for d in range(width)] for p in range(length)]
    )
    np.testing.assert_allclose(encoding[0], expected, rtol=0, atol=tolerance(length))
    np.testing.assert_array_equal(encoding[0], encoding[1])  # same for every batch row


def test_sines_on_even_and_cosines_on_odd_features():
    width = 8
    encoding = as_numpy(PositionalEncoding()(np.zeros((1, 30, width), "float32")))[0]
    # Position 0: sin(0) = 0 on even features, cos(0) = 1 on odd ones (not two halves).
    np.testing.assert_array_equal(encoding[0], [0.0, 1.0] * (width // 2))
    # Features 2i and 2i+1 share a frequency: sin^2 + cos^2 = 1 for every pair.
    np.testing.assert_allclose(
        encoding[:, 0::2] ** 2 + encoding[:, 1::2] ** 2, 1.0, rtol=0, atol=1e-6
    )
    # Feature 0 is sin(pos) itself, feature 1 cos(pos).
    positions = np.arange(30)
    np.testing.assert_allclose(encoding[:, 0], np.sin(positions), rtol=0, atol=1e-6)
    np.testing.assert_allclose(encoding[:, 1], np.cos(positions), rtol=0, atol=1e-6)


def test_max_wavelength_is_the_base():
    encoding = as_numpy(PositionalEncoding(max_wavelength=100.0)(np.zeros((1, 20, 8), "float32")))[
        0
    ]
    assert abs(encoding[17, 5] - paper_encoding(17, 5, 8, base=100.0)) <= tolerance(17)


@pytest.mark.parametrize("start_index", [0, 3, 11])
def test_start_index_equals_slicing_a_longer_encoding(start_index):
    layer = PositionalEncoding()
    longer = as_numpy(layer(np.zeros((2, 20, 16), "float32")))
    step = as_numpy(layer(np.zeros((2, 4, 16), "float32"), start_index=start_index))
    np.testing.assert_allclose(step, longer[:, start_index : start_index + 4], rtol=0, atol=1e-6)
    from_tensor = as_numpy(
        layer(np.zeros((2, 4, 16), "float32"), start_index=ops.convert_to_tensor(start_index))
    )
    np.testing.assert_array_equal(from_tensor, step)


def test_encoding_has_no_weights_and_follows_the_compute_dtype():
    layer = PositionalEncoding(dtype="mixed_bfloat16")
    outputs = layer(np.zeros((1, 3, 8), "float32"))
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
    assert layer.weights == []
    np.testing.assert_allclose(
        as_numpy(outputs)[0, 1, :2], [math.sin(1.0), math.cos(1.0)], rtol=0, atol=1e-2
    )


def test_bad_max_wavelength_raises():
    with pytest.raises(ValueError, match="max_wavelength=0"):
        PositionalEncoding(max_wavelength=0)


# --- learned positions ---


def test_position_embedding_returns_the_table_rows():
    rng = np.random.default_rng(0)
    inputs = random_floats(rng, 2, 5, 16)
    layer = PositionEmbedding(sequence_length=8)
    outputs = as_numpy(layer(inputs))
    table = as_numpy(layer.position_embeddings)
    assert table.shape == (8, 16)
    np.testing.assert_array_equal(outputs[0], table[:5])
    np.testing.assert_array_equal(outputs[1], table[:5])
    shifted = as_numpy(layer(inputs[:, :2], start_index=3))
    np.testing.assert_array_equal(shifted[0], table[3:5])


def test_position_embedding_bad_length_raises():
    with pytest.raises(ValueError, match="sequence_length=0"):
        PositionEmbedding(sequence_length=0)


# --- word positions (parsing, `config.word_positions`) ---


def test_word_positions_take_the_second_half_of_the_features():
    """With `word_positions`, features 0 .. D/2 - 1 are the D/2-wide encoding of the token's
    position (from `start_index`), the rest the D/2-wide encoding of its word's index."""
    layer = PositionalEncoding()
    words = np.array([[0, 0, 1, 2, 2, 2], [0, 1, 1, 1, 3, 4]], "int32")
    encoding = as_numpy(layer(np.zeros((2, 6, 16), "float32"), start_index=2, word_positions=words))
    assert encoding.shape == (2, 6, 16)
    half = as_numpy(layer(np.zeros((1, 20, 8), "float32")))[
        0
    ]  # the 8-wide encoding of positions 0 .. 19
    for row in range(2):
        np.testing.assert_allclose(encoding[row, :, :8], half[2:8], rtol=0, atol=1e-6)
        np.testing.assert_allclose(encoding[row, :, 8:], half[words[row]], rtol=0, atol=1e-6)


def test_word_index_counts_words_on_the_source_and_tags_on_the_target():
    from keras_transformer.layers.positional import WordIndex

    # ids: 0 PAD, 1 UNK, 2 BOS, 3 EOS (starts the slot after the last word), 4 "▁a", 5 "b" (inside
    # a word), 6 "▁(S" (starts a word, not a tag), 7 "▁NN" (a tag)
    layer = WordIndex(8)
    np.testing.assert_array_equal(as_numpy(layer.kinds), np.zeros(8))  # set from the tokenizer
    layer.set_kinds([0, 0, 0, 1, 1, 0, 1, 2])
    source = np.array([[4, 5, 4, 7, 3, 0], [5, 4, 3, 0, 0, 0]])
    np.testing.assert_array_equal(
        as_numpy(layer.source(source)), [[0, 0, 1, 2, 3, 3], [0, 0, 1, 1, 1, 1]]
    )
    target = np.array([[2, 6, 7, 6, 7, 7], [2, 7, 7, 0, 0, 0]])  # BOS (S NN (S NN NN
    np.testing.assert_array_equal(
        as_numpy(layer.target(target)), [[0, 0, 1, 1, 2, 3], [0, 1, 2, 2, 2, 2]]
    )
    assert layer.trainable_weights == []
    with pytest.raises(ValueError, match="kinds must be 8 values"):
        layer.set_kinds([0, 1, 2])
    with pytest.raises(ValueError, match="kinds must be 8 values"):
        layer.set_kinds([0, 0, 0, 3, 0, 0, 0, 0])
