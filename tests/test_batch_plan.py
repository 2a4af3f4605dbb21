"""`data.BatchPlan`: what each update of a planned epoch carries.

The quality a run reaches in a fixed number of updates depends on the tokens each update
carries. The plan replaced the streaming pipeline (`data.make_dataset` with `repeat`, whose
buckets fill across epochs) for restarts; its batches must carry what the streaming
pipeline's carry, not a few percent less.
"""

import numpy as np
import pytest

from keras_transformer.data import Tokenizer, builtin_task, make_dataset
from keras_transformer.data.plan import BatchPlan
from keras_transformer.data.tokenizer import PAD_ID, train_sentencepiece

BATCH_TOKENS = 4096
EPOCHS = 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    pairs = builtin_task("train")
    path = tmp_path_factory.mktemp("plan") / "spm.model"
    train_sentencepiece([text for pair in pairs for text in pair], path, 128)
    return pairs, Tokenizer(str(path))


@pytest.fixture(scope="module")
def plan(corpus):
    pairs, tokenizer = corpus
    return BatchPlan(pairs, tokenizer, batch_tokens=BATCH_TOKENS, max_length=48, seed=3)


def _planned(plan, epoch):
    return [plan.batch(epoch * plan.batches_per_epoch + i) for i in range(plan.batches_per_epoch)]


def test_a_bucket_that_fills_a_batch_gives_only_full_batches(plan):
    counts = np.bincount(plan._buckets, minlength=len(plan.batch_sizes))
    assert (counts >= plan.batch_sizes).any()
    for epoch in range(EPOCHS):
        batches = plan.epoch_batches(epoch)
        assert len(batches) == plan.batches_per_epoch
        assert sum(batch.size for batch in batches) == plan.pairs_per_epoch
        for batch in batches:
            bucket = plan._buckets_of(batch).max()
            assert (plan._buckets_of(batch) == bucket).all()
            if counts[bucket] >= plan.batch_sizes[bucket]:
                assert batch.size == plan.batch_sizes[bucket]
            else:  # too small a bucket for one batch: all of it, once
                assert batch.size == counts[bucket]


def test_the_pairs_left_out_of_an_epoch_are_others_in_the_next(plan):
    seen = [set(np.concatenate(plan.epoch_batches(epoch)).tolist()) for epoch in range(EPOCHS)]
    left_out = [set(plan._kept.tolist()) - epoch for epoch in seen]
    assert all(left_out)
    for before, after in zip(left_out, left_out[1:]):  # by chance, a few may wait twice
        assert len(before & after) < len(before) / 2


def test_updates_carry_the_streaming_pipelines_tokens(corpus, plan):
    """Real target tokens per batch, averaged over the same number of batches: the plan's
    equal the streaming pipeline's to within a percent (emitting every bucket's leftovers as
    partial batches costs 3 % on this corpus)."""
    pairs, tokenizer = corpus
    count = EPOCHS * plan.batches_per_epoch
    planned = [
        int(np.sum(labels != PAD_ID))
        for epoch in range(EPOCHS)
        for _, _, labels in _planned(plan, epoch)
    ]
    streamed = make_dataset(
        pairs, tokenizer, batch_tokens=BATCH_TOKENS, max_length=48, seed=3, repeat=True
    )
    streamed = [int(np.sum(labels.numpy() != PAD_ID)) for _, labels in streamed.take(count)]
    assert np.mean(planned) == pytest.approx(np.mean(streamed), rel=0.01)
