"""Tests for keras_transformer.evaluation.evalb: EVALB's own reports, reproduced.

`tests/evalb_cases/` holds one small crafted case per rule of `evalb.c` (CASE.gld, CASE.tst,
CASE.prm or COLLINS.prm) with what the real EVALB program printed for it: CASE.rsl (its
report), CASE.err (its stderr), CASE.rc (its exit status). They were recorded by running
EVALB's C program; `sh tests/evalb_cases/regenerate.sh /path/to/evalb` records them again.
"""

import re
from pathlib import Path

import pytest

from keras_transformer.evaluation.evalb import (
    SUMMARY_LABELS,
    EvalbParams,
    TooManyErrors,
    evalb,
    evalb_files,
    format_report,
    score_sentence,
)

CASES_DIR = Path(__file__).parent / "evalb_cases"
CASES = sorted(path.stem for path in CASES_DIR.glob("*.gld"))
SHARED_CASES = [("sample", "sample.prm"), ("ptb5", "COLLINS.prm"), ("bug", "COLLINS.prm")]
_SENTENCE_MESSAGE = re.compile(r"\d+ : ")


def _summary_figures(report):
    """{(section, label): printed value} of a report's summary (strings: EVALB prints `-nan`)."""
    figures, section = {}, None
    for line in report.split("=== Summary ===")[1].splitlines():
        if line.startswith("--"):
            section = line
        elif "=" in line:
            label, value = line.split("=")
            figures[(section, label.strip())] = value.strip()
    return figures


def _case(name):
    prm = CASES_DIR / f"{name}.prm"
    warnings = []
    params = EvalbParams.from_file(
        prm if prm.exists() else CASES_DIR / "COLLINS.prm", warn=warnings.append
    )
    stderr = (CASES_DIR / f"{name}.err").read_text().splitlines()
    return params, warnings, stderr, int((CASES_DIR / f"{name}.rc").read_text())


def test_every_case_is_recorded():
    assert len(CASES) >= 20
    for name in CASES:
        for suffix in ("tst", "rsl", "err", "rc"):
            assert (CASES_DIR / f"{name}.{suffix}").is_file(), f"{name}.{suffix}"


@pytest.mark.parametrize("name", CASES)
def test_reproduces_evalb_on_crafted_cases(name):
    params, warnings, stderr, exit_status = _case(name)
    expected = (CASES_DIR / f"{name}.rsl").read_text()
    gold, test = CASES_DIR / f"{name}.gld", CASES_DIR / f"{name}.tst"
    # EVALB's complaints about the parameter file, each also ours (with the file and line named)
    complaints = [line for line in stderr if not _SENTENCE_MESSAGE.match(line)]
    assert [
        warning.split(": ", 1)[1]
        for warning in warnings
        if "C's atoi" not in warning and "DEBUG" not in warning
    ] == complaints
    if exit_status == 0:
        result = evalb_files(gold, test, params)
        report = format_report(result)
        figures = _summary_figures(expected)
        assert len(figures) == 2 * len(SUMMARY_LABELS)
        assert _summary_figures(report) == figures
        assert report == expected  # the whole report, rows included, byte for byte
        assert list(result.messages) == [line for line in stderr if _SENTENCE_MESSAGE.match(line)]
    else:
        assert "=== Summary ===" not in expected  # EVALB stopped before its summary: so do we
        stopped_at = stderr[-1].split(" : ")[0]
        with pytest.raises(ValueError, match=rf"\bline {stopped_at}\b"):
            evalb_files(gold, test, params)


@pytest.mark.parametrize("name, prm", SHARED_CASES)
def test_reproduces_evalb_reports(evalb_sample_dir, name, prm):
    expected = (evalb_sample_dir / f"{name}.rsl").read_text()
    result = evalb_files(
        evalb_sample_dir / f"{name}.gld",
        evalb_sample_dir / f"{name}.tst",
        EvalbParams.from_file(evalb_sample_dir / prm),
    )
    figures = _summary_figures(expected)
    assert len(figures) == 2 * len(SUMMARY_LABELS)
    assert _summary_figures(format_report(result)) == figures
    assert format_report(result) == expected  # the whole report, rows included, byte for byte


