"""A target-vocabulary shortlist for beam search: the output projection over the tokens a
batch can plausibly produce (CTranslate2's vocabulary map, `use_vmap`).

The output projection is a large share of a beam step's multiply-adds (D x V per token
against the decoder's layers; docs/decoding.md counts them at the base size), and the
log-softmax and top-k run over all V tokens. A `VocabularyMap` lists, for every source token,
the target tokens that most often occur with it in the training pairs (ranked by the Dice
coefficient 2 c(s, t) / (c(s) + c(t)) of sentence co-occurrence), and the target tokens that
are frequent anywhere. A batch's shortlist is the union over its source tokens, plus the
frequent ones, EOS, UNK, and PAD and BOS (the search bans those two after the softmax, as
over the full vocabulary, so both normalize over the same kind of set).

**This is an approximation.** The softmax is renormalized over the shortlist and a token
outside it can never be produced, so outputs may differ from the full-vocabulary search;
docs/results-log.md ("Row e at the base size") reports its BLEU and speed beside the exact
search's. With a shortlist that holds every token it is exact (tests/test_shortlist.py).

`ShortlistStep` is `CachedStep` with the shortlist in its state; `beam_search` maps the
positions it selects back to token ids (`output_ids`). TensorFlow only.

A model whose decoder has a vocabulary of its own (`TransformerConfig.target_vocabulary_size`,
an OPUS-MT import) gets a map whose rows are its source tokens and whose candidates are its
target tokens (`VocabularyMap.target_vocabulary_size`).
"""

import dataclasses

import numpy as np
import tensorflow as tf

from keras_transformer.backends import require_tensorflow
from keras_transformer.data.tokenizer import EOS_ID, UNK_ID
from keras_transformer.decoding.lengths import BANNED_IDS
from keras_transformer.decoding.steps import CachedStep

# The state key of the shortlist's token ids (sorted, int32 (S,)).
OUTPUT_IDS = "output_ids"
# In every shortlist.
ALWAYS_IDS = (EOS_ID, UNK_ID, *BANNED_IDS)


