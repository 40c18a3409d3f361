"""The one stop rule of a process that drives a run (``tunefleet coordinator``, ``tunefleet
tune`` with or without local workers, :func:`tunefleet.tune` on the main thread).

The first SIGINT, SIGTERM or SIGHUP (Ctrl-C, ``kill``, a batch system's TERM, a closed
terminal) asks the run to stop cleanly: pending trials cancelled, the run ``stopped`` and
resumable; one line on stderr says so. Any later one, of any of the three, raises
:class:`KeyboardInterrupt` where the process is (a statement waiting on the database is
cancelled by psycopg), so a stop that hangs ends at once and the command exits 130.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: What the first stop signal prints.
STOPPING = (
    "tunefleet: stopping the run cleanly (pending trials cancelled, resumable); "
    "a second Ctrl-C or TERM ends at once\n"
)


class StopRule:
    """Installs the rule for the ``with`` block (main thread only: elsewhere signal handlers
    cannot be set, and the caller owns stopping); ``count`` is how many stop signals came."""

    def __init__(self, request_stop: Callable[[], None]) -> None:
        self._request_stop = request_stop
        self.count = 0
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt  # a second one: stop stopping
        # os.write, not print: the handler may interrupt a write to sys.stderr (a progress
        # line), and a buffered stream refuses a reentrant write.
        os.write(2, STOPPING.encode())
        self._request_stop()

    def __enter__(self) -> StopRule:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
