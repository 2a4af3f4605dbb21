"""Batched constituency parsing with a run trained on `--dataset=ptb`.

A `Parser` is a `Translator` whose search carries the `TreeConstraint` (every output is a
linearized tree over the sentence's words) and whose outputs get their words back
(`data.trees.delinearize`): tokenized sentences in, one-line trees out, e.g.
`(TOP (S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays)) (. .)))`.
"""

from keras_transformer.data.trees import delinearize
from keras_transformer.decoding.translator import Translator, translate_in_batches
from keras_transformer.decoding.tree_constraint import TreeConstraint


LENGTH_FACTOR = 4
"""A sinusoidal model's longest source, in multiples of its `max_length` (see `Parser`)."""


def check_not_blank(sentences, name="input"):
    """Raise `ValueError` naming the first blank sentence (`"<name>, line 3: a blank line ..."`)."""
    for index, sentence in enumerate(sentences):
        if not sentence.strip():
            raise ValueError(f"{name}, line {index + 1}: a blank line (one tokenized sentence per line)")


class Parser:
    """Parses tokenized sentences (Penn Treebank tokens, space-separated) into one-line trees.

    Args:
        model: a `Transformer` trained on linearized trees (e.g. from `runs.load_run`).
        tokenizer: the run's tokenizer (it holds the tree symbols as whole pieces).
        method: "greedy" or "beam" ("sample" works too).
        batch_size: sentences decoded together (grouped by length).
        max_source_length: longest source in pieces, EOS included; `check` rejects longer
            sentences. Default: the model's `max_length` with learned positions; with
            sinusoids (no hard limit) `LENGTH_FACTOR` times that, sentences far longer than
            any trained on.
        **options: the search settings (`SearchOptions.kwargs()`: beam size, α, offset).

    Call arguments:
        sentences: a list of non-blank tokenized sentences.
        progress: optional `progress(done, total)` called after every batch.

    Returns:
        the trees as one-line strings, in input order.
    """

    def __init__(self, model, tokenizer, method="beam", batch_size=64, max_source_length=None, **options):
        config = model.config
        if max_source_length is None:
            max_source_length = config.max_length * (1 if config.positional == "learned" else LENGTH_FACTOR)
        self.constraint = TreeConstraint.from_tokenizer(tokenizer)
        self.translator = Translator(
            model, tokenizer, method, batch_size=batch_size, max_source_length=max_source_length,
            constraint=self.constraint, **options,
        )

    def check(self, sentences, name="input"):
        """Raise `ValueError` naming the first blank or over-long sentence (`"<name>, line 3: ..."`)."""
        sentences = list(sentences)
        check_not_blank(sentences, name)
        cut = self.translator.cut_sources(sentences)
        if cut:
            index, pieces = cut[0]
            limit = self.translator.max_source_length
            raise ValueError(f"{name}, line {index + 1}: {pieces} pieces, longer than the model's {limit - 1}")

    def linearized(self, sentences, progress=None):
        """The best linearized tree of each sentence (`(S (NP NNP ) ...`), and its score."""
        sentences = list(sentences)
        done = 0

        def batch(texts):
            nonlocal done
            outputs = self.translator.translate_batch(texts)
            done += len(texts)
            if progress is not None:
                progress(done, len(sentences))
            return outputs

        lengths = [len(sentence.split()) for sentence in sentences]
        return translate_in_batches(batch, sentences, self.translator.batch_size, lengths)

    def __call__(self, sentences, progress=None):
        sentences = list(sentences)
        self.check(sentences)
        targets, _ = self.linearized(sentences, progress)
        return [str(delinearize(target, sentence)) for target, sentence in zip(targets, sentences)]
