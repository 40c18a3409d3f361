"""Keeping the embedded server up under a command that runs on it (``tunefleet tune``).

A postmaster that dies (killed, out of memory) under a run leaves every client of it retrying
its connection: the coordinator and the workers ride out an outage and reconnect by
themselves once the server is back on its address, but nothing brings it back. A command
that runs on the embedded server therefore keeps it: :class:`ServerKeeper` looks at the
server's own record (``postmaster.pid`` against the process table) every ``every_s`` seconds
in a thread of its own and starts the server again, on the address it had, when it is down
without anybody having stopped it (``tunefleet db stop --force`` leaves it down). Each
restart is told once through :meth:`ServerKeeper.restarts`, for the command to say.
"""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path
from types import TracebackType

import psycopg

from tunefleet.db.embedded.server import EmbeddedServer
from tunefleet.errors import TunefleetError

_log = logging.getLogger(__name__)

#: Seconds between two looks at the server: an outage costs the run about this much more.
KEEP_EVERY_S = 1.0


class ServerKeeper:
    """Starts ``server`` again whenever it is found down but not stopped on purpose, while
    the ``with`` block runs."""

    def __init__(self, server: EmbeddedServer, every_s: float = KEEP_EVERY_S) -> None:
        self.server = server
        self.every_s = every_s
        self._stop = threading.Event()
        self._restarted: queue.SimpleQueue[Path] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._keep, name="tunefleet-keeper", daemon=True)

    def __enter__(self) -> ServerKeeper:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def restarts(self) -> list[Path]:
        """The restarts since the last call (the data directory of each), oldest first."""
        told = []
        while not self._restarted.empty():
            told.append(self._restarted.get_nowait())
        return told

    def _keep(self) -> None:
        while not self._stop.wait(self.every_s):
            self.check()

    def check(self) -> bool:
        """Start the server again if it is down and nobody stopped it; whether it did."""
        if self.server.status().running or self.server.stopped_on_purpose():
            return False
        try:
            started = self.server.start().started
        except (TunefleetError, OSError, psycopg.Error) as exc:
            # The dead postmaster's backends may still hold its shared memory for a moment:
            # the next look tries again.
            _log.info("the embedded server is down and did not start yet: %s", exc)
            return False
        if started:
            self._restarted.put(self.server.data_dir)
        return started
