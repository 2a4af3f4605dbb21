"""What a user sees of a running training loop, and how it learns of a preemption."""

import signal
import threading
import time

import keras
from absl import logging


class ProgressMeter:
    """Loss and token rate over the updates since the last log line, skipped updates, and the ETA."""

    def __init__(self, train_steps, progress, start_step):
        self.train_steps = train_steps
        self.start_step = start_step
        self.run_start = time.time()
        self.progress = keras.utils.Progbar(
            train_steps, stateful_metrics=["loss", "lr", "tok/s", "skipped"]
        )
        if progress:
            self.progress.update(start_step)
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
