"""The mask helpers: one convention (True = real token / may attend) everywhere."""

import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import SharedEmbedding, causal_mask, merge_masks, padding_mask
from keras_transformer.layers.masks import implicit_mask


def as_numpy(tensor):
    return ops.convert_to_numpy(tensor)


def test_padding_mask_is_true_at_real_tokens():
    ids = np.array([[5, 3, 0, 0], [7, 1, 2, 9]])
    mask = as_numpy(padding_mask(ids))
    assert mask.dtype == bool
    np.testing.assert_array_equal(mask, [[True, True, False, False], [True, True, True, True]])


def test_padding_mask_with_another_pad_id():
    ids = np.array([[5, 3, 1, 1]])
    np.testing.assert_array_equal(
        as_numpy(padding_mask(ids, pad_id=1)), [[True, True, False, False]]
    )


def test_causal_mask_is_the_lower_triangle():
    mask = as_numpy(causal_mask(4))
    assert mask.shape == (1, 4, 4)
    np.testing.assert_array_equal(mask[0], np.tril(np.ones((4, 4), dtype=bool)))


def test_causal_mask_rectangular_and_offset_for_cached_decoding():
    # Queries are positions 3 and 4 of a 6-slot key buffer: query q sees keys k <= 3 + q.
    mask = as_numpy(causal_mask(2, 6, offset=3))
    expected = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]], dtype=bool)
    np.testing.assert_array_equal(mask[0], expected)
    # The offset form is the matching rows of the full triangle.
    full = as_numpy(causal_mask(6))
    np.testing.assert_array_equal(mask, full[:, 3:5, :])


def test_causal_mask_accepts_tensor_offset():
    mask = as_numpy(causal_mask(1, 5, offset=ops.convert_to_tensor(2)))
    np.testing.assert_array_equal(mask[0, 0], [True, True, True, False, False])


def test_merge_masks_nothing_to_mask_is_none():
    assert merge_masks(3, 4) is None


def test_merge_masks_key_padding_broadcasts_over_queries():
    key_padding = np.array([[True, True, False], [True, False, False]])
    mask = as_numpy(merge_masks(2, 3, key_padding_mask=key_padding))
    assert mask.shape == (2, 1, 3)
    np.testing.assert_array_equal(mask[:, 0, :], key_padding)


def test_merge_masks_ignores_query_padding():
    # A padded query row still attends to the real keys, so no row is ever fully masked.
    query_padding = np.array([[True, False]])
    assert merge_masks(2, 3, query_padding_mask=query_padding) is None
    key_padding = np.array([[True, True, False]])
    with_query = as_numpy(
        merge_masks(2, 3, query_padding_mask=query_padding, key_padding_mask=key_padding)
    )
    without_query = as_numpy(merge_masks(2, 3, key_padding_mask=key_padding))
    np.testing.assert_array_equal(with_query, without_query)


def test_merge_masks_combines_padding_attention_and_causal():
    key_padding = np.array([[True, True, True, False]])
    attention = np.ones((1, 4, 4), dtype=bool)
    attention[0, 3, 0] = False  # query 3 may not see key 0
    mask = as_numpy(
        merge_masks(4, 4, key_padding_mask=key_padding, attention_mask=attention, causal=True)
    )
    expected = np.tril(np.ones((4, 4), dtype=bool)) & key_padding[:, None, :] & attention
    np.testing.assert_array_equal(mask, expected)
    assert not mask[0, 3, 0] and not mask[0, 3, 3] and mask[0, 3, 1]


@pytest.mark.parametrize("with_padding", [False, True])
def test_merge_masks_causal_offset(with_padding):
    key_padding = np.array([[True] * 5 + [False]]) if with_padding else None
    mask = as_numpy(merge_masks(1, 6, key_padding_mask=key_padding, causal=True, causal_offset=4))
    np.testing.assert_array_equal(mask[0, 0], [True] * 5 + [False])


def test_merge_masks_accepts_integer_masks():
    mask = as_numpy(
        merge_masks(
            1, 3, key_padding_mask=np.array([[1, 0, 1]]), attention_mask=np.array([[[1, 1, 0]]])
        )
    )
    np.testing.assert_array_equal(mask, [[[True, False, False]]])


def test_implicit_mask_reads_the_keras_mask():
    ids = np.array([[4, 2, 0]])
    embedded = SharedEmbedding(10, 4)(ids)
    np.testing.assert_array_equal(as_numpy(implicit_mask(embedded)), [[True, True, False]])
    assert implicit_mask(np.zeros((1, 3, 4))) is None
