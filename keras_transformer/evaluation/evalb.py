"""EVALB's bracket scores (Sekine & Collins 1997): the figures behind every published parsing F1.

`evalb(gold_lines, test_lines, params)` scores one-line trees sentence by sentence following
the `evalb` C program (`evalb.c`: `read_line`, `calc_result`, `fix_quote`, `massage_data`,
`individual_result`, `print_total`) rule for rule, and `format_report` prints its report
(`.rsl`) in its formats, e.g. `Bracketing FMeasure       =  91.30`. `EvalbParams.from_file`
reads a parameter file as `read_parameter_file` does. The defaults of `EvalbParams()` are those
of EVALB's `COLLINS.prm`, the standard setting of the parsing literature.

EVALB's rules, as `evalb.c` applies them:

* Reading a line: a preterminal `(TAG word)` is a word; its tag, exactly as written
  (`NN-HLN` stays `NN-HLN`), is compared against `DELETE_LABEL` (deleted with its word, from
  that side only) and `DELETE_LABEL_FOR_LENGTH` (not counted in the gold length). Each side
  deletes by its **own** tags: a word the test tags as punctuation where the gold does not
  makes the lengths differ. Any other `(LABEL ...` is a bracket over the words kept inside it,
  the unlabeled root of `( (S ...) )` (label `""`) included; `(X)` is a bracket over no words.
  An unclosed bracket makes the sentence an error sentence.
* Per sentence: no test words left (a blank test line, or one of punctuation only) is a
  **skip**; otherwise different numbers of words (after `QUOTE_LABEL`'s re-insertion, below)
  or different words (`EQ_WORD` pairs being equal) are an **error**; a blank gold line against
  a non-blank test line is an error too.
* Brackets: one over no words is deleted; each label is cut at its first `-` or `=`
  (`NP-SBJ-1` is `NP`, `-NONE-` is `""`) and then deleted if it equals a `DELETE_LABEL` or
  an `EQ_LABEL` partner of one. Each gold bracket matches the first unmatched test bracket of
  the same span whose label is equal or an `EQ_LABEL` partner (any label when `LABELED 0`).
  `EQ_LABEL` and `EQ_WORD` pairs are each equal in both directions, and nothing more: `A B`
  and `B C` do not make `A` equal `C`. A test bracket that overlaps a gold one without
  nesting counts one crossing.
* Tagging accuracy compares the kept words' tags as written, `EQ_LABEL` pairs being equal.
* `QUOTE_LABEL TAG`: when the lengths differ, a `'`, `"` or `/` tagged `TAG` that one side
  deleted and the other kept with another tag is put back on the deleting side (EVALB's
  `fix_quote`, for `new.prm`).
* Every error message counts toward `MAX_ERROR`, and EVALB stops, before its summary, at
  message `MAX_ERROR + 2` (with `MAX_ERROR 10`, 11 pass); here that raises `TooManyErrors`.
  Files of different lengths are scored over their common lines, with an error message.
* The summary: recall and precision over all valid sentences' brackets, F = 2PR/(P+R) (`-nan`
  when P + R = 0, as EVALB prints it on x86-64), the `len<=CUTOFF_LEN` block by the gold length.

A line EVALB cannot read is refused (`ValueError` naming it): a word outside a preterminal
(EVALB repeats its "Reading sentence" error on it until `MAX_ERROR` stops it), a close bracket
with nothing open or a line that ends inside a bracket's label or word (undefined behaviour
in `evalb.c`); so is a parameter line with a key and no value. Lines longer than EVALB's 5000-byte buffer (which it splits in two) and sentences over its
200 words or brackets (which overflow its arrays) are read whole. `DEBUG` is read; its
listing is not printed.
"""

import dataclasses
import math
import sys
from pathlib import Path

SUMMARY_LABELS = (
    "Number of sentence",
    "Number of Error sentence",
    "Number of Skip  sentence",
    "Number of Valid sentence",
    "Bracketing Recall",
    "Bracketing Precision",
    "Bracketing FMeasure",
    "Complete match",
    "Average crossing",
    "No crossing",
    "2 or less crossing",
    "Tagging accuracy",
)
"""The labels of EVALB's summary, in its order (the spacing is EVALB's)."""

_SPACE = " \t\n\v\f\r"  # C's isspace in the C locale
_TERMINATORS = _SPACE + "()"
_QUOTE_WORDS = ("'", '"', "/")  # is_quote_term's words
_DELETED = 5  # s_bracket.result: deleted


def _warn_stderr(message):
    print(f"Warning: {message}", file=sys.stderr)


