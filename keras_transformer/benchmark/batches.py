"""Training batches for the benchmark: fixed-length padded batches, and real lengths of any batches."""

import numpy as np
import tensorflow as tf

from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def padded_batches(pairs, tokenizer, length, batch_size, count):
    """`count` batches of `batch_size` sentences, each side cut/padded to `length` tokens."""
    batches = []
    for start in range(0, count * batch_size, batch_size):
        chunk = [pairs[(start + i) % len(pairs)] for i in range(batch_size)]
        source = tokenizer.tokenize([s for s, _ in chunk])[:, : length - 1]
        target = tokenizer.tokenize([t for _, t in chunk])[:, : length - 1]
        eos = tf.fill([batch_size, 1], EOS_ID)
        bos = tf.fill([batch_size, 1], BOS_ID)
        source_ids = tf.concat([source, eos], 1).to_tensor(PAD_ID, shape=[batch_size, length])
        target_ids = tf.concat([bos, target], 1).to_tensor(PAD_ID, shape=[batch_size, length])
        labels = tf.concat([target, eos], 1).to_tensor(PAD_ID, shape=[batch_size, length])
        batches.append(({"source_ids": source_ids, "target_ids": target_ids}, labels))
    return batches


def real_lengths(batches):
    """Per-sentence real (non-padding) source and target lengths of `(inputs, labels)` batches
    (tensors or numpy arrays)."""
    source = np.concatenate(
        [np.sum(np.asarray(inputs["source_ids"]) != PAD_ID, 1) for inputs, _ in batches]
    )
    target = np.concatenate([np.sum(np.asarray(labels) != PAD_ID, 1) for _, labels in batches])
    return source, target
