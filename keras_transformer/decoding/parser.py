"""Batched constituency parsing with a run trained on `--dataset=ptb`.

A `Parser` is a `Translator` whose search carries the `TreeConstraint` (every output is a
linearized tree over the sentence's words) and whose outputs get their words back
(`data.trees.delinearize`): tokenized sentences in, one-line trees out, e.g.
`(TOP (S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays)) (. .)))`.

A sentence's words are `data.trees.sentence_words(sentence)` (whitespace-separated, `(` and
`)` written `-LRB-` and `-RRB-`): the model reads them joined by single spaces, the constraint
counts them, the tree holds them.
"""

from keras_transformer.data.trees import delinearize, sentence_words
from keras_transformer.decoding.translator import Translator, translate_in_batches
from keras_transformer.decoding.tree_constraint import TreeConstraint

LENGTH_FACTOR = 4
"""A sinusoidal model's longest source, in multiples of its `max_length` (see `Parser`)."""


def check_not_blank(sentences, name="input", first_line=1):
    """Raise `ValueError` naming the first blank sentence (`"<name>, line 3: a blank line ..."`;
    the sentences are lines `first_line`, `first_line + 1`, ... of `name`)."""
    for index, sentence in enumerate(sentences, start=first_line - 1):
        if not sentence.strip():
            raise ValueError(
                f"{name}, line {index + 1}: a blank line (one tokenized sentence per line)"
            )


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
        sentences: a list of non-blank tokenized sentences (`check` rejects the lines it cannot
            parse, naming the first).
        progress: optional `progress(done, total)` called after every batch.

    Returns:
        the trees as one-line strings, in input order.
    """

    def __init__(
        self, model, tokenizer, method="beam", batch_size=64, max_source_length=None, **options
    ):
        config = model.config
        if max_source_length is None:
            max_source_length = config.max_length * (
                1 if config.positional == "learned" else LENGTH_FACTOR
            )
        self.constraint = TreeConstraint.from_tokenizer(tokenizer)
        self.translator = Translator(
            model,
            tokenizer,
            method,
            batch_size=batch_size,
            max_source_length=max_source_length,
            constraint=self.constraint,
            **options,
        )

    def check(self, sentences, name="input", first_line=1):
        """Raise `ValueError` naming the first line that cannot be parsed (`"<name>, line 3: ..."`):
        a blank line, a word that the tokenizer does not keep as one word (so the model would not
        see the line's words; `TreeConstraint.kept_words`), a line longer than the model takes,
        or one with more words than a `max_length` output can hold (its tree needs one tag per
        word and EOS). The sentences are lines `first_line`, `first_line + 1`, ... of `name`."""
        sentences = list(sentences)
        check_not_blank(sentences, name, first_line)
        words = [sentence_words(sentence) for sentence in sentences]
        distinct = sorted({word for line in words for word in line})
        kept, starts = self.constraint.kept_words(self.translator.tokenizer, distinct)
        unkept = {
            word: int(count)
            for word, keep, count in zip(distinct, kept.numpy(), starts.numpy())
            if not keep
        }
        limit = self.translator.max_source_length
        pieces = (
            self.translator.tokenizer.tokenize([" ".join(line) for line in words])
            .row_lengths()
            .numpy()
        )
        max_length = self.translator.options.get("max_length")
        for index, line in enumerate(words):
            where = f"{name}, line {index + first_line}"
            for number, word in enumerate(line, start=1):
                if word in unkept:
                    count = unkept[word]
                    what = (
                        "deletes it"
                        if count == 0
                        else f"makes {count} words of it"
                        if count > 1
                        else "moves its start"
                    )
                    raise ValueError(
                        f"{where}: word {number}, {word!r}: the tokenizer's normalisation {what} "
                        "(the tree must hold the line's words one for one)"
                    )
            if pieces[index] > limit - 1:
                raise ValueError(
                    f"{where}: {pieces[index]} pieces, longer than the model's {limit - 1}"
                )
            if max_length is not None and len(line) + 1 > max_length:
                raise ValueError(
                    f"{where}: {len(line)} words, a tree of {len(line) + 1} tokens at least, "
                    f"longer than max_length={max_length}"
                )

    def sources(self, sentences):
        """The text the model reads for each sentence: its words (`data.trees.sentence_words`)
        joined by single spaces, e.g. `"He said -LRB- yes -RRB-"` for `"He said\t( yes )"`."""
        return [" ".join(sentence_words(sentence)) for sentence in sentences]

    def linearized(self, sentences, progress=None):
        """The best linearized tree of each sentence (`(S (NP NNP ) ...`), and its score."""
        texts = self.sources(sentences)
        return translate_in_batches(
            self.translator.translate_batch,
            texts,
            self.translator.batch_size,
            [len(text.split(" ")) for text in texts],
            progress=progress,
        )

    def nbest(self, sentences):
        """The trees of every hypothesis the search returns (`num_return` with beam search),
        best first, and their scores: `(trees, scores)`, a list of each per sentence."""
        sentences = list(sentences)
        self.check(sentences)
        texts = self.sources(sentences)
        targets, scores = self.translator.nbest(texts)
        trees = [
            [str(delinearize(target, sentence)) for target in hypotheses]
            for hypotheses, sentence in zip(targets, sentences)
        ]
        return trees, scores

    def __call__(self, sentences, progress=None):
        sentences = list(sentences)
        self.check(sentences)
        targets, _ = self.linearized(sentences, progress)
        return [str(delinearize(target, sentence)) for target, sentence in zip(targets, sentences)]
