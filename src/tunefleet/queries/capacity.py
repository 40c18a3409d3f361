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
