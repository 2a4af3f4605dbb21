"""Smoke test of experiments/benchmark.py (training rows a-c) and the FLOP count it relies on."""

import keras
import matplotlib.image
import numpy as np
import pytest

from keras_transformer import Transformer, get_preset
from keras_transformer.benchmark import keras_hub_transformer, training_flops
from keras_transformer.benchmark.peers import attention_layers
from tests.scripts import run_script

PEER_CONFIG = dict(vocabulary_size=100, num_encoder_layers=2, num_decoder_layers=3, hidden_dim=16,
                   intermediate_dim=32, num_heads=2)


def _all_layers(model):
    return list(model._flatten_layers(include_self=False, recursive=True))


@pytest.mark.parametrize("precision", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_peer_layers_compute_in_our_dtype(precision):
    config = get_preset("tiny", **PEER_CONFIG)
    ours = Transformer(config, dtype=precision)
    peer = keras_hub_transformer(config, dtype=precision)
    expected = keras.dtype_policies.get(precision).compute_dtype
    for model in (ours, peer):
        computing = {layer.name: layer.compute_dtype for layer in _all_layers(model)
                     if not isinstance(layer, keras.layers.InputLayer) and layer.name != "logits"}
        assert set(computing.values()) == {expected}, (model.name, computing)
        assert {weight.dtype for weight in model.weights} == {"float32"}
    assert ours.count_params() == peer.count_params()
    logits = peer({"source_ids": np.array([[5, 6, 3]]), "target_ids": np.array([[2, 7]])})
    assert logits.dtype == "float32"


@pytest.mark.parametrize("attention_dropout", [0.0, 0.2])
def test_peer_drops_out_where_ours_does(attention_dropout):
    """Dropout on embedding sums and sub-layer outputs at `dropout`, on attention
    probabilities at `attention_dropout`, nowhere else, in both models."""
    config = get_preset("tiny", dropout=0.1, attention_dropout=attention_dropout, **PEER_CONFIG)
    ours = Transformer(config)
    peer = keras_hub_transformer(config)
    ours_attention = [layer for layer in _all_layers(ours) if hasattr(layer, "query_kernel")]
    peer_attention = [attention for layer in _all_layers(peer) for attention in attention_layers(layer)]
    assert len(ours_attention) == len(peer_attention) == 2 + 2 * 3
    assert {layer._dropout_layer.rate for layer in ours_attention} == {attention_dropout}
    assert {layer._dropout for layer in peer_attention} == {attention_dropout}
    assert {layer._dropout_layer.rate for layer in peer_attention} == {attention_dropout}
    inner = {id(layer._dropout_layer) for layer in ours_attention + peer_attention}
    for model in (ours, peer):
        others = [layer.rate for layer in _all_layers(model)
                  if isinstance(layer, keras.layers.Dropout) and id(layer) not in inner and layer.rate > 0]
        assert others == [0.1] * (2 + 2 * 2 + 3 * 3)  # embedding sums, 2 per encoder block, 3 per decoder block


def test_peer_refuses_what_it_cannot_express():
    with pytest.raises(ValueError, match="activation_dropout=0.1"):
        keras_hub_transformer(get_preset("tiny", activation_dropout=0.1, **PEER_CONFIG))



def test_training_flops_matches_parameter_count_for_linear_layers():
    # With one-token sequences attention costs 4*D per layer-pair of scores/values; the rest
    # is 2 FLOPs per weight per token, times 3 for training.
    config = get_preset("tiny", vocabulary_size=100, num_encoder_layers=1, num_decoder_layers=1,
                        hidden_dim=16, intermediate_dim=32, num_heads=2)
    model = Transformer(config)
    weights = {w.path: int(np.prod(w.shape)) for w in model.trainable_weights if w.path.endswith(("kernel", "embeddings"))}
    matrix_weights = sum(weights.values())  # encoder, decoder, embedding (used once as output projection)
    flops = training_flops(config, [1], [1])
    attention = 3 * 2 * (1 * 2 * 16 + 2 * 2 * 16)  # encoder self + decoder self + cross, QK and AV, one token
    np.testing.assert_allclose(flops, 3 * 2 * matrix_weights + attention, rtol=1e-9)


def test_benchmark_script_prints_the_table(multi30k_dir, tmp_path):
    result = run_script(
        "benchmark.py", f"--data_dir={multi30k_dir}", "--preset=tiny",
        "--num_encoder_layers=1", "--num_decoder_layers=1", "--hidden_dim=32", "--intermediate_dim=64",
        "--num_heads=2", "--vocabulary_size=500", "--max_length=32", "--steps=2", "--batch_tokens=512",
        "--padded_batch=8", "--padded_length=16", "--rounds=1", f"--plot={tmp_path / 'ratios.png'}",
    )
    for row in ("a. train steps/s", "b1. real target tokens/s, same bucketed batches",
                "b2. real target tokens/s, bucketed vs fixed padding, ours", "c. MFU"):
        assert row in result.stdout
    assert "parameters: ours" in result.stdout
    assert matplotlib.image.imread(tmp_path / "ratios.png").shape[2] in (3, 4)


def test_benchmark_decoding_row_alone(trained_run, multi30k_dir):
    result = run_script(
        "benchmark.py", f"--data_dir={multi30k_dir}", "--notraining", f"--model_dir={trained_run}",
        "--decode_sentences=4", "--saved_model_sentences=6",
    )
    assert "d. beam 4 sentences/s, cached vs recompute, graph" in result.stdout
    assert "d. beam 4 sentences/s, cached vs recompute, XLA" in result.stdout
    assert "d. SavedModel, 6 test sentences, beam 4 (s)" in result.stdout
    assert "a. train steps/s" not in result.stdout and "parameters: ours" not in result.stdout
    result = run_script("benchmark.py", "--notraining", check=False)
    assert result.returncode != 0 and "needs --model_dir" in result.stderr
