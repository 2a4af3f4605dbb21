"""Parsing as its own model: the Transformer with positions that count words (docs/parsing.md).

`ParsingConfig` adds two fields to `TransformerConfig`; `ParsingTransformer` builds from it and
owns what they need: the word-kind table (`layers.positional.WordIndex`, read from the run's
tokenizer), the word positions it gives the position encodings, and the word window on
encoder-decoder attention. It reaches the trainer and the searches only through the
Transformer's hooks (`read_tokenizer`, `source_inputs`, `prefix_inputs`); the core model and
its config know nothing of it. The parsing presets live here too: `ptb_sample` (word positions
and a word window of 0) and `ptb_wsj` (the paper's architecture: a plain `Transformer`).

Shape letters: B batch, S source length, T target length, D model width, V vocabulary size.
"""

import dataclasses

import numpy as np
from keras import ops

from keras_transformer.layers.checks import check_non_negative_int
from keras_transformer.layers.positional import WordIndex
from keras_transformer.models.config import TINY_ARCHITECTURE, TransformerConfig, register_preset
from keras_transformer.models.transformer import Transformer, register_model

# The word-position model's extra inputs of `decode` / `decode_step` (`Transformer.extra_inputs`).
TARGET_WORDS, SOURCE_WORDS = "word_positions", "source_word_positions"


@dataclasses.dataclass(frozen=True)
class ParsingConfig(TransformerConfig):
    """A `TransformerConfig` with word positions, for parsing (linearized trees).

    Fields (besides the Transformer's):
        word_positions: half of each sinusoidal position vector encodes the token's
            position, half the index of the word it belongs to (source: the word of each
            piece; target: the number of POS tags so far, i.e. the word whose tag comes
            next), so that encoder-decoder attention can find the current word
            (`layers.positional.WordIndex`). Sinusoidal positions only. False: the
            Transformer's positions.
        word_window: with `word_positions`, encoder-decoder attention sees only the source
            pieces of the words at most this far from the current word (0: that word's
            pieces only; EOS counts as the word after the last); `None`: every piece.
    """

    word_positions: bool = False
    word_window: int | None = None

    architecture_fields = (*TransformerConfig.architecture_fields, "word_positions")

    def __post_init__(self):
        super().__post_init__()
        if self.word_window is not None:
            check_non_negative_int("word_window", self.word_window)
            if not self.word_positions:
                raise ValueError(
                    f"word_window needs word_positions=True. Received: word_window={self.word_window}"
                )
        if self.word_positions and (self.positional != "sinusoidal" or self.hidden_dim % 4):
            raise ValueError(
                "word_positions needs sinusoidal positions and a hidden_dim divisible by 4 (two sinusoid halves). "
                f"Received: positional={self.positional!r}, hidden_dim={self.hidden_dim}"
            )


register_preset(
    "ptb_sample",
    "Parsing recipe for the Penn Treebank sample on a 2-core CPU (docs/parsing.md): the tiny "
    "architecture with a 2,000-piece vocabulary and word positions (encoder-decoder attention on the "
    "current word only), P_drop 0.1, 3,200 updates at 0.3x the Noam rate decaying linearly, sequences up "
    "to 256; the WSJ search settings (beam 21, alpha 0.3, output up to input + 300)",
    dict(
        **{**TINY_ARCHITECTURE, "vocabulary_size": 2000, "max_length": 256},
        dropout=0.1,
        warmup_steps=320,
        learning_rate_scale=0.3,
        learning_rate_decay="linear",
        train_steps=3200,
        word_positions=True,
        word_window=0,
        beam_size=21,
        length_penalty=0.3,
        max_output_offset=300,
    ),
)
register_preset(
    "ptb_wsj",
    "Table 4, WSJ only: 4 + 4 layers, d_model 1024 (the base model's other settings), a 16K vocabulary; "
    "beam 21, alpha 0.3, output up to input + 300",
    dict(
        vocabulary_size=16000,
        num_encoder_layers=4,
        num_decoder_layers=4,
        hidden_dim=1024,
        max_length=1024,
        beam_size=21,
        length_penalty=0.3,
        max_output_offset=300,
    ),
)


