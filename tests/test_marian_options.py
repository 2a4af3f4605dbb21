"""The architecture options an OPUS-MT (Marian) model needs, through every path of the model:
sin || cos positions (`sinusoid_layout`), SiLU, a final-logits bias, a target vocabulary of
its own. Each is checked against an independent formula and the cached steps, searches and
shortlist against the full forward pass. (CTranslate2's outputs: tests/test_ctranslate2.py.)
"""

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer import Transformer, get_preset
from keras_transformer.decoding import beam_search, greedy_search
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.positional import PositionalEncoding
from keras_transformer.runs import read_run_config
from keras_transformer.training.loss import label_smoothed_nll, labels_and_logits

ATOL = 1e-5
VOCABULARY, TARGET_VOCABULARY = 31, 23
MARIAN = dict(
    vocabulary_size=VOCABULARY,
    num_encoder_layers=2,
    num_decoder_layers=2,
    hidden_dim=16,
    intermediate_dim=32,
    num_heads=2,
    max_length=32,
    sinusoid_layout="concatenated",
    activation="silu",
    final_logits_bias=True,
    layer_norm_epsilon=1e-5,
    share_embeddings=False,
    target_vocabulary_size=TARGET_VOCABULARY,
)
# Source row 1 is padded after 3 tokens; target row 1 after 4 (BOS = 2 first).
SOURCE = np.array([[5, 6, 7, 8, 9, 3], [11, 12, 3, 0, 0, 0]], "int32")
TARGET = np.array([[2, 14, 15, 16, 17], [2, 18, 19, 20, 0]], "int32")


