"""Lines read as they arrive, for the scripts that answer standard input line by line
(`experiments/translate.py`, `experiments/parse.py`), and the loop of those scripts that reads
their input, answers it and writes the answers (`answer_lines`).

A thread reads the stream one line at a time into a bounded queue; the caller takes every
line already there (at least one, at most `max_lines`) as one batch, so a line typed at a
terminal, or written by a program that waits for its answer, is answered at once, and a
file piped in still gives full batches.

Example:

>>> import io
>>> [batch for batch in line_batches(io.BytesIO(b"one\\ntwo\\nthree"), max_lines=2)]
[[b'one\\n', b'two\\n'], [b'three']]
"""

import errno
import os
import queue
import sys
import threading

STDIN_NAME = "<stdin>"
"""What a script's warnings and errors call its standard input (`<stdin>, line 3: ...`), as
Python names it."""

MAX_BATCHES = 8
"""A script reading a stream translates at most this many `--batch_size` batches of the lines
already there at once: a file piped in is still sorted by length, within that many batches."""

_END = object()  # the reader's last item: the stream ended (or failed)

_READERS = []  # the reader threads started (`reading`)


def reading():
    """Whether a reader thread of `line_batches` is still blocked reading its stream.

    A process that ends then (a script stopping at a bad line while its standard input stays
    open) must not finalize the interpreter: closing `sys.stdin` waits for the lock the blocked
    read holds, and CPython aborts ("could not acquire lock ... at interpreter shutdown,
    possibly due to daemon threads"). `cli.run` ends such a process with `os._exit`.
    """
    return any(thread.is_alive() for thread in _READERS)


def line_batches(stream, max_lines):
    """Yield the lines of a binary `stream` in batches of the lines already available.

    Waits only while no line is available. A reader thread (a daemon: an abandoned read does
    not keep the process alive) reads ahead at most `max_lines` lines.

    Args:
        stream: a binary stream with `readline` (e.g. `sys.stdin.buffer`).
        max_lines: the most lines in one batch.

    Yields:
        lists of 1 to `max_lines` lines (bytes, each with its line end; the stream's last line
        may have none).

    Raises:
        the error that reading the stream raised (e.g. `OSError`), after the lines read before it.
    """
    if not isinstance(max_lines, int) or max_lines < 1:
        raise ValueError(f"max_lines must be an int >= 1. Received: max_lines={max_lines!r}")
    lines = queue.Queue(maxsize=max_lines)
    failure = []

    def read():
        try:
            for line in iter(stream.readline, b""):
                lines.put(line)
        except BaseException as error:  # re-raised by the consumer
            failure.append(error)
        finally:
            lines.put(_END)

    reader = threading.Thread(target=read, name="line reader", daemon=True)
    _READERS[:] = [thread for thread in _READERS if thread.is_alive()] + [reader]
    reader.start()
    ended = False
    while not ended:
        batch = []
        line = lines.get()  # wait for the first line
        while line is not _END:
            batch.append(line)
            if len(batch) == max_lines:
                break
            try:
                line = lines.get_nowait()  # and take the ones already there
            except queue.Empty:
                break
        ended = line is _END
        if batch:
            yield batch
    if failure:
        raise failure[0]


def decoded_batches(stream, max_lines):
    """`line_batches` decoded as the exported SavedModel decodes text (`decoding.decode_lines`).

    Yields:
        `(start, lines, replaced)`: the 0-based index of the batch's first line in the stream,
        its lines (str, without line ends) and the stream indices of those that held invalid
        UTF-8 (now U+FFFD).
    """
    from keras_transformer.decoding import decode_lines

    start = 0
    for batch in line_batches(stream, max_lines):
        lines, replaced = decode_lines(b"".join(batch))
        yield start, lines, [start + index for index in replaced]
        start += len(lines)


def read_lines(path):
    """The lines of a script's `--input=<path>` as `decoded_batches` decodes a stream:
    `(lines, replaced)` (see `decoding.decode_lines`).

    Raises:
        absl.app.UsageError: one line naming `--input=<path>` and why it cannot be read.
    """
    from absl import app

    from keras_transformer import fs
    from keras_transformer.decoding import decode_lines

    try:
        data = fs.read_bytes(path)
    except OSError as error:
        # The system's reason for a known cause; TensorFlow's own (it names the path) otherwise.
        known = error.errno is not None and error.errno != errno.EIO
        reason = os.strerror(error.errno) if known else error.strerror
        raise app.UsageError(f"Cannot read --input={path}: {reason}") from error
    return decode_lines(data)


def answer_lines(respond, lines=None, output=None, max_lines=1, stdin=None, stdout=None):
    """Answer a script's input with `respond` and write its answers, in input order.

    Args:
        respond: `(start, lines, replaced) -> str`, the answers' text for `lines` (str, without
            line ends), the first of them input line `start` (0-based); `replaced`: the input
            indices of the lines whose invalid UTF-8 became U+FFFD. An error it raises stops
            the loop: the answers written before stay, `output` is not written.
        lines: `(lines, replaced)` of a whole file (`read_lines`), answered in one call; None:
            the lines of `stdin` (default: the standard input), each answered as it arrives in a
            batch with the lines already there (`decoded_batches`, at most `max_lines`).
        output: a file (any `fs` path) written once, when every line is answered; None:
            `stdout` (default: the standard output) in UTF-8, flushed after each answer.
    """
    if lines is None:
        batches = decoded_batches(stdin or sys.stdin.buffer, max_lines)
    else:
        batches = [(0, *lines)]
    answers = []
    for start, batch, replaced in batches:
        text = respond(start, batch, replaced)
        if output is None:
            stream = stdout or sys.stdout.buffer
            stream.write(text.encode("utf-8"))
            stream.flush()
        else:
            answers.append(text)
    if output is not None:
        from keras_transformer import fs

        fs.write_text(output, "".join(answers))
