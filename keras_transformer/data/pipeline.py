"""The `tf.data` input pipeline: sentence pairs to token-budget batches.

Data flow of `make_dataset`::

    (source, target) strings
      -> shard (one shard per input pipeline under tf.distribute)
      -> shuffle (seeded)
      -> tokenize in-graph with the Tokenizer
      -> source_ids = tokens + [EOS]; target_ids = [BOS] + tokens;
         labels = tokens + [EOS]
      -> drop pairs longer than max_length
      -> repeat (optional; each pass is shuffled anew)
      -> group by length bucket, pad to the bucket boundary and batch so that
         batch_size * boundary <= batch_tokens
      -> prefetch
"""

import numpy as np
import tensorflow as tf

from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.layers.checks import check_positive_int

DEFAULT_BUCKET_BOUNDARIES = (8, 12, 16, 24, 32, 48, 64, 96, 128)
"""Padded lengths used when `max_length` is 128; longer `max_length` values
continue the pattern (192, 256, 384, ...)."""

_TOKENIZE_BATCH = 512


def default_bucket_boundaries(max_length):
    """The default padded lengths for sequences of at most `max_length`.

    The boundaries grow by alternating factors 3/2 and 4/3 (8, 12, 16, 24, 32,
    ...), so no sequence is padded by more than half its length (beyond the
    first bucket), while the number of distinct batch shapes stays small. The
    list is clipped at `max_length`, which is always its last element.

    Args:
        max_length: longest sequence, BOS/EOS included.

    Returns:
        increasing boundaries ending with `max_length`.

    Example:
        >>> default_bucket_boundaries(40)
        [8, 12, 16, 24, 32, 40]
    """
    check_positive_int("max_length", max_length)
    boundaries = []
    value = DEFAULT_BUCKET_BOUNDARIES[0]
    while value < max_length:
        boundaries.append(value)
        value = value * 3 // 2 if value & (value - 1) == 0 else value * 4 // 3
    boundaries.append(max_length)
    return boundaries


def check_bucket_boundaries(boundaries, max_length):
    """`boundaries` as a list ending at `max_length`.

    Raises:
        ValueError: naming the boundaries, unless they are positive, strictly
            increasing and at most `max_length`.
    """
    boundaries = [int(b) for b in boundaries]
    if (
        not boundaries
        or any(b < 1 for b in boundaries)
        or any(a >= b for a, b in zip(boundaries, boundaries[1:]))
    ):
        raise ValueError(
            f"bucket_boundaries must be positive and strictly increasing. "
            f"Received: bucket_boundaries={list(boundaries)}"
        )
    if boundaries[-1] > max_length:
        raise ValueError(
            f"The largest bucket boundary {boundaries[-1]} exceeds max_length={max_length}"
        )
    if boundaries[-1] < max_length:
        boundaries.append(max_length)
    return boundaries


