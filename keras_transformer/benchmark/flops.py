"""Floating-point operation counts of a training step and the machine's matmul throughput."""

import time

import numpy as np


def training_flops(config, source_lengths, target_lengths):
    """FLOPs of one training update on sentences of the given real lengths.

    Counts the matrix multiplications (2 FLOPs per multiply-add) of the forward pass over
    real tokens only -- projections, attention scores and weighted sums, feed-forward, the
    output projection onto the target vocabulary (`decoder_vocabulary_size`; embedding
    lookups are not multiplications) -- and multiplies by 3 for the backward pass (the usual
    convention; softmax, normalization and elementwise work are not counted).

    Args:
        config: the model's `TransformerConfig`.
        source_lengths, target_lengths: per-sentence real lengths (EOS/BOS included).
    """
    s = np.asarray(source_lengths, dtype=np.float64)
    t = np.asarray(target_lengths, dtype=np.float64)
    d, f, v, h = (
        config.hidden_dim,
        config.intermediate_dim,
        config.decoder_vocabulary_size,  # the output projection's rows
        config.num_heads,
    )
    dk, dv = config.head_key_dim * h, config.head_value_dim * h
    projections = 2 * d * (2 * dk + dv) + 2 * dv * d  # Q, K, V and output projections per token
    feed_forward = 2 * 2 * d * f
    encoder = config.num_encoder_layers * (
        s.sum() * (projections + feed_forward) + 2 * (s**2).sum() * (dk + dv)
    )
    cross = (
        s.sum() * 2 * d * (dk + dv)
        + t.sum() * (2 * d * dk + 2 * dv * d)
        + 2 * (s * t).sum() * (dk + dv)
    )
    decoder = config.num_decoder_layers * (
        t.sum() * (projections + feed_forward) + 2 * (t**2).sum() * (dk + dv) + cross
    )
    output = t.sum() * 2 * d * v
    return 3.0 * (encoder + decoder + output)


# The side of the square matrices whose product measures the matmul rate, unless asked otherwise.
MATMUL_SIZE = 2048


def matmul_flops_per_second(size=MATMUL_SIZE, repeats=10, dtype="float32"):
    """Measured matmul throughput of this machine (FLOP/s) for `size`-square matrices of `dtype` (TensorFlow)."""
    import tensorflow as tf

    a = tf.random.normal([size, size], dtype=dtype)
    b = tf.random.normal([size, size], dtype=dtype)

    @tf.function
    def chain(a, b):
        result = a
        for _ in range(repeats):
            result = tf.matmul(result, b) * 1e-3
        return tf.reduce_sum(result)

    float(chain(a, b))  # trace and warm up
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        float(chain(a, b))
        best = min(best, time.perf_counter() - start)
    return repeats * 2 * size**3 / best
