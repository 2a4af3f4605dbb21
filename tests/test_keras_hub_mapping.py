"""docs/keras_hub.md: each mapping from keras-hub's layers to ours, checked with the same weights."""

import re
from pathlib import Path

import keras_hub
import numpy as np

from keras_transformer.layers import DecoderBlock, EncoderBlock, PositionalEncoding, SharedEmbedding

DOC = Path(__file__).resolve().parents[1] / "docs" / "keras_hub.md"
RNG = np.random.default_rng(0)
B, S, T, D, H, FF = 2, 7, 5, 16, 2, 32


def copy_weights(hub_layer, our_layer):
    """Give `our_layer` `hub_layer`'s weights, matched by what each one is, not by order."""
    names = {  # keras-hub's path pieces -> ours
        "/query/kernel": "/query_kernel",
        "/query/bias": "/query_bias",
        "/key/kernel": "/key_kernel",
        "/key/bias": "/key_bias",
        "/value/kernel": "/value_kernel",
        "/value/bias": "/value_bias",
        "/attention_output/kernel": "/output_kernel",
        "/attention_output/bias": "/output_bias",
        "self_attention_layer/": "self_attention/",
        "feedforward_intermediate_dense/": "feed_forward/intermediate_dense/",
        "feedforward_output_dense/": "feed_forward/output_dense/",
        "feedforward_layer_norm/": "feed_forward_layer_norm/",
    }
    ours = {w.path.split("/", 1)[1]: w for w in our_layer.weights}
    assert len(ours) == len(hub_layer.weights)
    for weight in hub_layer.weights:
        path = weight.path.split("/", 1)[1]
        for theirs, mine in names.items():
            path = path.replace(theirs, mine)
        ours.pop(path).assign(weight.numpy())
    assert not ours, f"not set: {sorted(ours)}"


def padding(lengths, length):
    return np.arange(length)[None, :] < np.array(lengths)[:, None]


def test_encoder_block_equals_transformer_encoder():
    inputs = RNG.normal(size=(B, S, D)).astype("float32")
    mask = padding([S, 4], S)
    hub = keras_hub.layers.TransformerEncoder(intermediate_dim=FF, num_heads=H)
    ours = EncoderBlock(num_heads=H, intermediate_dim=FF, layer_norm_epsilon=hub.layer_norm_epsilon)
    expected = hub(inputs, padding_mask=mask)
    ours(inputs, padding_mask=mask)
    copy_weights(hub, ours)
    np.testing.assert_allclose(ours(inputs, padding_mask=mask), expected, atol=1e-5)


def test_decoder_block_equals_transformer_decoder():
    target, source = (
        RNG.normal(size=(B, T, D)).astype("float32"),
        RNG.normal(size=(B, S, D)).astype("float32"),
    )
    masks = dict(decoder_padding_mask=padding([T, 3], T), encoder_padding_mask=padding([S, 4], S))
    hub = keras_hub.layers.TransformerDecoder(intermediate_dim=FF, num_heads=H)
    ours = DecoderBlock(num_heads=H, intermediate_dim=FF, layer_norm_epsilon=hub.layer_norm_epsilon)
    expected = hub(target, source, **masks)  # causal self-attention by default in both
    ours(target, source, **masks)
    copy_weights(hub, ours)
    np.testing.assert_allclose(ours(target, source, **masks), expected, atol=1e-5)


def test_positional_encoding_equals_sine_position_encoding():
    hidden = np.zeros((1, 50, 64), "float32")
    ours = PositionalEncoding()(hidden)
    theirs = keras_hub.layers.SinePositionEncoding()(hidden)
    # Both interleave: sin at even channels, cos at odd ones (keras-hub 0.32).
    np.testing.assert_allclose(ours, theirs, atol=2e-5)
    np.testing.assert_allclose(
        ours[0, 7, 0::2], np.sin(7 / 10000 ** (np.arange(0, 64, 2) / 64)), atol=1e-6
    )


def test_shared_embedding_is_a_scaled_reversible_embedding():
    ids = np.array([[5, 9, 0], [3, 0, 0]])
    hub = keras_hub.layers.ReversibleEmbedding(100, D, mask_zero=True)
    ours = SharedEmbedding(vocabulary_size=100, embedding_dim=D)
    hub(ids), ours(ids)
    ours.embeddings.assign(hub.embeddings.numpy())
    np.testing.assert_allclose(
        ours(ids), hub(ids) * np.sqrt(D), rtol=1e-6
    )  # the paper's sqrt(d_model)
    unscaled = SharedEmbedding(vocabulary_size=100, embedding_dim=D, scale=False)
    unscaled(ids)
    unscaled.embeddings.assign(hub.embeddings.numpy())
    np.testing.assert_allclose(unscaled(ids), hub(ids), rtol=1e-6)
    hidden = RNG.normal(size=(B, T, D)).astype("float32")
    np.testing.assert_allclose(
        ours(hidden, reverse=True), hub(hidden, reverse=True), rtol=1e-5, atol=1e-6
    )
    # Both mark id 0 as padding with a Keras implicit mask on their outputs.
    np.testing.assert_array_equal(ours(ids)._keras_mask, hub(ids)._keras_mask)
    np.testing.assert_array_equal(ours(ids)._keras_mask, ids != 0)


def test_keras_hub_applies_attention_dropout_and_we_do_not_by_default():
    hub = keras_hub.layers.TransformerEncoder(intermediate_dim=FF, num_heads=H, dropout=0.1)
    hub(np.zeros((1, 3, D), "float32"))
    assert hub._self_attention_layer.dropout == 0.1  # its attention weights are dropped too
    assert (
        EncoderBlock(num_heads=H, intermediate_dim=FF, dropout=0.1).get_config()[
            "attention_dropout"
        ]
        == 0.0
    )


def test_doc_names_every_mapping():
    text = DOC.read_text(encoding="utf-8")
    for ours, theirs in [
        ("EncoderBlock", "TransformerEncoder"),
        ("DecoderBlock", "TransformerDecoder"),
        ("SharedEmbedding", "ReversibleEmbedding"),
        ("PositionalEncoding", "SinePositionEncoding"),
        ("beam_search", "BeamSampler"),
        ("source_ids", "encoder_token_ids"),
    ]:
        rows = [line for line in text.splitlines() if line.startswith("|")]
        assert any(
            re.search(rf"`[^`]*\b{ours}\b[^`]*`", row)
            and re.search(rf"`[^`]*\b{theirs}\b[^`]*`", row)
            for row in rows
        ), (ours, theirs)


def test_doc_porting_example_runs_and_matches(capsys):
    block = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)[0]
    exec(compile(block, str(DOC), "exec"), {})
    assert capsys.readouterr().out == "True\n"
