"""Read-only statements behind ``tunefleet dashboard``: views only, so the reader role can run it.

The reader role may ``SELECT`` the schema's views and nothing else (``tunefleet.db.roles``):
every statement here reads ``run_progress``, ``run_settings``, ``results``, ``best_per_run``,
``standing_aside``, ``workers`` or ``trial_details``, never a table. Each function runs one
plain ``SELECT`` on an autocommit connection: it takes no row locks (only the ``ACCESS SHARE``
lock every read takes, released at the end of the statement) and holds no transaction open
afterwards. Two calls may see different moments of a live run, which a page that refreshes
itself tolerates. Every value is a bound parameter; the one identifier that varies (the sort
column of the configuration table) is chosen from :data:`SORT_COLUMNS` and composed with
``psycopg.sql``. Times are computed with the database clock (``now()``).

Charts get their data shaped by the database so that a run of tens of thousands of trials
answers in a few kilobytes: the best-so-far series keeps only the trials that improved the
best, the speed distribution comes as histogram bins, and the worker timeline as busy
fractions per time bin.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from tunefleet.settings import WORKER_ALIVE_S

Row = dict[str, Any]
Conn = psycopg.Connection[Any]

#: A worker whose heartbeat is older than this (seconds) counts as gone (as ``status`` says).
ALIVE_S = WORKER_ALIVE_S
#: Columns the configuration table may be sorted by (the key is what the page sends).
SORT_COLUMNS = {
    "gflops": "gflops",
    "median_s": "median_s",
    "min_s": "min_s",
    "gbps": "gbps",
    "compile_s": "compile_s",
    "trial_id": "trial_id",
    "finished_at": "finished_at",
    "state": "state",
}


def _all(conn: Conn, query: str | sql.Composed, params: dict[str, Any]) -> list[Row]:
    return [dict(r) for r in conn.execute(query, params).fetchall()]


def _one(conn: Conn, query: str, params: dict[str, Any]) -> Row | None:
    row = conn.execute(query, params).fetchone()
    return dict(row) if row is not None else None


def make_read_only(conn: Conn) -> None:
    """Make every later transaction of this session read-only (a second guard besides the
    reader role's missing privileges: even an administrator's URL cannot write through the
    dashboard).

    Locks nothing; changes only this session's setting."""
    conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")


def _runs(conn: Conn, *, run_id: int | None, limit: int) -> list[Row]:
    """The one statement behind :func:`list_runs` and :func:`run_summary`. Read-only."""
    return _all(
        conn,
        """
        SELECT p.run_id, p.name, p.problem, p.device_class, p.run_state, p.stop_reason,
               p.trials, p.pending, p.running, p.done, p.invalid, p.failed, p.timed_out,
               p.cancelled, p.cached, p.best_gflops, p.best_median_s, p.created_at,
               extract(epoch FROM p.elapsed)::float8 AS elapsed_s,
               p.evaluations_per_minute::float8 AS evaluations_per_minute,
               p.confirmed, p.confirming, p.best_status, p.best_trial_id, p.ruled_out,
               s.problem_args, s.protocol, s.search, s.max_trials, s.max_seconds,
               s.target_gflops, s.patience, s.finished_at,
               extract(epoch FROM now() - s.coordinator_heartbeat_at)::float8
                 AS coordinator_age_s,
               (SELECT count(*) FROM tunefleet.workers w
                 WHERE w.state = 'active'
                   AND w.heartbeat_at > now() - make_interval(secs => %(alive)s)
                   AND (w.device_class = p.device_class OR p.device_class = 'any')
                   AND NOT EXISTS (SELECT 1 FROM tunefleet.standing_aside a
                                    WHERE a.worker_id = w.worker_id AND a.run_id = p.run_id))
                 AS live_workers,
               (SELECT count(*) FROM tunefleet.standing_aside a WHERE a.run_id = p.run_id)
                 AS standing_aside,
               tl.timing_share
          FROM tunefleet.run_progress p
          JOIN tunefleet.run_settings s ON s.run_id = p.run_id
          LEFT JOIN tunefleet.run_timeline tl ON tl.run_id = p.run_id
         WHERE (%(run_id)s::bigint IS NULL OR p.run_id = %(run_id)s::bigint)
         ORDER BY p.run_id DESC
         LIMIT %(limit)s
        """,
        {"alive": ALIVE_S, "run_id": run_id, "limit": limit},
    )


