"""Restricted self-attention (paper Table 1): blocked computation equals full attention with the band mask."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import DecoderBlock, EncoderBlock, MultiHeadAttention
from keras_transformer.layers.attention import band_mask

RNG = np.random.default_rng(0)
D, H = 16, 2


def pair(window, **kwargs):
    """A windowed attention layer and a full one with the same weights."""
    windowed, full = MultiHeadAttention(H, attention_window=window, **kwargs), MultiHeadAttention(H, **kwargs)
    probe = np.zeros((1, 3, D), "float32")
    windowed(probe, probe), full(probe, probe)
    full.set_weights(windowed.get_weights())
    return windowed, full


def band_masked(full, inputs, window, causal, padding):
    length = inputs.shape[1]
    band = np.broadcast_to(np.asarray(band_mask(length, length, window, causal)), (inputs.shape[0], length, length))
    return np.asarray(full(inputs, inputs, key_mask=padding, use_causal_mask=causal, attention_mask=band))


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("length, window", [(13, 4), (16, 4), (5, 8), (9, 1), (40, 3)])
def test_windowed_equals_full_attention_with_the_band_mask(length, window, causal, padded):
    inputs = RNG.normal(size=(2, length, D)).astype("float32")
    padding = np.arange(length)[None, :] < np.array([[length], [max(length - 3, 1) if padded else length]])
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
    graph = tf.function(lambda x: layer(x, x, use_causal_mask=True)).get_concrete_function(inputs).graph
    largest = max(int(np.prod(t.shape)) for op in graph.get_operations() for t in op.outputs
                  if t.shape.rank is not None and t.shape.is_fully_defined())
    # At most H * N * 3 * window scores (a block and its neighbours); full attention holds H * N * N.
    assert largest <= H * length * 3 * window < H * length * length // 5, largest
    windowless = MultiHeadAttention(H)
    windowless(inputs, inputs)
    graph = tf.function(lambda x: windowless(x, x, use_causal_mask=True)).get_concrete_function(inputs).graph
    assert max(int(np.prod(t.shape)) for op in graph.get_operations() for t in op.outputs
               if t.shape.rank is not None and t.shape.is_fully_defined()) >= H * length * length


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
    assert rebuilt.self_attention.attention_window == 4 and rebuilt.cross_attention.attention_window is None
    with pytest.raises(ValueError, match="attention_window must be a positive integer. Received: attention_window=0"):
        MultiHeadAttention(H, attention_window=0)
    with pytest.raises(ValueError, match="query length 3, key length 5"):
        layer(np.zeros((1, 3, D), "float32"), np.zeros((1, 5, D), "float32"))


def test_windowed_model_trains_in_fit():
    from keras_transformer import Transformer, get_preset
    from keras_transformer.training import LabelSmoothedCrossEntropy

    config = get_preset("tiny", vocabulary_size=40, num_encoder_layers=1, num_decoder_layers=1, hidden_dim=D,
                        intermediate_dim=32, num_heads=H, max_length=32, attention_window=4)
    model = Transformer(config)
    model.compile("adam", LabelSmoothedCrossEntropy())
    source = RNG.integers(4, 40, (8, 20)).astype("int32")
    target = RNG.integers(4, 40, (8, 12)).astype("int32")
    history = model.fit({"source_ids": source, "target_ids": target}, target, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    assert restored.get_layer("encoder_layer_0").self_attention.attention_window == 4
