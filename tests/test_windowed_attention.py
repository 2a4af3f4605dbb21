"""Restricted self-attention (paper Table 1): blocked computation equals full attention with the band mask."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import DecoderBlock, EncoderBlock, MultiHeadAttention
from keras_transformer.layers.windowed_attention import band_mask

RNG = np.random.default_rng(0)
D, H = 16, 2


def pair(window, **kwargs):
    """A windowed attention layer and a full one with the same weights."""
    windowed, full = (
        MultiHeadAttention(H, attention_window=window, **kwargs),
        MultiHeadAttention(H, **kwargs),
    )
    probe = np.zeros((1, 3, D), "float32")
    windowed(probe, probe), full(probe, probe)
    full.set_weights(windowed.get_weights())
    return windowed, full


def band_masked(full, inputs, window, causal, padding):
    length = inputs.shape[1]
    band = np.broadcast_to(
        np.asarray(band_mask(length, length, window, causal)), (inputs.shape[0], length, length)
    )
    return np.asarray(
        full(inputs, inputs, key_mask=padding, use_causal_mask=causal, attention_mask=band)
    )


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("length, window", [(13, 4), (16, 4), (5, 8), (9, 1), (40, 3)])
def test_windowed_equals_full_attention_with_the_band_mask(length, window, causal, padded):
    inputs = RNG.normal(size=(2, length, D)).astype("float32")
    padding = np.arange(length)[None, :] < np.array(
        [[length], [max(length - 3, 1) if padded else length]]
    )
    mask = padding if padded else None
    windowed, full = pair(window)
    got = np.asarray(windowed(inputs, inputs, key_mask=mask, use_causal_mask=causal))
    expected = band_masked(full, inputs, window, causal, mask)
    # Outputs at padded positions are unspecified (ignored downstream); compare the real ones.
    np.testing.assert_allclose(got[padding], expected[padding], rtol=0, atol=2e-6)
    # The band matters: full attention differs once the sequence is longer than the window.
    if length > window:
        unrestricted = np.asarray(full(inputs, inputs, key_mask=mask, use_causal_mask=causal))
        assert np.abs(unrestricted[padding] - expected[padding]).max() > 1e-3


def test_band_mask_is_the_papers_neighbourhood():
    causal = np.asarray(band_mask(6, 6, 3, causal=True))[0]
    assert causal[4].tolist() == [False, False, True, True, True, False]  # itself and the 2 before
    both = np.asarray(band_mask(6, 6, 3, causal=False))[0]
    assert both[2].tolist() == [True, True, True, True, True, False]  # distance < 3 on each side
    cached = np.asarray(band_mask(1, 6, 3, causal=True, offset=4))[0, 0]
    assert cached.tolist() == causal[4].tolist()  # one decoding step at position 4


def test_only_the_band_is_computed():
    """No tensor of the traced computation holds N x N scores: memory grows as O(N * window)."""
    length, window = 256, 16
    layer = MultiHeadAttention(H, attention_window=window)
    inputs = tf.zeros((1, length, D))
    layer(inputs, inputs)
    graph = (
        tf.function(lambda x: layer(x, x, use_causal_mask=True)).get_concrete_function(inputs).graph
    )
    largest = max(
        int(np.prod(t.shape))
        for op in graph.get_operations()
        for t in op.outputs
        if t.shape.rank is not None and t.shape.is_fully_defined()
    )
    # At most H * N * 3 * window scores (a block and its neighbours); full attention holds H * N * N.
    assert largest <= H * length * 3 * window < H * length * length // 5, largest
    windowless = MultiHeadAttention(H)
    windowless(inputs, inputs)
    graph = (
        tf.function(lambda x: windowless(x, x, use_causal_mask=True))
        .get_concrete_function(inputs)
        .graph
    )
    assert (
        max(
            int(np.prod(t.shape))
            for op in graph.get_operations()
            for t in op.outputs
            if t.shape.rank is not None and t.shape.is_fully_defined()
        )
        >= H * length * length
    )


def test_xla_and_mixed_precision():
    inputs = RNG.normal(size=(2, 21, D)).astype("float32")
    windowed, full = pair(5)
    eager = np.asarray(windowed(inputs, inputs, use_causal_mask=True))
    compiled = tf.function(lambda x: windowed(x, x, use_causal_mask=True), jit_compile=True)
    np.testing.assert_allclose(np.asarray(compiled(tf.constant(inputs))), eager, atol=2e-6)
    mixed = MultiHeadAttention(H, attention_window=5, dtype="mixed_bfloat16")
    mixed(inputs, inputs)
    mixed.set_weights(windowed.get_weights())
    outputs = mixed(inputs, inputs, use_causal_mask=True)
    assert outputs.dtype == "bfloat16"
    np.testing.assert_allclose(np.asarray(tf.cast(outputs, tf.float32)), eager, atol=0.1)


def test_configs_round_trip_and_blocks_window_only_self_attention():
    layer = MultiHeadAttention(H, attention_window=7)
    assert MultiHeadAttention.from_config(layer.get_config()).attention_window == 7
    encoder = EncoderBlock(num_heads=H, intermediate_dim=32, attention_window=4)
    decoder = DecoderBlock(num_heads=H, intermediate_dim=32, attention_window=4)
    assert EncoderBlock.from_config(encoder.get_config()).self_attention.attention_window == 4
    rebuilt = DecoderBlock.from_config(decoder.get_config())
    assert (
        rebuilt.self_attention.attention_window == 4
        and rebuilt.cross_attention.attention_window is None
    )
    with pytest.raises(
        ValueError,
        match="attention_window must be a positive integer. Received: attention_window=0",
    ):
        MultiHeadAttention(H, attention_window=0)
    with pytest.raises(ValueError, match="query length 3, key length 5"):
        layer(np.zeros((1, 3, D), "float32"), np.zeros((1, 5, D), "float32"))


def test_windowed_model_trains_in_fit():
    from keras_transformer import Transformer, get_preset
    from keras_transformer.training import LabelSmoothedCrossEntropy

    config = get_preset(
        "tiny",
        vocabulary_size=40,
        num_encoder_layers=1,
        num_decoder_layers=1,
        hidden_dim=D,
        intermediate_dim=32,
        num_heads=H,
        max_length=32,
        attention_window=4,
    )
    model = Transformer(config)
    model.compile("adam", LabelSmoothedCrossEntropy())
    source = RNG.integers(4, 40, (8, 20)).astype("int32")
    target = RNG.integers(4, 40, (8, 12)).astype("int32")
    history = model.fit({"source_ids": source, "target_ids": target}, target, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    assert restored.get_layer("encoder_layer_0").self_attention.attention_window == 4


# --- cached decoding with a window: a ring buffer of r slots ---


@pytest.mark.parametrize("window, max_length", [(3, 11), (3, 40), (4, 2), (1, 11)])
def test_ring_cache_step_by_step_equals_the_full_pass(window, max_length):
    """Position t is written to slot t mod r of a `min(r, L)`-slot buffer and sees t - r + 1 .. t."""
    length = min(11, max_length)
    inputs = RNG.normal(size=(2, length, D)).astype("float32")
    layer = MultiHeadAttention(H, attention_window=window)
    full = np.asarray(layer(inputs, inputs, use_causal_mask=True))
    cache = layer.init_cache(2, max_length)
    steps = []
    for index in range(length):
        outputs, cache = layer(
            inputs[:, index : index + 1], cache=cache, cache_index=index, use_causal_mask=True
        )
        assert (
            tuple(cache["key"].shape)
            == tuple(cache["value"].shape)
            == (2, H, min(window, max_length), D // H)
        )
        steps.append(np.asarray(outputs))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=2e-6)
    # Slot s holds the keys of the last position written there.
    keys = np.asarray(layer.compute_cache(inputs)["key"])  # (B, H, T, Dk)
    for slot in range(min(window, length)):
        position = max(p for p in range(length) if p % min(window, max_length) == slot)
        np.testing.assert_allclose(
            np.asarray(cache["key"])[:, :, slot], keys[:, :, position], rtol=0, atol=2e-6
        )


@pytest.mark.parametrize("masked", [False, True], ids=["", "attention_mask"])
@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_ring_cache_in_chunks_equals_the_full_pass(chunk, masked):
    """Several new positions per call (also more than r) attend over the ring and the new keys;
    an explicit attention mask over absolute positions applies to the positions the slots hold."""
    inputs = RNG.normal(size=(2, 11, D)).astype("float32")
    mask = None
    if masked:  # row 0 hides position 1 and row 1 position 6 from the later queries
        mask = np.ones((2, 11, 11), bool)
        mask[0, 2:, 1] = mask[1, 7:, 6] = False
    layer = MultiHeadAttention(H, attention_window=3)
    full = np.asarray(layer(inputs, inputs, use_causal_mask=True, attention_mask=mask))
    cache, outputs = layer.init_cache(2, 11), []
    for start in range(0, 11, chunk):
        rows = None if mask is None else mask[:, start : start + chunk]
        step, cache = layer(
            inputs[:, start : start + chunk],
            attention_mask=rows,
            cache=cache,
            cache_index=start,
            use_causal_mask=True,
        )
        assert tuple(cache["key"].shape) == (2, H, 3, D // H)
        outputs.append(np.asarray(step))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, rtol=0, atol=2e-6)
    if masked:  # the mask matters
        assert np.abs(full - np.asarray(layer(inputs, inputs, use_causal_mask=True))).max() > 1e-3


WINDOW = 3
# Mixed source lengths, EOS (3) at the end, right-padded with PAD (0).
SOURCES = np.array([[5, 6, 7, 3, 0, 0], [8, 9, 10, 11, 12, 3], [4, 3, 0, 0, 0, 0]], np.int32)


@pytest.fixture(scope="module")
def windowed_model():
    from keras_transformer import Transformer, get_preset

    # Untied output projection and pre-LN: random weights that emit varied tokens.
    keras.utils.set_random_seed(1)
    config = get_preset(
        "tiny",
        vocabulary_size=32,
        num_encoder_layers=1,
        num_decoder_layers=2,
        hidden_dim=D,
        intermediate_dim=32,
        num_heads=H,
        dropout=0.0,
        tie_output=False,
        normalize_first=True,
        attention_window=WINDOW,
    )
    return Transformer(config)


class RecordingStep:
    """`CachedStep` that records the shapes of the self-attention buffers it is given each step."""

    def __init__(self, model):
        from keras_transformer.decoding.steps import CachedStep

        self.inner = CachedStep(model)
        self.model, self.can_drop_sentences = model, True
        self.shapes = set()

    def initialize(self, source_ids, buffer_size, num_copies=1):
        return self.inner.initialize(source_ids, buffer_size, num_copies)

    def step(self, state, target_ids, index):
        for layer in state["cache"]:
            self.shapes |= {tuple(layer["self"][name].shape[1:]) for name in ("key", "value")}
        return self.inner.step(state, target_ids, index)

    def reorder(self, state, indices, sentences=None):
        return self.inner.reorder(state, indices, sentences)


@pytest.mark.parametrize("max_length", [12, 40])
@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_windowed_cached_decoding_keeps_r_slots_and_equals_the_full_pass(
    windowed_model, method, max_length
):
    from keras_transformer.decoding import (
        beam_search,
        greedy_search,
        recompute_beam_search,
        recompute_greedy_search,
    )

    options = dict(max_length=max_length, max_output_offset=9)
    if method == "beam":
        options.update(beam_size=4, num_return=2)
    search, recompute = {
        "greedy": (greedy_search, recompute_greedy_search),
        "beam": (beam_search, recompute_beam_search),
    }[method]
    step = RecordingStep(windowed_model)
    cached_ids, cached_scores = search(step, SOURCES, **options)
    full_ids, full_scores = recompute(
        windowed_model, SOURCES, **options
    )  # the whole decoder over the prefix
    np.testing.assert_array_equal(cached_ids, full_ids)
    np.testing.assert_allclose(cached_scores, full_scores, rtol=1e-4, atol=1e-5)
    lengths = (np.asarray(cached_ids) != 0).sum(axis=-1)
    assert (
        lengths.max() > 2 * WINDOW and len(set(np.asarray(cached_ids).ravel().tolist())) > 4
    )  # past the window
    assert step.shapes == {(H, WINDOW, D // H)}  # r slots whatever max_length and the output length


def test_windowed_cached_greedy_under_xla(windowed_model):
    from keras_transformer.decoding import greedy_search, recompute_greedy_search

    step = RecordingStep(windowed_model)
    compiled = tf.function(
        lambda source: greedy_search(step, source, max_length=12, max_output_offset=9),
        jit_compile=True,
    )
    xla_ids, xla_scores = compiled(tf.constant(SOURCES))
    full_ids, full_scores = recompute_greedy_search(
        windowed_model, SOURCES, max_length=12, max_output_offset=9
    )
    np.testing.assert_array_equal(xla_ids, full_ids)
    np.testing.assert_allclose(xla_scores, full_scores, rtol=1e-4, atol=1e-5)
    assert (np.asarray(xla_ids) != 0).sum(axis=-1).max() > 2 * WINDOW
    assert step.shapes == {(H, WINDOW, D // H)}  # static shapes traced for XLA
