"""The SQL of judging a run's finalists across processes (:mod:`tunefleet.spread`): reading
every process that timed a confirmed search trial, and storing the verdicts.

One function per statement (or one short transaction), on the coordinator's autocommit
connection; locking is stated per function. Only the coordinator that holds the run's
advisory lock writes these rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class ProcessRow:
    """One measurement of a confirmed search trial: the search's own (``round`` 0) or a
    confirmation's (``round`` 1 and on), with what judging and re-timing it needs."""

    search_trial_id: int
    #: The trial whose measurement this is (the search trial itself for round 0).
    trial_id: int
    round: int
    state: str
    #: None while pending or running, or when it failed.
    median_s: float | None
    samples: list[float] | None
    #: The measurement generated the search's code (None: neither stored code, or round 0).
    same_source: bool | None
    config: dict[str, Any]
    config_hash: str
    #: Input seed of the search's measurement (round 0) or the confirmation's.
    input_seed: int | None


def finalist_processes(conn: Conn, run_id: int) -> list[ProcessRow]:
    """Every search trial of the run that has at least one confirmation, as its processes:
    its own measurement first, then each confirmation in round order, in any state.
    Locks: none."""
    cur = conn.cursor(row_factory=class_row(ProcessRow))
    return cur.execute(
        """
        WITH fin AS (
            SELECT DISTINCT c.confirms_trial_id AS id
              FROM tunefleet.trial c
             WHERE c.run_id = %(run)s AND c.purpose = 'confirm'
        )
        SELECT t.id AS search_trial_id, t.id AS trial_id, 0 AS round, t.state,
               m.median_s, m.samples_s AS samples, NULL::boolean AS same_source,
               t.config, t.config_hash, (m.protocol ->> 'seed')::bigint AS input_seed
          FROM fin
          JOIN tunefleet.trial t ON t.id = fin.id
          JOIN tunefleet.measurement m ON m.trial_id = t.id
         WHERE t.state = 'done'
        UNION ALL
        SELECT c.confirms_trial_id, c.id, c.confirm_round, c.state,
               mc.median_s, mc.samples_s,
               CASE WHEN mo.code IS NULL AND mc.code IS NULL THEN NULL
                    ELSE mo.code IS NOT DISTINCT FROM mc.code END,
               c.config, c.config_hash, c.input_seed
          FROM tunefleet.trial c
          LEFT JOIN tunefleet.measurement mc ON mc.trial_id = c.id AND c.state = 'done'
          LEFT JOIN tunefleet.measurement mo ON mo.trial_id = c.confirms_trial_id
         WHERE c.run_id = %(run)s AND c.purpose = 'confirm'
         ORDER BY 1, 3
        """,
        {"run": run_id},
    ).fetchall()


@dataclass(frozen=True)
class Timings:
    """What every process that finished timing one confirmed search trial measured: each
    one's median and its launches (samples), the search's process first."""

    medians: tuple[float, ...] = ()
    samples: tuple[tuple[float, ...], ...] = ()


def process_timings(conn: Conn, run_id: int) -> dict[int, Timings]:
    """The medians and launches of every process that finished timing each confirmed search
    trial of the run (:func:`finalist_processes`, the search's own included), by search
    trial. Locks: none."""
    medians: dict[int, list[float]] = {}
    samples: dict[int, list[tuple[float, ...]]] = {}
    for p in finalist_processes(conn, run_id):
        if p.median_s is not None:
            medians.setdefault(p.search_trial_id, []).append(p.median_s)
            samples.setdefault(p.search_trial_id, []).append(tuple(p.samples or ()))
    return {tid: Timings(tuple(m), tuple(samples[tid])) for tid, m in medians.items()}


@dataclass(frozen=True)
class FinalistVerdict:
    """What :func:`record_judgement` stores on one judged search trial."""

    trial_id: int
    standing: str
    figure_s: float
    processes: int


@dataclass(frozen=True)
class ProcessVerdict:
    """What :func:`record_judgement` stores on one done confirmation: whether its process is
    inconsistent with its configuration's figure, and the rank test's p against the
    search's samples."""

    trial_id: int
    disagrees: bool
    p_value: float


@dataclass(frozen=True)
class RunSpread:
    """What :func:`record_judgement` stores on the run."""

    typical: float | None
    tolerance: float
    processes: int
    unseparated_trial_id: int | None
    within: float | None = None


def record_judgement(
    conn: Conn,
    run_id: int,
    finalists: Sequence[FinalistVerdict],
    processes: Sequence[ProcessVerdict],
    spread: RunSpread,
) -> None:
    """Store one judgement of the run's finalists in one transaction, so that no reader sees
    a standing without the spread it was decided with: each search trial's standing, figure
    and process count, each done confirmation's verdict, and the run's spread.
    Locks: those trial rows and the run row, until the transaction commits."""
    with conn.transaction():
        conn.execute(
            """
            UPDATE tunefleet.trial t
               SET standing = v.standing, figure_s = v.figure_s, processes = v.processes
              FROM jsonb_to_recordset(%(items)s)
                   AS v(trial_id bigint, standing text, figure_s double precision,
                        processes integer)
             WHERE t.id = v.trial_id AND t.run_id = %(run)s AND t.purpose = 'search'
            """,
            {
                "run": run_id,
                "items": Jsonb(
                    [
                        {
                            "trial_id": f.trial_id,
                            "standing": f.standing,
                            "figure_s": f.figure_s,
                            "processes": f.processes,
                        }
                        for f in finalists
                    ]
                ),
            },
        )
        conn.execute(
            """
            UPDATE tunefleet.trial t
               SET disagrees = v.disagrees, agreement_p = v.p_value
              FROM jsonb_to_recordset(%(items)s)
                   AS v(trial_id bigint, disagrees boolean, p_value double precision)
             WHERE t.id = v.trial_id AND t.run_id = %(run)s AND t.purpose = 'confirm'
               AND t.state = 'done'
            """,
            {
                "run": run_id,
                "items": Jsonb(
                    [
                        {"trial_id": p.trial_id, "disagrees": p.disagrees, "p_value": p.p_value}
                        for p in processes
                    ]
                ),
            },
        )
        conn.execute(
            """
            UPDATE tunefleet.run
               SET spread_typical = %s, spread_tolerance = %s, spread_processes = %s,
                   unseparated_trial_id = %s, spread_within = %s
             WHERE id = %s
            """,
            (
                spread.typical,
                spread.tolerance,
                spread.processes,
                spread.unseparated_trial_id,
                spread.within,
                run_id,
            ),
        )
