"""Smoke test of experiments/benchmark.py (training rows a-c) and the FLOP count it relies on."""

import matplotlib.image
import numpy as np

from keras_transformer import Transformer, get_preset
from keras_transformer.benchmark import training_flops
from tests.scripts import run_script



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
    for row in ("a. train steps/s", "b. real target tokens/s", "c. MFU"):
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
