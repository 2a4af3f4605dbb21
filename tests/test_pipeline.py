"""Tests for the token-budget tf.data pipeline, with a real SentencePiece model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data.builtin_task import builtin_task
from keras_transformer.data.corpus import load_multi30k
from keras_transformer.data.pipeline import (
    DEFAULT_BUCKET_BOUNDARIES,
    default_bucket_boundaries,
    make_dataset,
    padding_fraction,
)
from keras_transformer.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    Tokenizer,
    train_sentencepiece,
)

MULTI30K_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
pytestmark = pytest.mark.skipif(
    not MULTI30K_DIR.is_dir(), reason=f"Multi30k copy not found at {MULTI30K_DIR}"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    pairs = load_multi30k("en", "de", "train", data_dir=MULTI30K_DIR)[:1000]
    sentences = [sentence for pair in pairs for sentence in pair]
    path = train_sentencepiece(
        sentences, tmp_path_factory.mktemp("spm") / "spm.model", vocabulary_size=500
    )
    return Tokenizer(path)


@pytest.fixture(scope="module")
def multi30k_val() -> list[tuple[str, str]]:
    return load_multi30k("en", "de", "val", data_dir=MULTI30K_DIR)


@pytest.fixture(scope="module")
def numbers() -> list[tuple[str, str]]:
    """500 pairs with distinct sources, so that examples can be told apart."""
    return builtin_task("val")


def _batches(dataset: tf.data.Dataset) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return [
        (inputs["source_ids"].numpy(), inputs["target_ids"].numpy(), labels.numpy())
        for inputs, labels in dataset
    ]


def _decode(tokenizer: Tokenizer, ids: np.ndarray) -> list[str]:
    return [s.decode("utf-8") for s in tokenizer.detokenize(ids).numpy()]


def _decoded_pairs(tokenizer, batches) -> list[tuple[str, str]]:
    pairs = []
    for source, _, labels in batches:
        pairs += zip(_decode(tokenizer, source), _decode(tokenizer, labels))
    return pairs


def test_batches_respect_the_token_budget(tokenizer, multi30k_val):
    batch_tokens = 600
    dataset = make_dataset(multi30k_val, tokenizer, batch_tokens=batch_tokens, max_length=64)
    spec_inputs, spec_labels = dataset.element_spec
    assert set(spec_inputs) == {"source_ids", "target_ids"}
    assert spec_labels.dtype == spec_inputs["source_ids"].dtype == tf.int32
    shapes = set()
    for source, target, labels in _batches(dataset):
        assert source.dtype == target.dtype == labels.dtype == np.int32
        assert labels.shape == target.shape
        assert source.shape[0] == target.shape[0]
        assert source.size <= batch_tokens and target.size <= batch_tokens
        assert source.shape[1] in default_bucket_boundaries(64)
        assert target.shape[1] in default_bucket_boundaries(64)
        shapes.add(source.shape)
    assert len(shapes) <= 2 * len(default_bucket_boundaries(64))


def test_teacher_forcing_shift_and_tail_padding(tokenizer, multi30k_val):
    dataset = make_dataset(multi30k_val[:300], tokenizer, batch_tokens=512, max_length=64)
    for source, target, labels in _batches(dataset):
        for ids in (source, target, labels):
            not_pad = ids != PAD_ID
            # Padding only at the tail: once a row hits PAD it stays PAD.
            assert (np.diff(not_pad.astype(np.int8), axis=1) <= 0).all()
            assert not_pad[:, 0].all()
        for src_row, tgt_row, lab_row in zip(source, target, labels):
            n_src = int((src_row != PAD_ID).sum())
            n = int((lab_row != PAD_ID).sum())
            assert src_row[n_src - 1] == EOS_ID and EOS_ID not in src_row[: n_src - 1]
            assert lab_row[n - 1] == EOS_ID and EOS_ID not in lab_row[: n - 1]
            assert tgt_row[0] == BOS_ID and BOS_ID not in tgt_row[1:]
            assert (tgt_row[1:n] == lab_row[: n - 1]).all()
            assert (tgt_row[n:] == PAD_ID).all()


def test_one_epoch_holds_every_pair_once(tokenizer, numbers):
    dataset = make_dataset(numbers, tokenizer, batch_tokens=256, max_length=64)
    assert Counter(_decoded_pairs(tokenizer, _batches(dataset))) == Counter(numbers)


def test_real_multi30k_sample(tokenizer, multi30k_val):
    sample = multi30k_val[:200]
    seen = set(
        "".join(s + t for s, t in load_multi30k("en", "de", "train", data_dir=MULTI30K_DIR)[:1000])
    )
    covered = [(s, t) for s, t in sample if set(s + t) <= seen]
    dataset = make_dataset(covered, tokenizer, batch_tokens=1024, max_length=128)
    normalized = [(" ".join(s.split()), " ".join(t.split())) for s, t in covered]
    assert Counter(_decoded_pairs(tokenizer, _batches(dataset))) == Counter(normalized)
    assert 0.0 < padding_fraction(dataset) < 0.5


def test_filters_pairs_longer_than_max_length(tokenizer, multi30k_val):
    max_length = 16
    lengths = zip(
        tokenizer.tokenize([s for s, _ in multi30k_val]).row_lengths().numpy(),
        tokenizer.tokenize([t for _, t in multi30k_val]).row_lengths().numpy(),
    )
    expected = sum(1 for s, t in lengths if s + 1 <= max_length and t + 1 <= max_length)
    assert 0 < expected < len(multi30k_val)
    dataset = make_dataset(
        multi30k_val, tokenizer, batch_tokens=256, max_length=max_length, shuffle=False
    )
    batches = _batches(dataset)
    assert sum(source.shape[0] for source, _, _ in batches) == expected
    assert max(max(s.shape[1], t.shape[1]) for s, t, _ in batches) <= max_length


def test_sampling_alpha_segments_every_pass_anew(tokenizer, numbers):
    dataset = make_dataset(
        numbers, tokenizer, batch_tokens=256, max_length=64, shuffle=False, sampling_alpha=0.2
    )
    passes = [_batches(dataset) for _ in range(2)]
    plain = _batches(
        make_dataset(numbers, tokenizer, batch_tokens=256, max_length=64, shuffle=False)
    )

    def rows(batches):
        return Counter(tuple(row[row != PAD_ID]) for _, _, labels in batches for row in labels)

    for batches in passes:  # every pair once per pass, with its text intact
        assert Counter(_decoded_pairs(tokenizer, batches)) == Counter(numbers)
    assert rows(passes[0]) != rows(passes[1])
    assert len(rows(passes[0]) & rows(plain)) < 0.5 * len(numbers)


def test_same_seed_same_batches_other_seed_other_order(tokenizer, numbers):
    def run(seed: int):
        return _batches(
            make_dataset(numbers[:200], tokenizer, batch_tokens=512, max_length=64, seed=seed)
        )

    first, again, other = run(7), run(7), run(8)
    assert len(first) > 1
    assert len(first) == len(again)
    for a, b in zip(first, again):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    order = _decoded_pairs(tokenizer, first)
    other_order = _decoded_pairs(tokenizer, other)
    assert Counter(order) == Counter(other_order)
    assert order != other_order


def test_shards_are_disjoint_and_cover_everything(tokenizer, numbers):
    shards = []
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=pipeline_id, num_replicas_in_sync=2
        )
        dataset = make_dataset(
            numbers, tokenizer, batch_tokens=256, max_length=64, input_context=context
        )
        shards.append(_decoded_pairs(tokenizer, _batches(dataset)))
    assert len(shards[0]) == len(shards[1]) == len(numbers) // 2
    assert not set(shards[0]) & set(shards[1])
    assert Counter(shards[0] + shards[1]) == Counter(numbers)


def test_distribute_datasets_from_function(tokenizer, numbers):
    strategy = tf.distribute.get_strategy()
    distributed = strategy.distribute_datasets_from_function(
        lambda context: make_dataset(
            numbers, tokenizer, batch_tokens=256, max_length=64, input_context=context
        )
    )
    inputs, labels = next(iter(distributed))
    assert inputs["source_ids"].shape[0] == labels.shape[0] > 0


def test_repeat_runs_past_one_epoch(tokenizer, numbers):
    dataset = make_dataset(numbers[:100], tokenizer, batch_tokens=512, max_length=64, repeat=True)
    assert dataset.cardinality() == tf.data.INFINITE_CARDINALITY
    examples = 0
    for inputs, _ in dataset.take(1000):
        examples += int(inputs["source_ids"].shape[0])
        if examples > 200:
            break
    assert examples > 200


def test_repeat_with_everything_filtered_fails_instead_of_hanging(tokenizer, numbers):
    dataset = make_dataset(numbers, tokenizer, batch_tokens=64, max_length=2, repeat=True)
    with pytest.raises(tf.errors.FailedPreconditionError, match="infinite number of elements"):
        next(iter(dataset))


def test_drop_remainder_gives_full_batches(tokenizer, numbers):
    batch_tokens = 200
    dataset = make_dataset(
        numbers[:200], tokenizer, batch_tokens=batch_tokens, max_length=64, drop_remainder=True
    )
    batches = _batches(dataset)
    assert batches
    for source, target, _ in batches:
        assert source.shape[0] == batch_tokens // source.shape[1]
        assert target.shape[0] == batch_tokens // target.shape[1]


def test_custom_bucket_boundaries(tokenizer, multi30k_val):
    dataset = make_dataset(
        multi30k_val[:200], tokenizer, batch_tokens=400, max_length=40, bucket_boundaries=[20, 30]
    )
    lengths = {source.shape[1] for source, _, _ in _batches(dataset)}
    assert lengths <= {20, 30, 40}


def test_default_bucket_boundaries():
    assert default_bucket_boundaries(128) == list(DEFAULT_BUCKET_BOUNDARIES)
    assert default_bucket_boundaries(40) == [8, 12, 16, 24, 32, 40]
    assert default_bucket_boundaries(512) == [
        8,
        12,
        16,
        24,
        32,
        48,
        64,
        96,
        128,
        192,
        256,
        384,
        512,
    ]
    assert default_bucket_boundaries(5) == [5]


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"batch_tokens": 32, "max_length": 64}, "batch_tokens=32 is smaller than max_length=64"),
        ({"batch_tokens": 64, "max_length": 1}, "max_length must be at least 2"),
        (
            {"batch_tokens": 64, "max_length": 32, "bucket_boundaries": [16, 8]},
            r"strictly increasing. Received: bucket_boundaries=\[16, 8\]",
        ),
        (
            {"batch_tokens": 64, "max_length": 32, "bucket_boundaries": [16, 48]},
            "largest bucket boundary 48 exceeds max_length=32",
        ),
        (
            {"batch_tokens": 64, "max_length": 32, "sampling_alpha": 0.0},
            r"sampling alpha must be a number in \(0, 1\]. Received: alpha=0.0",
        ),
    ],
)
def test_rejects_bad_arguments(tokenizer, numbers, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_dataset(numbers, tokenizer, **kwargs)


def test_rejects_no_pairs(tokenizer):
    with pytest.raises(ValueError, match="no sentence pairs"):
        make_dataset([], tokenizer, batch_tokens=64, max_length=32)


def test_padding_fraction_counts_pad_positions(tokenizer, multi30k_val):
    # Unshuffled, so that every pass over the dataset yields the same batches.
    dataset = make_dataset(
        multi30k_val[:150], tokenizer, batch_tokens=512, max_length=64, shuffle=False
    )
    padded = total = 0
    for source, target, _ in _batches(dataset):
        padded += (source == PAD_ID).sum() + (target == PAD_ID).sum()
        total += source.size + target.size
    assert padding_fraction(dataset) == pytest.approx(padded / total)
    first_two = _batches(dataset.take(2))
    expected = sum((s == PAD_ID).sum() + (t == PAD_ID).sum() for s, t, _ in first_two) / sum(
        s.size + t.size for s, t, _ in first_two
    )
    assert padding_fraction(dataset, num_batches=2) == pytest.approx(expected)


def test_padding_fraction_needs_num_batches_when_repeated(tokenizer, numbers):
    dataset = make_dataset(numbers[:50], tokenizer, batch_tokens=256, max_length=64, repeat=True)
    with pytest.raises(ValueError, match="needs num_batches"):
        padding_fraction(dataset)
    assert 0.0 <= padding_fraction(dataset, num_batches=3) < 1.0
