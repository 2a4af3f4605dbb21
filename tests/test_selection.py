"""The beam's two-stage top-k (`decoding.selection`) in TensorFlow graphs, as the search uses it.

Its exactness on tie-heavy rows, against numpy's ordering, is checked on every backend
(TensorFlow included) by `backend_harness.check_two_stage_top_k`; the searches' exactness
tests (`test_decoding_search.py`) go through it at every beam step.
"""

import numpy as np
import tensorflow as tf

from keras_transformer.decoding import selection


def test_two_stage_top_k_in_a_graph_with_unknown_rows_as_in_the_search_loop():
    beams, vocabulary_size = 4, 8000  # the multi30k beam: 32,000 candidates per sentence
    rng = np.random.default_rng(1)
    values = rng.normal(size=(6, beams * vocabulary_size)).astype("float32")
    values[:, ::97] = values[:, :1]  # ties across blocks
    assert selection.block_size(values.shape[1], 2 * beams) == 64

    @tf.function(input_signature=[tf.TensorSpec([None, beams * vocabulary_size], tf.float32)])
    def select(values):
        return selection.top_k(values, 2 * beams)

    found, expected = select(values), tf.math.top_k(values, 2 * beams)
    np.testing.assert_array_equal(found[0], expected[0])
    np.testing.assert_array_equal(found[1], expected[1])


def test_few_blocks_take_one_top_k():
    values = tf.constant([[3.0, 1.0, 2.0, 5.0]])
    top_values, indices = selection.top_k(values, 2, block=2)  # 2 blocks, k = 2: one top_k
    np.testing.assert_array_equal(top_values, [[5.0, 3.0]])
    np.testing.assert_array_equal(indices, [[3, 0]])


def test_rows_of_unknown_width_take_one_top_k():
    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def select(values):
        return selection.top_k(values, 2, block=2)

    top_values, indices = select(tf.constant([[1.0, 4.0, 4.0, 0.0, 2.0, 3.0]]))
    np.testing.assert_array_equal(top_values, [[4.0, 4.0]])
    np.testing.assert_array_equal(indices, [[1, 2]])


def test_take_per_row_is_a_gather_with_one_batch_axis_in_a_graph_with_unknown_shapes():
    rng = np.random.default_rng(2)
    tensor = rng.normal(size=(3, 4, 5, 2)).astype("float32")  # (A, K, ...) with two trailing axes
    indices = rng.integers(0, 4, size=(3, 6)).astype("int32")  # (A, M), M > K: rows picked twice

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 4, None, 2], tf.float32),
            tf.TensorSpec([None, 6], tf.int32),
        ]
    )
    def take(tensor, indices):
        return selection.take_per_row(tensor, indices)

    expected = tf.gather(tensor, indices, batch_dims=1)
    np.testing.assert_array_equal(take(tensor, indices), expected)
    np.testing.assert_array_equal(selection.take_per_row(tensor, indices), expected)  # eagerly
