"""The shared layer test helper and the table of layer cases every layer test runs.

`run_layer_test` is the one check every public layer passes (after keras-hub's
`run_layer_test`), with no per-class special cases: what differs between layers is data
(arguments, inputs, expected shape, weight count, output dtype).

`LAYER_CASES` is that data, one row per case. Each layer's test file runs
`run_layer_test` on its rows (`cases_for`), and `test_layers_saved_model.py` exports every
row as a SavedModel and checks it in a separate Python process.

Input data is either one array (passed as the first call argument) or a dict whose keys
are call-argument names (passed by keyword), e.g. `{"query": ..., "value": ...}`.
"""

import dataclasses
import inspect
import json
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np

from keras_transformer.layers import (
    DecoderBlock,
    EncoderBlock,
    LayerNormalization,
    MultiHeadAttention,
    PositionalEncoding,
    PositionEmbedding,
    PositionwiseFeedForward,
    SharedEmbedding,
)

# Tiny sizes: B batch, S source length, T target length, D width, H heads, F FFN width, V vocab.
B, S, T, D, H, F, V = 2, 6, 5, 16, 2, 32, 23

# Output equality after saving and loading (same weights, same graph).
SAVE_LOAD_ATOL = 1e-6


def random_floats(rng, *shape):
    """float32 standard-normal array of `shape`."""
    return rng.standard_normal(shape).astype("float32")


def random_ids(rng, lengths, length, vocabulary_size=V):
    """int32 ids `(len(lengths), length)` in `[1, V)`, zero-padded after `lengths[i]` tokens."""
    ids = rng.integers(1, vocabulary_size, size=(len(lengths), length)).astype("int32")
    return np.where(padding(lengths, length), ids, 0).astype("int32")


def padding(lengths, length):
    """bool padding mask `(len(lengths), length)`: True for the first `lengths[i]` positions."""
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


@dataclasses.dataclass(frozen=True)
class LayerCase:
    """One row of `LAYER_CASES`: a layer, how to call it, and what must come out."""

    layer_cls: type
    init_kwargs: dict
    make_inputs: Callable[[np.random.Generator], object]
    expected_output_shape: tuple
    expected_num_trainable_weights: int
    call_kwargs: dict = dataclasses.field(default_factory=dict)
    # None: the layer's compute dtype. A string: a dtype the layer documents for its
    # output whatever the policy (e.g. float32 logits).
    expected_output_dtype: str | None = None

    def inputs(self, seed=0):
        return self.make_inputs(np.random.default_rng(seed))

    def test_kwargs(self, seed=0):
        """The keyword arguments of `run_layer_test` for this case."""
        return dict(
            layer_cls=self.layer_cls,
            init_kwargs=self.init_kwargs,
            input_data=self.inputs(seed),
            expected_output_shape=self.expected_output_shape,
            expected_num_trainable_weights=self.expected_num_trainable_weights,
            call_kwargs=self.call_kwargs,
            expected_output_dtype=self.expected_output_dtype,
        )


