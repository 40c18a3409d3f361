"""Owns driving one run's search in this process: the one implementation behind every door
that runs a search (``tunefleet coordinator``, ``tunefleet tune`` with local workers or with
``--workers 0``, the search alone, and :func:`tunefleet.tune`).

Driving is the same whichever door: the stop rule (:mod:`tunefleet.stopping`: a first
signal stops the run cleanly, a second ends the command with 130), the engine's run until a
stop rule holds, and the run's progress line read from the database on a connection of its
own, at most every ``every_s``. What a door adds is only its own: what it checks and seeds
before the run (``tune`` seeds the problem's default configuration as a baseline and plans
its local workers), what it starts inside the stop rule before the search (``tune``'s local
workers) and how it prints (``coordinator`` for scripts, ``tune`` a live line and the report).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tunefleet.stopping import StopRule
from tunefleet.text.progress import ProgressReader

if TYPE_CHECKING:
    from tunefleet.settings import DatabaseSettings

    from .engine import Coordinator, Progress, RunResult

#: Called at most every ``every_s`` (and with the first record that shows the search's end
#: game) with the run's progress line (None while the database cannot be read) and the
#: engine's own progress.
OnTick = Callable[[str | None, "Progress"], None]


class SearchSession:
    """One run's search, driven in this process (see the module's docstring)."""

    def __init__(
        self,
        coordinator: Coordinator,
        run_id: int,
        db: DatabaseSettings,
        url: str,
        *,
        every_s: float,
    ) -> None:
        self.coordinator = coordinator
        self.run_id = run_id
        self.every_s = every_s
        self.stop_rule = StopRule(coordinator.request_stop)
        self._reader = ProgressReader(db, url, run_id)

    @property
    def signals(self) -> int:
        """How many stop signals came while the search ran."""
        return self.stop_rule.count

    def run(self, on_tick: OnTick, before: Callable[[], None] | None = None) -> RunResult:
        """Drive the search until a stop rule holds, under the stop rule; ``before`` runs
        first, inside it (a stop signal while local workers start stops the run too). A
        second signal raises :class:`KeyboardInterrupt` out of here."""
        last = -math.inf
        end_game_told = False

        def progress(p: Progress) -> None:
            nonlocal last, end_game_told
            now = time.monotonic()
            # The record in which the end game first shows is never held back: a run whose
            # last trials all end within ``every_s`` of it would end without saying so.
            news = p.end_game is not None and not end_game_told
            if now - last < self.every_s and not news:
                return
            last = now
            end_game_told = end_game_told or p.end_game is not None
            on_tick(self._reader.line(p.unserved), p)

        with self.stop_rule:
            if before is not None:
                before()
            return self.coordinator.run(self.run_id, progress_callback=progress)

    def final_row(self) -> dict[str, Any] | None:
        """The run's progress row once the search has ended (None when it cannot be read);
        closes the reader's connection."""
        try:
            return self._reader.row()
        finally:
            self._reader.close()

    def close(self) -> None:
        self._reader.close()
