"""`TreeConstraint`: every output of a search is a linearized tree over the source's words.

Shape letters: B batch, S source length, N hypotheses (B for greedy, B * K for beam),
L output buffer length, V vocabulary size.

Targets are linearized trees (`data.trees.linearize`): `(LABEL` opens a constituent, `)`
closes one, a POS tag stands for the next word. The constraint is a mask over the
vocabulary, computed at every step from a small state of each hypothesis, read off its
prefix: the open-bracket depth `d`, the tags emitted `t`, the source's word count `n`, whether
the last symbol opened a bracket, and the slots left before the length limit. A symbol is
allowed when:

* `(LABEL`: `t < n` (a constituent needs a word) and the slots left still hold the
  `n - t` tags, the `d + 1` closing brackets and EOS;
* a tag: `t < n` and the slots left still hold the rest (`n - t - 1` tags, `d` brackets, EOS);
* `)`: `d > 0` and the last symbol is not `(LABEL` (no empty constituent);
* EOS: `d == 0` and `t == n`;
* anything else (source words, other pieces): never.

So a hypothesis never closes a bracket it did not open, emits exactly `n` tags, and can always
end within its limit (when the limit allows `n + 1` tokens, as `source length + offset`
does: a source has at least one piece per word plus EOS). The searches apply the mask
through one hook (`constraint=`); without it they are unchanged. Written in `keras.ops`: it
runs wherever the searches run (every Keras backend).

The word count comes from the source pieces: a SentencePiece piece that starts with `▁`
starts a word, so `n` = the number of such pieces (and the parsing model's
`layers.WordIndex`, through `models.parsing.word_kinds`, numbers the words by the same
pieces). For that to be the count of the
sentence's words (`data.trees.sentence_words`), the tokenizer must keep each word as one:
its pieces start with the one piece that starts a word and hold no other. It does not for a
word that its normaliser deletes (U+200B, U+FFFD, control characters) or splits (one
holding `▁` or a zero-width space); `kept_words` finds them, and `decoding.Parser` rejects
such a line before parsing (the export gives it the empty tree).
"""

import numpy as np
from keras import ops

from keras_transformer.data.tokenizer import EOS_ID, WORD_START
from keras_transformer.data.trees import CLOSE, OPEN_PREFIX

OTHER, OPEN, CLOSING, TAG, END = range(5)
"""The kinds of target symbol (`TreeConstraint.kinds`)."""