def marian_sinusoids(positions, depth):
    """Marian's table: [sin(p w_0) .. sin(p w_{D/2-1}) | cos(p w_0) .. cos(p w_{D/2-1})],
    w_i = 10000^(-2i/D), written from the formula (D even)."""
    frequencies = 10000.0 ** (-2.0 * np.arange(depth // 2) / depth)
    angles = np.asarray(positions, np.float64)[:, None] * frequencies
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


def random_model(seed=0, **changes):
    keras.utils.set_random_seed(seed)
    model = Transformer(get_preset("tiny", **{**MARIAN, **changes}), dtype="float32")
    if model.logits_bias is not None:  # a bias the size of the logits' spread
        rng = np.random.default_rng(seed)
        model.logits_bias.bias.assign(rng.normal(0.0, 2.0, model.logits_bias.bias.shape))
    return model


@pytest.fixture(scope="module")
def model():
    return random_model()


def logits_of(model, source=SOURCE, target=TARGET):
    return ops.convert_to_numpy(model({"source_ids": source, "target_ids": target}))


# --- positions ---


def test_concatenated_sinusoids_are_marians_from_position_zero():
    layer = PositionalEncoding(layout="concatenated")
    table = ops.convert_to_numpy(layer(np.zeros((1, 40, 16), "float32")))[0]
    np.testing.assert_allclose(table, marian_sinusoids(range(40), 16), atol=ATOL)
    # a cached step at position 37 gets row 37
    step = ops.convert_to_numpy(layer(np.zeros((1, 1, 16), "float32"), start_index=37))[0]
    np.testing.assert_allclose(step, table[37:38], atol=ATOL)
    interleaved = ops.convert_to_numpy(PositionalEncoding()(np.zeros((1, 40, 16), "float32")))[0]
    np.testing.assert_allclose(interleaved[:, 0::2], table[:, :8], atol=ATOL)  # same frequencies
    np.testing.assert_allclose(interleaved[:, 1::2], table[:, 8:], atol=ATOL)
    with pytest.raises(ValueError, match="layout='halves'"):
        PositionalEncoding(layout="halves")


@pytest.mark.parametrize("depth", [16, 15])
def test_concatenated_sinusoids_equal_transformers_marian_table(depth):
    modeling = pytest.importorskip("transformers.models.marian.modeling_marian")
    reference = modeling.MarianSinusoidalPositionalEmbedding(50, depth).create_weight().numpy()
    layer = PositionalEncoding(layout="concatenated")
    table = ops.convert_to_numpy(layer(np.zeros((1, 50, depth), "float32")))[0]
    np.testing.assert_allclose(table, reference, atol=ATOL)


def test_the_model_adds_its_layouts_sinusoids_on_both_sides(model):
    """The encoder's and the decoder's inputs are the scaled embeddings plus Marian's table."""
    for layer, embedding, ids in (
        (model.source_position, model.source_embedding, SOURCE),
        (model.target_position, model.target_embedding, TARGET),
    ):
        embedded = embedding(ids)
        positions = ops.convert_to_numpy(layer(embedded))
        np.testing.assert_allclose(
            positions,
            np.broadcast_to(marian_sinusoids(range(ids.shape[1]), 16), positions.shape),
            atol=ATOL,
        )
    config = model.get_config()
    assert Transformer.from_config(config).source_position.layout == "concatenated"


# --- SiLU ---


def test_silu_feed_forward_is_x_sigmoid_x():
    layer = PositionwiseFeedForward(intermediate_dim=8, activation="silu")
    inputs = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")
    outputs = ops.convert_to_numpy(layer(inputs))
    dense_in, dense_out = layer.intermediate_dense, layer.output_dense
    hidden = inputs @ ops.convert_to_numpy(dense_in.kernel) + ops.convert_to_numpy(dense_in.bias)
    hidden = hidden / (1.0 + np.exp(-hidden))
    expected = hidden @ ops.convert_to_numpy(dense_out.kernel) + ops.convert_to_numpy(
        dense_out.bias
    )
    np.testing.assert_allclose(outputs, expected, atol=ATOL)


def test_the_models_feed_forward_layers_use_the_configs_activation(model):
    blocks = model.encoder_layers + model.decoder_layers
    assert all(block.feed_forward.activation is keras.activations.silu for block in blocks)


# --- the final-logits bias and the target vocabulary ---


def test_final_logits_bias_is_added_to_the_logits(model):
    with_bias = logits_of(model)
    bias = ops.convert_to_numpy(model.logits_bias.bias)
    model.logits_bias.bias.assign(np.zeros_like(bias))
    try:
        without = logits_of(model)
    finally:
        model.logits_bias.bias.assign(bias)
    real = TARGET != 0
    np.testing.assert_allclose(
        (with_bias - without)[real], np.broadcast_to(bias, with_bias.shape)[real], atol=ATOL
    )


def test_target_vocabulary_sizes_the_decoder_and_the_logits(model):
    assert logits_of(model).shape == (2, 5, TARGET_VOCABULARY)
    assert tuple(model.source_embedding.embeddings.shape) == (VOCABULARY, 16)
    assert tuple(model.target_embedding.embeddings.shape) == (TARGET_VOCABULARY, 16)
    untied = random_model(tie_output=False)
    assert logits_of(untied).shape == (2, 5, TARGET_VOCABULARY)


def test_default_options_build_the_same_weights_as_before():
    """The options off: no bias weight, one shared embedding (a run written before them loads)."""
    config = get_preset(
        "tiny",
        **{
            **MARIAN,
            "final_logits_bias": False,
            "share_embeddings": True,
            "target_vocabulary_size": None,
        },
    )
    model = Transformer(config)
    assert model.logits_bias is None
    assert not any("final_logits_bias" in weight.path for weight in model.weights)


# --- every path computes the same logits ---


def cached_logits(model, max_length, output_ids=None):
    encoder_outputs, source_mask = model.encode(SOURCE)
    cache = model.init_cache(encoder_outputs, max_length)
    steps = []
    for index in range(TARGET.shape[1]):
        logits, cache = model.decode_step(
            TARGET[:, index : index + 1], cache, index, source_mask, output_ids=output_ids
        )
        steps.append(ops.convert_to_numpy(logits))
    return np.concatenate(steps, axis=1)


@pytest.mark.parametrize("tie_output", [True, False])
def test_cached_steps_equal_the_full_model(tie_output):
    model = random_model(tie_output=tie_output)
    full, real = logits_of(model), TARGET != 0
    for max_length in (8, None):  # a preallocated buffer; a growing cache
        np.testing.assert_allclose(cached_logits(model, max_length)[real], full[real], atol=ATOL)


def test_shortlist_steps_equal_the_full_models_columns(model):
    output_ids = np.array([0, 3, 7, 22, 11], "int32")
    shortlisted = cached_logits(model, 8, output_ids=output_ids)
    full, real = logits_of(model), TARGET != 0
    np.testing.assert_allclose(shortlisted[real], full[..., output_ids][real], atol=ATOL)


def teacher_forced_scores(model, source_ids, token_ids):
    """Sum of the full model's log-probabilities of each row of `token_ids` (up to EOS)."""
    token_ids = np.asarray(token_ids)
    scores = []
    for source, output in zip(source_ids, token_ids):
        output = output.tolist()
        output = output[: output.index(3) + 1] if 3 in output else [t for t in output if t]
        logits = logits_of(model, source[None], np.array([[2] + output[:-1]], "int32"))[0]
        log_probs = np.asarray(tf.nn.log_softmax(logits, axis=-1))
        scores.append(log_probs[np.arange(len(output)), output].sum())
    return np.array(scores)


def test_searches_score_their_outputs_as_the_full_model(model):
    """Greedy and beam search (cached steps) find outputs in the decoder's vocabulary whose
    scores are the full model's log-probabilities; the uncached searches find the same."""
    token_ids, scores = greedy_search(model, SOURCE, max_output_offset=4)
    assert np.asarray(token_ids).max() < TARGET_VOCABULARY
    np.testing.assert_allclose(scores, teacher_forced_scores(model, SOURCE, token_ids), atol=1e-4)
    uncached_ids, uncached_scores = greedy_search(
        model, SOURCE, max_output_offset=4, use_cache=False
    )
    np.testing.assert_array_equal(uncached_ids, token_ids)
    np.testing.assert_allclose(uncached_scores, scores, atol=1e-4)
    beam_ids, beam_scores = beam_search(
        model, SOURCE, beam_size=4, length_penalty=0.0, max_output_offset=4
    )
    best = np.asarray(beam_ids)[:, 0]
    np.testing.assert_allclose(
        np.asarray(beam_scores)[:, 0], teacher_forced_scores(model, SOURCE, best), atol=1e-4
    )


def test_the_training_loss_reads_the_decoders_logits_and_trains_the_bias(model):
    """The trainer's output (the real target positions, `labels_and_logits`) has the decoder's
    vocabulary and the bias, labels up to target_vocabulary_size - 1 score, and the loss's
    gradient reaches the bias."""
    labels = np.concatenate([TARGET[:, 1:], np.zeros((2, 1), "int32")], axis=1)
    labels[0, -1] = TARGET_VOCABULARY - 1
    inputs = {"source_ids": SOURCE, "target_ids": TARGET}
    with tf.GradientTape() as tape:
        real_labels, logits = labels_and_logits(model, inputs, labels, training=False)
        loss, count = label_smoothed_nll(real_labels, logits)
    real = TARGET != 0
    np.testing.assert_allclose(ops.convert_to_numpy(logits), logits_of(model)[real], atol=ATOL)
    assert int(count) == (labels != 0).sum() and np.isfinite(float(loss))
    gradient = ops.convert_to_numpy(tape.gradient(loss, model.logits_bias.bias))
    assert gradient.shape == (TARGET_VOCABULARY,) and gradient[TARGET_VOCABULARY - 1] < 0


def test_keras_file_round_trip_keeps_the_options(model, tmp_path):
    path = tmp_path / "marian.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.config == model.config
    np.testing.assert_allclose(logits_of(loaded), logits_of(model), atol=1e-6)


def test_an_old_runs_config_reads_with_the_paper_options():
    """tests/old_runs/tiny's config.json predates the options: it reads at their defaults."""
    run = Path(__file__).parent / "old_runs" / "tiny"
    assert not {"sinusoid_layout", "final_logits_bias", "target_vocabulary_size"} & set(
        json.loads((run / "config.json").read_text())["model"]
    )
    config, _ = read_run_config(run)
    assert config.sinusoid_layout == "interleaved" and not config.final_logits_bias
    assert config.decoder_vocabulary_size == config.vocabulary_size


def test_an_int8_model_adds_the_bias_in_every_path():
    """`model.quantize("int8")` keeps the bias float32 and adds it to the int8 projection's
    logits, in the full pass and in the cached and shortlisted steps alike."""
    quantized = random_model()
    quantized.quantize("int8")
    assert keras.backend.standardize_dtype(quantized.logits_bias.bias.dtype) == "float32"
    full, real = logits_of(quantized), TARGET != 0
    np.testing.assert_allclose(cached_logits(quantized, 8)[real], full[real], atol=1e-4)
    output_ids = np.array([0, 3, 7, 22, 11], "int32")
    shortlisted = cached_logits(quantized, 8, output_ids=output_ids)
    np.testing.assert_allclose(shortlisted[real], full[..., output_ids][real], atol=1e-4)
    bias = ops.convert_to_numpy(quantized.logits_bias.bias)
    quantized.logits_bias.bias.assign(np.zeros_like(bias))
    without = logits_of(quantized)
    np.testing.assert_allclose(
        (full - without)[real], np.broadcast_to(bias, full.shape)[real], atol=1e-4
    )


def test_an_ensemble_refuses_models_of_other_target_vocabularies(model):
    from keras_transformer.decoding.ensemble import Ensemble

    other = random_model(target_vocabulary_size=TARGET_VOCABULARY + 1)
    with pytest.raises(ValueError, match=r"\(31, 23\), \(31, 24\)"):
        Ensemble([model, other])


def test_mixed_bfloat16_keeps_the_bias_and_the_logits_float32():
    mixed = Transformer(get_preset("tiny", **MARIAN), dtype="mixed_bfloat16")
    assert keras.backend.standardize_dtype(mixed.logits_bias.bias.dtype) == "float32"
    logits = mixed({"source_ids": SOURCE, "target_ids": TARGET})
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert tuple(logits.shape) == (2, 5, TARGET_VOCABULARY)
