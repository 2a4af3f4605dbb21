"""Lines read as they arrive, for the scripts that answer standard input line by line
(`experiments/translate.py`, `experiments/parse.py`).

A thread reads the stream one line at a time into a bounded queue; the caller takes every
line already there (at least one, at most `max_lines`) as one batch, so a line typed at a
terminal, or written by a program that waits for its answer, is answered at once, and a
file piped in still gives full batches.

Example:

>>> import io
>>> [batch for batch in line_batches(io.BytesIO(b"one\\ntwo\\nthree"), max_lines=2)]
[[b'one\\n', b'two\\n'], [b'three']]
"""

import queue
import threading

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