def test_bug_pair_is_all_errors(evalb_sample_dir):
    """EVALB's `bug/` pair: each side deletes punctuation by its own tags, so all 5 are errors."""
    result = evalb_files(evalb_sample_dir / "bug.gld", evalb_sample_dir / "bug.tst")
    assert (result.all.errors, result.all.valid) == (5, 0)
    assert [message.split(" : ")[1].split(" (")[0] for message in result.messages] == [
        "Length unmatch"
    ] * 5


def test_collins_prm_is_the_default(evalb_sample_dir):
    assert EvalbParams.from_file(evalb_sample_dir / "COLLINS.prm") == EvalbParams()


def test_new_prm_reads_quote_labels():
    params = EvalbParams.from_file(CASES_DIR / "quote_label.prm")
    assert params.quote_labels == ("``", "''", "POS", "NN", "CD", "VBZ", ":")


def test_known_figures():
    gold = ["(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))"]
    test = ["(TOP (S (NP (DT The)) (VP (VB cat) (VBD sat)) (. .)))"]
    result = evalb(gold, test)
    # gold S NP VP, test S NP VP: S matches; tags 2 of 3 (the period is deleted)
    assert (result.rows[0].matched, result.rows[0].gold, result.rows[0].test) == (1, 3, 3)
    assert result.all.tagging_accuracy == pytest.approx(200 / 3)
    assert re.search(r"Bracketing FMeasure       =  33.33", format_report(result))


def test_punctuation_is_deleted_by_each_sides_own_tags():
    """A word the test tags as punctuation (and the gold does not) leaves the lengths unequal."""
    gold = "(TOP (S (NP (NNP Haag)) (VP (VBZ plays)) (. .)))"
    row = score_sentence(gold, "(TOP (S (NP (NNP Haag)) (VP (VBZ plays)) (NN .)))")
    assert (row.status, row.reason) == (1, "Length unmatch (2|3)")
    assert score_sentence(gold, "(TOP (S (NP (NNP Haag)) (VP (VBZ plays)) (, .)))").status == 0


def test_mismatched_files_and_bad_lines():
    result = evalb(
        ["(S (A a))", "(S (A a))"], ["(S (A a))"]
    )  # scored over the common line, as EVALB
    assert result.all.sentences == 1
    assert result.messages == ("2 : Number of lines unmatch (too many lines in gold file)",)
    with pytest.raises(ValueError, match="gold line 1: the line ends inside a bracket"):
        evalb(["(S (A a"], ["(S (A a))"])
    with pytest.raises(ValueError, match="test line 1: the word 'b' outside a preterminal"):
        evalb(["(S (A a))"], ["(S (A a) b)"])
    with pytest.raises(ValueError, match="gold line 1: a close bracket with no open bracket"):
        evalb(["(S (A a)))"], ["(S (A a))"])
    assert evalb(["(S (A a))"] * 2, ["(S (A b))"] * 2, EvalbParams(max_error=1)).all.errors == 2
    with pytest.raises(
        TooManyErrors, match="line 3"
    ):  # EVALB stops at its error message MAX_ERROR + 2
        evalb(["(S (A a))"] * 3, ["(S (A b))"] * 3, EvalbParams(max_error=1))


def test_prm_reading(tmp_path):
    path = tmp_path / "odd.prm"
    path.write_text(
        "LABELED 1\nCUTOFF_LEN forty\nDELETE_LABEL X # not a comment\n#DELETE_LABEL Y\nEQ_WORD a b\n"
    )
    warnings = []
    params = EvalbParams.from_file(path, warn=warnings.append)
    assert (params.cutoff_len, params.delete_labels, params.eq_words) == (
        0,
        ("X # not a comment",),
        (("a", "b"),),
    )
    assert warnings == [f"{path}, line 2: 'forty' is read as 0 (C's atoi, as EVALB reads it)"]
    path.write_text("LABELED 1\nCUTOFF_LEN\n")
    with pytest.raises(ValueError, match=r"odd.prm, line 2: 'CUTOFF_LEN' has a key and no value"):
        EvalbParams.from_file(path)
