"""The one progress line of a run, read from one statement.

``tunefleet tune`` rewrites it on a terminal (a plain line every few seconds otherwise) and
``tunefleet coordinator`` prints it to stderr; both get it from :class:`ProgressReader`,
which reads :func:`tunefleet.queries.report.run_progress` (the ``run_progress`` view: counts
per state, best, rate; plus the budget and the workers able to serve the run). The engine's
own counters are not recounted into another format.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from tunefleet.db.engine import connect
from tunefleet.errors import DatabaseUnavailable
from tunefleet.queries import report
from tunefleet.settings import DatabaseSettings
from tunefleet.text.output import (
    best_mark,
    gflops,
    plus_minus,
    remeasured_text,
    seconds,
    trial_counts,
)


def progress_line(p: Mapping[str, Any], unserved: str | None = None) -> str:
    """One line of progress from a :func:`~tunefleet.queries.report.run_progress` row:
    search trials finished (of ``--max-trials``) by verdict and in flight, re-measurements
    of the best apart, best so far, rate, live workers able to serve it, elapsed; then, when
    workers stand aside from the run, how many, and why nobody can serve it (the
    coordinator's ``unserved``) when that is so."""
    workers = int(p.get("servable_workers") or 0)
    extra = remeasured_text(p)
    return (
        f"run {p['run_id']}: {trial_counts(p)}, {p['running']} running, {p['pending']} pending"
        + (f", {p['cached']} cached" if p.get("cached") else "")
        + (f"; {extra} (extra)" if extra else "")
        + f" | best {gflops(p['best_gflops'])} GFLOP/s{plus_minus(p)}"
        + best_mark(p.get("best_status"))
        + f" | {float(p['evaluations_per_minute']):.1f} eval/min"
        + f" | {workers} worker{'s' if workers != 1 else ''}"
        + f" | {seconds(p['elapsed_s'])}"
        + (f" | {p['standing_aside']} standing aside" if p.get("standing_aside") else "")
        + (f" | {unserved}" if unserved else "")
    )


class ProgressReader:
    """Reads one run's progress line on a connection of its own. A progress line must never
    stop a run: while the database is away :meth:`line` returns None (the coordinator rides
    out the outage on its own connection) and the next call connects again."""

    def __init__(self, settings: DatabaseSettings, url: str, run_id: int) -> None:
        self.settings = settings
        self.url = url
        self.run_id = run_id
        self._conn: psycopg.Connection[Any] | None = None

    def line(self, unserved: str | None = None) -> str | None:
        """The line now, or None when the run or the database cannot be read."""
        p = self.row()
        return None if p is None else progress_line(p, unserved)

    def row(self) -> dict[str, Any] | None:
        """The run's ``run_progress`` row now (its best among it), or None when the run or the
        database cannot be read."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.url, self.settings)
            return report.run_progress(self._conn, self.run_id)
        except (psycopg.Error, DatabaseUnavailable):
            self.close()
            return None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