def _fields(text):
    """The blank-separated fields of `text` (`narg`, `sscanf("%s")`: C's blanks only)."""
    return [
        field
        for field in "".join(" " if char in _SPACE else char for char in text).split(" ")
        if field
    ]


def _atoi(text):
    """C's `atoi`: leading blanks, an optional sign, the digits that follow; 0 when none."""
    text = text.lstrip(_SPACE)
    sign = -1 if text[:1] == "-" else 1
    digits = text[1:] if text[:1] in "+-" else text
    count = 0
    while count < len(digits) and digits[count] in "0123456789":
        count += 1
    return sign * int(digits[:count]) if count else 0


@dataclasses.dataclass(frozen=True)
class EvalbParams:
    """The settings of an EVALB parameter file (`.prm`); the defaults are `COLLINS.prm`'s."""

    labeled: bool = True
    cutoff_len: int = 40
    max_error: int = 10
    delete_labels: tuple = ("TOP", "-NONE-", ",", ":", "``", "''", ".")
    delete_labels_for_length: tuple = ("-NONE-",)
    quote_labels: tuple = ()
    eq_labels: tuple = (("ADVP", "PRT"),)
    eq_words: tuple = ()

    @classmethod
    def from_file(cls, path, warn=_warn_stderr):
        """Read an EVALB `.prm` file as `read_parameter_file` and `set_param` do.

        A line is a comment when it starts with `#` (a `#` further on is part of the value),
        ignored when shorter than 3 characters; the key is the text before the first blank, the
        value the rest (trailing blanks cut; `DELETE_LABEL a b` deletes the label `a b`).
        Numbers are read with C's `atoi` (`5x` is 5, `x` is 0). EVALB's complaints go to `warn`
        (a message naming the file and line): an unknown keyword, an `EQ_LABEL`/`EQ_WORD`
        without exactly two values (ignored); a number that `atoi` reads only in part and a
        non-zero `DEBUG` are named too.

        Raises:
            OSError: the file cannot be read.
            ValueError: a key with no value (`evalb.c` reads past the line's end there).
        """
        settings = {
            "labeled": True,
            "cutoff_len": 40,
            "max_error": 10,
            "delete_labels": [],  # evalb.c's own
            "delete_labels_for_length": [],
            "quote_labels": [],
            "eq_labels": [],
            "eq_words": [],
        }
        for number, line in enumerate(read_lines(path), start=1):
            end = len(line)
            while end > 1 and line[end - 1] in _SPACE:
                end -= 1
            line = line[:end]
            if line.startswith("#") or len(line) < 3:
                continue
            where = f"{path}, line {number}"
            blank = next((i for i, char in enumerate(line) if char in _SPACE), None)
            if blank is None:  # evalb.c reads on past the line's end here
                raise ValueError(f"{where}: {line!r} has a key and no value")
            value = line[blank:].lstrip(_SPACE)  # not empty: trailing blanks are cut

            def key(name, line=line):
                return line.startswith(name) and line[len(name) : len(name) + 1] in ("", *_SPACE)

            if key("DEBUG") or key("MAX_ERROR") or key("CUTOFF_LEN") or key("LABELED"):
                number_value = _atoi(value)
                if value.strip(_SPACE) != str(number_value):
                    warn(
                        f"{where}: {value!r} is read as {number_value} (C's atoi, as EVALB reads it)"
                    )
                if key("MAX_ERROR"):
                    settings["max_error"] = number_value
                elif key("CUTOFF_LEN"):
                    settings["cutoff_len"] = number_value
                elif key("LABELED"):
                    settings["labeled"] = number_value != 0
                elif number_value:
                    warn(
                        f"{where}: DEBUG {number_value} is read; EVALB's debug listing is not printed"
                    )
            elif key("DELETE_LABEL"):
                settings["delete_labels"].append(value)
            elif key("DELETE_LABEL_FOR_LENGTH"):
                settings["delete_labels_for_length"].append(value)
            elif key("QUOTE_LABEL"):
                settings["quote_labels"].append(value)
            elif key("EQ_LABEL") or key("EQ_WORD"):
                name = "EQ_LABEL" if key("EQ_LABEL") else "EQ_WORD"
                values = _fields(value)
                if len(values) != 2:
                    warn(f"{where}: {name} requires two values")
                    continue
                settings[name.lower() + "s"].append(tuple(values))
            else:
                warn(f"{where}: Unknown keyword ({line}) in parameter file")
        return cls(
            **{
                name: tuple(value) if isinstance(value, list) else value
                for name, value in settings.items()
            }
        )


