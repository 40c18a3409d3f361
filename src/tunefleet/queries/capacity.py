"""Statements that size a database for a fleet: the server settings a fleet needs, the
sessions it holds, and which server process serves a session.

``benchmarks/fleet_sim.py`` reads and raises the settings and counts the sessions;
:mod:`tunefleet.db.pooler` asks which server process serves a session, to tell a
connection pooler that hands sessions around from a direct connection.

Every function takes an autocommit psycopg connection with dict rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

Row = dict[str, Any]

#: The settings that decide how many workers one server carries.
FLEET_SETTINGS = (
    "max_connections",
    "superuser_reserved_connections",
    "shared_buffers",
    "work_mem",
    "max_locks_per_transaction",
    "max_files_per_process",
    "fsync",
    "synchronous_commit",
)


def backend_pid(conn: psycopg.Connection[Any]) -> int:
    """The process id of the server process that runs this statement (behind a pooler:
    of the server connection the pooler lent for it). Locks: none."""
    row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
    assert row is not None
    return int(row["pid"])


def server_settings(
    conn: psycopg.Connection[Any], names: Sequence[str] = FLEET_SETTINGS
) -> dict[str, str]:
    """The current value of each named setting, with its unit (``128MB`` style where the
    unit is a size). Locks: none (a read of ``pg_settings``)."""
    rows = conn.execute(
        "SELECT name, current_setting(name) AS value FROM pg_settings WHERE name = ANY(%s)",
        (list(names),),
    ).fetchall()
    return {str(r["name"]): str(r["value"]) for r in rows}


def alter_system(conn: psycopg.Connection[Any], name: str, value: str) -> None:
    """``ALTER SYSTEM SET name = value`` (superuser; written to ``postgresql.auto.conf``,
    effective after a reload or, for ``max_connections``, a restart). A utility statement
    takes no bind parameters, so the name is composed as an identifier and the value as a
    literal. Locks: none in the database (the server serialises writes of the file)."""
    conn.execute(
        sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
    )


def sessions(conn: psycopg.Connection[Any]) -> list[Row]:
    """Client sessions of the whole server by ``application_name`` and ``state``
    (``count``), with ``here``: whether they are connected to this session's database (the
    session running this statement included). Locks: none (``pg_stat_activity`` is a
    snapshot of shared memory)."""
    return conn.execute(
        """
        SELECT coalesce(datname = current_database(), false) AS here,
               coalesce(application_name, '') AS application_name,
               coalesce(state, '') AS state, count(*) AS count
          FROM pg_stat_activity
         WHERE backend_type = 'client backend'
         GROUP BY 1, 2, 3
         ORDER BY 1, 2, 3
        """
    ).fetchall()


def activity(conn: psycopg.Connection[Any], application_name: str) -> list[Row]:
    """One sample of what the sessions of ``application_name`` are doing, counted by
    ``statement`` (the ``tunefleet.`` function the session's current or last statement
    calls, else the statement's first word, lower case), ``state`` (``active``, ``idle``,
    ...) and ``wait`` (``wait_event_type:wait_event``, empty while on a CPU or in the run
    queue), as ``count``. What ``benchmarks/fleet_sim.py`` samples per cell to tell
    sessions that wait (on which lock or event) from sessions that compute.

    Locks: none (``pg_stat_activity`` is a snapshot of shared memory, read without taking
    the backends' locks; each row is read as of its backend's last report)."""
    return conn.execute(
        """
        SELECT coalesce(substring(query FROM 'tunefleet\\.([a-z_]+)\\('),
                        lower(substring(query FROM '^\\s*([A-Za-z]+)')), '') AS statement,
               coalesce(state, '') AS state,
               coalesce(wait_event_type || ':' || wait_event, '') AS wait,
               count(*) AS count
          FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND application_name = %s
           AND pid <> pg_backend_pid()
         GROUP BY 1, 2, 3
        """,
        (application_name,),
    ).fetchall()


def lock_waits(conn: psycopg.Connection[Any], application_name: str) -> list[Row]:
    """The sessions of ``application_name`` waiting for a heavyweight lock, each with one
    session that blocks it: the waiter's ``pid`` and ``statement`` (named as in
    :func:`activity`), the ``lock`` it waits for (``wait_event``), and the blocker's
    ``blocker_pid``, ``blocker_statement``, ``blocker_state`` and ``blocker_wait``.

    Locks: ``pg_blocking_pids`` takes every lock-manager partition lock (shared) for a
    moment, as the deadlock detector does: sample it seldom (``fleet_sim.py`` once a
    second, and only when a session waits for a lock)."""
    return conn.execute(
        """
        SELECT a.pid, coalesce(substring(a.query FROM 'tunefleet\\.([a-z_]+)\\('),
                               lower(substring(a.query FROM '^\\s*([A-Za-z]+)')), '')
                   AS statement,
               a.wait_event AS lock, b.pid AS blocker_pid,
               coalesce(substring(b.query FROM 'tunefleet\\.([a-z_]+)\\('),
                        lower(substring(b.query FROM '^\\s*([A-Za-z]+)')), '')
                   AS blocker_statement,
               coalesce(b.state, '') AS blocker_state,
               coalesce(b.wait_event_type || ':' || b.wait_event, '') AS blocker_wait
          FROM pg_stat_activity a
         CROSS JOIN LATERAL (SELECT min(x) AS pid FROM unnest(pg_blocking_pids(a.pid)) AS x)
               AS first_blocker
          JOIN pg_stat_activity b ON b.pid = first_blocker.pid
         WHERE a.backend_type = 'client backend' AND a.application_name = %s
           AND a.wait_event_type = 'Lock'
        """,
        (application_name,),
    ).fetchall()


def pooler_pools(console: psycopg.Connection[Any], database: str) -> list[Row]:
    """PgBouncer's pools of ``database`` (``SHOW POOLS`` on its admin console, a connection
    to the database ``pgbouncer`` as one of its ``admin_users``; tuple rows or dict rows):
    clients active and waiting for a server connection (``cl_active``, ``cl_waiting``),
    server connections active, idle, used, tested and logging in, and the longest current
    wait (``maxwait`` s + ``maxwait_us``). Locks: none (PgBouncer answers from its memory;
    the server is not involved)."""
    cur = psycopg.ClientCursor(console)  # the console speaks only the simple query protocol
    cur.execute("SHOW POOLS")
    names = [d.name for d in cur.description or ()]
    rows = [r if isinstance(r, dict) else dict(zip(names, r, strict=True)) for r in cur]
    return [r for r in rows if r.get("database") == database]
