"""Tests for keras_transformer.evaluation.evalb: EVALB's reference reports, reproduced."""

import re

import pytest

from keras_transformer.evaluation.evalb import SUMMARY_LABELS, EvalbParams, evalb, evalb_files, format_report

CASES = [("sample", "sample.prm"), ("ptb5", "COLLINS.prm")]


def _summary_figures(report):
    """{(section, label): value} of a report's summary."""
    figures, section = {}, None
    for line in report.split("=== Summary ===")[1].splitlines():
        if line.startswith("--"):
            section = line
        elif "=" in line:
            label, value = line.split("=")
            figures[(section, label.strip())] = float(value)
    return figures


@pytest.mark.parametrize("name, prm", CASES)
def test_reproduces_evalb_reports(evalb_sample_dir, name, prm):
    expected = (evalb_sample_dir / f"{name}.rsl").read_text()
    result = evalb_files(evalb_sample_dir / f"{name}.gld", evalb_sample_dir / f"{name}.tst",
                         EvalbParams.from_file(evalb_sample_dir / prm))
    figures = _summary_figures(expected)
    assert len(figures) == 2 * len(SUMMARY_LABELS)
    assert _summary_figures(format_report(result)) == figures
    assert format_report(result) == expected  # the whole report, rows included, byte for byte


def test_collins_prm_is_the_default(evalb_sample_dir):
    assert EvalbParams.from_file(evalb_sample_dir / "COLLINS.prm") == EvalbParams()


def test_known_figures():
    gold = ["(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))"]
    test = ["(TOP (S (NP (DT The)) (VP (VB cat) (VBD sat)) (. .)))"]
    result = evalb(gold, test)
    # gold S NP VP, test S NP VP: S matches; tags 2 of 3 (the period is deleted)
    assert (result.rows[0].matched, result.rows[0].gold, result.rows[0].test) == (1, 3, 3)
    assert result.all.tagging_accuracy == pytest.approx(200 / 3)
    assert re.search(r"Bracketing FMeasure       =  33.33", format_report(result))


def test_mismatched_files_and_bad_lines():
    with pytest.raises(ValueError, match="gold file has 2 lines, the test file 1"):
        evalb(["(S (A a))", "(S (A a))"], ["(S (A a))"])
    with pytest.raises(ValueError, match="Sentence 1"):
        evalb(["(S (A a)"], ["(S (A a))"])
    with pytest.raises(ValueError, match="Too many errors"):
        evalb(["(S (A a))"] * 3, ["(S (A b))"] * 3, EvalbParams(max_error=1))


def test_bad_prm_line(tmp_path):
    path = tmp_path / "bad.prm"
    path.write_text("LABELED 1\nCUTOFF_LEN forty\n")
    with pytest.raises(ValueError, match=r"bad.prm:2: "):
        EvalbParams.from_file(path)


def test_punctuation_is_what_the_gold_tree_tags_so():
    """A word the test mis-tags as punctuation is still scored (EVALB deletes by the gold tags)."""
    gold = ["(TOP (S (NP (NNP Haag)) (VP (VBZ plays)) (. .)))"]
    test = ["(TOP (S (NP (NNP Haag)) (VP (. plays)) (NN .)))"]
    row = evalb(gold, test).rows[0]
    assert (row.status, row.words, row.correct_tags, row.matched, row.gold, row.test) == (0, 2, 1, 3, 3, 3)
