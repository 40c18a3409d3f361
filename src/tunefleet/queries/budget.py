"""The statements of a run's time budget: how fast the run's trials come back (what the
coordinator plans its confirmation from), handing in-flight work back at the deadline, and
reviving what was handed back when the run is resumed.

Same conventions as :mod:`tunefleet.queries.search`: one function per statement, each on an
open autocommit connection (its own short transaction), called only by the coordinator that
holds the run's advisory lock; locking is stated per function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row

from tunefleet.vocabulary import NOTIFY_CHANNEL

Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class Pace:
    """How the run's trials measured by workers came back so far (:func:`run_pace`)."""

    #: Search trials a worker finished (cache answers and rejected-at-once trials excluded).
    measured: int
    #: Median seconds from a claim to its result (code generation, waiting in the worker,
    #: timing): what one more trial costs a worker that starts it now. None before any.
    turnaround_s: float | None
    #: Seconds between the first and the last of those results (None below two): the
    #: fleet's throughput is ``(measured - 1) / span_s``.
    span_s: float | None
    #: The 90th percentile of those turnarounds: how long the slow ones take (None before
    #: any). The last trial in flight ends no sooner (:meth:`~tunefleet.coordinator.budget.
    #: Speed.drains`).
    slow_turnaround_s: float | None = None
    #: The median code generation and build seconds of the measured search trials (None
    #: before any): what a cold build pays again, without caches.
    compile_s: float | None = None
    #: The median turnaround of the run's finished confirmations (cold builds: a fresh
    #: process, code generation without caches, build, timing; None before any).
    cold_s: float | None = None


@dataclass(frozen=True)
class HandedBack:
    """What :func:`hand_back` cancelled: trials that were pending, and trials that were
    running (their workers drop them at their next heartbeat)."""

    pending: int
    running: int

    @property
    def total(self) -> int:
        return self.pending + self.running


def run_pace(conn: Conn, run_id: int) -> Pace:
    """The run's :class:`Pace`, from its finished trials that a worker claimed (``started_at``
    set): the search's, and the confirmations' for ``cold_s``. Locks: none (reads the run's
    rows by trial_run_state_idx, their measurements by primary key)."""
    cur = conn.cursor(row_factory=class_row(Pace))
    row = cur.execute(
        """
        WITH finished AS (
            SELECT t.purpose, t.state, t.finished_at, m.compile_s,
                   extract(epoch FROM t.finished_at - t.started_at)::float8 AS turnaround
              FROM tunefleet.trial t
              LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
             WHERE t.run_id = %s
               AND t.state IN ('done', 'invalid', 'failed', 'timed_out')
               AND t.started_at IS NOT NULL AND t.finished_at IS NOT NULL
        )
        SELECT count(*) FILTER (WHERE purpose = 'search')::int AS measured,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY turnaround)
                   FILTER (WHERE purpose = 'search') AS turnaround_s,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY turnaround)
                   FILTER (WHERE purpose = 'search') AS slow_turnaround_s,
               CASE WHEN count(*) FILTER (WHERE purpose = 'search') > 1
                    THEN extract(epoch FROM max(finished_at) FILTER (WHERE purpose = 'search')
                                            - min(finished_at) FILTER (WHERE purpose = 'search')
                                 )::float8
               END AS span_s,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY compile_s)
                   FILTER (WHERE purpose = 'search' AND compile_s IS NOT NULL) AS compile_s,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY turnaround)
                   FILTER (WHERE purpose = 'confirm' AND state = 'done') AS cold_s
          FROM finished
        """,
        (run_id,),
    ).fetchone()
    return row if row is not None else Pace(0, None, None)