def list_runs(conn: Conn, *, limit: int = 200) -> list[Row]:
    """The newest ``limit`` runs with their progress (counts per state, best GFLOP/s so far,
    evaluations per minute), arguments, protocol, budget and the live workers able to serve
    each (active, a fresh heartbeat, the run's device class, not standing aside from it);
    ``ruled_out`` (the view's): the invalid ones no worker ever saw (the problem's rules
    rejected them: they cost no evaluation, so ``--max-trials`` does not count them).

    Read-only, no locks."""
    return _runs(conn, run_id=None, limit=limit)


def run_summary(conn: Conn, run_id: int) -> Row | None:
    """One run as :func:`list_runs` shows it, or ``None`` when there is no such run. Small
    and cheap: the page polls it to notice changes.

    Read-only, no locks."""
    rows = _runs(conn, run_id=run_id, limit=1)
    return rows[0] if rows else None


def run_settings(conn: Conn, run_id: int) -> Row | None:
    """The run's settings (problem, arguments, device class, protocol), or ``None``.

    Read-only, no locks."""
    return _one(
        conn, "SELECT * FROM tunefleet.run_settings WHERE run_id = %(run_id)s", {"run_id": run_id}
    )


def best(conn: Conn, run_id: int) -> Row | None:
    """The run's best configuration as ``best_per_run`` ranks it (confirmed figure first), or
    ``None`` before any trial succeeded.

    Read-only, no locks."""
    return _one(
        conn, "SELECT * FROM tunefleet.best_per_run WHERE run_id = %(run_id)s", {"run_id": run_id}
    )


def speed_charts(conn: Conn, run_id: int, *, bins: int = 30) -> Row:
    """The data of the run page's speed charts, from ONE scan of the run's finished search
    trials (so the two agree and a run of tens of thousands of trials is read once), as JSON:

    ``best_so_far``: the search trials that raised the best GFLOP/s, in completion order:
    ``n`` (it was the n-th finished evaluation), ``trial_id``, ``elapsed_s`` (seconds since the
    run was created) and ``gflops`` (the new best). Between two points the best stays the
    same, so they draw the whole step curve against time and against evaluations.

    ``histogram``: the measured GFLOP/s of the successful (``done``) search trials in
    ``bins`` equal-width bins from the slowest to the fastest: ``bin``, ``low``, ``high``,
    ``trials`` (empty bins included; no bins when nothing succeeded).

    Read-only, no locks."""
    row = _one(
        conn,
        """
        WITH s AS (SELECT created_at AS t0,
                          greatest(date_part('epoch', coalesce(finished_at, now())
                                                      - created_at), 1e-3) AS span
                     FROM tunefleet.run_settings WHERE run_id = %(run_id)s),
             -- The finished search trials with their speed (trial and measurement).
             f AS MATERIALIZED (
               SELECT d.trial_id, d.state, d.gflops, d.finished_at,
                      date_part('epoch', d.finished_at - s.t0) AS elapsed_s
                 FROM tunefleet.trial_details d, s
                WHERE d.run_id = %(run_id)s AND d.purpose = 'search'
                  AND d.state IN ('done', 'invalid', 'failed', 'timed_out')
                  AND d.finished_at IS NOT NULL),
             evaluations AS (
               SELECT row_number() OVER w AS n, trial_id, gflops, elapsed_s,
                      max(gflops) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                        AS before
                 FROM f
               WINDOW w AS (ORDER BY finished_at, trial_id)),
             best AS (
               SELECT n, trial_id, elapsed_s, gflops FROM evaluations
                WHERE gflops IS NOT NULL AND (before IS NULL OR gflops > before)),
             r AS (SELECT min(gflops) AS lo,
                          CASE WHEN max(gflops) > min(gflops) THEN max(gflops)
                               ELSE min(gflops) + 1 END AS hi
                     FROM f WHERE state = 'done' AND gflops IS NOT NULL HAVING count(*) > 0),
             counted AS (SELECT least(width_bucket(f.gflops, r.lo, r.hi, %(hbins)s),
                                      %(hbins)s) AS b, count(*) AS trials
                           FROM f, r WHERE f.state = 'done' AND f.gflops IS NOT NULL
                          GROUP BY 1),
             histogram AS (
               SELECT b.b AS bin,
                      r.lo + (b.b - 1) * (r.hi - r.lo) / %(hbins)s AS low,
                      r.lo + b.b * (r.hi - r.lo) / %(hbins)s AS high,
                      coalesce(c.trials, 0) AS trials
                 FROM r CROSS JOIN generate_series(1, %(hbins)s) AS b(b)
                 LEFT JOIN counted c ON c.b = b.b)
        SELECT (SELECT coalesce(jsonb_agg(to_jsonb(best) ORDER BY n), '[]') FROM best)
                 AS best_so_far,
               (SELECT coalesce(jsonb_agg(to_jsonb(histogram) ORDER BY bin), '[]')
                  FROM histogram) AS histogram
        """,
        {"run_id": run_id, "hbins": bins},
    )
    assert row is not None
    return row


