"""Evaluate a parsing run (`--dataset=ptb`) on a treebank split with EVALB's figures."""

import dataclasses
import time

from keras_transformer.data.trees import delinearize
from keras_transformer.evaluation.evalb import EvalbParams, evalb


@dataclasses.dataclass(frozen=True)
class ParsingResult:
    """The parses of a split, their EVALB result (`evalb.EvalbResult`) and the time taken."""

    trees: list
    evalb: object
    seconds: float
    settings: dict

    @property
    def sentences_per_second(self):
        return len(self.trees) / self.seconds if self.seconds else float("inf")


def gold_trees(pairs):
    """The cleaned gold trees of `(words, linearized tree)` pairs, one line each."""
    return [str(delinearize(target, words)) for words, target in pairs]


def evaluate_parser(parse, pairs, params=EvalbParams(), output=None, settings=None, progress=None):
    """Parse the words of `pairs` with `parse(sentences) -> trees` and score them against their trees.

    Args:
        parse: e.g. a `decoding.Parser`.
        pairs: `(words, linearized tree)` pairs (`data.sources.load_pairs("ptb", ...)`).
        params: EVALB's settings (default `COLLINS.prm`'s).
        output: write the parses there, one line each (after parsing: nothing half-written).
        progress: optional `progress(done, total)`, passed on to `parse` (as a keyword) to be
            called after every batch.
    """
    sentences = [words for words, _ in pairs]
    start = time.perf_counter()
    trees = parse(sentences) if progress is None else parse(sentences, progress=progress)
    seconds = time.perf_counter() - start
    if output:
        from keras_transformer.evaluation.evaluate import write_lines

        write_lines(output, trees)
    return ParsingResult(
        trees, evalb(gold_trees(pairs), trees, params), seconds, dict(settings or {})
    )


def evaluate_parsing_run(
    model_dir,
    pairs,
    method="beam",
    checkpoint=None,
    average_last=None,
    batch_size=64,
    output=None,
    params=EvalbParams(),
    ensemble=(),
    progress=None,
    **options,
):
    """`evaluate_parser` with the `Parser` of a run directory (search settings as `Parser`'s),
    or of an ensemble of it and the runs `ensemble` (`runs.load_ensemble`); `progress` as
    `evaluate_parser`'s."""
    from keras_transformer.decoding.parser import Parser
    from keras_transformer.runs import load_ensemble

    model, tokenizer, _ = load_ensemble([model_dir, *ensemble], checkpoint, average_last)
    parser = Parser(model, tokenizer, method, batch_size=batch_size, **options)
    settings = {
        "method": method,
        **options,
        **({"ensemble": ",".join(map(str, ensemble))} if ensemble else {}),
    }
    return evaluate_parser(parser, pairs, params, output, settings=settings, progress=progress)
