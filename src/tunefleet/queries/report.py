"""Read-only statements behind the CLI's status, runs, best, show, export and plot commands.

Every function here runs one plain ``SELECT`` on an autocommit connection: it takes no row
locks, holds no transaction open afterwards, and sees a consistent snapshot of its own
statement only (two calls may see different moments of a live run, which a progress display
tolerates). Rows come back as dicts (the connections of ``tunefleet.db.engine`` use dict rows).
Times are computed with the database clock (``now()``) so a laptop with a skewed clock still
shows correct ages.
"""

from __future__ import annotations

from typing import Any

import psycopg

from tunefleet.settings import COORDINATOR_ALIVE_S, WORKER_ALIVE_S

Row = dict[str, Any]
Conn = psycopg.Connection[Any]

#: A worker whose heartbeat is older than this (seconds) counts as gone.
ALIVE_S = WORKER_ALIVE_S


def _all(conn: Conn, query: str, params: dict[str, Any] | None = None) -> list[Row]:
    return [dict(r) for r in conn.execute(query, params or {}).fetchall()]


def _one(conn: Conn, query: str, params: dict[str, Any] | None = None) -> Row | None:
    row = conn.execute(query, params or {}).fetchone()
    return dict(row) if row is not None else None


def run_row(conn: Conn, run_id: int) -> Row | None:
    """The ``run`` row itself (problem, arguments, budget, state), or ``None``.

    Read-only, no locks."""
    return _one(conn, "SELECT * FROM tunefleet.run WHERE id = %(run_id)s", {"run_id": run_id})


def list_runs(conn: Conn, *, limit: int | None = None, only_active: bool = False) -> list[Row]:
    """Runs with their progress counters (the ``run_progress`` view plus arguments and budget),
    newest first. ``only_active`` keeps runs in state ``running``.

    Read-only, no locks."""
    return _runs(conn, run_id=None, only_active=only_active, limit=limit)


def run_progress(conn: Conn, run_id: int) -> Row | None:
    """One run's progress counters (``run_progress`` view plus budget), or ``None``.
    ``ruled_out`` (the view's): the search trials the problem's rules rejected before any
    worker saw them, counted inside ``invalid``; they cost no evaluation.

    Read-only, no locks; cheap enough to poll once a second during ``tunefleet tune``."""
    rows = _runs(conn, run_id=run_id, only_active=False, limit=1)
    return rows[0] if rows else None


def _runs(conn: Conn, *, run_id: int | None, only_active: bool, limit: int | None) -> list[Row]:
    """The one statement behind :func:`list_runs` and :func:`run_progress`. Read-only."""
    return _all(
        conn,
        """
        SELECT p.*, r.problem_args, r.max_trials, r.max_seconds, r.target_gflops,
               r.finished_at, extract(epoch FROM p.elapsed)::float8 AS elapsed_s,
               r.coordinator_heartbeat_at,
               extract(epoch FROM now() - r.coordinator_heartbeat_at)::float8
                 AS coordinator_age_s,
               (SELECT count(*) FROM tunefleet.stand_aside s WHERE s.run_id = p.run_id)
                 AS standing_aside,
               tl.timing_share,
               (SELECT count(*) FROM tunefleet.worker w
                 WHERE w.state = 'active'
                   AND w.heartbeat_at > now() - make_interval(secs => %(alive)s)
                   AND (w.device_class = p.device_class OR p.device_class = 'any')
                   AND NOT EXISTS (SELECT 1 FROM tunefleet.stand_aside s
                                    WHERE s.worker_id = w.id AND s.run_id = p.run_id))
                 AS servable_workers
          FROM tunefleet.run_progress p
          JOIN tunefleet.run r ON r.id = p.run_id
          LEFT JOIN tunefleet.run_timeline tl ON tl.run_id = p.run_id
         WHERE (%(run_id)s::bigint IS NULL OR p.run_id = %(run_id)s::bigint)
           AND (NOT %(only_active)s OR r.state = 'running')
         ORDER BY p.run_id DESC
         LIMIT %(limit)s
        """,
        {"run_id": run_id, "only_active": only_active, "limit": limit, "alive": ALIVE_S},
    )


