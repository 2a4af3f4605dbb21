"""`tracing.gradient_scope`: a custom gradient's ops carry the scope of the forward pass."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.benchmark.profile import training_part
from keras_transformer.layers import LayerNormalization, packing

B, T, D = 2, 5, 8


def layer_norm():
    layer = LayerNormalization(name="decoder_layer_0_layer_norm")
    layer.build((B, T, D))
    return lambda inputs: (layer(inputs), layer.trainable_variables)


def pack_and_unpack():
    def forward(inputs):
        mask = tf.constant(np.arange(T)[None, :] < np.array([[T], [2]]))
        with tf.name_scope("encoder_layer_0/feed_forward"):
            rows = packing.pack(inputs, packing.packing(mask))
            return packing.unpack(rows * 2.0, packing.packing(mask)), []

    return forward


@pytest.mark.parametrize("make_forward, part", [(layer_norm, "layer norm"), (pack_and_unpack, "feed-forward")])
def test_custom_gradients_ops_are_named_under_the_forward_pass_scope(make_forward, part):
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
    assert len(backward) >= 3, backward
    assert {training_part(name) for name in backward} == {part}, backward
