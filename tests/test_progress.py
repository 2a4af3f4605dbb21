"""What a user watches while a run trains: `training.progress.ProgressMeter`'s line."""

import io
import logging

import pytest

from keras_transformer.training.progress import ProgressMeter


class Terminal(io.StringIO):
    def isatty(self):
        return True


FIGURES = dict(loss=1.23456, lr=0.0011634, rate=8387.4, skipped=0, eta=83.9)
LINE = "loss 1.2346 lr 0.00116 8387 tok/s skipped 0 ETA 0:01:23"


def test_on_a_terminal_the_line_is_rewritten_in_place_and_ended_once():
    stream = Terminal()
    meter = ProgressMeter(600, True, 0, stream)
    with meter.line:
        meter.report(200, **FIGURES)
        meter.report(400, **{**FIGURES, "rate": 8.0})  # a shorter line covers the longer one
        meter.line.end()  # before a validation's log line
        meter.line.end()  # nothing open: nothing written
        meter.report(600, **FIGURES)  # the last step ends its line
        meter.report(600, **FIGURES)
    short = LINE.replace("8387 tok/s", "8 tok/s")
    assert stream.getvalue() == (
        f"\rstep 200/600 [{'=' * 10}{'.' * 20}] {LINE}"
        f"\rstep 400/600 [{'=' * 20}{'.' * 10}] {short}   \n"
        f"\rstep 600/600 [{'=' * 30}] {LINE}\n"
        f"\rstep 600/600 [{'=' * 30}] {LINE}\n"
    )


def test_a_line_left_open_is_ended_on_the_way_out():
    stream = Terminal()
    meter = ProgressMeter(600, True, 300, stream)
    with pytest.raises(RuntimeError), meter.line:
        meter.report(450, **FIGURES)
        raise RuntimeError("diverged")
    assert stream.getvalue() == f"\rstep 450/600 [{'=' * 22}{'.' * 8}] {LINE}\n"


def test_elsewhere_each_report_is_a_line():
    stream = io.StringIO()
    meter = ProgressMeter(600, True, 0, stream)
    meter.report(200, **FIGURES)
    meter.report(400, **FIGURES)
    assert stream.getvalue() == (
        f"step 200/600 [{'=' * 10}{'.' * 20}] {LINE}\nstep 400/600 [{'=' * 20}{'.' * 10}] {LINE}\n"
    )


def test_without_progress_the_figures_are_an_absl_info_line(caplog):
    stream = Terminal()
    with caplog.at_level(logging.INFO, logger="absl"):
        ProgressMeter(600, False, 0, stream).report(200, **FIGURES)
    assert stream.getvalue() == ""
    assert [record.getMessage() for record in caplog.records] == [f"step 200/600 {LINE}"]


def test_a_result_is_shown_below_the_progress_where_absl_info_is_hidden(absl_verbosity, caplog):
    """A notebook (absl at WARNING): the validation line follows the progress line on the
    stream, which it ends; where absl's INFO lines show (a script), it is in the log only."""
    from absl import logging as absl_logging

    absl_verbosity(absl_logging.WARNING)
    stream = Terminal()
    meter = ProgressMeter(600, True, 0, stream)
    meter.report(200, **FIGURES)
    meter.note("step %d validation loss %.4f perplexity %.2f", 200, 1.5, 4.48)
    assert stream.getvalue() == (
        f"\rstep 200/600 [{'=' * 10}{'.' * 20}] {LINE}\n"
        "\rstep 200 validation loss 1.5000 perplexity 4.48\n"
    )
    elsewhere = io.StringIO()
    ProgressMeter(600, True, 0, elsewhere).note("step %d BLEU %.2f", 200, 31.0)
    assert elsewhere.getvalue() == "step 200 BLEU 31.00\n"

    for progress, verbosity in ((True, absl_logging.INFO), (False, absl_logging.WARNING)):
        absl_verbosity(verbosity)
        stream = Terminal()
        ProgressMeter(600, progress, 0, stream).note("step %d BLEU %.2f", 200, 31.0)
        assert stream.getvalue() == "", (progress, verbosity)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="absl"):
        ProgressMeter(600, True, 0, Terminal()).note("step %d BLEU %.2f", 200, 31.0)
    assert [record.getMessage() for record in caplog.records] == ["step 200 BLEU 31.00"]
    assert caplog.records[0].pathname == __file__  # the log line names the caller's line
