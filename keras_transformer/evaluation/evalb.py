"""EVALB's bracket scores (Sekine & Collins 1997): the figures behind every published parsing F1.

`evalb(gold_lines, test_lines, params)` scores one-line trees sentence by sentence the way
the `evalb` C program does, and `format_report` prints its report (`.rsl`) with its own
labels, e.g. `Bracketing FMeasure       =  91.30`. The default parameters are those of
EVALB's `COLLINS.prm`, the standard setting of the parsing literature:

* `TOP` brackets are not counted; punctuation preterminals (`,` `:` ``` `` ``` `''` `.`) and
  empty elements (`-NONE-`) are deleted with their words before brackets are compared (which
  words: those the gold tree tags so, on both sides, as EVALB does);
* function tags and indices are ignored (`NP-SBJ-1` is `NP`);
* `ADVP` and `PRT` count as one label;
* a sentence's length (for the `len<=40` figures) counts every word but `-NONE-`.

Per sentence: a blank test (or gold) line is a **skip**; different words (after deletion,
`EQ_WORD` pairs being equal) or a different number of them are an **error**; both leave
the sentence out of the bracket figures. Brackets are labeled spans over the words left after
deletion, compared as multisets; a test bracket that overlaps a gold one without nesting is
a crossing bracket.
"""

import dataclasses
from pathlib import Path

from keras_transformer.data.trees import TreeError, read_trees, strip_function_tags  # EVALB strips labels alike

SUMMARY_LABELS = (
    "Number of sentence", "Number of Error sentence", "Number of Skip  sentence", "Number of Valid sentence",
    "Bracketing Recall", "Bracketing Precision", "Bracketing FMeasure", "Complete match", "Average crossing",
    "No crossing", "2 or less crossing", "Tagging accuracy",
)
"""The labels of EVALB's summary, in its order (the spacing is EVALB's)."""


@dataclasses.dataclass(frozen=True)
class EvalbParams:
    """The settings of an EVALB parameter file (`.prm`); the defaults are `COLLINS.prm`'s."""

    labeled: bool = True
    cutoff_len: int = 40
    max_error: int = 10
    delete_labels: tuple = ("TOP", "-NONE-", ",", ":", "``", "''", ".")
    delete_labels_for_length: tuple = ("-NONE-",)
    eq_labels: tuple = (("ADVP", "PRT"),)
    eq_words: tuple = ()

    @classmethod
    def from_file(cls, path):
        """Read an EVALB `.prm` file (`DEBUG` is accepted and ignored).

        Raises:
            ValueError: `"<path>:<line>: ..."` for a line EVALB would not read.
        """
        settings = {"delete_labels": [], "delete_labels_for_length": [], "eq_labels": [], "eq_words": []}
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            key, values = fields[0], fields[1:]
            try:
                if key in ("DEBUG", "LABELED", "CUTOFF_LEN", "MAX_ERROR"):
                    (value,) = values
                    value = int(value)
                    if key == "LABELED":
                        settings["labeled"] = bool(value)
                    elif key != "DEBUG":
                        settings[key.lower()] = value
                elif key in ("DELETE_LABEL", "DELETE_LABEL_FOR_LENGTH"):
                    (value,) = values
                    settings[{"DELETE_LABEL": "delete_labels"}.get(key, "delete_labels_for_length")].append(value)
                elif key in ("EQ_LABEL", "EQ_WORD"):
                    first, second = values
                    settings[{"EQ_LABEL": "eq_labels"}.get(key, "eq_words")].append((first, second))
                else:
                    raise ValueError(f"unknown setting {key}")
            except ValueError as err:
                raise ValueError(f"{path}:{number}: cannot read {line.strip()!r} ({err})") from None
        return cls(**{name: tuple(value) if isinstance(value, list) else value for name, value in settings.items()})


@dataclasses.dataclass(frozen=True)
class SentenceScore:
    """One row of EVALB's report. `status`: 0 scored, 1 error, 2 skipped."""

    length: int
    status: int
    matched: int = 0
    gold: int = 0
    test: int = 0
    crossing: int = 0
    words: int = 0
    correct_tags: int = 0
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class Summary:
    """EVALB's summary over a set of sentences (percentages as EVALB prints them, unrounded)."""

    sentences: int
    errors: int
    skipped: int
    valid: int
    recall: float
    precision: float
    f_measure: float
    complete_match: float
    average_crossing: float
    no_crossing: float
    two_or_less_crossing: float
    tagging_accuracy: float

    def values(self):
        """The figures in `SUMMARY_LABELS` order."""
        return [getattr(self, field.name) for field in dataclasses.fields(self)]