def fleet(
    conn: Conn,
    *,
    run_id: int | None = None,
    stale_after_s: float = ALIVE_S,
    include_stopped: bool = False,
) -> list[Row]:
    """Worker processes with their device, heartbeat age, their sizing (code-generation
    processes, prefetch, what chose them) and device busy fraction, the trial they hold now,
    and how many trials they measured (overall, or for ``run_id`` when given; cache copies
    excluded).
    ``alive`` is false for an ``active`` worker whose heartbeat is older than
    ``stale_after_s`` (killed without a goodbye). Stopped workers are listed only with
    ``include_stopped``.

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT w.id AS worker_id, w.host, w.pid, w.state, w.device_class,
               d.name AS device_name, w.version, w.started_at, w.heartbeat_at, w.stopped_at,
               w.capacity, w.prepare_workers, w.prefetch, w.sizing, w.device_busy,
               extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_s,
               (w.state = 'active'
                AND w.heartbeat_at > now() - make_interval(secs => %(stale)s)) AS alive,
               (SELECT count(*) FROM tunefleet.trial t
                 WHERE t.lease_owner = w.id AND t.state = 'running') AS holding,
               (SELECT min(t.id) FROM tunefleet.trial t
                 WHERE t.lease_owner = w.id AND t.state = 'running') AS current_trial,
               (SELECT count(*) FROM tunefleet.measurement m
                 WHERE m.worker_id = w.id
                   AND m.attempt IS NOT NULL  -- not a cache hit's copy
                   AND (%(run_id)s::bigint IS NULL OR m.run_id = %(run_id)s)) AS measured
          FROM tunefleet.worker w
          LEFT JOIN tunefleet.device d ON d.id = w.device_id
         WHERE (%(include_stopped)s OR w.state = 'active')
           AND (%(run_id)s::bigint IS NULL
                OR EXISTS (SELECT 1 FROM tunefleet.trial t
                            WHERE t.run_id = %(run_id)s AND t.lease_owner = w.id)
                OR (w.state = 'active' AND w.device_class IN
                      (SELECT r.device_class FROM tunefleet.run r WHERE r.id = %(run_id)s)))
         ORDER BY w.state, w.host, w.started_at
        """,
        {"run_id": run_id, "stale": stale_after_s, "include_stopped": include_stopped},
    )


