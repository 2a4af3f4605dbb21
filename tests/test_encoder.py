"""EncoderBlock: self-attention and FFN sub-layers, post-LN (paper) or pre-LN, padding masks."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import EncoderBlock, PositionalEncoding, SharedEmbedding
from tests.layer_test_case import (
    B,
    D,
    F,
    H,
    S,
    V,
    cases_for,
    padding,
    random_floats,
    random_ids,
    run_case,
)

ATOL = 1e-5
LENGTHS = [S, 3]  # the second source row is padded after 3 tokens


def as_numpy(tensor):
    return ops.convert_to_numpy(tensor)


def embed(embedding, position, ids):
    """Scaled embeddings plus positions; `keras.layers.Add` keeps the implicit padding mask."""
    hidden = embedding(ids)
    return keras.layers.Add()([hidden, position(hidden)])


@pytest.mark.parametrize("name", cases_for(EncoderBlock))
def test_layer(name):
    run_case(name)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_implicit_mask_equals_explicit_mask(normalize_first):
    ids = random_ids(np.random.default_rng(0), LENGTHS, S)
    embedding, position = SharedEmbedding(V, D), PositionalEncoding()
    block = EncoderBlock(num_heads=H, intermediate_dim=F, normalize_first=normalize_first)

    # Implicit: the mask travels from SharedEmbedding(mask_zero=True) through Add.
    id_input = keras.Input(shape=(None,), dtype="int32")
    implicit_model = keras.Model(id_input, block(embed(embedding, position, id_input)))
    # Explicit: plain float inputs (no Keras mask attached) and a padding-mask input.
    hidden_input = keras.Input(shape=(None, D))
    mask_input = keras.Input(shape=(None,), dtype="bool")
    explicit_model = keras.Model(
        [hidden_input, mask_input], block(hidden_input, padding_mask=mask_input)
    )

    hidden = as_numpy(embed(embedding, position, ids))
    explicit = as_numpy(explicit_model([hidden, ids != 0]))
    np.testing.assert_allclose(as_numpy(implicit_model(ids)), explicit, rtol=0, atol=ATOL)
    np.testing.assert_allclose(implicit_model.predict(ids, verbose=0), explicit, rtol=0, atol=ATOL)
    # Eagerly, too.
    eager = as_numpy(block(embed(embedding, position, ids)))
    np.testing.assert_allclose(eager, explicit, rtol=0, atol=ATOL)
    # The mask matters: without it the real tokens of the padded row see the pads.
    unmasked = as_numpy(block(hidden))
    assert np.abs(unmasked[1, :3] - explicit[1, :3]).max() > 1e-3


@pytest.mark.parametrize("normalize_first", [False, True])
def test_padding_does_not_change_real_positions(normalize_first):
    rng = np.random.default_rng(1)
    ids = random_ids(rng, LENGTHS, S)
    embedding, position = SharedEmbedding(V, D), PositionalEncoding()
    block = EncoderBlock(num_heads=H, intermediate_dim=F, normalize_first=normalize_first)
    outputs = as_numpy(block(embed(embedding, position, ids)))
    real = padding(LENGTHS, S)

    # More padding appended.
    longer = np.concatenate([ids, np.zeros((B, 4), "int32")], axis=1)
    longer_outputs = as_numpy(block(embed(embedding, position, longer)))
    np.testing.assert_allclose(longer_outputs[:, :S][real], outputs[real], rtol=0, atol=ATOL)

    # Other tokens at the padded positions, masked explicitly.
    noisy = np.where(real, ids, rng.integers(1, V, ids.shape)).astype("int32")
    hidden = as_numpy(embed(SharedEmbedding(V, D, mask_zero=False), position, noisy))
    hidden[real] = as_numpy(embed(embedding, position, ids))[real]
    noisy_outputs = as_numpy(block(hidden, padding_mask=real))
    np.testing.assert_allclose(noisy_outputs[real], outputs[real], rtol=0, atol=ATOL)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_block_is_the_papers_residual_wiring(normalize_first):
    """Post-LN: LN(x + Sublayer(x)); pre-LN: x + Sublayer(LN(x)); for both sub-layers."""
    inputs = random_floats(np.random.default_rng(2), B, S, D)
    mask = padding(LENGTHS, S)
    block = EncoderBlock(num_heads=H, intermediate_dim=F, normalize_first=normalize_first)
    outputs = as_numpy(block(inputs, padding_mask=mask))

    def attention(x):
        return block.self_attention(x, x, key_mask=mask)

    norm1, norm2 = block.self_attention_layer_norm, block.feed_forward_layer_norm
    if normalize_first:
        hidden = inputs + attention(norm1(inputs))
        expected = hidden + block.feed_forward(norm2(hidden))
    else:
        hidden = norm1(inputs + attention(inputs))
        expected = norm2(hidden + block.feed_forward(hidden))
    np.testing.assert_allclose(outputs, as_numpy(expected), rtol=0, atol=ATOL)


def test_attention_scores_skip_padded_keys():
    inputs = random_floats(np.random.default_rng(3), B, S, D)
    block = EncoderBlock(num_heads=H, intermediate_dim=F)
    outputs, scores = block(inputs, padding_mask=padding(LENGTHS, S), return_attention_scores=True)
    assert tuple(outputs.shape) == (B, S, D)
    scores = as_numpy(scores)
    assert scores.shape == (B, H, S, S)
    assert np.all(scores[1, :, :, 3:] == 0.0)
    np.testing.assert_allclose(scores.sum(axis=-1), 1.0, rtol=0, atol=1e-6)


def test_symbolic_scores_equal_eager_scores():
    inputs = random_floats(np.random.default_rng(5), B, S, D)
    block = EncoderBlock(num_heads=H, intermediate_dim=F)
    hidden = keras.Input(shape=(None, D))
    outputs, scores = block(hidden, return_attention_scores=True)
    assert tuple(scores.shape) == (None, H, None, None)
    model = keras.Model(hidden, [outputs, scores])
    for got, expected in zip(model(inputs), block(inputs, return_attention_scores=True)):
        np.testing.assert_allclose(as_numpy(got), as_numpy(expected), rtol=0, atol=1e-6)


def test_training_false_disables_dropout():
    inputs = random_floats(np.random.default_rng(4), B, S, D)
    block = EncoderBlock(
        num_heads=H, intermediate_dim=F, dropout=0.5, attention_dropout=0.5, activation_dropout=0.5
    )
    inference = as_numpy(block(inputs, training=False))
    np.testing.assert_array_equal(as_numpy(block(inputs, training=False)), inference)
    without_dropout = EncoderBlock(num_heads=H, intermediate_dim=F, dropout=0.0)
    without_dropout(inputs)
    without_dropout.set_weights(block.get_weights())
    np.testing.assert_allclose(as_numpy(without_dropout(inputs)), inference, rtol=0, atol=1e-6)
    first, second = as_numpy(block(inputs, training=True)), as_numpy(block(inputs, training=True))
    assert np.abs(first - inference).max() > 1e-3
    assert np.abs(first - second).max() > 1e-3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=0, intermediate_dim=8), "num_heads=0"),
        (dict(num_heads=2, intermediate_dim=-1), "intermediate_dim=-1"),
        (dict(num_heads=2, intermediate_dim=8, dropout=1.0), "dropout=1.0"),
        (dict(num_heads=2, intermediate_dim=8, attention_dropout=2), "attention_dropout=2"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EncoderBlock(**kwargs)


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match="num_heads=7.*512"):
        EncoderBlock(num_heads=7, intermediate_dim=8)(np.zeros((1, 2, 512), "float32"))