@dataclasses.dataclass(frozen=True)
class EvalbResult:
    """Rows per sentence, and the summaries for all sentences and for length <= `cutoff_len`."""

    rows: tuple
    all: Summary
    short: Summary
    cutoff_len: int


class _Canon:
    """Equivalence classes of `EQ_LABEL` / `EQ_WORD` pairs (non-directional, transitive)."""

    def __init__(self, pairs):
        self.parent = {}
        for first, second in pairs:
            first, second = self(first), self(second)
            if first != second:
                self.parent[first] = second

    def __call__(self, item):
        while item in self.parent:
            item = self.parent[item]
        return item


def _raw_items(line, number, params):
    """`(length, [(raw tag, word)], [(label, start, end)])` of one line's trees, spans over all its words."""
    trees = [tree for _, tree in read_trees(line, source=f"line {number}")]
    words = []
    brackets = []

    def walk(tree):
        if tree.is_preterminal:
            words.append((tree.label, tree.children[0]))
            return
        start = len(words)
        for child in tree.children:
            walk(child)
        if tree.label and tree.label not in params.delete_labels:
            brackets.append((strip_function_tags(tree.label), start, len(words)))

    for tree in trees:
        walk(tree)
    length = sum(tag not in params.delete_labels_for_length for tag, _ in words)
    return length, words, brackets


def _delete(words, brackets, deleted):
    """The words whose positions are not in `deleted` (tags stripped), and the brackets re-spanned
    over them; a bracket left without words is dropped."""
    kept_before = [0]
    for position in range(len(words)):
        kept_before.append(kept_before[-1] + (position not in deleted))
    kept = [(strip_function_tags(tag), word) for position, (tag, word) in enumerate(words) if position not in deleted]
    spans = [(label, kept_before[start], kept_before[end]) for label, start, end in brackets]
    return kept, [(label, start, end) for label, start, end in spans if end > start]


def _items(gold_line, test_line, number, params):
    """`(length, gold words, gold brackets, test words, test brackets)` after deletion.

    As EVALB: when both lines hold the same number of words, the words deleted (punctuation,
    empty elements) are those the **gold** tree tags with a `DELETE_LABEL`, on both sides, so a
    word the test mis-tags as punctuation is still scored; otherwise each side deletes by its
    own tags (and different lengths are an error).
    """
    length, gold_words, gold_brackets = _raw_items(gold_line, number, params)
    _, test_words, test_brackets = _raw_items(test_line, number, params)

    def deleted(words):
        return {position for position, (tag, _) in enumerate(words) if tag in params.delete_labels}

    gold_deleted = deleted(gold_words)
    test_deleted = gold_deleted if len(gold_words) == len(test_words) else deleted(test_words)
    return (length, *_delete(gold_words, gold_brackets, gold_deleted), *_delete(test_words, test_brackets, test_deleted))


def _crosses(first, second):
    (_, a, b), (_, c, d) = first, second
    return a < c < b < d or c < a < d < b


def score_sentence(gold_line, test_line, params=EvalbParams(), number=0):
    """One sentence's `SentenceScore` (see the module docstring for skips and errors)."""
    labels, words_eq = _Canon(params.eq_labels), _Canon(params.eq_words)
    if not gold_line.strip():
        return SentenceScore(0, 2, reason="blank gold line")
    if not test_line.strip():
        return SentenceScore(_raw_items(gold_line, number, params)[0], 2, reason="blank test line")
    length, gold_words, gold_brackets, test_words, test_brackets = _items(gold_line, test_line, number, params)
    if len(gold_words) != len(test_words):
        return SentenceScore(length, 1, reason="length unmatch")
    if any(words_eq(g) != words_eq(t) for (_, g), (_, t) in zip(gold_words, test_words)):
        return SentenceScore(length, 1, reason="words unmatch")

    def key(bracket):
        label, start, end = bracket
        return (labels(label) if params.labeled else "", start, end)

    unmatched = {}
    for bracket in test_brackets:
        unmatched[key(bracket)] = unmatched.get(key(bracket), 0) + 1
    matched = 0
    for bracket in gold_brackets:
        if unmatched.get(key(bracket), 0):
            unmatched[key(bracket)] -= 1
            matched += 1
    crossing = sum(any(_crosses(test, gold) for gold in gold_brackets) for test in test_brackets)
    correct_tags = sum(labels(g) == labels(t) for (g, _), (t, _) in zip(gold_words, test_words))
    return SentenceScore(
        length, 0, matched, len(gold_brackets), len(test_brackets), crossing, len(gold_words), correct_tags
    )


