"""Corpus BLEU and chrF through the `sacrebleu` library, with its signature strings.

The numbers are sacreBLEU's own (`sacrebleu.metrics.BLEU` and `CHRF`), computed on
detokenized text, so they are comparable with published sacreBLEU scores that carry the
same signature. The signature records every setting that changes the number, e.g.
`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0` for BLEU and
`nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0` for chrF; `lowercase=True`
shows as `case:lc`, the tokenizer as `tok:<name>`.

BLEU counts word n-grams up to 4, so a corpus of one-word sentences (such as the built-in
number-words task, whose German side is always one compound word) scores BLEU 0 even when
every translation is right; score such data with `tokenize="char"` (character n-grams)
and chrF.

Note that the paper's BLEU scores (28.4 / 41.8 on WMT14) were computed on tokenized text
with compound splitting (`multi-bleu.perl`); sacreBLEU's 13a scores on detokenized text
are usually somewhat lower.
"""

import dataclasses

from sacrebleu.metrics import BLEU, CHRF

TOKENIZERS = tuple(BLEU.TOKENIZERS)
"""BLEU tokenizers sacreBLEU knows: "13a" (default, WMT), "intl", "none", "char", "zh", ...
(`ja-mecab`, `ko-mecab`, `spm` and `flores*` need extra packages or downloads)."""


@dataclasses.dataclass(frozen=True)
class CorpusScores:
    """Corpus-level scores of a set of hypotheses.

    Attributes:
        bleu: corpus BLEU in [0, 100].
        chrf: corpus chrF (chrF2, character 6-grams) in [0, 100].
        bleu_signature: sacreBLEU's BLEU signature string.
        chrf_signature: sacreBLEU's chrF signature string.
        bleu_details: sacreBLEU's full BLEU line (n-gram precisions, brevity penalty,
            length ratio), e.g. `BLEU = 31.20 62.1/38.4/25.0/16.7 (BP = 1.000 ...)`.
        num_sentences: number of hypotheses scored.
        exact_match: fraction of hypotheses equal to (one of) their reference(s), after
            stripping surrounding whitespace (and lowercasing with `lowercase=True`).
    """

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    bleu_details: str
    num_sentences: int
    exact_match: float

    def format(self):
        """Two report lines: `BLEU = 31.20 <signature>` and `chrF2 = 55.10 <signature>`."""
        return f"BLEU = {self.bleu:.2f} {self.bleu_signature}\nchrF2 = {self.chrf:.2f} {self.chrf_signature}"

    def to_dict(self):
        return dataclasses.asdict(self)


def _reference_streams(hypotheses, references):
    """sacreBLEU's `[stream][sentence]` reference layout, checking the lengths.

    `references` is either one reference string per hypothesis, or a list of reference
    streams (each a list with one string per hypothesis) for multiple references.
    """
    hypotheses = list(hypotheses)
    if isinstance(references, str):
        raise ValueError(
            "references must be a list of strings (one per hypothesis), not a single string"
        )
    references = list(references)
    if references and not isinstance(references[0], str):
        streams = [list(stream) for stream in references]
    else:
        streams = [references]
    for stream in streams:
        if len(stream) != len(hypotheses):
            raise ValueError(
                "Every reference stream needs one reference per hypothesis. "
                f"Received: {len(hypotheses)} hypotheses, {len(stream)} references"
            )
    if not hypotheses:
        raise ValueError("No hypotheses to score")
    return hypotheses, streams


def _check_tokenize(tokenize):
    if tokenize not in BLEU.TOKENIZERS:
        raise ValueError(
            f"Unknown BLEU tokenizer {tokenize!r}. Valid tokenizers: {', '.join(TOKENIZERS)}"
        )


def corpus_bleu(hypotheses, references, lowercase=False, tokenize="13a"):
    """sacreBLEU corpus BLEU.

    Args:
        hypotheses: list of detokenized output strings.
        references: one reference string per hypothesis, or a list of reference streams.
        lowercase: compare case-insensitively (signature `case:lc`).
        tokenize: sacreBLEU tokenizer: "13a" (default), "intl", "none", "char", "zh", ...

    Returns:
        `(score, signature, details)`: the BLEU score in [0, 100], the signature string and
        sacreBLEU's full result line.

    Example:

    >>> score, signature, _ = corpus_bleu(["the cat sat on the mat"], ["the cat sat on the mat"])
    >>> round(score, 2), signature.split("|")[1]
    (100.0, 'case:mixed')
    """
    _check_tokenize(tokenize)
    hypotheses, streams = _reference_streams(hypotheses, references)
    metric = BLEU(lowercase=lowercase, tokenize=tokenize)
    result = metric.corpus_score(hypotheses, streams)
    return float(result.score), str(metric.get_signature()), str(result)


def corpus_chrf(hypotheses, references, lowercase=False):
    """sacreBLEU corpus chrF (chrF2: character 6-grams, beta 2).

    Returns:
        `(score, signature)`.

    Example:

    >>> score, signature = corpus_chrf(["Ein Hund rennt."], ["Ein Hund rennt."])
    >>> round(score, 2)
    100.0
    """
    hypotheses, streams = _reference_streams(hypotheses, references)
    metric = CHRF(lowercase=lowercase)
    result = metric.corpus_score(hypotheses, streams)
    return float(result.score), str(metric.get_signature())


def score_corpus(hypotheses, references, lowercase=False, tokenize="13a"):
    """BLEU and chrF of `hypotheses` against `references` (see `corpus_bleu`).

    Returns:
        a `CorpusScores`.

    Example:

    >>> scores = score_corpus(["zwei und zwanzig"], ["zweiundzwanzig"])
    >>> print(scores.format())  # doctest: +ELLIPSIS
    BLEU = 0.00 nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:...
    chrF2 = ... nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:...
    """
    hypotheses, streams = _reference_streams(hypotheses, references)
    bleu, bleu_signature, details = corpus_bleu(hypotheses, streams, lowercase, tokenize)
    chrf, chrf_signature = corpus_chrf(hypotheses, streams, lowercase)

    def normalize(text):
        text = text.strip()
        return text.lower() if lowercase else text

    matches = sum(
        any(normalize(hypothesis) == normalize(stream[i]) for stream in streams)
        for i, hypothesis in enumerate(hypotheses)
    )
    return CorpusScores(
        bleu,
        chrf,
        bleu_signature,
        chrf_signature,
        details,
        len(hypotheses),
        matches / len(hypotheses),
    )
