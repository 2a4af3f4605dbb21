"""Training batches planned per epoch, so that a run's input can start anywhere at once.

`data.make_dataset` streams pairs through shuffling, tokenization and bucketing;
to continue a run at update 100,000 it would have to replay everything before it. A
`BatchPlan` tokenizes the corpus once, then plans each epoch from a seed (as
fairseq's `EpochBatchIterator` does): the pairs of epoch `e` are shuffled with
`(seed, e)`, grouped by the bucket of their length in that order, and cut into batches
of `batch_tokens // boundary` pairs, each emitted when its last pair is reached. Every
batch of a bucket that fills one is full, as the streaming pipeline's are: the pairs left
over at the end of such a bucket (fewer than a batch) wait for another epoch, whose shuffle
leaves out others; a bucket too small to fill one batch is one partial batch at the
epoch's end. (Emitting every bucket's leftovers as partial batches would make a few
percent of the updates small ones and cut the tokens an update carries on average by as
much.) The number of batches of an epoch does not depend on the shuffle, so a position,
the number of global batches drawn since the start, is `(epoch, offset)`, and the input
starts there directly: the cost of a restart does not grow with the updates done.

Global batch `g` is fed to the replicas in order: with `P` input pipelines of `R`
replicas each, pipeline `p` delivers `g = start + (k // R) * P * R + p * R + k % R`
as its `k`-th batch, so one update of `R * P` replicas and `accum_steps`
micro-batches takes `R * P * accum_steps` consecutive global batches whatever the
layout, and a run resumed with another layout continues with the same examples.

Batches are `(inputs, labels)` exactly as `data.make_dataset` makes them
(`source_ids = tokens + [EOS]`, `target_ids = [BOS] + tokens`, `labels = tokens +
[EOS]`, padded with `PAD_ID` to the bucket boundary; pairs longer than `max_length`
dropped).
"""

import numpy as np
import tensorflow as tf

from keras_transformer.data.pipeline import check_bucket_boundaries, default_bucket_boundaries
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.layers.checks import check_positive_int

_TOKENIZE_CHUNK = 20_000


