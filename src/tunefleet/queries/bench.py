"""Read-only statements the scripts in ``benchmarks/`` use to time a fleet from the database's
own clock: when a batch of trials was enqueued, when the last one finished, who ran what.

Not used by the product (no command imports it): it ships only because every SQL statement
lives in ``tunefleet.queries``, where its docstrings and the tests of the statements apply.

Every function takes an autocommit psycopg connection with dict rows and reads; none takes a
lock beyond the snapshot of its statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

Row = dict[str, Any]


def open_trials(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> int:
    """Pending plus running trials of these runs. Locks: none."""
    row = conn.execute(
        """
        SELECT count(*) AS n FROM tunefleet.trial
         WHERE run_id = ANY(%(runs)s) AND state IN ('pending', 'running')
        """,
        {"runs": list(run_ids)},
    ).fetchone()
    return int(row["n"]) if row else 0


def batch_timing(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> Row:
    """One batch of trials on the database clock: ``trials``, ``done``, ``not_done`` (any
    other state), ``wall_s`` (first enqueued to last finished), ``first_claim_s`` and
    ``last_claim_s`` (after the first enqueue). Locks: none."""
    row = conn.execute(
        """
        SELECT count(*) AS trials,
               count(*) FILTER (WHERE state = 'done') AS done,
               count(*) FILTER (WHERE state <> 'done') AS not_done,
               extract(epoch FROM max(finished_at) - min(created_at))::float8 AS wall_s,
               extract(epoch FROM min(started_at) - min(created_at))::float8 AS first_claim_s,
               extract(epoch FROM max(started_at) - min(created_at))::float8 AS last_claim_s
          FROM tunefleet.trial
         WHERE run_id = ANY(%(runs)s)
        """,
        {"runs": list(run_ids)},
    ).fetchone()
    assert row is not None
    return dict(row)


def trials_per_worker(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> list[Row]:
    """How many of these runs' ``done`` trials each worker completed (``worker_id``,
    ``trials``), busiest first. Locks: none."""
    rows = conn.execute(
        """
        SELECT worker_id, count(*) AS trials
          FROM tunefleet.measurement
         WHERE run_id = ANY(%(runs)s)
         GROUP BY worker_id
         ORDER BY count(*) DESC
        """,
        {"runs": list(run_ids)},
    ).fetchall()
    return [dict(r) for r in rows]


def trial_ids(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> list[int]:
    """Ids of every trial of these runs. Locks: none."""
    rows = conn.execute(
        "SELECT id FROM tunefleet.trial WHERE run_id = ANY(%(runs)s) ORDER BY id",
        {"runs": list(run_ids)},
    ).fetchall()
    return [int(r["id"]) for r in rows]


def ping(conn: psycopg.Connection[Any]) -> None:
    """The cheapest round trip (``SELECT 1``): the floor under every statement's latency on
    this machine and connection. Locks: none."""
    conn.execute("SELECT 1").fetchone()


def trial_times(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> list[Row]:
    """Every trial of these runs with its state and database-clock timestamps
    (``created_at``, ``started_at``, ``finished_at``), in id order. Locks: none."""
    rows = conn.execute(
        """
        SELECT id, state, created_at, started_at, finished_at FROM tunefleet.trial
         WHERE run_id = ANY(%(runs)s)
         ORDER BY id
        """,
        {"runs": list(run_ids)},
    ).fetchall()
    return [dict(r) for r in rows]


def state_counts(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> dict[str, int]:
    """How many trials of these runs are in each state. Locks: none."""
    rows = conn.execute(
        """
        SELECT state, count(*) AS n FROM tunefleet.trial
         WHERE run_id = ANY(%(runs)s)
         GROUP BY state
        """,
        {"runs": list(run_ids)},
    ).fetchall()
    return {str(r["state"]): int(r["n"]) for r in rows}


def measurements(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> list[Row]:
    """The measured numbers of these runs' trials (``median_s``, ``gflops``, ``gbps``,
    ``compile_s``, ``byte_count``, ``config``), fastest first. Locks: none."""
    rows = conn.execute(
        """
        SELECT trial_id, config, median_s, min_s, gflops, gbps, compile_s, byte_count,
               flop_count
          FROM tunefleet.measurement
         WHERE run_id = ANY(%(runs)s)
         ORDER BY median_s, trial_id
        """,
        {"runs": list(run_ids)},
    ).fetchall()
    return [dict(r) for r in rows]


def failure_reasons(conn: psycopg.Connection[Any], run_ids: Sequence[int]) -> list[Row]:
    """Unsuccessful trials of these runs by state and error text (``state``, ``error``,
    ``trials``), most frequent first. Locks: none."""
    rows = conn.execute(
        """
        SELECT state, coalesce(error, '') AS error, count(*) AS trials
          FROM tunefleet.trial
         WHERE run_id = ANY(%(runs)s) AND state IN ('invalid', 'failed', 'timed_out')
         GROUP BY state, error
         ORDER BY count(*) DESC, state
        """,
        {"runs": list(run_ids)},
    ).fetchall()
    return [dict(r) for r in rows]