def worker_intervals(conn: Conn, run_id: int) -> list[Row]:
    """The rows of :func:`tunefleet.queries.report.worker_intervals` (``worker_id``,
    ``start_s``, ``end_s``: one per finished trial a worker evaluated, cache answers
    excluded) read through the dashboard's views, for the busy share (:mod:`tunefleet.busy`)
    that ``status`` and the plot quote too.

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT d.worker_id::text AS worker_id,
               extract(epoch FROM d.started_at - s.created_at)::float8 AS start_s,
               extract(epoch FROM d.finished_at - s.created_at)::float8 AS end_s
          FROM tunefleet.trial_details d
          JOIN tunefleet.run_settings s ON s.run_id = d.run_id
         WHERE d.run_id = %(run_id)s
           AND d.state IN ('done', 'invalid', 'failed', 'timed_out')
           AND d.started_at IS NOT NULL AND d.finished_at IS NOT NULL
           AND d.source <> 'cache'
           AND d.worker_id IS NOT NULL
        """,
        {"run_id": run_id},
    )


def worker_timeline(conn: Conn, run_id: int, *, bins: int = 60) -> list[Row]:
    """How busy each worker was on the run, in ``bins`` equal time bins from the run's
    creation to its end (now while it runs): one row per worker and bin it worked in with
    ``busy``, the share of the bin (0-1) covered by the trials it held (the trial's lease
    owner, from claim to finish, running ones up to now; cache answers excluded;
    confirmations included), ``held_s`` (the worker's total held seconds) and ``span_s`` (the
    run's span). A worker that prefetches holds several trials at once: a bin counts as fully
    busy at most. Reads trial columns only, so only the trial table is scanned.

    Read-only, no locks."""
    row = _one(
        conn,
        """
        WITH s AS (SELECT created_at AS t0,
                          greatest(date_part('epoch', coalesce(finished_at, now())
                                                      - created_at), 1e-3) AS span
                     FROM tunefleet.run_settings WHERE run_id = %(run_id)s),
             -- Held intervals: trial columns only, so the trial table alone is read.
             iv AS MATERIALIZED (
               SELECT x.*, least(floor(x.a / x.w), %(tbins)s - 1)::int AS b1,
                      least(floor(x.e / x.w), %(tbins)s - 1)::int AS b2
                 FROM (SELECT d.lease_owner AS worker_id, s.span / %(tbins)s AS w,
                              greatest(date_part('epoch', d.started_at - s.t0), 0) AS a,
                              least(date_part('epoch', coalesce(d.finished_at, now()) - s.t0),
                                    s.span) AS e
                         FROM tunefleet.trial_details d, s
                        WHERE d.run_id = %(run_id)s AND d.lease_owner IS NOT NULL
                          AND d.started_at IS NOT NULL AND d.source <> 'cache'
                          AND d.state IN ('done', 'invalid', 'failed', 'timed_out', 'running'))
                      x),
             -- Each interval's part in its first bin, then (rarely) the bins it runs on into.
             pieces AS (
               SELECT worker_id, b1 AS b, sum(greatest(least(e, (b1 + 1) * w) - a, 0)) AS busy
                 FROM iv GROUP BY worker_id, b1
               UNION ALL
               SELECT iv.worker_id, b, greatest(least(iv.e, (b + 1) * iv.w) - b * iv.w, 0)
                 FROM iv, generate_series(iv.b1 + 1, iv.b2) AS b
                WHERE iv.b1 < iv.b2),
             binned AS (SELECT worker_id, b, sum(busy) AS busy FROM pieces
                         GROUP BY worker_id, b),
             held AS (SELECT worker_id, sum(busy) AS held_s FROM binned GROUP BY worker_id),
             timeline AS (
               SELECT p.worker_id, coalesce(w.host, '?') AS worker_host, p.b AS bin,
                      h.held_s, s.span AS span_s,
                      least(p.busy / (s.span / %(tbins)s), 1.0) AS busy
                 FROM binned p
                 JOIN held h ON h.worker_id = p.worker_id
                 LEFT JOIN tunefleet.workers w ON w.worker_id = p.worker_id
                 CROSS JOIN s)
        SELECT coalesce(jsonb_agg(to_jsonb(timeline) ORDER BY worker_host, worker_id, bin),
                        '[]') AS timeline
          FROM timeline
        """,
        {"run_id": run_id, "tbins": bins},
    )
    return list(row["timeline"]) if row else []