@dataclasses.dataclass(frozen=True)
class SentenceScore:
    """One row of EVALB's report. `status`: 0 scored, 1 error, 2 skipped; `reason`: EVALB's
    error messages for the sentence (empty when none)."""

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
    """EVALB's summary over a set of sentences (percentages as EVALB prints them, unrounded;
    `f_measure` is NaN when recall and precision are both 0)."""

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
    """Rows per sentence, the summaries for all sentences and for gold length <= `cutoff_len`,
    and EVALB's messages (what it prints on stderr, e.g. `12 : Words unmatch (is|was)`)."""

    rows: tuple
    all: Summary
    short: Summary
    cutoff_len: int
    messages: tuple = ()


class TooManyErrors(ValueError):
    """EVALB stops: more than `MAX_ERROR + 1` error messages."""


def _equal(first, second, pairs):
    """`label_comp` / `word_comp`: equal strings, or one of `pairs` in either order."""
    return first == second or any((first, second) in (pair, pair[::-1]) for pair in pairs)


class _Errors:
    """EVALB's `Error`: each message sets the sentence's status to error and counts; the one
    that finds the count already above `MAX_ERROR` stops the run."""

    def __init__(self, max_error):
        self.max_error, self.count, self.messages, self.line_messages = max_error, 0, [], []

    def __call__(self, line, message):
        self.messages.append(f"{line} : {message}")
        self.line_messages.append(message)
        self.count += 1
        if self.count - 1 > self.max_error:
            raise TooManyErrors(
                f"Too many errors: EVALB stops at line {line} ({message}), its error message "
                f"{self.count} with MAX_ERROR {self.max_error}"
            )


@dataclasses.dataclass
class _Quote:
    """A `QUOTE_LABEL` terminal as `read_line` records it (`s_term_ind`)."""

    label: str
    word: str
    index: int
    bracket: int
    ends: list


@dataclasses.dataclass
class _Side:
    """One line as `read_line` leaves it: kept terminals `[tag, word]`, brackets
    `[label, start, end]` (end -1 while open), quote terminals, the length `r_wn`."""

    terminals: list
    brackets: list
    quotes: list
    length: int


def _read_line(line, params, number, side, errors):
    """`read_line`: the terminals, brackets and length of one line (see the module docstring)."""
    terminals, brackets, quotes, stack = [], [], [], []
    length, position, size = 0, 0, len(line)

    def refuse(what):
        raise ValueError(
            f"{side} line {number}: {what} ({line.strip(_SPACE)[:80]!r}); EVALB cannot read it"
        )

    def scan(start):
        end = start
        while end < size and line[end] not in _TERMINATORS:
            end += 1
        if end == size:
            refuse("the line ends inside a bracket")
        return end

    while position < size:
        char = line[position]
        if char in _SPACE:
            position += 1
        elif char == "(":
            end = scan(position + 1)
            label, position = line[position + 1 : end], end
            if line[position] in _SPACE:
                start = position
                while start < size and line[start] in _SPACE:
                    start += 1
                end = scan(start)
                word = line[start:end]
                if line[end] == ")":
                    if label not in params.delete_labels_for_length:
                        length += 1
                    if label in params.quote_labels and word in _QUOTE_WORDS:
                        quotes.append(
                            _Quote(label, word, len(terminals), len(brackets), list(stack))
                        )
                    if label not in params.delete_labels:
                        terminals.append([label, word])
                    position = end + 1
                    continue
                if line[end] != "(":
                    refuse("more than two elements in a bracket")
            stack.append(len(brackets))
            brackets.append([label, len(terminals), -1])
        elif char == ")":
            if not stack:
                refuse("a close bracket with no open bracket")
            brackets[stack.pop()][2] = len(terminals)
            position += 1
        else:
            end = position
            while end < size and line[end] not in _TERMINATORS:
                end += 1
            refuse(f"the word {line[position:end]!r} outside a preterminal")
    if stack:
        errors(number, "Bracketing is unbalanced (too many open bracket)")
    return _Side(terminals, brackets, quotes, length)


def _reinsert(quote, side):
    """`reinsert_term`: put a deleted quote terminal back, shifting the brackets after it."""
    side.terminals.insert(quote.index, [quote.label, quote.word])
    for bracket in side.brackets[quote.bracket :]:
        bracket[1] += 1
        bracket[2] += 1
    for index in quote.ends:
        side.brackets[index][2] += 1


