"""Answering standard input line by line: `keras_transformer.streaming` and translate.py reading
stdin (each line answered before the next is sent) and printing n-best lists."""

import io
import os
import queue
import select
import threading
import time

import pytest

from keras_transformer.streaming import answer_lines, line_batches, read_lines
from tests.scripts import ScriptSession, run_script

NEXT_ANSWER_TIMEOUT = 120  # seconds for a line's answer once the model answered a first one


def test_line_batches_yield_each_line_when_it_arrives():
    read_end, write_end = os.pipe()
    batches = queue.Queue()

    def consume():
        with os.fdopen(read_end, "rb") as stream:
            for batch in line_batches(stream, max_lines=4):
                batches.put(batch)
        batches.put(None)

    threading.Thread(target=consume, daemon=True).start()
    with os.fdopen(write_end, "wb", buffering=0) as writer:
        for line in (b"one\n", b"\n", b"three\r\n"):  # the pipe stays open: no end of input yet
            writer.write(line)
            assert batches.get(timeout=10) == [line]
        writer.write(b"four\nfive")  # a last line without a line end
    rest = []
    while (batch := batches.get(timeout=10)) is not None:
        assert 1 <= len(batch) <= 4
        rest += batch
    assert rest == [b"four\n", b"five"]


def test_line_batches_take_what_is_there_up_to_max_lines():
    stream = io.BytesIO(b"".join(b"%d\n" % i for i in range(10)))
    batches = list(line_batches(stream, max_lines=3))
    assert all(1 <= len(batch) <= 3 for batch in batches)
    assert [line for batch in batches for line in batch] == [b"%d\n" % i for i in range(10)]


class _FailingStream:
    def __init__(self):
        self.calls = 0

    def readline(self):
        self.calls += 1
        if self.calls > 1:
            raise OSError(5, "Input/output error")
        return b"first\n"


def test_line_batches_raise_the_read_error_after_the_lines_before_it():
    batches = line_batches(_FailingStream(), max_lines=2)
    assert next(batches) == [b"first\n"]
    with pytest.raises(OSError, match="Input/output error"):
        next(batches)
    with pytest.raises(ValueError, match="max_lines must be an int >= 1. Received: max_lines=0"):
        next(line_batches(io.BytesIO(b""), max_lines=0))


def _respond(calls, fail_at=None):
    """A `respond` for `answer_lines` that records its calls and answers each line upper-cased."""

    def respond(start, lines, replaced):
        if start == fail_at:
            raise ValueError(f"line {start + 1}: cannot answer")
        calls.append((start, lines, replaced))
        return "".join(f"{line.upper()}\n" for line in lines)

    return respond


def test_answer_lines_answers_stdin_in_order():
    calls, stdout = [], io.BytesIO()
    stdin = io.BytesIO(b"".join(b"line %d\n" % i for i in range(7)) + b"bad \xff\n")
    answer_lines(_respond(calls), max_lines=3, stdin=stdin, stdout=stdout)
    assert stdout.getvalue().decode() == "".join(f"LINE {i}\n" for i in range(7)) + "BAD \ufffd\n"
    assert [line for _, lines, _ in calls for line in lines][-1] == "bad \ufffd"
    assert all(1 <= len(lines) <= 3 for _, lines, _ in calls)
    starts = [start for start, _, _ in calls]
    assert starts == [sum(len(lines) for _, lines, _ in calls[:i]) for i in range(len(calls))]
    assert [index for _, _, replaced in calls for index in replaced] == [7]


def test_answer_lines_flushes_each_answer_while_stdin_stays_open():
    """A buffered stdout (a pipe, as under a program that waits for each answer) gets each
    answer before the next line is sent (the scripts' tests run unbuffered: they cannot tell)."""
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    stdin, stdout = os.fdopen(in_read, "rb"), os.fdopen(out_write, "wb")  # stdout: 8 KiB buffer
    answering = threading.Thread(
        target=answer_lines,
        args=(_respond([]),),
        kwargs=dict(max_lines=4, stdin=stdin, stdout=stdout),
        daemon=True,
    )
    answering.start()
    with os.fdopen(in_write, "wb", buffering=0) as writer:
        for line, answer in ((b"one\n", b"ONE\n"), (b"two\n", b"TWO\n")):
            writer.write(line)
            assert select.select([out_read], [], [], 10)[0], f"no answer to {line!r}"
            assert os.read(out_read, 100) == answer
    answering.join(timeout=10)
    assert not answering.is_alive()
    for stream in (stdin, stdout):
        stream.close()
    os.close(out_read)


def test_answer_lines_writes_a_file_once_every_line_is_answered(tmp_path):
    calls, output = [], tmp_path / "out.txt"
    answer_lines(_respond(calls), (["a", "b"], []), output=output, stdout=io.BytesIO())
    assert calls == [(0, ["a", "b"], [])] and output.read_text() == "A\nB\n"
    stdout, stopped = io.BytesIO(), tmp_path / "stopped.txt"
    stdin = io.BytesIO(b"".join(b"%d\n" % i for i in range(5)))
    with pytest.raises(ValueError, match="line 4: cannot answer"):  # answered one line a batch
        answer_lines(_respond([], fail_at=3), output=stopped, stdin=stdin, stdout=stdout)
    assert not stopped.exists() and stdout.getvalue() == b""
    with pytest.raises(ValueError, match="line 4: cannot answer"):
        answer_lines(_respond([], fail_at=3), stdin=io.BytesIO(b"0\n1\n2\n3\n"), stdout=stdout)
    assert stdout.getvalue() == b"0\n1\n2\n"  # the answers before the stop were written


