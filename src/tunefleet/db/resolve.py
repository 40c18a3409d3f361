"""Which database a command works on, and the check that its schema is the one we need.

:func:`database_url` resolves :class:`~tunefleet.settings.DatabaseSettings`: the explicit URL,
checked to be at the migration head (waiting for it with ``wait_s``), else the embedded server,
started or reused and upgraded to head. :func:`check_at_head` and :func:`current_revision` are
that check on an open connection (also used by ``tunefleet db check`` and ``tunefleet db
roles``). :func:`open_db` is the read connection every report (command, API, feinsum archive)
opens from a ``--db`` value.

This module sits above :mod:`~tunefleet.db.engine` (connections), :mod:`~tunefleet.db.migrate`
(Alembic) and :mod:`~tunefleet.db.embedded` (the server), which never import it. The last two
are imported inside the functions that need them: every worker (and each of its children)
resolves its URL at start, and a database at head is recognised by comparing with
``tunefleet.db.head.HEAD`` alone, without loading Alembic and SQLAlchemy (0.9 s of CPU per
process) or the embedded server's code.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from tunefleet.db.engine import connect, redact, wait_for_database
from tunefleet.errors import SchemaOutOfDate
from tunefleet.settings import DatabaseSettings

#: Data directories of the embedded servers this process started (they outlive it): the
#: command line says so once its command is done (:func:`started_embedded`).
_started: list[Path] = []


def current_revision(conn: psycopg.Connection[Any]) -> str | None:
    """The Alembic revision the database is at, or ``None`` when it has no tunefleet schema."""
    row = conn.execute(
        "SELECT to_regclass('tunefleet.alembic_version') IS NOT NULL AS present"
    ).fetchone()
    present = row["present"] if isinstance(row, dict) else row[0]  # type: ignore[index]
    if not present:
        return None
    row = conn.execute("SELECT version_num FROM tunefleet.alembic_version").fetchone()
    if row is None:
        return None
    return str(row["version_num"] if isinstance(row, dict) else row[0])  # type: ignore[index]


def check_at_head(conn: psycopg.Connection[Any], url_hint: str = "") -> str:
    """Refuse to work on a database that is not at the migration head; return the head.

    ``url_hint`` is the (redacted) URL to put into the fixing command of the message.
    """
    from tunefleet.db.head import HEAD

    current = current_revision(conn)
    if current == HEAD:
        return HEAD
    # Not at the recorded head: ask the migration scripts themselves (loads Alembic).
    from tunefleet.db.migrate import head_revision, is_known_revision

    head = head_revision()
    if current == head:
        return head
    fix = "tunefleet db upgrade" + (f" --db {shlex.quote(url_hint)}" if url_hint else "")
    # Missing or behind is what a database looks like while another process migrates it.
    if current is None:
        raise SchemaOutOfDate(
            f"the database has no tunefleet schema (expected revision {head}); run `{fix}`",
            transient=True,
        )
    if not is_known_revision(current):
        raise SchemaOutOfDate(
            f"the database schema is at revision {current}, which this tunefleet does not know "
            f"(its newest is {head}): the database is newer; upgrade tunefleet "
            "(pip install -U tunefleet)"
        )
    raise SchemaOutOfDate(
        f"the database schema is at revision {current}, this tunefleet needs {head}; run `{fix}`",
        transient=True,
    )


def database_url(settings: DatabaseSettings, *, read_only: bool = False) -> str:
    """The URL to use: the explicit one (checked to be at head), else the embedded server
    (started or reused, and upgraded to head). A ``read_only`` command (one that only reads
    results) never starts an embedded server someone stopped: EmbeddedServerError says how to
    start it. A crashed or never started one is still started: nobody asked it to stay down.

    With ``settings.wait_s`` an unreachable server or a schema not yet at head is retried,
    with backoff, until that many seconds have passed; errors that waiting cannot fix (a
    wrong password, database or host name) are raised at once.
    """
    if settings.url is None:
        return embedded_url(read_only=read_only)
    url = settings.url
    wait_for_database(url, settings, lambda conn: check_at_head(conn, url_hint=redact(url)))
    return url


def embedded_url(*, read_only: bool = False) -> str:
    """Start (or reuse) the embedded server, upgrade it to head, return its local URL; with
    ``read_only``, refuse to start one that was stopped on purpose."""
    from tunefleet.db.embedded import default_server
    from tunefleet.errors import EmbeddedServerError

    server = default_server()
    if read_only and server.stopped_on_purpose():
        raise EmbeddedServerError(
            "the embedded database is stopped (`tunefleet db stop`); start it with "
            "`tunefleet db start`, or pass --db URL to read another database"
        )
    if server.start().started:
        _started.append(server.data_dir)
    url = server.local_url()
    upgrade_to_head(url)
    return url


def upgrade_to_head(url: str) -> None:
    """Migrate the database at ``url`` to head, unless it is there: one query then, without
    loading Alembic and SQLAlchemy (most of a report command's CPU on an embedded server)."""
    from tunefleet.db.head import HEAD

    with connect(url) as conn:
        if current_revision(conn) == HEAD:
            return
    from tunefleet.db.migrate import upgrade

    upgrade(url)


def started_embedded() -> Path | None:
    """The data directory of the embedded server this process started (it was down) and
    that still runs, or None: a command that leaves a server running says so."""
    from tunefleet.db.embedded import EmbeddedServer

    for data_dir in reversed(_started):
        if EmbeddedServer(data_dir).status().running:
            return data_dir
    return None


@contextmanager
def open_db(db_flag: str | None) -> Iterator[Any]:
    """A read connection to the database of ``--db`` (or the embedded one, never started
    here once stopped on purpose), at head."""
    settings = DatabaseSettings.build(db_flag, application_name="tunefleet-cli")
    url = database_url(settings, read_only=True)
    conn = connect(url, settings)
    try:
        yield conn
    finally:
        conn.close()
