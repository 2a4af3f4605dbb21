"""`ParsingModule`: the exported parser, text in (tokenized sentences), one-line trees out.

A `TranslationModule` whose beam search carries the `TreeConstraint` and whose `translate`
and `translate_nbest` put the sentence's words back into the linearized trees in the graph,
so the SavedModel (and TF Serving) answers what `experiments/parse.py` prints:

* `translate(text)`: tf.string `(B,)` tokenized sentences -> `{"translation": (B,) trees
  such as "(TOP (S (NP (NNP Ms.) (NNP Haag)) ...))", "score": (B,)}`; `serving_default`.
* `translate_nbest(text)`: the `beam_size` best trees of each sentence.
* `translate_ids` and `score` work on linearized trees (`data.trees.linearize`), as trained.

A sentence's words are those of `data.trees.sentence_words`, split in the graph by
`sentence_words_in_graph` (the same rule: `str.split()`'s whitespace, `(`/`)` as
`-LRB-`/`-RRB-`), and the model reads them joined by single spaces, as `Parser` feeds them.
Where `parse.py` stops with one line naming the line, the SavedModel cannot: a sentence it
cannot parse over exactly its words gets the empty tree "": a blank text, one with a word that
the tokenizer does not keep as one word (`TreeConstraint.kept_words`; it is not decoded, score
0.0), and one longer than `max_source_length - 1` pieces (cut, as in translation, so its
tree would miss the last words).
"""

import functools
import re
import sys

import tensorflow as tf

from keras_transformer.data.trees import BRACKET_WORDS, CLOSE, OPEN_PREFIX, ROOT
from keras_transformer.decoding.text import valid_utf8
from keras_transformer.decoding.tree_constraint import TreeConstraint
from keras_transformer.export.translator import TEXT_SPEC, TranslationModule, _check_shape
from keras_transformer.runs import read_run_config


@functools.cache
def _separator_pattern():
    """An RE2 class of every character that `str.split()` splits at (`str.isspace()`), in runs."""
    separators = (code for code in range(sys.maxunicode + 1) if chr(code).isspace())
    return "[" + "".join(f"\\x{{{code:x}}}" for code in separators) + "]+"


def sentence_words_in_graph(text):
    """In-graph `data.trees.sentence_words`: tf.string `(B,)` -> the words, tf.string `(B, None)` ragged.

    Every whitespace character of `str.split()` becomes a space, the text is split at spaces
    (no empty word), and `(`/`)` in a word become `-LRB-`/`-RRB-`."""
    spaced = tf.strings.regex_replace(text, _separator_pattern(), " ")
    words = tf.strings.split(spaced)  # at ASCII whitespace, of which only " " is left
    flat = words.flat_values
    for bracket, name in BRACKET_WORDS.items():
        flat = tf.strings.regex_replace(flat, re.escape(bracket), name)
    return words.with_flat_values(flat)


def is_parsing_run(model_dir):
    """True for a run trained on `--dataset=ptb` (its targets are linearized trees)."""
    return read_run_config(model_dir)[1].get("data", {}).get("dataset") == "ptb"


