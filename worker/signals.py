"""How a worker is asked to stop, and how its wait is cut short.

Shutdown: the first SIGTERM/SIGINT asks for a graceful stop: the worker stops claiming,
releases every held trial that is not being timed (back to pending, attempt not counted),
lets the one being timed finish and records it, then exits 0. A second signal kills the
children and exits at once; the leases expire. SIGUSR1 asks for the same graceful stop but
never escalates: ``tunefleet tune`` makes it its workers' parent-death signal, which Linux
sends once for every thread of the dying parent. A graceful stop that cannot reach the
database gives up after one lease (``stop_deadline``; the loop's ``stop`` step).

Wake-ups: one socket pair. Python writes to it when a signal arrives
(``signal.set_wakeup_fd``) and the heartbeat thread when it lost a lease (:meth:`wake`); the
loop waits on its read end (:attr:`waitable`) beside the children and the database, so
either ends the wait at once.

A worker embedded in another program's thread installs no handlers: that program owns the
signals.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from .supervise import Child

log = logging.getLogger("tunefleet.worker")


class Signals:
    """The stop request of one worker and its wake-up pipe."""

    def __init__(self, grace_s: float, children: Callable[[], Iterable[Child]]) -> None:
        #: How long a graceful stop may wait for the database (the lease).
        self.grace_s = grace_s
        #: The processes a second signal kills before the worker exits.
        self.children = children
        self.stopping = False
        self.stop_deadline: float | None = None
        #: SIGTERM/SIGINT received so far.
        self.count = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._old_handlers: dict[int, Any] = {}
        self._old_wakeup_fd = -1

    @property
    def waitable(self) -> socket.socket:
        """Readable when something woke the worker (drain it with :meth:`drain`)."""
        return self._wake_r

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # embedded in another program's thread: that program handles signals
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        self._old_handlers[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_parent_gone)
        self._old_wakeup_fd = signal.set_wakeup_fd(self._wake_w.fileno())

    def restore(self) -> None:
        if not self._old_handlers:
            return
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._old_wakeup_fd)

    def close(self) -> None:
        """Restore the handlers and close the pipe."""
        self.restore()
        self._wake_r.close()
        self._wake_w.close()

    def wake(self) -> None:
        """End the loop's wait now (safe from any thread)."""
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # already awake

    def drain(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _stop(self) -> None:
        self.stopping = True
        self.stop_deadline = time.monotonic() + self.grace_s

    def _on_parent_gone(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping:
            self._stop()
            log.warning(
                "SIGUSR1: the process that started this worker is gone; finishing the trial "
                "being timed, releasing the others, then exiting"
            )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            self._stop()
            log.warning(
                "%s: finishing the trial being timed, releasing the others, then exiting "
                "(send it again to exit at once)",
                signal.Signals(signum).name,
            )
            return
        # Second signal: abort now. Children first, or a hung kernel would outlive us.
        for child in self.children():
            if child.proc is not None:
                try:
                    child.proc.kill()
                except Exception:
                    pass
        os.write(
            2,
            b"tunefleet worker: aborted; held trials return to the queue when their "
            b"leases expire\n",
        )
        os._exit(128 + signum)