class BatchPlan:
    """A corpus tokenized once, and its batches planned per epoch (see the module docstring).

    Args:
        pairs: `(source, target)` sentence pairs.
        tokenizer: the `Tokenizer` for both languages.
        batch_tokens: upper bound on `batch_size * padded_length` of each batch, source
            and target each (per replica).
        max_length: longest allowed sequence, BOS/EOS included.
        bucket_boundaries: increasing padded lengths (default:
            `data.default_bucket_boundaries`).
        seed: the shuffle seed; epoch `e` is shuffled with `(seed, e)`.
        interrupted: optional function of no arguments, checked between tokenization
            chunks; when it returns True, planning stops with `InterruptedError`.

    Raises:
        ValueError: no pairs, no pair short enough, or a bad argument (named).

    Example:

    >>> from keras_transformer.data import Tokenizer, builtin_task
    >>> plan = BatchPlan(builtin_task("train"), Tokenizer("runs/builtin_tiny/spm.model"),
    ...                  batch_tokens=1024, max_length=48)
    >>> plan.batches_per_epoch, plan.pairs_per_epoch, plan.examples
    (284, 19837, 20000)
    >>> inputs, labels = next(iter(plan.dataset(start=0)))
    >>> inputs["source_ids"].shape
    TensorShape([42, 24])
    """

    def __init__(
        self,
        pairs,
        tokenizer,
        *,
        batch_tokens,
        max_length=128,
        bucket_boundaries=None,
        seed=0,
        interrupted=None,
    ):
        check_positive_int("batch_tokens", batch_tokens)
        if batch_tokens < max_length:
            raise ValueError(
                f"batch_tokens={batch_tokens} is smaller than max_length={max_length}; "
                f"a batch must hold at least one sequence of max_length tokens"
            )
        if len(pairs) == 0:
            raise ValueError("BatchPlan got no sentence pairs")
        self.seed = seed
        self.boundaries = np.asarray(
            default_bucket_boundaries(max_length)
            if bucket_boundaries is None
            else check_bucket_boundaries(bucket_boundaries, max_length),
            np.int64,
        )
        self.batch_sizes = batch_tokens // self.boundaries
        sources = self._tokenize([source for source, _ in pairs], tokenizer.tokenize, interrupted)
        targets = self._tokenize(
            [target for _, target in pairs], tokenizer.tokenize_target, interrupted
        )
        source_lengths = np.diff(sources[1]) + 1  # + EOS
        target_lengths = np.diff(targets[1]) + 1  # + BOS (target_ids) or EOS (labels)
        keep = np.flatnonzero(np.maximum(source_lengths, target_lengths) <= max_length)
        if keep.size == 0:
            raise ValueError(f"No sentence pair fits max_length={max_length}")
        self._sources, self._targets, self._kept = sources, targets, keep
        lengths = np.maximum(source_lengths, target_lengths)[keep]
        self._buckets = np.searchsorted(self.boundaries, lengths, side="left")  # per kept pair
        counts = np.bincount(self._buckets, minlength=len(self.boundaries))
        full = counts // self.batch_sizes  # a bucket that fills batches gives only full ones
        self.batches_per_epoch = int(np.sum(np.where(full > 0, full, counts > 0)))
        self.pairs_per_epoch = int(np.sum(np.where(full > 0, full * self.batch_sizes, counts)))
        self._cached_epoch = None

    @staticmethod
    def _tokenize(strings, tokenize, interrupted):
        """`(flat ids, row offsets)` of every string, split by `tokenize`."""
        flat, lengths = [], []
        for start in range(0, len(strings), _TOKENIZE_CHUNK):
            if interrupted is not None and interrupted():
                raise InterruptedError("Interrupted while tokenizing the training data")
            ragged = tokenize(tf.constant(strings[start : start + _TOKENIZE_CHUNK]))
            flat.append(ragged.flat_values.numpy())
            lengths.append(ragged.row_lengths().numpy())
        offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64)
        return np.concatenate(flat).astype(np.int32), offsets

    @property
    def examples(self):
        """Pairs that fit `max_length` (an epoch delivers `pairs_per_epoch` of them)."""
        return int(self._kept.size)

    def epoch_batches(self, epoch):
        """The planned batches of `epoch`, in order: each an array of pair indices (into `pairs`)."""
        if self._cached_epoch is not None and self._cached_epoch[0] == epoch:
            return self._cached_epoch[1]
        order = np.random.default_rng([self.seed, epoch]).permutation(
            self.examples
        )  # positions into kept
        buckets = self._buckets[order]
        batches, keys = [], []
        for bucket, size in enumerate(self.batch_sizes):
            where = np.flatnonzero(buckets == bucket)  # positions in this epoch's order
            if where.size >= size:
                where = where[: where.size - where.size % size]  # the leftovers wait
            for first in range(0, where.size, size):
                chunk = where[first : first + size]
                batches.append(self._kept[order[chunk]])
                # A full batch is emitted at its last pair; a small bucket's one at the epoch's end.
                keys.append(chunk[-1] if chunk.size == size else self.examples + bucket)
        plan = [batches[i] for i in np.argsort(keys, kind="stable")]
        self._cached_epoch = (epoch, plan)
        return plan

    def examples_before(self, batches_drawn):
        """Pairs delivered by the first `batches_drawn` global batches (the position counted in examples)."""
        epoch, offset = divmod(batches_drawn, self.batches_per_epoch)
        return epoch * self.pairs_per_epoch + int(
            sum(b.size for b in self.epoch_batches(epoch)[:offset])
        )

    def batch(self, global_index):
        """Global batch `global_index` as padded numpy `(source_ids, target_ids, labels)`."""
        epoch, offset = divmod(global_index, self.batches_per_epoch)
        pairs = self.epoch_batches(epoch)[offset]
        length = int(self.boundaries[self._buckets_of(pairs).max()])
        source = np.full((pairs.size, length), PAD_ID, np.int32)
        target = np.full((pairs.size, length), PAD_ID, np.int32)
        labels = np.full((pairs.size, length), PAD_ID, np.int32)
        (source_ids, source_offsets), (target_ids, target_offsets) = self._sources, self._targets
        for row, pair in enumerate(pairs):
            tokens = source_ids[source_offsets[pair] : source_offsets[pair + 1]]
            source[row, : tokens.size] = tokens
            source[row, tokens.size] = EOS_ID
            tokens = target_ids[target_offsets[pair] : target_offsets[pair + 1]]
            target[row, 0] = BOS_ID
            target[row, 1 : tokens.size + 1] = tokens
            labels[row, : tokens.size] = tokens
            labels[row, tokens.size] = EOS_ID
        return source, target, labels

    def _buckets_of(self, pairs):
        return self._buckets[np.searchsorted(self._kept, pairs)]

    def global_indices(self, start, num_pipelines=1, pipeline_id=0, replicas_per_pipeline=1):
        """The global batch indices one input pipeline delivers from position `start`, forever."""
        width = num_pipelines * replicas_per_pipeline
        k = 0
        while True:
            yield (
                start
                + (k // replicas_per_pipeline) * width
                + pipeline_id * replicas_per_pipeline
                + k % replicas_per_pipeline
            )
            k += 1

    def dataset(self, start=0, input_context=None):
        """The batches from global position `start` on, for one input pipeline, repeating epochs forever."""
        if input_context is None:
            layout = (1, 0, 1)
        else:
            layout = (
                input_context.num_input_pipelines,
                input_context.input_pipeline_id,
                max(input_context.num_replicas_in_sync // input_context.num_input_pipelines, 1),
            )

        def generate():
            for index in self.global_indices(start, *layout):
                yield self.batch(index)

        ids = tf.TensorSpec([None, None], tf.int32)
        dataset = tf.data.Dataset.from_generator(generate, output_signature=(ids, ids, ids))
        dataset = dataset.map(
            lambda source, target, labels: ({"source_ids": source, "target_ids": target}, labels)
        )
        return dataset.prefetch(tf.data.AUTOTUNE)

    def dataset_fn(self, batches_drawn):
        """`input_context -> dataset` starting at global position `batches_drawn` (for `Trainer.train`)."""
        return lambda input_context: self.dataset(batches_drawn, input_context)
