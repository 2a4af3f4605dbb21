"""DecoderBlock: causal self-attention, encoder-decoder attention, FFN; masks and the cache."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import DecoderBlock, PositionalEncoding, SharedEmbedding
from tests.layer_test_case import (
    B,
    D,
    F,
    H,
    S,
    T,
    V,
    cases_for,
    padding,
    random_floats,
    random_ids,
    run_case,
)

ATOL = 1e-5
SOURCE_LENGTHS = [S, 4]
TARGET_LENGTHS = [T, 3]


def as_numpy(tensor):
    return ops.convert_to_numpy(tensor)


def embed(embedding, position, ids):
    """Scaled embeddings plus positions; `keras.layers.Add` keeps the implicit padding mask."""
    hidden = embedding(ids)
    return keras.layers.Add()([hidden, position(hidden)])


def block_and_inputs(normalize_first=False, seed=0, **kwargs):
    rng = np.random.default_rng(seed)
    block = DecoderBlock(num_heads=H, intermediate_dim=F, normalize_first=normalize_first, **kwargs)
    return block, random_floats(rng, B, T, D), random_floats(rng, B, S, D)


@pytest.mark.parametrize("name", cases_for(DecoderBlock))
def test_layer(name):
    run_case(name)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_implicit_masks_equal_explicit_masks(normalize_first):
    rng = np.random.default_rng(1)
    source_ids, target_ids = random_ids(rng, SOURCE_LENGTHS, S), random_ids(rng, TARGET_LENGTHS, T)
    embedding, position = SharedEmbedding(V, D), PositionalEncoding()
    block = DecoderBlock(num_heads=H, intermediate_dim=F, normalize_first=normalize_first)

    # Implicit: both sequences carry the masks of SharedEmbedding(mask_zero=True).
    source_input = keras.Input(shape=(None,), dtype="int32")
    target_input = keras.Input(shape=(None,), dtype="int32")
    outputs = block(
        embed(embedding, position, target_input), embed(embedding, position, source_input)
    )
    implicit_model = keras.Model([source_input, target_input], outputs)
    # Explicit: plain float inputs (no Keras masks attached) and padding-mask inputs.
    target_hidden, source_hidden = keras.Input(shape=(None, D)), keras.Input(shape=(None, D))
    target_mask, source_mask = (
        keras.Input(shape=(None,), dtype="bool"),
        keras.Input(shape=(None,), dtype="bool"),
    )
    outputs = block(
        target_hidden,
        source_hidden,
        decoder_padding_mask=target_mask,
        encoder_padding_mask=source_mask,
    )
    explicit_model = keras.Model([target_hidden, source_hidden, target_mask, source_mask], outputs)

    target, source = (
        as_numpy(embed(embedding, position, target_ids)),
        as_numpy(embed(embedding, position, source_ids)),
    )
    explicit = as_numpy(explicit_model([target, source, target_ids != 0, source_ids != 0]))
    np.testing.assert_allclose(
        as_numpy(implicit_model([source_ids, target_ids])), explicit, rtol=0, atol=ATOL
    )
    np.testing.assert_allclose(
        implicit_model.predict([source_ids, target_ids], verbose=0), explicit, rtol=0, atol=ATOL
    )
    eager = block(embed(embedding, position, target_ids), embed(embedding, position, source_ids))
    np.testing.assert_allclose(as_numpy(eager), explicit, rtol=0, atol=ATOL)
    # The source mask matters: without it the second row attends to the source pads.
    unmasked = as_numpy(block(target, source))
    assert np.abs(unmasked[1] - explicit[1]).max() > 1e-3


@pytest.mark.parametrize("normalize_first", [False, True])
def test_source_padding_does_not_change_outputs(normalize_first):
    rng = np.random.default_rng(2)
    block, target, source = block_and_inputs(normalize_first, seed=2)
    source_mask = padding(SOURCE_LENGTHS, S)
    outputs = as_numpy(block(target, source, encoder_padding_mask=source_mask))
    # Other values at the padded source positions.
    noisy = np.where(source_mask[:, :, None], source, random_floats(rng, B, S, D) * 10)
    np.testing.assert_allclose(
        as_numpy(block(target, noisy, encoder_padding_mask=source_mask)), outputs, rtol=0, atol=ATOL
    )
    # More padding appended.
    longer = np.concatenate([source, random_floats(rng, B, 3, D)], axis=1)
    longer_mask = np.concatenate([source_mask, np.zeros((B, 3), bool)], axis=1)
    np.testing.assert_allclose(
        as_numpy(block(target, longer, encoder_padding_mask=longer_mask)),
        outputs,
        rtol=0,
        atol=ATOL,
    )


@pytest.mark.parametrize("normalize_first", [False, True])
def test_step_t_does_not_see_later_targets(normalize_first):
    rng = np.random.default_rng(3)
    block, target, source = block_and_inputs(normalize_first, seed=3)
    outputs = as_numpy(block(target, source))
    for step in range(T - 1):
        changed = target.copy()
        changed[:, step + 1 :] = random_floats(rng, B, T - step - 1, D)
        changed_outputs = as_numpy(block(changed, source))
        np.testing.assert_allclose(
            changed_outputs[:, : step + 1], outputs[:, : step + 1], rtol=0, atol=ATOL
        )
        assert np.abs(changed_outputs[:, step + 1 :] - outputs[:, step + 1 :]).max() > 1e-3
    # Without the causal mask, step 0 does see the future.
    free = as_numpy(block(target, source, use_causal_mask=False))
    assert np.abs(free[:, 0] - outputs[:, 0]).max() > 1e-3


@pytest.mark.parametrize("normalize_first", [False, True])
def test_cached_decoding_equals_full_pass(normalize_first):
    block, target, source = block_and_inputs(normalize_first, seed=4)
    source_mask = padding(SOURCE_LENGTHS, S)
    full = as_numpy(block(target, source, encoder_padding_mask=source_mask))
    max_length = T + 3
    cache = block.init_cache(source, max_length)
    assert set(cache) == {"self", "cross"}
    assert tuple(cache["self"]["key"].shape) == (B, H, max_length, D // H)
    assert tuple(cache["cross"]["value"].shape) == (B, H, S, D // H)
    steps = []
    for index in range(T):
        result = block(
            target[:, index : index + 1],
            encoder_padding_mask=source_mask,
            cache=cache,
            cache_index=index,
        )
        assert isinstance(result, tuple) and len(result) == 2
        outputs, cache = result
        assert set(cache) == {"self", "cross"} and set(cache["self"]) == {"key", "value"}
        steps.append(as_numpy(outputs))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=ATOL)


def test_cached_decoding_in_one_chunk_equals_full_pass():
    block, target, source = block_and_inputs(seed=5)
    full = as_numpy(block(target, source))
    outputs, _ = block(target, cache=block.init_cache(source, T), cache_index=0)
    np.testing.assert_allclose(as_numpy(outputs), full, rtol=0, atol=ATOL)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_block_is_the_papers_residual_wiring(normalize_first):
    """Post-LN: LN(x + Sublayer(x)); pre-LN: x + Sublayer(LN(x)); for all three sub-layers."""
    block, target, source = block_and_inputs(normalize_first, seed=6)
    source_mask = padding(SOURCE_LENGTHS, S)
    outputs = as_numpy(block(target, source, encoder_padding_mask=source_mask))
    sublayers = [
        (
            lambda x: block.self_attention(x, x, use_causal_mask=True),
            block.self_attention_layer_norm,
        ),
        (
            lambda x: block.cross_attention(x, source, key_mask=source_mask),
            block.cross_attention_layer_norm,
        ),
        (block.feed_forward, block.feed_forward_layer_norm),
    ]
    hidden = target
    for sublayer, norm in sublayers:
        hidden = (
            hidden + sublayer(norm(hidden)) if normalize_first else norm(hidden + sublayer(hidden))
        )
    np.testing.assert_allclose(outputs, as_numpy(hidden), rtol=0, atol=ATOL)


def test_attention_scores_are_causal_and_skip_source_padding():
    block, target, source = block_and_inputs(seed=7)
    outputs, scores = block(
        target,
        source,
        encoder_padding_mask=padding(SOURCE_LENGTHS, S),
        return_attention_scores=True,
    )
    assert tuple(outputs.shape) == (B, T, D)
    self_scores, cross_scores = as_numpy(scores["self"]), as_numpy(scores["cross"])
    assert self_scores.shape == (B, H, T, T) and cross_scores.shape == (B, H, T, S)
    future = np.triu(np.ones((T, T), bool), k=1)  # key after query
    assert np.all(self_scores[:, :, future] == 0.0)
    assert np.all(cross_scores[1, :, :, 4:] == 0.0)
    np.testing.assert_allclose(self_scores.sum(axis=-1), 1.0, rtol=0, atol=1e-6)
    np.testing.assert_allclose(cross_scores.sum(axis=-1), 1.0, rtol=0, atol=1e-6)


def test_symbolic_calls_return_the_eager_structure():
    block, target, source = block_and_inputs(seed=10)
    target_input, source_input = keras.Input(shape=(T, D)), keras.Input(shape=(S, D))
    outputs, scores = block(target_input, source_input, return_attention_scores=True)
    assert tuple(scores["self"].shape) == (None, H, T, T)
    assert tuple(scores["cross"].shape) == (None, H, T, S)
    model = keras.Model([target_input, source_input], [outputs, scores["self"], scores["cross"]])
    eager_outputs, eager_scores = block(target, source, return_attention_scores=True)
    expected = [eager_outputs, eager_scores["self"], eager_scores["cross"]]
    for got, want in zip(model([target, source]), expected):
        np.testing.assert_allclose(as_numpy(got), as_numpy(want), rtol=0, atol=1e-6)
    # Cached mode: (outputs, cache) symbolically too.
    step = keras.Input(shape=(1, D))
    buffer, memory = keras.Input(shape=(H, 8, D // H)), keras.Input(shape=(H, S, D // H))
    cache = {"self": {"key": buffer, "value": buffer}, "cross": {"key": memory, "value": memory}}
    outputs, new_cache = block(step, cache=cache, cache_index=0)
    assert tuple(outputs.shape) == (None, 1, D)
    assert tuple(new_cache["self"]["key"].shape) == (None, H, 8, D // H)
    assert tuple(new_cache["cross"]["value"].shape) == (None, H, S, D // H)


def test_training_false_disables_dropout():
    block, target, source = block_and_inputs(seed=8, dropout=0.5, attention_dropout=0.5)
    inference = as_numpy(block(target, source, training=False))
    np.testing.assert_array_equal(as_numpy(block(target, source, training=False)), inference)
    without_dropout, _, _ = block_and_inputs(dropout=0.0)
    without_dropout(target, source)
    without_dropout.set_weights(block.get_weights())
    np.testing.assert_allclose(
        as_numpy(without_dropout(target, source)), inference, rtol=0, atol=1e-6
    )
    first, second = (
        as_numpy(block(target, source, training=True)),
        as_numpy(block(target, source, training=True)),
    )
    assert np.abs(first - inference).max() > 1e-3
    assert np.abs(first - second).max() > 1e-3


def test_call_argument_errors():
    block, target, source = block_and_inputs(seed=9)
    block(target, source)  # builds the block
    cache = block.init_cache(source, T)
    with pytest.raises(ValueError, match="cache_index=None"):
        block(target, cache=cache)
    with pytest.raises(ValueError, match="encoder_sequence=None"):
        block(target)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="activation_dropout=1.0"):
        DecoderBlock(num_heads=2, intermediate_dim=8, activation_dropout=1.0)
    with pytest.raises(ValueError, match="num_heads=7.*512"):
        DecoderBlock(num_heads=7, intermediate_dim=8)(
            np.zeros((1, 2, 512), "float32"), np.zeros((1, 3, 512), "float32")
        )