def best_trials(conn: Conn, run_id: int, *, limit: int = 1) -> list[Row]:
    """The ``limit`` best finished (``done``) search trials of a run with their measurement,
    device and confirmation, best first, ranked as ``best_per_run`` ranks them: those judged
    to agree across processes first, then the rest, each by its figure across processes
    where judged, else the confirmed figure where a confirmation
    measured one, else the search's median time; a configuration whose re-measurement failed
    comes after every other.

    ``confirm_state`` is the confirmation's trial state (NULL: never confirmed);
    ``confirmed_median_s``, ``confirmed_gflops``, ``confirm_worker_host``, ``spread``,
    ``noise``, ``disagrees``, ``agreement_p``, ``same_source`` and ``cold_build`` come from
    the ``confirmations`` view (its first round); ``standing``, ``figure_s`` and ``processes``
    are the judgement across processes (``tunefleet.spread``; NULL until judged), with the
    run's ``spread_tolerance`` / ``spread_typical`` and ``unseparated_trial_id`` (the runner-up
    the run's best could not be told apart from; NULL: separated, or not judged);
    ``measured_noise`` and ``noisy`` (the search measurement's samples) from ``results``;
    ``ranked_median_s`` is the time it is ranked by (re-measured, else the search's).

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT t.id AS trial_id, t.config, t.config_hash, t.source, t.finished_at,
               m.median_s, m.min_s, m.gflops, m.gbps, m.compile_s, m.protocol, m.validation,
               m.versions, m.code IS NOT NULL AS has_code,
               d.name AS device_name, d.device_class, d.platform, d.driver_version,
               w.host AS worker_host, m.worker_id,
               c.confirm_trial_id, c.state AS confirm_state, c.confirmed_median_s,
               c.confirmed_gflops, c.input_seed AS confirm_input_seed,
               c.confirm_worker_id, cw.host AS confirm_worker_host,
               c.spread, c.noise, c.disagrees, c.agreement_p, c.same_source, c.cold_build,
               r.noise AS measured_noise, r.noisy, t.standing, t.figure_s, t.processes,
               run.spread_tolerance, run.spread_typical, run.spread_within,
               run.unseparated_trial_id,
               coalesce(t.figure_s, c.confirmed_median_s, m.median_s) AS ranked_median_s
          FROM tunefleet.trial t
          JOIN tunefleet.measurement m ON m.trial_id = t.id
          JOIN tunefleet.results r ON r.trial_id = t.id
          JOIN tunefleet.run run ON run.id = t.run_id
          LEFT JOIN tunefleet.device d ON d.id = m.device_id
          LEFT JOIN tunefleet.worker w ON w.id = m.worker_id
          LEFT JOIN tunefleet.confirmations c ON c.trial_id = t.id AND c.confirm_round = 1
          LEFT JOIN tunefleet.worker cw ON cw.id = c.confirm_worker_id
         WHERE t.run_id = %(run_id)s AND t.state = 'done' AND t.purpose = 'search'
         ORDER BY coalesce(c.state IN ('invalid', 'failed', 'timed_out'), false),
                  CASE WHEN t.standing = 'agrees' THEN 0 ELSE 1 END,
                  ranked_median_s, t.id
         LIMIT %(limit)s
        """,
        {"run_id": run_id, "limit": limit},
    )


def trial_detail(conn: Conn, run_id: int, trial_id: int) -> Row | None:
    """One trial of a run with its measurement (samples, protocol, validation, versions, the
    generated code), device and worker, or ``None`` when the run has no such trial.

    Read-only, no locks."""
    return _one(
        conn,
        """
        SELECT t.id AS trial_id, t.run_id, t.config, t.config_hash, t.state, t.source,
               t.purpose, t.confirms_trial_id, t.input_seed, t.attempt, t.max_attempts,
               t.error, t.created_at, t.started_at, t.finished_at,
               m.id AS measurement_id, m.median_s, m.min_s, m.samples_s, m.gflops, m.gbps,
               m.flop_count, m.byte_count, m.compile_s, m.protocol, m.validation, m.versions,
               m.code, m.source AS measurement_source,
               d.name AS device_name, d.device_class, d.platform, d.vendor, d.driver_version,
               w.host AS worker_host, coalesce(m.worker_id, t.lease_owner) AS worker_id
          FROM tunefleet.trial t
          LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
          LEFT JOIN tunefleet.device d ON d.id = m.device_id
          LEFT JOIN tunefleet.worker w ON w.id = coalesce(m.worker_id, t.lease_owner)
         WHERE t.run_id = %(run_id)s AND t.id = %(trial_id)s
        """,
        {"run_id": run_id, "trial_id": trial_id},
    )


def search_trial_of(conn: Conn, run_id: int, config_hash: str) -> Row | None:
    """The run's search trial of one configuration (by its hash), with its state and
    measured median, or ``None`` when the run never queued it. Read-only, no locks."""
    return _one(
        conn,
        """
        SELECT t.id AS trial_id, t.state, m.median_s
          FROM tunefleet.trial t
          LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
         WHERE t.run_id = %(run_id)s AND t.config_hash = %(hash)s AND t.purpose = 'search'
        """,
        {"run_id": run_id, "hash": config_hash},
    )


