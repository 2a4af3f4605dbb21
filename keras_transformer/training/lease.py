"""One owner per run directory: a lease file that a live trainer renews, and that a successor
takes over once its owner stops renewing it.

`<run>/lease.json` (`runs.lease_path`) names the process that trains into the run: a random
owner id, the host, the pid, and the time of its last heartbeat. The chief of a run takes
the lease first thing at start, renews it while it starts up (a background heartbeat, until
training begins) and then at every log line and before every checkpoint save, and removes it
when it stops (finished, preempted or failed). A second process that starts on the same
directory while the heartbeat is younger than the timeout is refused in one line
(`RunDirectoryBusyError`): two processes never interleave their saves. A process killed
without a chance to clean up (SIGKILL, a lost machine) leaves its lease behind. On the same
host, a start whose predecessor's pid is no longer running takes the lease over at once; from
another host (a restarted pod, another machine), once its heartbeat is older than the
timeout, so the same command continues after at most one timeout. Either takeover is logged. An owner that
finds the lease taken over (it stalled for longer than the timeout) stops before its next
save (`LeaseLostError`).

The lease is a file on the run's own storage (any `keras_transformer.fs` path), written
atomically; reading it, comparing and writing are separate steps, so two processes that
take over an expired lease in the same moment can both believe they won: the later write
wins, and the other stops at its first renewal, before any checkpoint. Heartbeats are wall
clock times of the hosts involved; their clocks must agree to well within the timeout.
"""

import json
import os
import secrets
import socket
import threading
import time

from absl import logging

from keras_transformer import fs, runs

DEFAULT_LEASE_TIMEOUT = 1800.0
"""Seconds without a heartbeat after which a run's lease may be taken over (`--lease_timeout`).
It must exceed the longest stretch without a log line or a save (the first steps' tracing and
compilation, a validation)."""


class RunDirectoryBusyError(RuntimeError):
    """Another live process (its heartbeat younger than the timeout) trains into the run directory."""


class LeaseLostError(RuntimeError):
    """Another process took the run directory over from this one."""


class RunLease:
    """The lease of one process on one run directory (see the module docstring).

    Args:
        model_dir: the run directory.
        timeout: seconds without a heartbeat after which another process may take the lease over.
    """

    def __init__(self, model_dir, timeout=DEFAULT_LEASE_TIMEOUT):
        if not timeout > 0:
            raise ValueError(
                f"The lease timeout must be a positive number of seconds. Received: {timeout!r}"
            )
        self.model_dir = model_dir
        self.path = runs.lease_path(model_dir)
        self.timeout = float(timeout)
        self.owner = {
            "owner": secrets.token_hex(8),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        self._held = False
        self._lock = threading.Lock()
        self._stop_heartbeat = None

    def holder(self):
        """The lease file's content (a dict), or None when there is none or it cannot be parsed."""
        try:
            text = fs.read_text(self.path)
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(text)
            float(holder["heartbeat"])
            return holder
        except (ValueError, KeyError, TypeError):
            logging.warning("Ignoring the unreadable lease file %s", self.path)
            return None

    def acquire(self):
        """Take the lease: free, expired, or already this process's.

        Raises:
            RunDirectoryBusyError: another process renewed it less than `timeout` seconds ago.
        """
        holder = self.holder()
        if holder is not None and holder.get("owner") != self.owner["owner"]:
            age = time.time() - float(holder["heartbeat"])
            if self._ended_here(holder):
                logging.warning(
                    "Taking over %s from %s pid %s, which is no longer running",
                    self.model_dir,
                    holder.get("host"),
                    holder.get("pid"),
                )
            elif age < self.timeout:
                raise self._busy(holder, age)
            else:
                logging.warning(
                    "Taking over %s from %s pid %s, whose last heartbeat was %.0f s ago (lease timeout "
                    "%.0f s)",
                    self.model_dir,
                    holder.get("host"),
                    holder.get("pid"),
                    age,
                    self.timeout,
                )
        self._write()
        holder = self.holder()
        if (
            holder is None or holder.get("owner") != self.owner["owner"]
        ):  # another start wrote after this one
            raise self._busy(holder or {}, 0.0)
        self._held = True
        return self

    def renew(self):
        """Write a new heartbeat, after checking that the lease is still this process's.

        Raises:
            LeaseLostError: another process took the lease over (or removed it); this one
                must stop without writing into the run.
        """
        with self._lock:
            holder = self.holder()
            if holder is None or holder.get("owner") != self.owner["owner"]:
                self._held = False
                taker = (
                    f"{holder.get('host')} pid {holder.get('pid')}"
                    if holder
                    else "someone (it is gone)"
                )
                raise LeaseLostError(
                    f"{self.model_dir} was taken over by {taker} after this process renewed its lease {self.path} "
                    f"for longer than the {self.timeout:.0f} s lease timeout; stopping without saving"
                )
            self._write()

    def release(self):
        """Remove the lease if this process still holds it (nothing on errors: a successor takes it over anyway)."""
        self.stop_heartbeat()
        if not self._held:
            return
        self._held = False
        try:
            holder = self.holder()
            if holder is not None and holder.get("owner") == self.owner["owner"]:
                fs.remove(self.path)
        except OSError as error:
            logging.warning("Could not remove the lease %s: %s", self.path, error)

    def start_heartbeat(self, every=None):
        """Renew the lease from a background thread every `every` seconds (default: a quarter of the
        timeout) until `stop_heartbeat`: for start-up stages that log nothing for a long time."""
        self.stop_heartbeat()
        stop = self._stop_heartbeat = threading.Event()
        every = self.timeout / 4 if every is None else every

        def beat():
            while not stop.wait(every):
                try:
                    self.renew()
                except (
                    LeaseLostError,
                    OSError,
                ) as error:  # the main thread finds out at its next renewal
                    logging.warning("Lease heartbeat failed: %s", error)
                    return

        threading.Thread(target=beat, name="lease-heartbeat", daemon=True).start()

    def stop_heartbeat(self):
        if self._stop_heartbeat is not None:
            self._stop_heartbeat.set()
            self._stop_heartbeat = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()
        return False

    def _ended_here(self, holder):
        """Whether `holder` ran on this host and its process is gone (a run killed outright and
        restarted on the same machine need not wait for the timeout). A lease of this very pid
        (another lease object of this process) counts as live."""
        if holder.get("host") != self.owner["host"]:
            return False
        try:
            pid = int(holder["pid"])
        except (KeyError, TypeError, ValueError):
            return False
        if pid <= 0 or pid == self.owner["pid"]:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # alive, owned by another user
            return False
        return False

    def _write(self):
        fs.write_text(
            self.path, json.dumps({**self.owner, "heartbeat": time.time()}, sort_keys=True)
        )

    def _busy(self, holder, age):
        return RunDirectoryBusyError(
            f"{self.model_dir} is being trained by {holder.get('host')} pid {holder.get('pid')} (its lease "
            f"{self.path} was renewed {age:.0f} s ago; it expires {self.timeout:.0f} s after the last renewal, "
            "--lease_timeout): run the same command again once that process has stopped"
        )
