"""The beam's two-stage top-k (`decoding.selection`) against one `tf.math.top_k`.

The other backends run the same comparison in `backend_harness.check_two_stage_top_k`; the
searches' exactness tests (`test_decoding_search.py`) go through it at every beam step.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding import selection


def tie_heavy(rng, rows, width):
    """Values from 6 levels and -inf: most candidates tie with others."""
    values = rng.integers(-3, 3, size=(rows, width)).astype("float32")
    values[rng.random((rows, width)) < 0.2] = -np.inf
    return values


@pytest.mark.parametrize("block", [None, 2, 3, 7, 16])
def test_two_stage_top_k_equals_one_top_k_ties_and_minus_inf_included(block):
    rng = np.random.default_rng(block or 0)
    for _ in range(40):
        rows, width = int(rng.integers(1, 5)), int(rng.integers(2, 400))
        k = int(rng.integers(1, min(width, 40) + 1))
        values = tie_heavy(rng, rows, width)
        expected_values, expected_indices = tf.math.top_k(values, k)
        found_values, found_indices = selection.top_k(tf.constant(values), k, block=block)
        np.testing.assert_array_equal(found_values, expected_values)
        np.testing.assert_array_equal(found_indices, expected_indices)
        assert found_indices.dtype == tf.int32


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