def trial_attempts(conn: Conn, trial_id: int) -> list[Row]:
    """The claim history of one trial (who, when, how each attempt ended), oldest first.

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT a.attempt, a.worker_id, w.host AS worker_host, a.claimed_at, a.ended_at,
               a.outcome, a.error
          FROM tunefleet.attempt a
          LEFT JOIN tunefleet.worker w ON w.id = a.worker_id
         WHERE a.trial_id = %(trial_id)s
         ORDER BY a.claimed_at, a.attempt
        """,
        {"trial_id": trial_id},
    )


def export_rows(conn: Conn, run_id: int) -> list[Row]:
    """Every finished trial of a run (the ``results`` view's columns plus the raw samples,
    protocol and validation verdict), in trial order: what ``tunefleet export`` writes.

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT res.*, m.samples_s, m.protocol, m.validation, m.flop_count, m.byte_count
          FROM tunefleet.results res
          LEFT JOIN tunefleet.measurement m ON m.trial_id = res.trial_id
         WHERE res.run_id = %(run_id)s
         ORDER BY res.trial_id
        """,
        {"run_id": run_id},
    )


def progress_series(conn: Conn, run_id: int) -> list[Row]:
    """Finished trials of a run in completion order with the best GFLOP/s so far: ``n`` (the
    n-th evaluation), ``elapsed_s`` (seconds since the run was created), the trial's own
    ``gflops`` (NULL unless done) and ``best_gflops`` (running maximum). The data of the
    best-so-far plots, against time and against trials.

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT row_number() OVER w AS n,
               t.id AS trial_id, t.state,
               extract(epoch FROM t.finished_at - r.created_at)::float8 AS elapsed_s,
               m.gflops,
               max(m.gflops) OVER w AS best_gflops
          FROM tunefleet.trial t
          JOIN tunefleet.run r ON r.id = t.run_id
          LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id AND t.state = 'done'
         WHERE t.run_id = %(run_id)s AND t.purpose = 'search'
           AND t.state IN ('done', 'invalid', 'failed', 'timed_out')
           AND t.finished_at IS NOT NULL
        WINDOW w AS (ORDER BY t.finished_at, t.id)
         ORDER BY t.finished_at, t.id
        """,
        {"run_id": run_id},
    )


def worker_intervals(conn: Conn, run_id: int) -> list[Row]:
    """Busy intervals of each worker on a run: one row per evaluated trial (cache hits
    excluded) with the worker that finished it, ``start_s``/``end_s`` in seconds since the
    run was created, and the outcome. The data of the per-worker timeline (utilisation) plot.

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT coalesce(m.worker_id, t.lease_owner) AS worker_id,
               coalesce(w.host, '?') AS worker_host, w.pid AS worker_pid,
               t.id AS trial_id, t.state,
               extract(epoch FROM t.started_at - r.created_at)::float8 AS start_s,
               extract(epoch FROM t.finished_at - r.created_at)::float8 AS end_s
          FROM tunefleet.trial t
          JOIN tunefleet.run r ON r.id = t.run_id
          LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
          LEFT JOIN tunefleet.worker w ON w.id = coalesce(m.worker_id, t.lease_owner)
         WHERE t.run_id = %(run_id)s
           AND t.state IN ('done', 'invalid', 'failed', 'timed_out')
           AND t.started_at IS NOT NULL AND t.finished_at IS NOT NULL
           AND t.source <> 'cache'  -- answered from the database: nobody worked on it
           AND coalesce(m.worker_id, t.lease_owner) IS NOT NULL
         ORDER BY worker_host, worker_id, t.started_at
        """,
        {"run_id": run_id},
    )


def run_timeline(conn: Conn, run_id: int) -> Row | None:
    """Where a run's evaluations spent their wall time (the ``run_timeline`` view: each
    phase summed over its attempts, the devices' windows and ``timing_share``), or ``None``
    before an attempt reported its timeline.

    Read-only, no locks."""
    return _one(
        conn, "SELECT * FROM tunefleet.run_timeline WHERE run_id = %(run_id)s", {"run_id": run_id}
    )


