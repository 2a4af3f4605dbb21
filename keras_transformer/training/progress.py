"""What a user sees of a running training loop, and how it learns of a preemption."""

import signal
import sys
import threading
import time

from absl import logging


class StatusLine:
    """One line of progress on `stream` (default stderr; stdout keeps a script's results):
    rewritten in place on a terminal, a line per `show` elsewhere (a log file gets no carriage
    returns). Used as a context manager, it ends a line left open on the way out.
    """

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self._open_width = None  # the width of the line left open on a terminal

    def show(self, text, last=False):
        """Show `text`; `last` ends its line (nothing follows it in place)."""
        if not self.stream.isatty():
            self.stream.write(text + "\n")
        else:
            padding = " " * max((self._open_width or 0) - len(text), 0)
            self.stream.write("\r" + text + padding)
            self._open_width = len(text)
            if last:
                self.end()
        self.stream.flush()

    def end(self):
        """End a line left open, before other output (a log line) or at the end."""
        if self._open_width is not None:
            self.stream.write("\n")
            self.stream.flush()
            self._open_width = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.end()
        return False


class ProgressMeter:
    """Loss and token rate over the updates since the last log line, skipped updates, the ETA,
    and the line that shows them.

    `report` writes `step N/M loss … lr … <rate> tok/s skipped … ETA h:mm:ss`: with `progress`,
    behind a bar of the steps done on `line`, a `StatusLine` of `stream` (its user ends it
    before other output, a validation's log line, and on the way out); without, as an absl
    INFO line. `note` writes a result of the run (a validation, a score) where the user
    looks.
    """

    BAR_WIDTH = 30

    def __init__(self, train_steps, progress, start_step, stream=None):
        self.train_steps = train_steps
        self.start_step = start_step
        self.progress = progress
        self.line = StatusLine(stream)
        self.run_start = time.time()
        self._reset()

    def _reset(self):
        self.window_start, self.loss_sum, self.tokens = time.time(), 0.0, 0.0

    def add(self, loss_sum, tokens):
        self.loss_sum += loss_sum
        self.tokens += tokens

    def window(self, step):
        """`(loss per token, tokens/s, ETA seconds)` of the window; starts a new one."""
        loss = self.loss_sum / max(self.tokens, 1.0)
        rate = self.tokens / max(time.time() - self.window_start, 1e-9)
        eta = (
            (time.time() - self.run_start)
            / max(step - self.start_step, 1)
            * (self.train_steps - step)
        )
        self._reset()
        return loss, rate, eta

    def report(self, step, loss, lr, rate, skipped, eta):
        figures = (
            f"loss {loss:.4f} lr {lr:.3g} {rate:.0f} tok/s skipped {skipped} "
            f"ETA {format_seconds(eta)}"
        )
        if not self.progress:
            logging.info("step %d/%d %s", step, self.train_steps, figures)
            return
        done = self.BAR_WIDTH * min(step, self.train_steps) // max(self.train_steps, 1)
        bar = "=" * done + "." * (self.BAR_WIDTH - done)
        self.line.show(
            f"step {step}/{self.train_steps} [{bar}] {figures}", last=step >= self.train_steps
        )

    def note(self, message, *args):
        """A result of the run (`message % args`): an absl INFO line; with `progress`, where
        absl's INFO lines are not shown (a notebook, a program that never set absl's
        verbosity), also a line on the stream, below the progress line: who watches the
        progress sees the validation loss and the scores too."""
        logging.info(message, *args, stacklevel=2)  # named by the caller's file and line
        if self.progress and not logging.level_info():
            self.line.end()
            self.line.show(message % args, last=True)


class TerminationSignal:
    """Records SIGTERM (main thread only) instead of dying mid-step or mid-start-up.

    `received` turns True; the training loop finishes its step, saves and returns, and
    the start-up checks it between its stages (see `training.run`).
    """

    def __init__(self):
        self.received = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        del signum, frame
        logging.warning("SIGTERM received: stopping at the next safe point.")
        self.received = True

    def __exit__(self, *exc_info):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False


def format_seconds(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
