"""The functional Transformer: config, saving, training, precision, masks, cached decoding."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer import Transformer, TransformerConfig, get_preset
from keras_transformer.models import build_model

ATOL = 1e-5
VOCAB = 31
TINY = dict(
    vocabulary_size=VOCAB,
    num_encoder_layers=2,
    num_decoder_layers=2,
    hidden_dim=16,
    intermediate_dim=32,
    num_heads=2,
    max_length=16,
)
VARIANTS = {
    "post_ln": {},
    "pre_ln": dict(normalize_first=True),
    "learned_positions": dict(positional="learned"),
    "untied_separate": dict(tie_output=False, share_embeddings=False),
    "windowed": dict(attention_window=2),  # restricted self-attention (Table 1)
}
# Source row 1 is padded after 3 tokens; target row 1 after 4 (BOS = 1 first).
SOURCE = np.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]], "int32")
TARGET = np.array([[1, 14, 15, 16, 17], [1, 18, 19, 20, 0]], "int32")


def tiny_config(**changes):
    return get_preset("tiny", **{**TINY, **changes})


def as_numpy(tensor):
    return ops.convert_to_numpy(tensor)


def logits_of(model, source=SOURCE, target=TARGET, **kwargs):
    return as_numpy(model({"source_ids": source, "target_ids": target}, **kwargs))


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    return Transformer(tiny_config())


def test_outputs_are_float32_logits(model):
    logits = model({"source_ids": SOURCE, "target_ids": TARGET})
    assert tuple(logits.shape) == (2, 5, VOCAB)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert set(model.input) == {"source_ids", "target_ids"}
    assert model.count_params() > 0


def test_accepts_a_preset_name_or_a_dict():
    assert Transformer("tiny").config == get_preset("tiny")
    assert Transformer(tiny_config().to_dict()).config == tiny_config()


def test_get_config_round_trip(model):
    config = model.get_config()
    revived = Transformer.from_config(config)
    assert isinstance(revived, Transformer)
    assert revived.config == model.config
    assert revived.get_config() == config
    revived.set_weights(model.get_weights())
    np.testing.assert_allclose(logits_of(revived), logits_of(model), rtol=0, atol=1e-6)


def test_keras_save_and_load_give_equal_outputs(model, tmp_path):
    path = tmp_path / "transformer.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, Transformer)
    assert loaded.config == model.config
    np.testing.assert_allclose(logits_of(loaded), logits_of(model), rtol=0, atol=1e-6)


def test_one_fit_step():
    model = Transformer(tiny_config(num_encoder_layers=1, num_decoder_layers=1))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = [as_numpy(weight) for weight in model.trainable_weights]
    labels = np.concatenate([TARGET[:, 1:], np.zeros((2, 1), "int32")], axis=1)
    history = model.fit(
        {"source_ids": SOURCE, "target_ids": TARGET}, labels, batch_size=2, epochs=1, verbose=0
    )
    assert np.isfinite(history.history["loss"][0])
    after = [as_numpy(weight) for weight in model.trainable_weights]
    changed = sum(not np.array_equal(old, new) for old, new in zip(before, after))
    assert changed > len(before) // 2


@pytest.mark.parametrize("tie_output", [True, False])
def test_mixed_bfloat16_gives_float32_logits(tie_output, tmp_path):
    model = Transformer(tiny_config(tie_output=tie_output), dtype="mixed_bfloat16")
    assert model.dtype_policy.name == "mixed_bfloat16"
    assert all(
        keras.backend.standardize_dtype(weight.dtype) == "float32" for weight in model.weights
    )
    assert model.encoder_layers[0].compute_dtype == "bfloat16"
    encoder_outputs, _ = model.encode(SOURCE)
    assert keras.backend.standardize_dtype(encoder_outputs.dtype) == "bfloat16"
    logits = model({"source_ids": SOURCE, "target_ids": TARGET})
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert np.all(np.isfinite(as_numpy(logits)))
    # The policy survives get_config / .keras files.
    assert Transformer.from_config(model.get_config()).encoder_layers[0].compute_dtype == "bfloat16"
    model.save(tmp_path / "mixed.keras")
    loaded = keras.saving.load_model(tmp_path / "mixed.keras")
    assert loaded.decoder_layers[0].compute_dtype == "bfloat16"
    np.testing.assert_allclose(logits_of(loaded), as_numpy(logits), rtol=0, atol=1e-6)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_config_options_build_and_run(variant):
    model = Transformer(tiny_config(**VARIANTS[variant]))
    logits = logits_of(model)
    assert logits.shape == (2, 5, VOCAB) and np.all(np.isfinite(logits))
    names = {layer.name for layer in model.layers}
    if variant == "pre_ln":
        assert {"encoder_final_layer_norm", "decoder_final_layer_norm"} <= names
    if variant == "learned_positions":
        assert {"source_position_embedding", "target_position_embedding"} <= names
    if variant == "untied_separate":
        assert {"output_projection", "target_token_embedding"} <= names


def test_training_flag_controls_dropout():
    model = Transformer(tiny_config(dropout=0.3))
    inference = logits_of(model, training=False)
    np.testing.assert_array_equal(logits_of(model, training=False), inference)
    np.testing.assert_array_equal(logits_of(model), inference)  # inference by default
    without_dropout = Transformer(tiny_config(dropout=0.0))
    without_dropout.set_weights(model.get_weights())
    np.testing.assert_allclose(logits_of(without_dropout), inference, rtol=0, atol=1e-6)
    first, second = logits_of(model, training=True), logits_of(model, training=True)
    assert np.abs(first - inference).max() > 1e-3
    assert np.abs(first - second).max() > 1e-3


# --- masks and causality ---


@pytest.mark.parametrize("variant", ["post_ln", "pre_ln"])
def test_step_t_does_not_see_later_targets(variant):
    model = Transformer(tiny_config(**VARIANTS[variant]))
    logits = logits_of(model)
    rng = np.random.default_rng(0)
    for step in range(TARGET.shape[1] - 1):
        changed = TARGET.copy()
        changed[:, step + 1 :] = rng.integers(1, VOCAB, size=(2, TARGET.shape[1] - step - 1))
        changed_logits = logits_of(model, target=changed)
        np.testing.assert_allclose(
            changed_logits[:, : step + 1], logits[:, : step + 1], rtol=0, atol=ATOL
        )
        assert np.abs(changed_logits[:, step + 1 :] - logits[:, step + 1 :]).max() > 1e-4


def test_padding_does_not_change_real_positions(model):
    logits = logits_of(model)
    longer_source = np.concatenate([SOURCE, np.zeros((2, 3), "int32")], axis=1)
    np.testing.assert_allclose(logits_of(model, source=longer_source), logits, rtol=0, atol=ATOL)
    longer_target = np.concatenate([TARGET, np.zeros((2, 2), "int32")], axis=1)
    real = TARGET != 0
    np.testing.assert_allclose(
        logits_of(model, target=longer_target)[:, :5][real], logits[real], rtol=0, atol=ATOL
    )
    # Source padding is masked: a row's logits match the same row encoded alone without pads.
    alone = logits_of(model, source=SOURCE[1:, :3], target=TARGET[1:])
    np.testing.assert_allclose(alone[0][real[1]], logits[1][real[1]], rtol=0, atol=ATOL)


# Labels of TARGET: the next token, EOS (2) after the last, padding after that.
LABELS = np.array([[14, 15, 16, 17, 2], [18, 19, 20, 2, 0]], "int32")


@pytest.mark.parametrize(
    "variant, jit_compile",
    [*((name, False) for name in [*VARIANTS, "word_positions"]), ("post_ln", True)],
)
def test_skipping_padding_equals_the_padded_model(variant, jit_compile):
    """`skip_padding` (the default): on the same weights, the logits at every real position,
    the loss and every gradient equal those of the model computing on the padded batch
    (eagerly, and compiled with XLA, where the packing carries every position); and so do
    the training output's (`real_target_logits`: the real positions' logits, in order)."""
    from keras_transformer.layers import packing
    from keras_transformer.training.loss import label_smoothed_nll

    changes = (
        dict(word_positions=True, word_window=1)
        if variant == "word_positions"
        else VARIANTS[variant]
    )
    config = tiny_config(dropout=0.0, **changes)
    keras.utils.set_random_seed(1)
    packed, padded = build_model(config), build_model(config.replace(skip_padding=False))
    padded.set_weights(packed.get_weights())
    assert any(isinstance(layer, packing.Pack) for layer in packed.layers)
    assert not any(isinstance(layer, packing.Pack) for layer in padded.layers)
    source = np.concatenate(
        [SOURCE, np.zeros((2, 2), "int32")], axis=1
    )  # more padding on both sides
    target = np.concatenate([TARGET, np.zeros((2, 1), "int32")], axis=1)
    labels = np.concatenate([LABELS, np.zeros((2, 1), "int32")], axis=1)
    real = labels != 0

    def forward_and_backward(model, rows=False):
        def step(source, target, labels):
            inputs = {"source_ids": source, "target_ids": target}
            with tf.GradientTape() as tape:
                if rows:
                    labels, logits = model.real_target_logits(inputs, labels, training=True)
                else:
                    logits = model(inputs, training=True)
                loss_sum, _ = label_smoothed_nll(labels, logits)
            return logits, loss_sum, tape.gradient(loss_sum, model.trainable_variables)

        if jit_compile:
            step = tf.function(step, jit_compile=True)
        logits, loss_sum, grads = step(source, target, labels)
        return as_numpy(logits), float(loss_sum), grads

    padded_logits, padded_loss, padded_grads = forward_and_backward(padded)
    for rows in (False, True):
        logits, loss, grads = forward_and_backward(packed, rows)
        if rows:  # the real positions' rows, in order; under XLA every position's
            assert logits.shape == (real.size if jit_compile else real.sum(), VOCAB)
            at_real = logits[real.ravel()] if jit_compile else logits
        else:
            at_real = logits[real]
        np.testing.assert_allclose(at_real, padded_logits[real], rtol=0, atol=ATOL)
        assert abs(loss - padded_loss) <= ATOL
        assert len(grads) == len(padded_grads)
        for variable, ours, theirs in zip(packed.trainable_variables, grads, padded_grads):
            np.testing.assert_allclose(
                as_numpy(tf.convert_to_tensor(ours)),
                as_numpy(tf.convert_to_tensor(theirs)),
                rtol=0,
                atol=ATOL,
                err_msg=f"rows={rows}: {variable.path}",
            )


def test_training_output_draws_the_forward_passs_dropout_and_refuses_labels_past_the_target():
    """`real_target_logits` with dropout: the same masks as `model(inputs)` draws (two models
    built from one seed give the same loss both ways, unlike without dropout); labels with a
    token where `target_ids` is padding are refused, naming the contract."""
    from keras_transformer.training.loss import label_smoothed_nll

    models = []
    for _ in range(2):
        keras.utils.set_random_seed(3)
        models.append(Transformer(tiny_config(dropout=0.3)))
    inputs = {"source_ids": SOURCE, "target_ids": TARGET}
    full_loss, tokens = label_smoothed_nll(LABELS, models[0](inputs, training=True))
    labels, logits = models[1].real_target_logits(inputs, LABELS, training=True)
    rows_loss, rows_tokens = label_smoothed_nll(labels, logits)
    no_dropout, _ = label_smoothed_nll(LABELS, models[0](inputs, training=False))
    assert float(rows_tokens) == float(tokens) == (LABELS != 0).sum()
    assert abs(float(rows_loss) - float(full_loss)) <= ATOL
    assert abs(float(rows_loss) - float(no_dropout)) > 1e-2
    past_the_target = LABELS.copy()
    past_the_target[1, 4] = 7
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="labels hold real tokens where target_ids is padding"
    ):
        models[1].real_target_logits(inputs, past_the_target)


def test_under_xla_a_packing_carries_every_position():
    """XLA compiles fixed shapes, and a training step whose number of real positions changed
    with every batch ran several times slower there than on the padded batch (docs/results-log.md,
    "Where the step's time goes now, and skipping the padding under XLA"). So while TensorFlow
    traces for XLA a packing carries every position; in graph mode and eagerly it carries the
    real ones."""
    from keras_transformer.layers import packing

    mask = tf.constant([[True, True, False], [True, False, False]])

    def positions(mask):
        return packing.packing(mask)[0]

    assert tf.function(positions, jit_compile=True)(mask).numpy().tolist() == [0, 1, 2, 3, 4, 5]
    assert tf.function(positions)(mask).numpy().tolist() == [0, 1, 3]
    assert as_numpy(positions(mask)).tolist() == [0, 1, 3]


def test_encode_and_decode_views_equal_the_model(model):
    encoder_outputs, source_mask = model.encode(SOURCE)
    assert tuple(encoder_outputs.shape) == (2, 6, TINY["hidden_dim"])
    np.testing.assert_array_equal(as_numpy(source_mask), SOURCE != 0)
    logits = model.decode(TARGET, encoder_outputs, source_mask)
    real = TARGET != 0  # the model skips the padding; its logits there are not computed
    np.testing.assert_allclose(as_numpy(logits)[real], logits_of(model)[real], rtol=0, atol=1e-6)
    logits, scores = model.decode(
        TARGET, encoder_outputs, source_mask, return_attention_scores=True
    )
    assert len(scores) == TINY["num_decoder_layers"]
    assert tuple(scores[0]["cross"].shape) == (2, TINY["num_heads"], 5, 6)
    assert np.all(as_numpy(scores[0]["cross"])[1, :, :, 3:] == 0.0)
    encoder_scores = model.encoder_attention_scores(SOURCE)
    assert len(encoder_scores) == TINY["num_encoder_layers"]
    assert tuple(encoder_scores[0].shape) == (2, TINY["num_heads"], 6, 6)


# --- cached decoding ---


def cached_logits(model, decode_step, max_length, cache_index=lambda index: index):
    encoder_outputs, source_mask = model.encode(SOURCE)
    cache = model.init_cache(encoder_outputs, max_length)
    assert isinstance(cache, tuple) and len(cache) == TINY["num_decoder_layers"]
    steps = []
    for index in range(TARGET.shape[1]):
        result = decode_step(TARGET[:, index : index + 1], cache, cache_index(index), source_mask)
        assert isinstance(result, tuple) and len(result) == 2
        logits, cache = result
        assert isinstance(cache, tuple) and len(cache) == TINY["num_decoder_layers"]
        assert set(cache[0]) == {"self", "cross"}
        window = model.config.attention_window
        if max_length is None and not window:  # growing: the positions decoded so far
            assert tuple(cache[0]["self"]["past_key"].shape) == (2, TINY["num_heads"], index + 1, 8)
        else:
            slots = min(
                window or max_length, max_length or window
            )  # a ring of r slots with a window
            assert tuple(cache[0]["self"]["key"].shape) == (2, TINY["num_heads"], slots, 8)
        steps.append(as_numpy(logits))
    return np.concatenate(steps, axis=1)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_decoding_equals_the_full_model(variant):
    model = Transformer(tiny_config(**VARIANTS[variant]))
    full = logits_of(model)
    real = TARGET != 0
    for max_length in (8, None):  # a preallocated buffer; a growing cache (a ring with a window)
        stepwise = cached_logits(model, model.decode_step, max_length=max_length)
        assert stepwise.shape == full.shape
        np.testing.assert_allclose(stepwise[real], full[real], rtol=0, atol=ATOL)


def test_cached_decoding_in_a_tf_function(model):
    """Decoding loops trace `decode_step` once, with the position as a tensor."""
    step = tf.function(model.decode_step)
    traced = cached_logits(model, step, max_length=8, cache_index=lambda index: tf.constant(index))
    eager = cached_logits(model, model.decode_step, max_length=8)
    np.testing.assert_allclose(traced, eager, rtol=0, atol=ATOL)
    assert step.experimental_get_tracing_count() == 1


def test_config_errors_surface_from_the_model():
    with pytest.raises(ValueError, match="num_heads=7"):
        Transformer(TransformerConfig.from_dict(dict(TINY, num_heads=7)))
    with pytest.raises(ValueError, match="Unknown preset"):
        Transformer("no_such_preset")
