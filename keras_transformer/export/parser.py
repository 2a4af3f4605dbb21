"""`ParsingModule`: the exported parser, text in (tokenized sentences), one-line trees out.

A `TranslationModule` whose beam search carries the `TreeConstraint` and whose `translate`
and `translate_nbest` put the sentence's words back into the linearized trees in the graph,
so the SavedModel (and TF Serving) answers what `experiments/parse.py` prints:

* `translate(text)`: tf.string `(B,)` tokenized sentences -> `{"translation": (B,) trees
  such as "(TOP (S (NP (NNP Ms.) (NNP Haag)) ...))", "score": (B,)}`; `serving_default`.
* `translate_nbest(text)`: the `beam_size` best trees of each sentence.
* `translate_ids` and `score` work on linearized trees (`data.trees.linearize`), as trained.

Sentences longer than `max_source_length - 1` pieces are cut, as in translation (`parse.py`
rejects them instead); a blank text gets an empty tree "".
"""

import tensorflow as tf

from keras_transformer.data.trees import CLOSE, OPEN_PREFIX, ROOT
from keras_transformer.decoding.text import valid_utf8
from keras_transformer.decoding.tree_constraint import TreeConstraint
from keras_transformer.export.translator import TEXT_SPEC, TranslationModule, _check_shape
from keras_transformer.runs import read_run_config


def is_parsing_run(model_dir):
    """True for a run trained on `--dataset=ptb` (its targets are linearized trees)."""
    return read_run_config(model_dir)[1].get("data", {}).get("dataset") == "ptb"


def trees_from_targets(targets, sentences):
    """In-graph `str(data.trees.delinearize(target, sentence))` of well-formed targets.

    Args:
        targets: tf.string `(B,)` linearized trees (`(S (NP NNP ) ... )`), "" for none.
        sentences: tf.string `(B,)` the space-separated words.

    Returns:
        tf.string `(B,)`: `(TOP ...)` one-line trees, "" where the target is "".
    """
    symbols = tf.strings.split(targets)  # (B, None)
    words = tf.strings.split(sentences).to_tensor(default_value="")  # (B, W)
    dense = symbols.to_tensor(default_value="")  # (B, T)
    closing = tf.equal(dense, CLOSE)
    opening = tf.strings.regex_full_match(dense, tf.constant(r"\(.+"))
    is_tag = tf.logical_not(closing | opening) & tf.not_equal(dense, "")
    word_index = tf.maximum(tf.cumsum(tf.cast(is_tag, tf.int32), axis=1) - 1, 0)  # (B, T)
    word = tf.gather(words, tf.minimum(word_index, tf.maximum(tf.shape(words)[1] - 1, 0)), batch_dims=1)
    preterminal = tf.strings.join([OPEN_PREFIX, dense, " ", word, CLOSE])
    text = tf.where(is_tag, preterminal, dense)
    first = tf.equal(tf.range(tf.shape(dense)[1]), 0)[None, :]
    separator = tf.where(closing | first, "", " ")
    pieces = tf.RaggedTensor.from_tensor(tf.strings.join([separator, text]), lengths=symbols.row_lengths())
    joined = tf.strings.reduce_join(pieces, axis=1)
    return tf.where(tf.equal(targets, ""), "", tf.strings.join([f"{OPEN_PREFIX}{ROOT} ", joined, CLOSE]))


class ParsingModule(TranslationModule):
    """The exported parser (see the module docstring). Arguments as `TranslationModule`'s."""

    def __init__(self, model, tokenizer, **settings):
        super().__init__(model, tokenizer, **settings)
        self.constraint = TreeConstraint.from_tokenizer(tokenizer)

    @tf.function(input_signature=[TEXT_SPEC])
    def translate(self, text):
        """Parse tokenized sentences: tf.string `(B,)` -> `{"translation": trees (B,), "score": (B,)}`."""
        text = _check_shape(text, TEXT_SPEC)
        token_ids, scores = self._best(self.encode(text))  # (B, 1, L), (B, 1)
        trees = trees_from_targets(self.decode(token_ids[:, 0]), valid_utf8(text))
        return {"translation": trees, "score": scores[:, 0]}

    @tf.function(input_signature=[TEXT_SPEC])
    def translate_nbest(self, text):
        """The `beam_size` best trees of each sentence: `{"translations": (B, K), "scores": (B, K)}`."""
        text = _check_shape(text, TEXT_SPEC)
        token_ids, scores = self._search(self.encode(text), num_return=self.beam_size)  # (B, K, L), (B, K)
        targets = self.decode_nbest(token_ids)  # (B, K)
        sentences = tf.repeat(valid_utf8(text), self.beam_size)  # (B * K,)
        trees = trees_from_targets(tf.reshape(targets, [-1]), sentences)
        return {"translations": tf.reshape(trees, tf.shape(targets)), "scores": scores}