def word_kinds(vocabulary):
    """The word-kind table of `ParsingTransformer.set_word_kinds` for a vocabulary: `(V,)`
    int32, `WordIndex.TAG` for the POS tags, `WORD_START` for the other pieces that start a
    word (`▁...`) and for EOS, `OTHER` for the rest.

    Args:
        vocabulary: a run's `data.Tokenizer` (with the tree symbols), or its
            `decoding.TreeConstraint`.
    """
    from keras_transformer.data.tokenizer import EOS_ID
    from keras_transformer.decoding.tree_constraint import TAG, TreeConstraint

    constraint = (
        vocabulary
        if isinstance(vocabulary, TreeConstraint)
        else TreeConstraint.from_tokenizer(vocabulary)
    )
    kinds = np.where(constraint.word_starts, WordIndex.WORD_START, WordIndex.OTHER)
    kinds[constraint.kinds == TAG] = WordIndex.TAG
    kinds[EOS_ID] = WordIndex.WORD_START
    return kinds.astype(np.int32)


@register_model
class ParsingTransformer(Transformer):
    """The Transformer of a `ParsingConfig`: with `word_positions`, the positions count words.

    Its word-kind table (`WordIndex`, a non-trainable weight saved with the checkpoints) is
    read from the run's tokenizer before training (`read_tokenizer`); its extra inputs are
    the words of the target prefix (`prefix_inputs`: `word_positions`, which `decode_step`
    takes) and, with a `word_window`, the source's (`source_inputs`:
    `source_word_positions`, which `decode` and `decode_step` take). Without
    `word_positions` it is the Transformer.

    Example:

    >>> import numpy as np
    >>> from keras_transformer.models import build_model, get_preset
    >>> model = build_model(get_preset("ptb_sample", vocabulary_size=8, num_encoder_layers=1,
    ...                                num_decoder_layers=1))
    >>> model.set_word_kinds([0, 0, 0, 1, 1, 2, 0, 0])  # EOS and id 4 start words, 5 is a tag
    >>> sorted(model.source_inputs(np.array([[4, 4, 3]])))
    ['source_word_positions']
    """

    config_class = ParsingConfig
    reads_tokenizer = True
    extra_inputs = (TARGET_WORDS, SOURCE_WORDS)

    def _build_extra_layers(self, config):
        # The table of which pieces start words and which are tags (`set_word_kinds`).
        self.word_index = (
            WordIndex(config.vocabulary_size, name="word_index") if config.word_positions else None
        )
        # A word window masks encoder-decoder attention per hypothesis (each has its own
        # current word), so beam copies cannot share one row of cross keys/values and mask.
        self.supports_shared_cross_cache = config.word_window is None

    # --- the word-kind table ---

    @property
    def uses_word_positions(self):
        """Whether positions count words (`config.word_positions`): `decode_step` then needs
        `word_positions` (see `target_word_positions`)."""
        return self.word_index is not None

    @property
    def uses_word_window(self):
        """Whether encoder-decoder attention is limited to the current word's neighbours
        (`config.word_window`): `decode` and `decode_step` then need `source_word_positions`."""
        return self.config.word_window is not None

    def read_tokenizer(self, tokenizer):
        """Set the word-kind table from the run's tokenizer (`word_kinds`)."""
        if self.uses_word_positions:
            self.set_word_kinds(word_kinds(tokenizer))

    def set_word_kinds(self, kinds):
        """Set the `word_positions` table: `(V,)` kinds, `layers.WordIndex.OTHER`, `WORD_START`
        or `TAG` per id (`word_kinds(tokenizer)`)."""
        if self.word_index is None:
            raise ValueError("set_word_kinds needs a model with word_positions=True")
        self.word_index.set_kinds(kinds)

    def target_word_positions(self, target_ids):
        """int `(B, T)`: the word index of each decoder input (`layers.positional.WordIndex.target`)."""
        return self.word_index.target(ops.convert_to_tensor(target_ids, "int32"))

    def source_word_positions(self, source_ids):
        """int `(B, S)`: the word index of each source piece (`layers.positional.WordIndex.source`)."""
        return self.word_index.source(ops.convert_to_tensor(source_ids, "int32"))

    # --- the Transformer's hooks ---

    def source_inputs(self, source_ids):
        if not self.uses_word_window:
            return {}
        return {SOURCE_WORDS: self.source_word_positions(source_ids)}  # (B, S)

    def prefix_inputs(self, target_ids, index):
        if not self.uses_word_positions:
            return {}
        # The word index counts the tags of the whole prefix; PAD after it counts nothing.
        words = self.target_word_positions(target_ids)  # (N, L + 1)
        return {TARGET_WORDS: ops.take(words, ops.convert_to_tensor(index)[None], axis=1)}

    def _target_inputs(self, target_ids, inputs):
        if not self.uses_word_positions or TARGET_WORDS in inputs:
            return inputs
        return {**inputs, TARGET_WORDS: self.word_index.target(target_ids)}

    def _source_positions(self, source_ids):
        if not self.uses_word_positions:
            return super()._source_positions(source_ids)
        words = self.word_index.source(source_ids)  # (B, S)
        return lambda embedded: self.source_position(embedded, word_positions=words)

    def _target_positions(self, start_index, inputs):
        if not self.uses_word_positions:
            return super()._target_positions(start_index, inputs)
        return lambda embedded: self.target_position(
            embedded, start_index=start_index, word_positions=inputs[TARGET_WORDS]
        )

    def _encoder_attention_mask(self, inputs):
        """bool `(B, T, S)`: the source pieces within `word_window` words of each query's word."""
        if not self.uses_word_window:
            return None
        source_words, target_words = inputs[SOURCE_WORDS], inputs[TARGET_WORDS]
        distance = ops.abs(ops.expand_dims(source_words, 1) - ops.expand_dims(target_words, 2))
        return ops.less_equal(distance, self.config.word_window)

    # --- the views, with the word inputs checked ---

    def decode(self, target_ids, encoder_outputs, source_padding_mask, **kwargs):
        """`Transformer.decode`; with a `word_window` (and only then) it takes
        `source_word_positions`, int `(B, S)` from `source_word_positions(source_ids)`."""
        self._check_source_words(kwargs.get(SOURCE_WORDS), "decode")
        return super().decode(target_ids, encoder_outputs, source_padding_mask, **kwargs)

    def decode_step(self, token_ids, cache, cache_index, source_padding_mask, **kwargs):
        """`Transformer.decode_step`, which then takes:

        * with `word_positions` (and only then) `word_positions`, int `(B, Q)`: the word index
          of each token, `target_word_positions` of the whole prefix at these positions (the
          tags before a token are not in the cache's tokens): `prefix_inputs`;
        * with a `word_window` (and only then) `source_word_positions`, int `(B, S)` from
          `source_word_positions(source_ids)`, one row per token row (a model with a word
          window shares no cross cache between beam copies): `source_inputs`.
        """
        word_positions = kwargs.get(TARGET_WORDS)
        if (word_positions is None) == self.uses_word_positions:
            raise ValueError(
                "decode_step takes word_positions exactly when the model has word_positions=True. "
                f"Received: word_positions={'None' if word_positions is None else 'a tensor'}, "
                f"config.word_positions={self.config.word_positions}"
            )
        self._check_source_words(kwargs.get(SOURCE_WORDS), "decode_step")
        if word_positions is not None:
            kwargs[TARGET_WORDS] = ops.convert_to_tensor(word_positions, "int32")
        return super().decode_step(token_ids, cache, cache_index, source_padding_mask, **kwargs)

    def _check_source_words(self, source_words, method):
        if (source_words is None) == self.uses_word_window:
            raise ValueError(
                f"{method} takes source_word_positions exactly when the model has a word_window. "
                f"Received: source_word_positions={'None' if source_words is None else 'a tensor'}, "
                f"config.word_window={self.config.word_window}"
            )
