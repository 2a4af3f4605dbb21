"""The task's own score of a model while it trains (`TrainOptions.score_every`).

A `TaskScorer` decodes a fixed list of validation pairs with the model as it is now, with the
cached search of `decoding` (greedy by default), and scores the output with the measures the
evaluation scripts use: sacreBLEU's BLEU and chrF for translation (`evaluate_translator`),
EVALB's F1 and tagging accuracy for parsing (`evaluate_parser`). The search function is traced
once and reads the model's variables at every call, so each evaluation costs one decode.
"""

import dataclasses

from keras_transformer.decoding.options import SearchOptions

METRICS = {False: "bleu", True: "f1"}
"""The metric the best checkpoint and early stopping follow: BLEU for translation, EVALB's
bracketing F1 for parsing (both higher is better)."""


@dataclasses.dataclass(frozen=True)
class TaskScore:
    """One scored evaluation.

    Attributes:
        metric: the name of the score that decides (`METRICS`).
        values: every figure measured, by name (`bleu`, `chrf`; or `f1`, `tagging_accuracy`),
            `metric` among them.
        signature: how the figures were measured (sacreBLEU's signatures or EVALB's
            parameters, the search settings and the number of sentences): scores with
            different signatures are not compared.
        seconds: the time the decode took.
    """

    metric: str
    values: dict
    signature: str
    seconds: float

    @property
    def score(self):
        return self.values[self.metric]


class TaskScorer:
    """Scores a model on `pairs` with its task's measure.

    Args:
        tokenizer: the run's `data.Tokenizer`.
        pairs: `(source, reference)` pairs; for parsing `(words, linearized tree)` pairs.
        parsing: a parsing run (`--dataset=ptb`): EVALB's figures of `decoding.Parser`'s trees.
        search: a `SearchOptions` (default: greedy search with the config's offset).
        batch_size: sentences decoded together.
        tokenize: sacreBLEU's tokenizer (`evaluation.default_tokenize`).

    Call arguments:
        model: the `Transformer` to decode with (the same model at every call: the search is
            built at the first).

    Returns:
        a `TaskScore`.
    """

    def __init__(self, tokenizer, pairs, parsing=False, search=None, batch_size=64, tokenize="13a"):
        self.pairs = list(pairs)
        if not self.pairs:
            raise ValueError("No validation pairs to score")
        self.tokenizer = tokenizer
        self.parsing = parsing
        self.search = search or SearchOptions(method="greedy")
        self.batch_size = batch_size
        self.tokenize = tokenize
        self._decoder = None

    @classmethod
    def from_config(cls, config, tokenizer, pairs, search=None, **kwargs):
        """A scorer searching with `search` (a dict: "method", greedy by default, and
        `SearchOptions` overrides) over the search settings of the run's `config`
        (`SearchOptions.from_config`); `kwargs` as for the constructor."""
        search = dict(search or {"method": "greedy"})
        options = SearchOptions.from_config(config, search.pop("method", "greedy"), **search)
        return cls(tokenizer, pairs, search=options, **kwargs)

    @property
    def metric(self):
        return METRICS[self.parsing]

    def settings(self):
        """The search settings, as `method=greedy max_output_offset=50`."""
        return " ".join(
            f"{name}={value}"
            for name, value in {"method": self.search.method, **self.search.kwargs()}.items()
        )

    def _build(self, model):
        if self.parsing:
            from keras_transformer.decoding.parser import Parser

            return Parser(
                model,
                self.tokenizer,
                self.search.method,
                batch_size=self.batch_size,
                **self.search.kwargs(),
            )
        from keras_transformer.decoding.translator import Translator

        return Translator(
            model,
            self.tokenizer,
            self.search.method,
            batch_size=self.batch_size,
            **self.search.kwargs(),
        )

    def __call__(self, model):
        if self._decoder is None or self._decoder_model is not model:
            self._decoder, self._decoder_model = self._build(model), model
        where = f"{self.settings()}|sentences:{len(self.pairs)}"
        if self.parsing:
            from keras_transformer.evaluation.parsing import evaluate_parser

            result = evaluate_parser(self._decoder, self.pairs)
            summary = result.evalb.all
            values = {"f1": summary.f_measure, "tagging_accuracy": summary.tagging_accuracy}
            return TaskScore("f1", values, f"EVALB:COLLINS.prm|{where}", result.seconds)
        from keras_transformer.evaluation.evaluate import evaluate_translator

        result = evaluate_translator(self._decoder, self.pairs, tokenize=self.tokenize)
        scores = result.scores
        values = {"bleu": scores.bleu, "chrf": scores.chrf}
        signature = f"BLEU:{scores.bleu_signature}|chrF:{scores.chrf_signature}|{where}"
        return TaskScore("bleu", values, signature, result.seconds)