# Weight counts: MultiHeadAttention 8 (4 kernels, 4 biases), FFN 4, LayerNormalization 2.
LAYER_CASES = {
    "multi_head_attention": LayerCase(
        MultiHeadAttention,
        dict(num_heads=H),
        lambda rng: {"query": random_floats(rng, B, T, D), "value": random_floats(rng, B, S, D)},
        (B, T, D),
        8,
    ),
    "multi_head_attention_causal_masked": LayerCase(
        MultiHeadAttention,
        dict(num_heads=H, key_dim=4, value_dim=6, output_dim=12, dropout=0.1),
        lambda rng: {
            "query": random_floats(rng, B, T, D),
            "value": random_floats(rng, B, T, D),
            "value_mask": padding([T, 3], T),
        },
        (B, T, 12),
        8,
        call_kwargs=dict(use_causal_mask=True),
    ),
    "positional_encoding": LayerCase(
        PositionalEncoding,
        dict(),
        lambda rng: random_floats(rng, B, T, D),
        (B, T, D),
        0,
    ),
    "position_embedding": LayerCase(
        PositionEmbedding,
        dict(sequence_length=8),
        lambda rng: random_floats(rng, B, T, D),
        (B, T, D),
        1,
    ),
    "shared_embedding": LayerCase(
        SharedEmbedding,
        dict(vocabulary_size=V, embedding_dim=D),
        lambda rng: random_ids(rng, [T, 3], T),
        (B, T, D),
        1,
    ),
    "shared_embedding_reverse": LayerCase(
        SharedEmbedding,
        dict(vocabulary_size=V, embedding_dim=D),
        lambda rng: random_floats(rng, B, T, D),
        (B, T, V),
        1,
        call_kwargs=dict(reverse=True),
        expected_output_dtype="float32",
    ),
    "layer_normalization": LayerCase(
        LayerNormalization,
        dict(epsilon=1e-6),
        lambda rng: random_floats(rng, B, T, D),
        (B, T, D),
        2,
    ),
    "positionwise_feed_forward": LayerCase(
        PositionwiseFeedForward,
        dict(intermediate_dim=F, activation="gelu", dropout=0.1),
        lambda rng: random_floats(rng, B, T, D),
        (B, T, D),
        4,
    ),
    "encoder_block_post_ln": LayerCase(
        EncoderBlock,
        dict(num_heads=H, intermediate_dim=F),
        lambda rng: {"inputs": random_floats(rng, B, S, D), "padding_mask": padding([S, 4], S)},
        (B, S, D),
        8 + 4 + 2 * 2,
    ),
    "encoder_block_pre_ln": LayerCase(
        EncoderBlock,
        dict(
            num_heads=H,
            intermediate_dim=F,
            normalize_first=True,
            attention_dropout=0.1,
            activation_dropout=0.1,
        ),
        lambda rng: random_floats(rng, B, S, D),
        (B, S, D),
        8 + 4 + 2 * 2,
    ),
    "decoder_block_post_ln": LayerCase(
        DecoderBlock,
        dict(num_heads=H, intermediate_dim=F),
        lambda rng: {
            "decoder_sequence": random_floats(rng, B, T, D),
            "encoder_sequence": random_floats(rng, B, S, D),
            "encoder_padding_mask": padding([S, 4], S),
        },
        (B, T, D),
        2 * 8 + 4 + 3 * 2,
    ),
    "decoder_block_pre_ln": LayerCase(
        DecoderBlock,
        dict(num_heads=H, intermediate_dim=F, normalize_first=True, key_dim=4),
        lambda rng: {
            "decoder_sequence": random_floats(rng, B, T, D),
            "encoder_sequence": random_floats(rng, B, S, D),
        },
        (B, T, D),
        2 * 8 + 4 + 3 * 2,
    ),
}


def cases_for(layer_cls):
    """Names of the `LAYER_CASES` rows of `layer_cls` (for `pytest.mark.parametrize`)."""
    return [name for name, case in LAYER_CASES.items() if case.layer_cls is layer_cls]


def call_layer(layer, input_data, call_kwargs=None, **kwargs):
    """Call `layer` on one array (first argument) or a dict of call arguments."""
    call_kwargs = {**(call_kwargs or {}), **kwargs}
    if isinstance(input_data, dict):
        return layer(**input_data, **call_kwargs)
    return layer(input_data, **call_kwargs)


def functional_model(layer, input_data, call_kwargs=None):
    """A functional model around `layer`, with one named `keras.Input` per input array.

    Input names are the call-argument names of a dict input, else "inputs".
    """

    def make_input(name, array):
        return keras.Input(shape=array.shape[1:], dtype=str(array.dtype), name=name)

    if isinstance(input_data, dict):
        inputs = {name: make_input(name, array) for name, array in input_data.items()}
    else:
        inputs = make_input("inputs", input_data)
    return keras.Model(inputs, call_layer(layer, inputs, call_kwargs))


def _dtype(tensor):
    return keras.backend.standardize_dtype(tensor.dtype)


def _check_config(layer_cls, init_kwargs):
    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    init_params = inspect.signature(layer_cls.__init__).parameters.values()
    missing = [
        param.name
        for param in init_params
        if param.name != "self"
        and param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL)
        and param.name not in config
    ]
    assert not missing, f"{layer_cls.__name__}.get_config() lacks constructor arguments {missing}"
    for name, value in init_kwargs.items():
        if isinstance(value, (bool, int, float)):  # strings may be stored serialized
            assert config[name] == value, (name, config[name], value)

    revived = layer_cls.from_config(config)
    assert revived.get_config() == config

    text = json.dumps(keras.saving.serialize_keras_object(layer))
    deserialized = keras.saving.deserialize_keras_object(json.loads(text))
    assert type(deserialized) is layer_cls
    assert deserialized.get_config() == config


