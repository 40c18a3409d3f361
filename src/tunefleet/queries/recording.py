"""Read-only statements that build a :class:`~tunefleet.recording.Recording` from what a
database holds for one cache key (``tunefleet replay RUN``).

Each runs one plain ``SELECT`` on an autocommit connection: no row locks, no transaction left
open; a live run may finish trials between the statements, which a replay tolerates (it
reads a snapshot of the measurements as they were).
"""

from __future__ import annotations

from typing import Any

import psycopg

from tunefleet.errors import RunError, UsageError
from tunefleet.queries.search import device_limits
from tunefleet.recording import Recording, rows_from
from tunefleet.space import Space

Conn = psycopg.Connection[Any]


def recording_of(conn: Conn, source: str) -> Recording:
    """The recording of a run id's cache key, or of a cache key itself (32 hex digits).

    Read-only, no locks (three statements; see the module docstring)."""
    run = _one(
        conn,
        """
        SELECT r.problem, r.problem_args, r.space, r.device_class, r.cache_key
        FROM tunefleet.run r
        WHERE (%(id)s::bigint IS NOT NULL AND r.id = %(id)s::bigint)
           OR (%(key)s::text IS NOT NULL AND r.cache_key = %(key)s::text)
        ORDER BY r.id LIMIT 1
        """,
        {
            "id": int(source) if source.isdigit() else None,
            "key": None if source.isdigit() else source,
        },
    )
    if run is None:
        raise RunError(
            f"no run {source} in this database; give a run id or cache key of "
            "`tunefleet runs`, or a recording file"
        )
    found = conn.execute(
        # One row per configuration of the key: its measurement when it has one, else the
        # latest finished search trial's state (a rule or a build rejected it).
        """
        SELECT DISTINCT ON (t.config_hash)
               t.config, t.state, m.median_s, m.compile_s,
               (SELECT sum(s) FROM unnest(m.samples_s) s) AS timing_s
        FROM tunefleet.trial t
        JOIN tunefleet.run r ON r.id = t.run_id
        LEFT JOIN tunefleet.measurement m
               ON m.cache_key = r.cache_key AND m.config_hash = t.config_hash
        WHERE r.cache_key = %(key)s AND t.purpose = 'search'
          AND t.state IN ('done', 'invalid', 'failed', 'timed_out')
        ORDER BY t.config_hash, (m.id IS NULL), m.id, t.finished_at DESC
        """,
        {"key": run["cache_key"]},
    ).fetchall()
    space = Space.from_json(run["space"])
    rows = rows_from(space, [dict(f) for f in found])
    if not any(r.median_s is not None for r in rows):
        raise UsageError(
            f"run {source}'s cache key {run['cache_key']} has no measured configuration yet; "
            "replay a run with finished trials"
        )
    return Recording(
        problem=run["problem"],
        problem_args=dict(run["problem_args"] or {}),
        space=space,
        rows=rows,
        cache_key=run["cache_key"],
        device_class=run["device_class"],
        source=f"run {source}",
        device_limits=device_limits(conn, run["device_class"]),
    )


def _one(conn: Conn, query: str, params: dict[str, Any]) -> dict[str, Any] | None:
    row = conn.execute(query, params).fetchone()
    return dict(row) if row is not None else None