def test_read_lines_names_an_input_it_cannot_read(tmp_path):
    from absl import app

    (tmp_path / "in.txt").write_bytes(b"one\ntwo \xff\n")
    assert read_lines(tmp_path / "in.txt") == (["one", "two \ufffd"], [1])
    with pytest.raises(app.UsageError) as raised:
        read_lines(tmp_path / "missing.txt")
    assert (
        str(raised.value)
        == f"Cannot read --input={tmp_path}/missing.txt: No such file or directory"
    )


LINES = ["twenty one", "", "four hundred thousand three"]
NBEST = 3


@pytest.fixture(scope="module")
def nbest_file_run(trained_run, tmp_path_factory):
    """translate.py --nbest=3 over `LINES` from a file: `(stdout lines, seconds the run took)`."""
    source = tmp_path_factory.mktemp("nbest") / "source.txt"
    source.write_text("".join(f"{line}\n" for line in LINES), encoding="utf-8")
    start = time.monotonic()
    stdout = run_script(
        "translate.py", f"--model_dir={trained_run}", f"--input={source}", f"--nbest={NBEST}"
    ).stdout
    return stdout.splitlines(), time.monotonic() - start


def _nbest_rows(lines):
    rows = [line.split("\t") for line in lines]
    assert all(len(row) == 3 for row in rows), lines
    return [(int(index), float(score), text) for index, score, text in rows]


def test_translate_nbest_prints_k_sorted_hypotheses_per_line(nbest_file_run):
    rows = _nbest_rows(nbest_file_run[0])
    assert [index for index, _, _ in rows] == [i for i in range(len(LINES)) for _ in range(NBEST)]
    for i, line in enumerate(LINES):
        hypotheses = [(score, text) for index, score, text in rows if index == i]
        scores = [score for score, _ in hypotheses]
        assert scores == sorted(scores, reverse=True), hypotheses
        if line:
            assert len({text for _, text in hypotheses}) == NBEST  # K different hypotheses
        else:  # a blank line: nothing decoded
            assert hypotheses == [(0.0, "")] * NBEST


def test_translate_nbest_larger_than_the_beam_is_one_line(trained_run):
    failed = run_script(
        "translate.py", f"--model_dir={trained_run}", "--nbest=5", "--beam_size=4", check=False
    )
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines()[-1] == (
        "error: --nbest=5 must be at most the beam size (4): give --beam_size=5 or more "
        "(see --help)"
    )


def test_translate_answers_each_stdin_line_before_the_next(trained_run, nbest_file_run):
    """Each line is written only after the previous one's answer was read (stdin stays open);
    the answers are the n-best lists' first hypotheses and scores (the same beam search)."""
    nbest_lines, seconds = nbest_file_run
    received = []
    with ScriptSession("translate.py", f"--model_dir={trained_run}", "--scores") as session:
        timeout = 2 * seconds + 60  # the first answer waits for the model: about a file run
        for line in LINES:
            session.send(line)
            received.append(session.answer(timeout))
            timeout = NEXT_ANSWER_TIMEOUT
        status, stderr = session.close(NEXT_ANSWER_TIMEOUT)
        assert status == 0, stderr[-3000:]
        assert session.answer(NEXT_ANSWER_TIMEOUT) is None  # nothing more
    best = {index: (score, text) for index, score, text in reversed(_nbest_rows(nbest_lines))}
    assert received == [f"{text}\t{score:.4f}" for score, text in (best[i] for i in range(3))]


STOPPING_SCRIPT = """
import sys
from keras_transformer import cli, streaming

def main(argv):
    for batch in streaming.line_batches(sys.stdin.buffer, 4):
        raise ValueError(f"bad line {batch[0]!r}")

cli.run(main, tensorflow_only=False)
"""


def test_a_script_stopping_while_its_input_stays_open_exits_with_its_status(tmp_path):
    """A script that stops at a line while its standard input stays open (the reader thread
    blocked in a read) exits with its status and one line: finalizing the interpreter then
    would abort the process (SIGABRT: stdin's lock held by the blocked read)."""
    import subprocess
    import sys

    from tests.scripts import script_environment

    script = tmp_path / "stop.py"
    script.write_text(STOPPING_SCRIPT)
    process = subprocess.Popen(
        [sys.executable, str(script)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=script_environment(),
    )
    try:
        process.stdin.write(b"first\n")
        process.stdin.flush()  # and stdin stays open
        status = process.wait(timeout=300)
        stderr = process.stderr.read().decode()
    finally:
        process.kill()
        process.stdin.close()
    assert status == 1, (status, stderr[-2000:])
    assert stderr.strip().splitlines()[-1] == "error: bad line b'first\\n'"