def configurations(
    conn: Conn,
    run_id: int,
    *,
    sort: str = "gflops",
    descending: bool = True,
    limit: int = 50,
    offset: int = 0,
) -> list[Row]:
    """One page of the run's finished search trials (the ``results`` view): configuration,
    state, times, GFLOP/s, worker, error, and ``total`` (how many there are in all); sorted by
    ``sort`` (a key of :data:`SORT_COLUMNS`; anything else raises ``KeyError``), missing
    values last, ties by trial id.

    Read-only, no locks."""
    column = sql.Identifier(SORT_COLUMNS[sort])
    order = sql.SQL("{column} {direction} NULLS LAST, trial_id").format(
        column=column, direction=sql.SQL("DESC" if descending else "ASC")
    )
    # Sort the narrow rows (id and key) of the whole run, then read the page's wide ones.
    query = sql.SQL(
        """
        WITH page AS (
          SELECT trial_id AS id, {column} AS key, count(*) OVER () AS total
            FROM tunefleet.results
           WHERE run_id = %(run_id)s
           ORDER BY {order}
           LIMIT %(limit)s OFFSET %(offset)s)
        SELECT res.trial_id, res.state, res.source, res.config, res.median_s, res.min_s,
               res.gflops, res.gbps, res.compile_s, res.worker_host, res.device_name,
               res.error, res.finished_at, page.total
          FROM page JOIN tunefleet.results res ON res.trial_id = page.id
         ORDER BY page.key {direction} NULLS LAST, page.id
        """
    ).format(column=column, order=order, direction=sql.SQL("DESC" if descending else "ASC"))
    return _all(conn, query, {"run_id": run_id, "limit": limit, "offset": offset})


def finished_count(conn: Conn, run_id: int) -> int:
    """How many search trials of the run have finished (the rows of the ``results`` view).

    Read-only, no locks."""
    row = _one(
        conn,
        "SELECT count(*) AS n FROM tunefleet.results WHERE run_id = %(run_id)s",
        {"run_id": run_id},
    )
    return int(row["n"]) if row else 0


def failure_groups(conn: Conn, run_id: int) -> list[Row]:
    """The run's unsuccessful search trials grouped by state and reason, most frequent first,
    with the first and last trial of each group.

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT res.state, coalesce(res.error, '(no reason recorded)') AS error,
               count(*) AS trials, min(res.trial_id) AS first_trial,
               max(res.trial_id) AS last_trial
          FROM tunefleet.results res
         WHERE res.run_id = %(run_id)s AND res.state IN ('invalid', 'failed', 'timed_out')
         GROUP BY res.state, res.error
         ORDER BY count(*) DESC, res.state, min(res.trial_id)
        """,
        {"run_id": run_id},
    )


def trial(conn: Conn, run_id: int, trial_id: int) -> Row | None:
    """One trial of the run (any state, either purpose) with its measurement, samples,
    protocol, validation, versions and generated code, or ``None`` when the run has no
    such trial.

    Read-only, no locks."""
    return _one(
        conn,
        """
        SELECT * FROM tunefleet.trial_details
         WHERE run_id = %(run_id)s AND trial_id = %(trial_id)s
        """,
        {"run_id": run_id, "trial_id": trial_id},
    )


def fleet(conn: Conn, *, stopped: int = 20) -> list[Row]:
    """Every active worker and the ``stopped`` most recently stopped ones, with device, host,
    heartbeat age, ``alive`` (active with a heartbeat younger than :data:`ALIVE_S`), sizing,
    the trials and runs they hold now, the running runs they may serve (their device class,
    not standing aside) and the runs they stand aside from with the reasons.

    Read-only, no locks."""
    return _all(
        conn,
        """
        SELECT w.worker_id, w.host, w.pid, w.state, w.device_class, w.version,
               w.device_name, w.platform, w.vendor, w.driver_version, w.compute_units,
               w.started_at, w.heartbeat_at, w.stopped_at, w.capacity, w.prepare_workers,
               w.prefetch, w.sizing, w.device_busy, w.holding, w.current_trial,
               coalesce(w.holding_runs, '{}') AS holding_runs,
               extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_s,
               (w.state = 'active'
                AND w.heartbeat_at > now() - make_interval(secs => %(alive)s)) AS alive,
               coalesce((SELECT array_agg(p.run_id ORDER BY p.run_id)
                           FROM tunefleet.run_settings p
                          WHERE w.state = 'active' AND p.state = 'running'
                            AND (p.device_class = w.device_class OR p.device_class = 'any')
                            AND NOT EXISTS (SELECT 1 FROM tunefleet.standing_aside a
                                             WHERE a.worker_id = w.worker_id
                                               AND a.run_id = p.run_id)), '{}') AS serves,
               coalesce((SELECT jsonb_agg(jsonb_build_object('run_id', a.run_id,
                                                             'reason', a.reason,
                                                             'at', a.at)
                                          ORDER BY a.run_id)
                           FROM tunefleet.standing_aside a
                          WHERE a.worker_id = w.worker_id), '[]') AS stands_aside
          FROM tunefleet.workers w
         WHERE w.state = 'active'
            OR w.worker_id IN (SELECT x.worker_id FROM tunefleet.workers x
                                WHERE x.state <> 'active'
                                ORDER BY x.stopped_at DESC NULLS LAST LIMIT %(stopped)s)
         ORDER BY w.state, w.host, w.started_at, w.worker_id
        """,
        {"alive": ALIVE_S, "stopped": stopped},
    )