@dataclasses.dataclass(frozen=True)
class VocabularyMap:
    """Per source token, the target tokens it may lead to; and tokens always allowed.

    Attributes:
        candidates: int32 `(V, m)`: row `s` lists source token `s`'s candidates (target
            token ids), best first, padded with PAD (which never enters a shortlist).
        always: int32 `(F,)`: the frequent target tokens, candidates for every batch.
        target_vocabulary_size: the target vocabulary's size V_t (every candidate is below
            it); None: V, one vocabulary for both sides.
    """

    candidates: np.ndarray
    always: np.ndarray
    target_vocabulary_size: int | None = None

    def __post_init__(self):
        if self.target_vocabulary_size is None:
            object.__setattr__(self, "target_vocabulary_size", self.vocabulary_size)
        largest = max(
            (int(ids.max()) for ids in (self.candidates, self.always) if ids.size), default=0
        )
        if largest >= self.target_vocabulary_size:
            raise ValueError(
                "A vocabulary map's candidates must be target token ids. Received: candidate "
                f"{largest}, target_vocabulary_size={self.target_vocabulary_size}"
            )

    @property
    def vocabulary_size(self):
        """The source vocabulary's size V (the rows of `candidates`)."""
        return self.candidates.shape[0]

    @property
    def description(self):
        """E.g. "10 per source token + 300 frequent"."""
        return f"{self.candidates.shape[1]} per source token + {len(self.always)} frequent"

    @classmethod
    def every_token(cls, vocabulary_size, target_vocabulary_size=None):
        """The map whose every shortlist is the whole target vocabulary: a shortlisted search
        with it is the exact search (the reference the shortlist is checked against)."""
        target_vocabulary_size = target_vocabulary_size or vocabulary_size
        ids = np.arange(target_vocabulary_size, dtype=np.int32)
        return cls(
            np.tile(ids, (vocabulary_size, 1)), np.zeros(0, np.int32), target_vocabulary_size
        )

    @classmethod
    def build(
        cls, pairs, vocabulary_size, per_source=10, frequent=300, target_vocabulary_size=None
    ):
        """The map of tokenized `(source ids, target ids)` pairs (the training data).

        Args:
            pairs: iterable of `(source_ids, target_ids)` int sequences.
            vocabulary_size: V, the source vocabulary's size.
            per_source: m, candidates kept per source token (by Dice coefficient, then
                co-occurrence count).
            frequent: F, the most frequent target tokens, always candidates.
            target_vocabulary_size: V_t, the target vocabulary's size; None: V.
        """
        if per_source < 1 or frequent < 0:
            raise ValueError(
                f"per_source must be >= 1 and frequent >= 0. Received: per_source={per_source}, "
                f"frequent={frequent}"
            )
        target_vocabulary_size = target_vocabulary_size or vocabulary_size
        keys, source_count = [], np.zeros(vocabulary_size, np.int64)
        target_count, target_tokens = (
            np.zeros(target_vocabulary_size, np.int64),
            np.zeros(target_vocabulary_size, np.int64),
        )
        for source, target in pairs:
            source, target = np.asarray(source, np.int64), np.asarray(target, np.int64)
            unique_source, unique_target = np.unique(source), np.unique(target)
            source_count[unique_source] += 1
            target_count[unique_target] += 1
            np.add.at(target_tokens, target, 1)
            keys.append(
                (unique_source[:, None] * target_vocabulary_size + unique_target[None, :]).ravel()
            )
        keys, together = np.unique(
            np.concatenate(keys) if keys else np.zeros(0, np.int64), return_counts=True
        )
        sources, targets = keys // target_vocabulary_size, keys % target_vocabulary_size
        dice = 2.0 * together / (source_count[sources] + target_count[targets])
        allowed = ~np.isin(targets, BANNED_IDS)
        sources, targets, dice, together = (
            sources[allowed],
            targets[allowed],
            dice[allowed],
            together[allowed],
        )
        order = np.lexsort((targets, -together, -dice, sources))  # per source: best first
        sources, targets = sources[order], targets[order]
        starts = np.searchsorted(sources, sources, side="left")
        rank = np.arange(len(sources)) - starts
        keep = rank < per_source
        candidates = np.zeros((vocabulary_size, per_source), np.int32)  # PAD-padded
        candidates[sources[keep], rank[keep]] = targets[keep]
        by_frequency = [
            token for token in np.argsort(-target_tokens, kind="stable") if token not in BANNED_IDS
        ]
        return cls(
            candidates, np.asarray(by_frequency[:frequent], np.int32), target_vocabulary_size
        )

    def shortlist(self, source_ids):
        """The sorted token ids a batch may produce: int32 `(S,)` (numpy, for checks)."""
        allowed = np.zeros(self.target_vocabulary_size, bool)
        allowed[self.candidates[np.asarray(source_ids)].ravel()] = True
        allowed[self.always] = True
        allowed[list(ALWAYS_IDS)] = True
        return np.flatnonzero(allowed).astype(np.int32)

    def write_ctranslate2(self, path, pieces, target_pieces=None):
        """The same map as CTranslate2's `vmap` text file: `source<TAB>targets` per source
        token, and `<TAB>targets` for the tokens always allowed (`pieces`: the source tokens in
        id order; `target_pieces`: the target's, None: `pieces`, one vocabulary)."""
        target_pieces = pieces if target_pieces is None else target_pieces
        sizes = (len(pieces), len(target_pieces))
        if sizes != (self.vocabulary_size, self.target_vocabulary_size):
            raise ValueError(
                "The pieces and the vocabulary map have different vocabularies. Received: "
                f"{sizes[0]} source and {sizes[1]} target pieces, a map of "
                f"{self.vocabulary_size} rows and target_vocabulary_size="
                f"{self.target_vocabulary_size}"
            )
        with open(path, "w", encoding="utf-8") as vmap:
            vmap.write("\t" + " ".join(target_pieces[token] for token in self.always) + "\n")
            for source, row in enumerate(self.candidates):
                targets = [target_pieces[token] for token in row if token not in BANNED_IDS]
                if targets and source not in BANNED_IDS:
                    vmap.write(f"{pieces[source]}\t{' '.join(targets)}\n")