class TreeConstraint:
    """The tree mask of a vocabulary: which ids open, close, tag or end.

    Args:
        kinds: `(V,)` ints, one of `OTHER`, `OPEN`, `CLOSING`, `TAG`, `END` per id.
        word_starts: `(V,)` bools, True for the pieces that start a source word.

    Example:

    >>> constraint = TreeConstraint(kinds=[0, 0, 0, 4, 1, 2, 3], word_starts=[0, 0, 0, 0, 1, 1, 1])
    >>> words = constraint.source_words([[6, 6, 3]])  # two words
    >>> allowed = constraint.allowed([[2, 4, 0, 0]], index=1, words=words, limits=[9])  # after "(S"
    >>> ops.convert_to_numpy(allowed).astype(int).tolist()  # another "(X" or a tag, no ")" or EOS yet
    [[0, 0, 0, 0, 1, 0, 1]]
    """

    def __init__(self, kinds, word_starts):
        kinds = np.asarray(kinds, np.int32)
        word_starts = np.asarray(word_starts, bool)
        if kinds.shape != word_starts.shape or kinds.ndim != 1:
            raise ValueError(
                f"kinds and word_starts must be (V,) arrays. Received: {kinds.shape}, {word_starts.shape}"
            )
        for kind, name in (
            (OPEN, "opening bracket"),
            (CLOSING, "closing bracket"),
            (TAG, "tag"),
            (END, "EOS"),
        ):
            if not (kinds == kind).any():
                raise ValueError(
                    f"The vocabulary has no {name} symbol; train its tokenizer with the tree symbols"
                )
        self.kinds = kinds  # (V,) numpy; a constant of the backend where used
        self.word_starts = word_starts  # (V,) numpy

    @classmethod
    def from_tokenizer(cls, tokenizer):
        """The constraint of a run's tokenizer: its user-defined pieces `▁(LABEL`, `▁)` and `▁TAG`
        (`train_sentencepiece(whole_words=data.trees.tree_symbols(...))`) and `</s>`."""
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(tokenizer.model_proto)
        kinds, word_starts = [], []
        for index, piece in enumerate(proto.pieces):
            text = piece.piece
            if index == EOS_ID:
                kind = END
            elif piece.type != piece.USER_DEFINED or not text.startswith(WORD_START):
                kind = OTHER
            elif text == WORD_START + CLOSE:
                kind = CLOSING
            elif text.startswith(WORD_START + OPEN_PREFIX) and len(text) > 2:
                kind = OPEN
            else:
                kind = TAG
            kinds.append(kind)
            word_starts.append(text.startswith(WORD_START))
        return cls(kinds, word_starts)

    def source_words(self, source_ids):
        """The number of words of each source: int32 `(B,)` from `(B, S)` piece ids."""
        starts = ops.take(
            ops.convert_to_tensor(self.word_starts.astype(np.int32)),
            ops.cast(source_ids, "int32"),
            axis=0,
        )
        return ops.sum(starts, axis=1)  # (B,)

    def kept_words(self, tokenizer, words):
        """Whether `tokenizer` keeps each word as one word: `(kept, starts)`, bool and int32 `(N,)`.

        Args:
            tokenizer: the run's `data.Tokenizer` (this constraint's vocabulary).
            words: tf.string `(N,)` (or a list of `str`), single words (`data.trees.sentence_words`).

        Returns:
            `starts`: the number of pieces of each word that start a word (`source_words` counts
            them); `kept`: `starts == 1` and the first piece is that one. TensorFlow ops, the same
            eagerly (`decoding.Parser.check`) and in the exported graph.
        """
        import tensorflow as tf

        ids = tokenizer.tokenize(tf.convert_to_tensor(words, tf.string))  # (N, None) ragged
        is_start = tf.gather(tf.constant(self.word_starts.astype(np.int32)), ids)  # (N, None)
        starts = tf.reduce_sum(is_start, axis=1)  # (N,)
        first = tf.reduce_sum(is_start[:, :1], axis=1)  # (N,) 1 when the first piece starts a word
        return tf.equal(starts, 1) & tf.equal(first, 1), starts

    def allowed(self, prefix_ids, index, words, limits):
        """Which ids may come next: bool `(N, V)`.

        Args:
            prefix_ids: int `(N, L + 1)`: BOS, the `index` tokens so far, PAD after them.
            index: the step (the number of tokens so far).
            words: int `(N,)`, each hypothesis's source word count.
            limits: int `(N,)`, each hypothesis's length limit (tokens, EOS included).
        """
        prefix_ids = ops.convert_to_tensor(prefix_ids, "int32")
        kind_of_id = ops.convert_to_tensor(self.kinds)  # (V,)
        kinds = ops.take(kind_of_id, prefix_ids, axis=0)  # (N, L + 1); BOS and PAD are OTHER
        depth = ops.sum(
            ops.cast(ops.equal(kinds, OPEN), "int32")
            - ops.cast(ops.equal(kinds, CLOSING), "int32"),
            axis=1,
        )
        tags = ops.sum(ops.cast(ops.equal(kinds, TAG), "int32"), axis=1)  # (N,)
        index = ops.convert_to_tensor(index, "int32")
        last_opened = ops.equal(ops.take(kinds, index[None], axis=1)[:, 0], OPEN)  # (N,)
        words = ops.convert_to_tensor(words, "int32")
        slots_after = (
            ops.convert_to_tensor(limits, "int32") - index - 1
        )  # (N,) tokens left after this one
        words_left = words - tags
        may_open = (words_left > 0) & (words_left + depth + 2 <= slots_after)
        may_tag = (words_left > 0) & (words_left + depth <= slots_after)
        may_close = (depth > 0) & ops.logical_not(last_opened)
        may_end = ops.equal(depth, 0) & ops.equal(words_left, 0)
        by_kind = ops.stack(
            [ops.zeros_like(may_open), may_open, may_close, may_tag, may_end], axis=1
        )  # (N, 5)
        return ops.take(by_kind, kind_of_id, axis=1)  # (N, V)

    def apply(self, scores, prefix_ids, index, words, limits):
        """`scores` `(N, V)` with the ids that `allowed` forbids set to -inf."""
        allowed = self.allowed(prefix_ids, index, words, limits)
        return ops.where(allowed, scores, ops.cast(-np.inf, scores.dtype))