def worker_timing(conn: Conn, run_id: int) -> dict[str, float]:
    """Each worker's device timing share on a run (``worker_timeline.timing_share``), keyed
    by its id as text.

    Read-only, no locks."""
    rows = _all(
        conn,
        """
        SELECT worker_id::text AS worker_id, timing_share FROM tunefleet.worker_timeline
         WHERE run_id = %(run_id)s AND timing_share IS NOT NULL
        """,
        {"run_id": run_id},
    )
    return {r["worker_id"]: float(r["timing_share"]) for r in rows}


def attempt_timelines(conn: Conn, run_id: int) -> list[Row]:
    """Every ended attempt of a run that reported its timeline (the ``timeline`` view's
    trial, attempt, purpose, worker, outcome, ``queued_s``, ``wall_s``, ``untracked_s`` and
    the phases as a JSON object), in the order they ended.

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT trial_id, attempt, purpose, worker_id, outcome, queued_s, wall_s, untracked_s,
               timeline
          FROM tunefleet.timeline
         WHERE run_id = %(run_id)s
         ORDER BY ended_at
        """,
        {"run_id": run_id},
    )


def failure_summary(conn: Conn, run_id: int) -> list[Row]:
    """Counts of unsuccessful trials of a run by state and error text (most frequent first),
    for the one-line failure summary of ``status`` and ``best``.

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT t.state, coalesce(t.error, '(no reason recorded)') AS error, count(*) AS trials
          FROM tunefleet.trial t
         WHERE t.run_id = %(run_id)s AND t.state IN ('invalid', 'failed', 'timed_out')
           AND t.purpose = 'search'
         GROUP BY t.state, t.error
         ORDER BY count(*) DESC, t.state
        """,
        {"run_id": run_id},
    )


def live_clients(
    conn: Conn,
    *,
    coordinator_alive_s: float = COORDINATOR_ALIVE_S,
    worker_alive_s: float = WORKER_ALIVE_S,
) -> list[Row]:
    """The processes a stop of the server would cut off: coordinators driving a ``running``
    run (heartbeat younger than ``coordinator_alive_s``) and ``active`` workers with a fresh
    heartbeat, each with the run it drives or the trials it holds (``holding``). Empty when
    the database has no tunefleet schema.

    Read-only, no locks."""
    if _one(conn, "SELECT to_regclass('tunefleet.run') IS NOT NULL AS ok") != {"ok": True}:
        return []
    return _all(
        conn,
        """
        SELECT 'coordinator' AS kind, r.coordinator_id::text AS id, r.id AS run_id,
               NULL::text AS host, NULL::integer AS pid, 0::bigint AS holding
          FROM tunefleet.run r
         WHERE r.state = 'running' AND r.coordinator_id IS NOT NULL
           AND r.coordinator_heartbeat_at > now() - make_interval(secs => %(coordinator)s)
        UNION ALL
        SELECT 'worker', w.id::text, NULL, w.host, w.pid,
               (SELECT count(*) FROM tunefleet.trial t
                 WHERE t.lease_owner = w.id AND t.state = 'running')
          FROM tunefleet.worker w
         WHERE w.state = 'active'
           AND w.heartbeat_at > now() - make_interval(secs => %(worker)s)
         ORDER BY 1, 3, 4, 5
        """,
        {"coordinator": coordinator_alive_s, "worker": worker_alive_s},
    )


def stand_asides(conn: Conn, run_id: int, *, stale_after_s: float = ALIVE_S) -> list[Row]:
    """The workers standing aside from a run (the ``standing_aside`` view), earliest first,
    with ``alive`` as :func:`fleet` computes it.

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT s.*,
               (s.worker_state = 'active'
                AND s.heartbeat_at > now() - make_interval(secs => %(stale)s)) AS alive
          FROM tunefleet.standing_aside s
         WHERE s.run_id = %(run_id)s
         ORDER BY s.at, s.worker_id
        """,
        {"run_id": run_id, "stale": stale_after_s},
    )