def _fix_quote(gold, test, params):
    """`fix_quote`: re-insert quote terminals that one side deleted and the other kept."""
    for i, test_quote in enumerate(test.quotes):
        index = test_quote.index
        for j, gold_quote in enumerate(gold.quotes):
            if gold_quote.index != index or gold_quote.label == test_quote.label:
                continue
            gold_deleted, test_deleted = (
                quote.label in params.delete_labels for quote in (gold_quote, test_quote)
            )
            if gold_deleted and not test_deleted:
                _reinsert(gold_quote, gold)
                for quote in gold.quotes[j:]:
                    quote.index += 1
            elif test_deleted and not gold_deleted:
                _reinsert(test_quote, test)
                for quote in test.quotes[i:]:
                    quote.index += 1


def _massage(brackets, params):
    """`massage_data` for one side: `[label, start, end, result]` with result 0 or deleted."""
    out = []
    for label, start, end in brackets:
        if start == end:
            out.append([label, start, end, _DELETED])
            continue
        for cut, char in enumerate(label):
            if char in "-=":
                label = label[:cut]
                break
        deleted = any(_equal(label, name, params.eq_labels) for name in params.delete_labels)
        out.append([label, start, end, _DELETED if deleted else 0])
    return out


def _crosses(gold, test):
    _, a, b, _ = gold
    _, c, d, _ = test
    return (a < c < b < d) or (c < a < d < b)


def _calc_result(gold, test, status, params, number, errors):
    """`calc_result`: one sentence's `SentenceScore` (status 1 already when reading erred)."""
    empty = dict(length=gold.length)
    if not test.terminals:
        return SentenceScore(status=2, **empty)
    if len(gold.terminals) != len(test.terminals):
        _fix_quote(gold, test, params)
        if len(gold.terminals) != len(test.terminals):
            errors(number, f"Length unmatch ({len(gold.terminals)}|{len(test.terminals)})")
            return SentenceScore(status=1, **empty)
    for (_, gold_word), (_, test_word) in zip(gold.terminals, test.terminals):
        if not _equal(gold_word, test_word, params.eq_words):
            errors(number, f"Words unmatch ({gold_word}|{test_word})")
            return SentenceScore(status=1, **empty)
    gold_brackets, test_brackets = _massage(gold.brackets, params), _massage(test.brackets, params)
    matched = 0
    for gold_bracket in gold_brackets:
        if gold_bracket[3] == _DELETED:
            continue
        for test_bracket in test_brackets:
            if (
                test_bracket[3] == 0
                and gold_bracket[1:3] == test_bracket[1:3]
                and (
                    not params.labeled or _equal(gold_bracket[0], test_bracket[0], params.eq_labels)
                )
            ):
                gold_bracket[3] = test_bracket[3] = 1
                matched += 1
                break
    kept_gold = [bracket for bracket in gold_brackets if bracket[3] != _DELETED]
    kept_test = [bracket for bracket in test_brackets if bracket[3] != _DELETED]
    crossing = sum(
        any(_crosses(gold_bracket, test_bracket) for gold_bracket in kept_gold)
        for test_bracket in kept_test
    )
    correct_tags = sum(
        _equal(gold_tag, test_tag, params.eq_labels)
        for (gold_tag, _), (test_tag, _) in zip(gold.terminals, test.terminals)
    )
    return SentenceScore(
        gold.length,
        status,
        matched,
        len(kept_gold),
        len(kept_test),
        crossing,
        len(gold.terminals),
        correct_tags,
    )


def score_sentence(gold_line, test_line, params=EvalbParams(), number=0):
    """One sentence's `SentenceScore` (see the module docstring for skips and errors).

    Raises:
        ValueError: a line EVALB cannot read.
    """
    return _score(gold_line, test_line, params, number, _Errors(math.inf))


def _score(gold_line, test_line, params, number, errors):
    errors.line_messages = []
    gold = _read_line(gold_line, params, number, "gold", errors)
    test = _read_line(test_line, params, number, "test", errors)
    score = _calc_result(gold, test, 1 if errors.line_messages else 0, params, number, errors)
    return dataclasses.replace(score, reason="; ".join(errors.line_messages))


def _percent(part, whole):
    return 100.0 * part / whole if whole > 0 else 0.0


def summarize(rows):
    """The `Summary` of `SentenceScore` rows (`print_total`)."""
    valid = [row for row in rows if row.status == 0]
    matched, gold, test = (
        sum(getattr(row, name) for row in valid) for name in ("matched", "gold", "test")
    )
    recall, precision = _percent(matched, gold), _percent(matched, test)
    return Summary(
        sentences=len(rows),
        errors=sum(row.status == 1 for row in rows),
        skipped=sum(row.status == 2 for row in rows),
        valid=len(valid),
        recall=recall,
        precision=precision,
        f_measure=2 * precision * recall / (precision + recall) if precision + recall else math.nan,
        complete_match=_percent(
            sum(row.matched == row.gold == row.test for row in valid), len(valid)
        ),
        average_crossing=sum(row.crossing for row in valid) / len(valid) if valid else 0.0,
        no_crossing=_percent(sum(row.crossing == 0 for row in valid), len(valid)),
        two_or_less_crossing=_percent(sum(row.crossing <= 2 for row in valid), len(valid)),
        tagging_accuracy=_percent(
            sum(row.correct_tags for row in valid), sum(row.words for row in valid)
        ),
    )