def _percent(part, whole):
    return 100.0 * part / whole if whole else 0.0


def summarize(rows):
    """The `Summary` of `SentenceScore` rows."""
    valid = [row for row in rows if row.status == 0]
    matched, gold, test = (sum(getattr(row, name) for row in valid) for name in ("matched", "gold", "test"))
    recall, precision = _percent(matched, gold), _percent(matched, test)
    return Summary(
        sentences=len(rows),
        errors=sum(row.status == 1 for row in rows),
        skipped=sum(row.status == 2 for row in rows),
        valid=len(valid),
        recall=recall,
        precision=precision,
        f_measure=2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        complete_match=_percent(sum(row.matched == row.gold == row.test for row in valid), len(valid)),
        average_crossing=sum(row.crossing for row in valid) / len(valid) if valid else 0.0,
        no_crossing=_percent(sum(row.crossing == 0 for row in valid), len(valid)),
        two_or_less_crossing=_percent(sum(row.crossing <= 2 for row in valid), len(valid)),
        tagging_accuracy=_percent(sum(row.correct_tags for row in valid), sum(row.words for row in valid)),
    )


def evalb(gold_lines, test_lines, params=EvalbParams()):
    """Score test trees against gold trees, one tree (or a blank) per line, as EVALB does.

    Raises:
        ValueError: different numbers of lines, a line that is not a bracketed tree (naming
            it), or more than `params.max_error` error sentences (EVALB stops there too).
    """
    gold_lines, test_lines = list(gold_lines), list(test_lines)
    if len(gold_lines) != len(test_lines):
        raise ValueError(f"The gold file has {len(gold_lines)} lines, the test file {len(test_lines)}")
    rows = []
    for number, (gold_line, test_line) in enumerate(zip(gold_lines, test_lines), start=1):
        try:
            rows.append(score_sentence(gold_line, test_line, params, number))
        except TreeError as err:
            raise ValueError(f"Sentence {number}: not a bracketed tree ({err})") from None
        if sum(row.status == 1 for row in rows) > params.max_error:
            raise ValueError(f"Too many errors: more than MAX_ERROR={params.max_error} error sentences by line "
                             f"{number} (the last: {rows[-1].reason})")
    short = [row for row in rows if row.length <= params.cutoff_len]
    return EvalbResult(tuple(rows), summarize(rows), summarize(short), params.cutoff_len)


def evalb_files(gold_path, test_path, params=EvalbParams()):
    """`evalb` over two files of one-line trees."""
    return evalb(_lines(gold_path), _lines(test_path), params)


def _lines(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


_HEADER = (
    "  Sent.                        Matched  Bracket   Cross        Correct Tag\n"
    " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy\n"
)
_RULE = "=" * 76 + "\n"


def format_summary(summary):
    """EVALB's summary block: `Number of sentence        =     24` ... `Tagging accuracy          =  98.15`."""
    lines = []
    for label, value in zip(SUMMARY_LABELS, summary.values()):
        number = f"{value:6d}" if isinstance(value, int) else f"{value:6.2f}"
        lines.append(f"{label:<26}= {number}\n")
    return "".join(lines)


def format_report(result, sentences=True):
    """EVALB's report: the per-sentence table (when `sentences`), then the summaries."""
    text = ""
    if sentences:
        text += _HEADER + _RULE
        for number, row in enumerate(result.rows, start=1):
            recall, precision = _percent(row.matched, row.gold), _percent(row.matched, row.test)
            text += (
                f"{number:4d} {row.length:4d}    {row.status:d}  {recall:6.2f} {precision:6.2f}  {row.matched:4d}"
                f"   {row.gold:4d} {row.test:4d}   {row.crossing:4d}   {row.words:4d}  {row.correct_tags:4d}"
                f"   {_percent(row.correct_tags, row.words):6.2f}\n"
            )
        text += _RULE
        valid = [row for row in result.rows if row.status == 0]
        total = {name: sum(getattr(row, name) for row in valid) for name in
                 ("matched", "gold", "test", "crossing", "words", "correct_tags")}
        text += (
            f"                {result.all.recall:6.2f} {result.all.precision:6.2f} {total['matched']:6d}"
            f" {total['gold']:5d} {total['test']:5d}  {total['crossing']:5d}  {total['words']:5d}"
            f" {total['correct_tags']:5d}   {result.all.tagging_accuracy:6.2f}\n"
        )
    text += "=== Summary ===\n\n-- All --\n" + format_summary(result.all)
    text += f"\n-- len<={result.cutoff_len} --\n" + format_summary(result.short)
    return text