def _check_training(layer_cls, init_kwargs, input_data, call_kwargs, expected_output_shape):
    layer = layer_cls(**init_kwargs)
    model = functional_model(layer, input_data, call_kwargs)
    before = [keras.ops.convert_to_numpy(weight) for weight in layer.trainable_weights]
    targets = np.random.default_rng(1).standard_normal(expected_output_shape).astype("float32")
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse")
    with warnings.catch_warnings():  # a layer without weights trains nothing, which is fine
        warnings.filterwarnings("ignore", message="The model does not have any trainable weights")
        history = model.fit(
            input_data, targets, batch_size=expected_output_shape[0], epochs=1, verbose=0
        )
    assert np.isfinite(history.history["loss"][0])
    after = [keras.ops.convert_to_numpy(weight) for weight in layer.trainable_weights]
    for weight in after:
        assert np.all(np.isfinite(weight))
    changed = [not np.array_equal(old, new) for old, new in zip(before, after)]
    if before:
        assert any(changed), "one fit step changed no trainable weight"


def _check_mixed_precision(layer_cls, init_kwargs, input_data, call_kwargs, expected_output_dtype):
    layer = layer_cls(**{**init_kwargs, "dtype": "mixed_bfloat16"})
    outputs = call_layer(layer, input_data, call_kwargs)
    assert layer.compute_dtype == "bfloat16"
    for weight in layer.weights:
        assert keras.backend.standardize_dtype(weight.dtype) == "float32", weight.path
    expected = expected_output_dtype or "bfloat16"
    assert _dtype(outputs) == expected
    assert np.all(np.isfinite(keras.ops.convert_to_numpy(keras.ops.cast(outputs, "float32"))))
    model = functional_model(layer, input_data, call_kwargs)
    assert _dtype(model.outputs[0]) == expected


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    expected_output_shape,
    expected_num_trainable_weights,
    call_kwargs=None,
    expected_num_non_trainable_weights=0,
    expected_output_dtype=None,
):
    """Check everything a toolkit layer must support.

    * `get_config` holds every constructor argument, `from_config` rebuilds the same
      config, and `keras.saving.serialize_keras_object` output survives a JSON round trip;
      building the layer does not change its config.
    * Eager and symbolic (`keras.Input`) output shapes and dtypes; the functional model's
      outputs equal the eager call's.
    * The number of trainable and non-trainable weights.
    * One `fit` step of a functional model around the layer changes its weights.
    * Under the `mixed_bfloat16` policy the variables stay float32 and the output is
      bfloat16, or `expected_output_dtype` where the layer documents a fixed output dtype.
    * `.keras` save and load give identical outputs.

    The SavedModel export of every case is checked in `test_layers_saved_model.py` (one
    separate Python process for all cases).

    Args:
        layer_cls: the layer class.
        init_kwargs: constructor arguments.
        input_data: one array (first call argument) or a dict of call arguments.
        expected_output_shape: shape of the eager output, batch included.
        expected_num_trainable_weights: number of trainable weights once built.
        call_kwargs: extra (non-tensor) call arguments, e.g. `{"reverse": True}`.
        expected_num_non_trainable_weights: number of non-trainable weights once built.
        expected_output_dtype: the output dtype whatever the policy, if the layer fixes it;
            None means the layer's compute dtype.
    """
    call_kwargs = dict(call_kwargs or {})
    _check_config(layer_cls, init_kwargs)

    # Eager call: shape, dtype, weight counts; building leaves the config alone.
    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    outputs = call_layer(layer, input_data, call_kwargs)
    assert tuple(outputs.shape) == tuple(expected_output_shape)
    assert _dtype(outputs) == (expected_output_dtype or layer.compute_dtype)
    assert len(layer.trainable_weights) == expected_num_trainable_weights
    assert len(layer.non_trainable_weights) == expected_num_non_trainable_weights
    assert layer.get_config() == config

    # Symbolic call: the same shape with an unknown batch, and the same numbers.
    model = functional_model(layer, input_data, call_kwargs)
    assert len(model.outputs) == 1
    assert tuple(model.outputs[0].shape) == (None,) + tuple(expected_output_shape[1:])
    assert _dtype(model.outputs[0]) == _dtype(outputs)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(input_data)),
        keras.ops.convert_to_numpy(outputs),
        rtol=0,
        atol=1e-6,
    )

    # .keras file: the same outputs after loading.
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "model.keras"
        model.save(path)
        loaded = keras.saving.load_model(path)
    assert any(type(sublayer) is layer_cls for sublayer in loaded.layers)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded(input_data)),
        keras.ops.convert_to_numpy(model(input_data)),
        rtol=0,
        atol=SAVE_LOAD_ATOL,
    )

    _check_training(layer_cls, init_kwargs, input_data, call_kwargs, expected_output_shape)
    _check_mixed_precision(layer_cls, init_kwargs, input_data, call_kwargs, expected_output_dtype)


def run_case(name):
    """`run_layer_test` on the `LAYER_CASES` row `name`."""
    run_layer_test(**LAYER_CASES[name].test_kwargs())