def run_vocabulary_map(model_dir, per_source=10, frequent=300):
    """`VocabularyMap.build` over a run's training pairs (its `config.json`'s data), tokenized
    with the run's tokenizer (`runs.run_tokenizer`)."""
    from keras_transformer.runs import load_run_pairs, run_tokenizer  # runs imports the model

    tokenizer = run_tokenizer(model_dir)
    pairs = load_run_pairs(model_dir, "train")
    sources = tokenizer.tokenize([source for source, _ in pairs]).to_list()
    targets = tokenizer.tokenize_target([target for _, target in pairs]).to_list()
    return VocabularyMap.build(
        zip(sources, targets),
        tokenizer.vocabulary_size,
        per_source,
        frequent,
        target_vocabulary_size=tokenizer.target_vocabulary_size,
    )


def batch_shortlist(candidates, always, source_ids, target_vocabulary_size):
    """`VocabularyMap.shortlist` in the graph: `candidates (V, m)`, `always (F,)`,
    `source_ids (B, S)`, the target vocabulary's size V_t -> sorted int32 `(S',)`."""
    ids = tf.concat(
        [tf.reshape(tf.gather(candidates, source_ids), [-1]), always, ALWAYS_IDS], axis=0
    )
    counts = tf.scatter_nd(ids[:, None], tf.ones_like(ids), [target_vocabulary_size])  # (V_t,)
    return tf.cast(tf.reshape(tf.where(counts > 0), [-1]), tf.int32)


class ShortlistStep(CachedStep):
    """`CachedStep` whose logits cover only the batch's shortlist (`state[OUTPUT_IDS]`).

    Args:
        model: a `Transformer` with a tied output projection (`decode_step(...,
            output_ids=...)`).
        vocabulary_map: a `VocabularyMap` of the model's vocabularies (its rows the source
            vocabulary, its candidates the decoder's, `config.decoder_vocabulary_size`).
    """

    def __init__(self, model, vocabulary_map):
        require_tensorflow("A vocabulary shortlist (decoding.shortlist.ShortlistStep)")
        super().__init__(model)
        config = model.config
        if (vocabulary_map.vocabulary_size, vocabulary_map.target_vocabulary_size) != (
            config.vocabulary_size,
            config.decoder_vocabulary_size,
        ):
            raise ValueError(
                "The vocabulary map and the model have different vocabularies. Received: a map "
                f"of {vocabulary_map.vocabulary_size} rows and target_vocabulary_size="
                f"{vocabulary_map.target_vocabulary_size}, model.config.vocabulary_size="
                f"{config.vocabulary_size} and decoder_vocabulary_size="
                f"{config.decoder_vocabulary_size}"
            )
        self.candidates = tf.constant(vocabulary_map.candidates, tf.int32)
        self.always = tf.constant(vocabulary_map.always, tf.int32)
        self.target_vocabulary_size = vocabulary_map.target_vocabulary_size

    def initialize(self, source_ids, buffer_size, num_copies=1):
        state = super().initialize(source_ids, buffer_size, num_copies)
        return {
            **state,
            OUTPUT_IDS: batch_shortlist(
                self.candidates, self.always, source_ids, self.target_vocabulary_size
            ),
        }

    def output_kwargs(self, state):
        return {"output_ids": state[OUTPUT_IDS]}

    def reorder(self, state, indices, sentences=None):
        return {**super().reorder(state, indices, sentences), OUTPUT_IDS: state[OUTPUT_IDS]}