def evalb(gold_lines, test_lines, params=EvalbParams()):
    """Score test trees against gold trees, one tree (or a blank) per line, as EVALB does.

    Files of different lengths are scored over their common lines, with EVALB's message in
    `messages`.

    Raises:
        ValueError: a line EVALB cannot read (naming it); `TooManyErrors` (a `ValueError`)
            where EVALB stops for `MAX_ERROR`.
    """
    gold_lines, test_lines = list(gold_lines), list(test_lines)
    errors = _Errors(params.max_error)
    rows = []
    for number, (gold_line, test_line) in enumerate(zip(gold_lines, test_lines), start=1):
        rows.append(_score(gold_line, test_line, params, number, errors))
    if len(gold_lines) > len(test_lines):
        _read_line(gold_lines[len(test_lines)], params, len(test_lines) + 1, "gold", errors)
        errors(len(test_lines) + 1, "Number of lines unmatch (too many lines in gold file)")
    elif len(test_lines) > len(gold_lines):
        errors(len(gold_lines) + 1, "Number of lines unmatch (too many lines in test file)")
    short = [row for row in rows if row.length <= params.cutoff_len]
    return EvalbResult(
        tuple(rows), summarize(rows), summarize(short), params.cutoff_len, tuple(errors.messages)
    )


def read_lines(path):
    """A file's lines as EVALB's `fgets` reads them (split at `\\n` only; bytes that are not
    UTF-8 kept as they are, compared byte for byte)."""
    data = Path(path).read_bytes().decode("utf-8", errors="surrogateescape")
    lines = data.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def evalb_files(gold_path, test_path, params=EvalbParams()):
    """`evalb` over two files of one-line trees."""
    return evalb(read_lines(gold_path), read_lines(test_path), params)


_HEADER = (
    "  Sent.                        Matched  Bracket   Cross        Correct Tag\n"
    " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy\n"
)
_RULE = "=" * 76 + "\n"


def _float(value):
    """C's `%6.2f`, with NaN as glibc prints the NaN of 0.0 / 0.0 on x86-64."""
    return "  -nan" if math.isnan(value) else "%6.2f" % value


def format_summary(summary):
    """EVALB's summary block: `Number of sentence        =     24` ... `Tagging accuracy          =  98.15`."""
    lines = []
    for label, value in zip(SUMMARY_LABELS, summary.values()):
        number = "%6d" % value if isinstance(value, int) else _float(value)
        lines.append(f"{label:<26}= {number}\n")
    return "".join(lines)


def format_report(result, sentences=True):
    """EVALB's report (`print_head`, `individual_result`, `print_total`): the per-sentence table
    (when `sentences`), then the summaries."""
    text = ""
    if sentences:
        text += _HEADER + _RULE
        for number, row in enumerate(result.rows, start=1):
            text += "%4d  %3d    %d  " % (number, row.length, row.status)
            text += "%6.2f %6.2f   %3d    %3d  %3d    %3d" % (
                _percent(row.matched, row.gold),
                _percent(row.matched, row.test),
                row.matched,
                row.gold,
                row.test,
                row.crossing,
            )
            text += "   %4d  %4d   %6.2f\n" % (
                row.words,
                row.correct_tags,
                _percent(row.correct_tags, row.words),
            )
        text += _RULE
        valid = [row for row in result.rows if row.status == 0]
        total = {
            name: sum(getattr(row, name) for row in valid)
            for name in ("matched", "gold", "test", "crossing", "words", "correct_tags")
        }
        if total["gold"] > 0 and total["test"] > 0:
            text += "                %6.2f %6.2f %6d %5d %5d  %5d" % (
                result.all.recall,
                result.all.precision,
                total["matched"],
                total["gold"],
                total["test"],
                total["crossing"],
            )
        text += "  %5d %5d   %6.2f\n" % (
            total["words"],
            total["correct_tags"],
            result.all.tagging_accuracy,
        )
    text += "=== Summary ===\n\n-- All --\n" + format_summary(result.all)
    text += f"\n-- len<={result.cutoff_len} --\n" + format_summary(result.short)
    return text
