"""`tracing.gradient_scope`: a custom gradient's ops carry the scope of the forward pass."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.benchmark.profile import training_part
from keras_transformer.layers import LayerNormalization, packing
from tests.layer_test_case import B, D, T


def layer_norm():
    layer = LayerNormalization(name="decoder_layer_0_layer_norm")
    layer.build((B, T, D))
    return lambda inputs: (layer(inputs), layer.trainable_variables)


def pack_and_unpack():
    lengths = np.arange(B) % T + 1  # at least one padded sequence (B < T)

    def forward(inputs):
        positions = packing.packing(tf.constant(np.arange(T)[None, :] < lengths[:, None]))
        with tf.name_scope("encoder_layer_0/feed_forward"):
            return packing.unpack(packing.pack(inputs, positions) * 2.0, positions), []

    return forward


# An op type each backward pass runs, and how many: the layer norm's two row means are
# matrix-vector products; pack's and unpack's gradients are a gather each.
@pytest.mark.parametrize(
    "make_forward, part, op_type, count",
    [(layer_norm, "layer norm", "MatMul", 2), (pack_and_unpack, "feed-forward", "GatherV2", 2)],
)
def test_custom_gradients_ops_are_named_under_the_forward_pass_scope(
    make_forward, part, op_type, count
):
    """Traced under `tape.gradient` outside the layer, the backward pass's ops are named
    `<forward scope>/gradient/...`, so the training profile counts them as the layer's part
    (`benchmark.profile.training_part`), not as the loss's."""

    forward = make_forward()

    @tf.function
    def gradients(inputs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs, variables = forward(inputs)
            loss = tf.reduce_sum(outputs * outputs)
        return tape.gradient(loss, [inputs, *variables])

    graph = gradients.get_concrete_function(tf.TensorSpec((B, T, D))).graph
    backward = [f"{op.name}:{op.type}" for op in graph.get_operations() if "/gradient/" in op.name]
    assert sum(name.endswith(f":{op_type}") for name in backward) >= count, backward
    assert {training_part(name) for name in backward} == {part}, backward