def hand_back(conn: Conn, run_id: int, reason: str) -> HandedBack:
    """Cancel every pending and running trial of the run (search and confirmation), as the
    time budget ends: a running one loses its lease (its worker's next heartbeat, or its
    completion, finds it gone: the fence refuses the result) and gets its attempt back, like a
    worker's release; its open claim is closed as ``released`` with ``reason``, which the
    trial keeps as its error. A resume revives these (:func:`revive_handed_back`).

    Locks: the run's pending and running trial rows, taken in trial id order (``ORDER BY id
    FOR NO KEY UPDATE``, the order of a worker's heartbeat and release, so neither waits on the
    other in a cycle), then the claims' attempt rows, in one transaction of two statements.

    The rows are locked by a statement of their own first because a worker's claim or release
    can commit after a statement's snapshot and before its lock: in one statement the claim's
    attempt row was invisible (the claim stayed open) and the new trial row, computed from the
    snapshot's counter, failed the attempt constraint before PostgreSQL recomputed it from the
    locked version. The second statement's snapshot sees the rows as locked."""
    with conn.transaction():
        conn.execute(
            """
            SELECT t.id FROM tunefleet.trial t
             WHERE t.run_id = %s AND t.state IN ('pending', 'running')
             ORDER BY t.id
               FOR NO KEY UPDATE
            """,
            (run_id,),
        )
        # ``held`` locks again, at no cost: it keeps this statement right for a row that
        # became pending after the first one (none does today: only this run's coordinator
        # queues its trials).
        row = conn.execute(
            """
            WITH held AS (
                SELECT t.id, t.state, t.attempt, t.lease_owner
                  FROM tunefleet.trial t
                 WHERE t.run_id = %(run)s AND t.state IN ('pending', 'running')
                 ORDER BY t.id
                   FOR NO KEY UPDATE OF t
            ), given AS (
                UPDATE tunefleet.trial t
                   SET state = 'cancelled', finished_at = now(), error = %(reason)s,
                       attempt = CASE WHEN t.state = 'running' THEN t.attempt - 1
                                      ELSE t.attempt END,
                       lease_owner = NULL, lease_expires_at = NULL, lease_token_hash = NULL,
                       started_at = NULL
                  FROM held h
                 WHERE t.id = h.id
                RETURNING t.id, h.state AS was, h.attempt, h.lease_owner
            ), closed AS (
                UPDATE tunefleet.attempt a
                   SET ended_at = now(), outcome = 'released', error = %(reason)s
                  FROM given g
                 WHERE g.was = 'running' AND a.trial_id = g.id AND a.attempt = g.attempt
                   AND a.worker_id = g.lease_owner AND a.ended_at IS NULL
            )
            SELECT count(*) FILTER (WHERE was = 'pending')::int AS pending,
                   count(*) FILTER (WHERE was = 'running')::int AS running
              FROM given
            """,
            {"run": run_id, "reason": reason},
        ).fetchone()
    return HandedBack(int(row["pending"]), int(row["running"])) if row else HandedBack(0, 0)


def revive_handed_back(conn: Conn, run_id: int, limit: int | None) -> int:
    """On resume: queue again (``pending``) the run's cancelled search trials that a worker
    had claimed (they were in flight when the run stopped: handed back at the deadline, or
    released by a stopping worker), oldest first, at most ``limit`` (None: all), so the work
    a stop cut short is done first. Pending trials cancelled before any claim are left to the
    search, which proposes them again if it still wants them. Returns how many. Cancelled
    confirmations are the confirmation's to revive.

    One ``NOTIFY`` per device class revived wakes idle workers. Locks: the revived rows, for
    this statement."""
    row = conn.execute(
        """
        WITH revived AS (
            UPDATE tunefleet.trial t
               SET state = 'pending', finished_at = NULL, reported = false, error = NULL,
                   max_attempts = greatest(t.max_attempts, t.attempt + 1)
             WHERE t.id IN (
                    SELECT c.id FROM tunefleet.trial c
                     WHERE c.run_id = %(run)s AND c.state = 'cancelled'
                       AND c.purpose = 'search'
                       AND EXISTS (SELECT 1 FROM tunefleet.attempt a WHERE a.trial_id = c.id)
                     ORDER BY c.id
                     LIMIT %(limit)s)
            RETURNING t.device_class
        )
        SELECT (SELECT count(*) FROM revived)::int AS n,
               (SELECT count(pg_notify(%(channel)s, c.device_class))
                  FROM (SELECT DISTINCT device_class FROM revived) AS c) AS woken
        """,
        {"run": run_id, "limit": limit, "channel": NOTIFY_CHANNEL},
    ).fetchone()
    return int(row["n"]) if row else 0