def make_dataset(
    pairs,
    tokenizer,
    *,
    batch_tokens,
    max_length=128,
    shuffle=True,
    seed=0,
    repeat=False,
    input_context=None,
    bucket_boundaries=None,
    drop_remainder=False,
    sampling_alpha=None,
):
    """Build a batched, length-bucketed training or evaluation dataset.

    Each element is `(inputs, labels)` with `inputs = {"source_ids": (B, S),
    "target_ids": (B, T)}` and `labels` of shape `(B, T)`, all `int32`
    and padded with `PAD_ID` (0)::

        source_ids = tokens(source) + [EOS]
        target_ids = [BOS] + tokens(target)      # decoder input (teacher forcing)
        labels     = tokens(target) + [EOS]      # target_ids shifted left by one

    Pairs whose `source_ids` or `labels` would be longer than
    `max_length` are dropped. The remaining examples are grouped by the
    bucket of `max(S, T)`: `S` and `T` are padded to that bucket's
    boundary `L` and a batch holds `batch_tokens // L` examples, so that
    `B * S <= batch_tokens` and `B * T <= batch_tokens` for every batch.

    Without `sampling_alpha` the sequence of batches is a deterministic
    function of the arguments; with `shuffle`, each pass over the data
    (each repetition, or each new iterator) is shuffled differently, but
    predictably from `seed`.

    Works with `tf.distribute`: pass it to
    `strategy.distribute_datasets_from_function(lambda ctx: make_dataset(...,
    input_context=ctx))`; each input pipeline then reads a disjoint shard of
    the pairs, and `batch_tokens` is the budget of one replica.

    Args:
        pairs: `(source, target)` sentence pairs.
        tokenizer: the `Tokenizer` for both languages.
        batch_tokens: upper bound on `batch_size * padded_length` of each
            batch, for source and target separately (per replica).
        max_length: longest allowed sequence, BOS/EOS included.
        shuffle: shuffle the pairs (with a buffer holding the whole shard).
        seed: shuffle seed.
        repeat: repeat indefinitely (for step-based training).
        input_context: the `tf.distribute.InputContext` of this input
            pipeline, to read only its shard.
        bucket_boundaries: increasing padded lengths; `max_length` is
            appended if missing. Defaults to
            `default_bucket_boundaries`.
        drop_remainder: drop the last, partial batch of each bucket (gives
            static batch sizes per bucket).
        sampling_alpha: if set, subword regularization: every pass over the
            data draws a new segmentation of each sentence, source and target,
            with `Tokenizer.sampler` and this `alpha` (in `(0, 1]`).
            The draws are not seeded, so batches are no longer a deterministic
            function of the arguments. For training data only.

    Returns:
        A `tf.data.Dataset` of `(inputs, labels)` batches, prefetched.

    Raises:
        ValueError: if `pairs` is empty, `batch_tokens < max_length`, or
            an argument is out of range.

    Example:
        >>> from keras_transformer.data import Tokenizer, builtin_task
        >>> tokenizer = Tokenizer("runs/builtin_tiny/spm.model")
        >>> dataset = make_dataset(builtin_task("train"), tokenizer,
        ...                        batch_tokens=4096, max_length=64)
        >>> inputs, labels = next(iter(dataset))
        >>> inputs["source_ids"].shape
        TensorShape([170, 24])
    """
    if max_length < 2:
        raise ValueError(
            f"max_length must be at least 2 (a token plus BOS/EOS). "
            f"Received: max_length={max_length}"
        )
    if batch_tokens < max_length:
        raise ValueError(
            f"batch_tokens={batch_tokens} is smaller than max_length={max_length}; "
            f"a batch must hold at least one sequence of max_length tokens"
        )
    if len(pairs) == 0:
        raise ValueError("make_dataset got no sentence pairs")
    if sampling_alpha is None:
        tokenize, tokenize_target = tokenizer.tokenize, tokenizer.tokenize_target
    else:
        tokenize = tokenizer.sampler(sampling_alpha)
        tokenize_target = tokenizer.sampler(sampling_alpha, target=True)
    boundaries = (
        default_bucket_boundaries(max_length)
        if bucket_boundaries is None
        else check_bucket_boundaries(bucket_boundaries, max_length)
    )
    batch_sizes = [batch_tokens // b for b in boundaries]

    sources = [source for source, _ in pairs]
    targets = [target for _, target in pairs]
    dataset = tf.data.Dataset.from_tensor_slices((sources, targets))
    if input_context is not None and input_context.num_input_pipelines > 1:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if shuffle:
        buffer_size = -(
            -len(pairs) // (input_context.num_input_pipelines if input_context is not None else 1)
        )
        dataset = dataset.shuffle(buffer_size, seed=seed, reshuffle_each_iteration=True)

    def encode(source, target):
        source_tokens = tokenize(source)
        target_tokens = tokenize_target(target)
        eos = tf.fill([source_tokens.nrows(), 1], EOS_ID)
        bos = tf.fill([target_tokens.nrows(), 1], BOS_ID)
        return (
            tf.concat([source_tokens, eos], axis=1),
            tf.concat([bos, target_tokens], axis=1),
            tf.concat([target_tokens, eos], axis=1),
        )

    # Tokenizing a batch at a time is much faster than one string at a time;
    # unbatch restores the element order. Unbatched rows of a ragged batch are
    # typed RaggedTensorSpec(ragged_rank=0), which padded_batch rejects; inside
    # a map they arrive as plain tensors, so the identity map below retypes them.
    dataset = (
        dataset.batch(_TOKENIZE_BATCH)
        .map(encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .unbatch()
        .map(lambda source_ids, target_ids, labels: (source_ids, target_ids, labels))
    )
    dataset = dataset.filter(
        lambda source_ids, target_ids, labels: tf.logical_and(
            tf.size(source_ids) <= max_length, tf.size(labels) <= max_length
        )
    )
    if repeat:
        # Repeating after the filter makes an all-filtered dataset end (and fail
        # the cardinality assertion) instead of searching forever.
        dataset = dataset.repeat().apply(
            tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY)
        )

    boundaries_tensor = tf.constant(boundaries, tf.int64)
    batch_sizes_tensor = tf.constant(batch_sizes, tf.int64)

    def bucket_of(source_ids, target_ids, labels):
        length = tf.cast(tf.maximum(tf.size(source_ids), tf.size(labels)), tf.int64)
        return tf.searchsorted(
            boundaries_tensor, length[tf.newaxis], side="left", out_type=tf.int64
        )[0]

    def batch_bucket(bucket, window):
        length = boundaries_tensor[bucket]
        padded = window.padded_batch(
            batch_sizes_tensor[bucket],
            padded_shapes=([length], [length], [length]),
            padding_values=(PAD_ID, PAD_ID, PAD_ID),
            drop_remainder=drop_remainder,
        )
        return padded.map(
            lambda source_ids, target_ids, labels: (
                {"source_ids": source_ids, "target_ids": target_ids},
                labels,
            )
        )

    dataset = dataset.group_by_window(
        key_func=bucket_of,
        reduce_func=batch_bucket,
        window_size_func=lambda bucket: batch_sizes_tensor[bucket],
    )
    return dataset.prefetch(tf.data.AUTOTUNE)


def padding_fraction(dataset, num_batches=None):
    """Fraction of positions that are padding, over source and target of all batches.

    `(pad positions in source_ids + pad positions in target_ids) / (all
    positions in source_ids + target_ids)`, counted over the first
    `num_batches` batches. It measures how much compute the bucketing
    wastes: 0.0 means no padding at all.

    Args:
        dataset: a dataset made by `make_dataset`.
        num_batches: batches to inspect; all of them when `None`.

    Returns:
        the padding fraction, in `[0, 1)`.

    Raises:
        ValueError: if `num_batches` is `None` for an infinite dataset,
            not positive, or the dataset yields no batch.

    Example:
        >>> from keras_transformer.data import Tokenizer, builtin_task
        >>> dataset = make_dataset(builtin_task("train"), Tokenizer("runs/builtin_tiny/spm.model"),
        ...                        batch_tokens=4096, max_length=64)
        >>> round(padding_fraction(dataset, num_batches=10), 3)
        0.354
    """
    if num_batches is None:
        if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise ValueError(
                "padding_fraction needs num_batches for an infinite (repeated) dataset"
            )
    else:
        check_positive_int("num_batches", num_batches)
        dataset = dataset.take(num_batches)
    padded = 0
    total = 0
    for inputs, _ in dataset:
        for key in ("source_ids", "target_ids"):
            ids = inputs[key].numpy()
            padded += int(np.count_nonzero(ids == PAD_ID))
            total += ids.size
    if total == 0:
        raise ValueError("padding_fraction got a dataset without batches")
    return padded / total
