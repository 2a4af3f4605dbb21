"""SharedEmbedding: E[ids] * sqrt(D) forward, hidden @ E^T reverse, one matrix (section 3.4)."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import Transformer, get_preset
from keras_transformer.layers import SharedEmbedding
from keras_transformer.layers.masks import implicit_mask
from tests.layer_test_case import cases_for, random_floats, random_ids, run_case


def as_numpy(tensor):
    return ops.convert_to_numpy(ops.cast(tensor, "float32"))


@pytest.mark.parametrize("name", cases_for(SharedEmbedding))
def test_layer(name):
    run_case(name)


def test_forward_is_the_embedding_row_scaled_by_sqrt_width():
    ids = random_ids(np.random.default_rng(0), [5, 3], 5, vocabulary_size=30)
    layer = SharedEmbedding(vocabulary_size=30, embedding_dim=16)
    outputs = as_numpy(layer(ids))
    table = as_numpy(layer.embeddings)
    np.testing.assert_allclose(outputs, table[ids] * math.sqrt(16), rtol=1e-6, atol=0)
    unscaled = SharedEmbedding(vocabulary_size=30, embedding_dim=16, scale=False)
    unscaled(ids)
    unscaled.set_weights(layer.get_weights())
    np.testing.assert_array_equal(as_numpy(unscaled(ids)), table[ids])


def test_reverse_uses_the_same_matrix():
    rng = np.random.default_rng(1)
    layer = SharedEmbedding(vocabulary_size=30, embedding_dim=16)
    layer(np.array([[1]]))
    hidden = random_floats(rng, 2, 4, 16)
    logits = layer(hidden, reverse=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert tuple(logits.shape) == (2, 4, 30)
    np.testing.assert_allclose(
        as_numpy(logits), hidden @ as_numpy(layer.embeddings).T, rtol=0, atol=1e-5
    )
    # One matrix: changing it changes both directions.
    layer.embeddings.assign(as_numpy(layer.embeddings) * 2.0)
    np.testing.assert_allclose(
        as_numpy(layer(hidden, reverse=True)), 2.0 * as_numpy(logits), rtol=0, atol=2e-5
    )
    assert len(layer.weights) == 1


def test_reverse_logits_are_float32_under_mixed_precision():
    layer = SharedEmbedding(vocabulary_size=30, embedding_dim=16, dtype="mixed_bfloat16")
    hidden = layer(np.array([[3, 4, 0]]))
    assert keras.backend.standardize_dtype(hidden.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(layer(hidden, reverse=True).dtype) == "float32"


def test_implicit_padding_mask_marks_id_zero():
    ids = np.array([[4, 2, 0, 0], [1, 1, 1, 0]])
    mask = implicit_mask(SharedEmbedding(10, 8)(ids))
    np.testing.assert_array_equal(as_numpy(mask).astype(bool), ids != 0)
    assert implicit_mask(SharedEmbedding(10, 8, mask_zero=False)(ids)) is None


def test_default_initializer_gives_unit_variance_scaled_embeddings():
    width = 64
    layer = SharedEmbedding(vocabulary_size=4000, embedding_dim=width)
    layer.build()
    std = float(np.std(as_numpy(layer.embeddings)))
    assert abs(std - width**-0.5) < 0.05 * width**-0.5
    scaled = as_numpy(layer(np.arange(1, 4000)[None, :]))
    assert abs(float(np.std(scaled)) - 1.0) < 0.05


TINY = dict(
    vocabulary_size=31,
    num_encoder_layers=1,
    num_decoder_layers=1,
    hidden_dim=16,
    intermediate_dim=32,
    num_heads=2,
)


def matrices(model):
    return sorted(tuple(weight.shape) for weight in model.weights if len(weight.shape) == 2)


def test_tied_transformer_has_no_separate_output_weights():
    vocab, width = TINY["vocabulary_size"], TINY["hidden_dim"]
    tied = Transformer(get_preset("tiny", **TINY))
    assert tied.output_projection is None
    assert tied.target_embedding is tied.source_embedding
    shapes = matrices(tied)
    assert shapes.count((vocab, width)) == 1 and (width, vocab) not in shapes

    untied = Transformer(get_preset("tiny", tie_output=False, **TINY))
    assert (width, vocab) in matrices(untied)
    assert untied.count_params() - tied.count_params() == width * vocab + vocab

    separate = Transformer(get_preset("tiny", share_embeddings=False, **TINY))
    assert matrices(separate).count((vocab, width)) == 2
    assert separate.count_params() - tied.count_params() == vocab * width


def test_tied_logits_are_decoder_states_times_embedding_transpose():
    model = Transformer(get_preset("tiny", **TINY))
    source = np.array([[3, 4, 5, 0]], "int32")
    target = np.array([[1, 7, 8]], "int32")
    logits = as_numpy(model({"source_ids": source, "target_ids": target}))
    # Logits of the tied model lie in the span of the embedding rows: solving
    # logits = h E^T for h reproduces them exactly.
    table = as_numpy(model.source_embedding.embeddings)  # (V, D)
    hidden, *_ = np.linalg.lstsq(table, logits[0].T, rcond=None)  # (D, T)
    np.testing.assert_allclose((table @ hidden).T, logits[0], rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(vocabulary_size=0, embedding_dim=4), "vocabulary_size=0"),
        (dict(vocabulary_size=5, embedding_dim=-3), "embedding_dim=-3"),
    ],
)
def test_bad_sizes_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SharedEmbedding(**kwargs)