def importance_fingerprint(conn: Conn, run_id: int, *, all_runs: bool = False) -> str:
    """What changes whenever the rows of :func:`importance_trials` (same arguments) change:
    how many there are, the newest finish and the sum of their trial ids. A finished trial's
    row never changes (a trial finishes once per attempt, and a re-run finishes later), so
    an unchanged fingerprint means unchanged rows. Reads trial columns only.

    Read-only, no locks."""
    row = _one(
        conn,
        """
        WITH me AS (SELECT problem, problem_args, device_class, protocol
                      FROM tunefleet.run_settings WHERE run_id = %(run_id)s),
             runs AS (SELECT s.run_id FROM tunefleet.run_settings s, me
                       WHERE s.run_id = %(run_id)s
                          OR (%(all_runs)s AND s.problem = me.problem
                              AND s.problem_args = me.problem_args
                              AND s.device_class = me.device_class
                              AND s.protocol = me.protocol))
        SELECT concat_ws(':', count(*), max(res.finished_at), sum(res.trial_id)) AS f
          FROM tunefleet.results res
         WHERE res.run_id IN (SELECT run_id FROM runs)
        """,
        {"run_id": run_id, "all_runs": all_runs},
    )
    return str(row["f"]) if row else ""


def importance_trials(conn: Conn, run_id: int, *, all_runs: bool = False) -> list[Row]:
    """The finished search trials behind a parameter-importance report
    (:mod:`tunefleet.importance`): ``run_id``, ``trial_id``, ``config``, ``state``,
    ``median_s`` and ``gflops`` of the run, or with ``all_runs`` of every run of its cache key
    (the same problem, arguments, device class and protocol, as ``run_settings`` shows them:
    the four things the cache key is made of), in run and trial order. Narrow rows: no
    samples, code or errors. Views only (``results``, ``run_settings``), so the reader role
    can run it.

    The rows travel as one row of arrays, the configurations as one JSON text (an array)
    parsed at once: decoding ten thousand JSONB values one by one costs the client several
    times what the statement costs the server (and building one JSON value of the rows on
    the server costs it more than both).

    Read-only, no locks."""
    query = """
        WITH me AS (SELECT problem, problem_args, device_class, protocol
                      FROM tunefleet.run_settings WHERE run_id = %(run_id)s),
             runs AS (SELECT s.run_id FROM tunefleet.run_settings s, me
                       WHERE s.run_id = %(run_id)s
                          OR (%(all_runs)s AND s.problem = me.problem
                              AND s.problem_args = me.problem_args
                              AND s.device_class = me.device_class
                              AND s.protocol = me.protocol))
        SELECT '[' || coalesce(string_agg(res.config::text, ',' ORDER BY res.run_id,
                                                                       res.trial_id), '')
                   || ']',
               array_agg(res.run_id ORDER BY res.run_id, res.trial_id),
               array_agg(res.trial_id ORDER BY res.run_id, res.trial_id),
               array_agg(res.state ORDER BY res.run_id, res.trial_id),
               array_agg(res.median_s ORDER BY res.run_id, res.trial_id),
               array_agg(res.gflops ORDER BY res.run_id, res.trial_id)
          FROM tunefleet.results res
         WHERE res.run_id IN (SELECT run_id FROM runs)
        """
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(query, {"run_id": run_id, "all_runs": all_runs}).fetchone()
    if row is None or row[1] is None:
        return []
    configs = json.loads(row[0])
    return [
        {"run_id": r, "trial_id": t, "config": c, "state": st, "median_s": m, "gflops": g}
        for r, t, c, st, m, g in zip(row[1], row[2], configs, row[3], row[4], row[5], strict=True)
    ]