def trees_from_targets(targets, sentences):
    """In-graph `str(data.trees.delinearize(target, sentence))`.

    Args:
        targets: tf.string `(B,)` linearized trees (`(S (NP NNP ) ... )`), "" for none.
        sentences: tf.string `(B,)` the sentences (`sentence_words_in_graph` splits them).

    Returns:
        tf.string `(B,)`: `(TOP ...)` one-line trees; "" where the target is "" or does not
        hold one tag per word (never a tree over other words than the sentence's).
    """
    symbols = tf.strings.split(targets)  # (B, None)
    words = sentence_words_in_graph(sentences)  # (B, None)
    dense_words = words.to_tensor(default_value="")  # (B, W)
    dense = symbols.to_tensor(default_value="")  # (B, T)
    closing = tf.equal(dense, CLOSE)
    opening = tf.strings.regex_full_match(dense, tf.constant(r"\(.+"))
    is_tag = tf.logical_not(closing | opening) & tf.not_equal(dense, "")
    tags = tf.reduce_sum(tf.cast(is_tag, tf.int32), axis=1)  # (B,)
    word_index = tf.maximum(tf.cumsum(tf.cast(is_tag, tf.int32), axis=1) - 1, 0)  # (B, T)
    word = tf.gather(
        dense_words,
        tf.minimum(word_index, tf.maximum(tf.shape(dense_words)[1] - 1, 0)),
        batch_dims=1,
    )
    preterminal = tf.strings.join([OPEN_PREFIX, dense, " ", word, CLOSE])
    text = tf.where(is_tag, preterminal, dense)
    first = tf.equal(tf.range(tf.shape(dense)[1]), 0)[None, :]
    separator = tf.where(closing | first, "", " ")
    pieces = tf.RaggedTensor.from_tensor(
        tf.strings.join([separator, text]), lengths=symbols.row_lengths()
    )
    joined = tf.strings.reduce_join(pieces, axis=1)
    whole = tf.not_equal(targets, "") & tf.equal(tags, tf.cast(words.row_lengths(), tf.int32))
    return tf.where(whole, tf.strings.join([f"{OPEN_PREFIX}{ROOT} ", joined, CLOSE]), "")


class ParsingModule(TranslationModule):
    """The exported parser (see the module docstring). Arguments as `TranslationModule`'s.

    Raises:
        ValueError: a static `max_output_length` below `max_source_length`: the tree of a
            sentence of `max_source_length - 1` words needs that many tokens.
    """

    def __init__(self, model, tokenizer, **settings):
        super().__init__(model, tokenizer, **settings)
        if self.static_buffer and self.max_output_length < self.max_source_length:
            raise ValueError(
                f"max_output_length={self.max_output_length} cannot hold the tree of a sentence of "
                f"max_source_length - 1 = {self.max_source_length - 1} words (one tag per word and EOS); "
                f"use at least {self.max_source_length}"
            )
        self.constraint = TreeConstraint.from_tokenizer(tokenizer)

    def sentences(self, text):
        """The text each sentence is parsed from: tf.string `(B,)` -> `(B,)`, its words
        (`sentence_words_in_graph`) joined by single spaces, "" for a sentence with a word that
        the tokenizer does not keep as one word."""
        words = sentence_words_in_graph(valid_utf8(text))  # (B, None)
        kept, _ = self.constraint.kept_words(self.tokenizer, words.flat_values)
        every_kept = tf.reduce_all(words.with_flat_values(kept), axis=1)  # (B,)
        return tf.where(every_kept, tf.strings.reduce_join(words, axis=1, separator=" "), "")

    @tf.function(input_signature=[TEXT_SPEC])
    def translate(self, text):
        """Parse tokenized sentences: tf.string `(B,)` -> `{"translation": trees (B,), "score": (B,)}`."""
        sentences = self.sentences(_check_shape(text, TEXT_SPEC))
        token_ids, scores = self._best(self.encode(sentences))  # (B, 1, L), (B, 1)
        trees = trees_from_targets(self.decode(token_ids[:, 0]), sentences)
        return {"translation": trees, "score": scores[:, 0]}

    @tf.function(input_signature=[TEXT_SPEC])
    def translate_nbest(self, text):
        """The `beam_size` best trees of each sentence: `{"translations": (B, K), "scores": (B, K)}`."""
        sentences = self.sentences(_check_shape(text, TEXT_SPEC))
        token_ids, scores = self._search(
            self.encode(sentences), num_return=self.beam_size
        )  # (B, K, L), (B, K)
        targets = self.decode_nbest(token_ids)  # (B, K)
        trees = trees_from_targets(tf.reshape(targets, [-1]), tf.repeat(sentences, self.beam_size))
        return {"translations": tf.reshape(trees, tf.shape(targets)), "scores": scores}
