"""Connections to the database.

Two kinds of handle: plain psycopg connections (the queue statements in ``tunefleet.queries``
run on these, autocommit, with ``statement_timeout`` and
``idle_in_transaction_session_timeout`` set at connect time) and a SQLAlchemy engine for
Alembic. :func:`open_database` resolves the settings (explicit URL or the embedded server),
checks the schema is at head and returns the URL to connect with.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tunefleet.errors import DatabaseUnavailable, SchemaOutOfDate, UsageError
from tunefleet.settings import DatabaseSettings

_SCHEME = re.compile(r"^(postgres|postgresql)(\+\w+)?://")


def normalise_url(url: str) -> str:
    """Accept ``postgresql://``, ``postgres://`` and SQLAlchemy's ``postgresql+psycopg://``
    URLs as well as libpq ``key=value`` strings; return what libpq takes."""
    url = url.strip()
    if not url:
        raise UsageError("empty database URL; pass --db postgresql://USER@HOST:PORT/DBNAME")
    m = _SCHEME.match(url)
    if m:
        return "postgresql://" + url[m.end() :]
    if "=" in url and "://" not in url:
        return url
    raise UsageError(
        f"database URL {redact(url)!r} is not a PostgreSQL URL; "
        "use postgresql://USER@HOST:PORT/DBNAME (password in PGPASSWORD or ~/.pgpass)"
    )


def redact(url: str) -> str:
    """Hide a password that somebody put into a URL anyway."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def _describe(url: str) -> str:
    try:
        info = psycopg.conninfo.conninfo_to_dict(normalise_url(url))
    except (psycopg.ProgrammingError, UsageError):
        return redact(url)
    host = info.get("host") or "local socket"
    port = info.get("port") or "5432"
    db = info.get("dbname") or "(default database)"
    return f"{host}:{port}/{db}"


def session_options(settings: DatabaseSettings) -> str:
    """libpq ``options`` that every non-migrator session of ours carries."""
    return (
        f"-c statement_timeout={int(settings.statement_timeout_ms)}"
        f" -c idle_in_transaction_session_timeout={int(settings.idle_in_transaction_timeout_ms)}"
    )


def connect(
    url: str,
    settings: DatabaseSettings | None = None,
    *,
    autocommit: bool = True,
    dict_rows: bool = True,
    connect_timeout: int = 10,
) -> psycopg.Connection[Any]:
    """Open one psycopg connection with our session settings.

    Raises :class:`DatabaseUnavailable` with a one-line reason on any connection failure.
    """
    settings = settings or DatabaseSettings(url=url)
    try:
        return psycopg.connect(
            normalise_url(url),
            autocommit=autocommit,
            row_factory=dict_row if dict_rows else psycopg.rows.tuple_row,  # type: ignore[arg-type]
            options=session_options(settings),
            application_name=settings.application_name,
            connect_timeout=connect_timeout,
        )
    except psycopg.OperationalError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        reason = lines[0] if lines else type(exc).__name__
        raise DatabaseUnavailable(
            f"cannot connect to the database at {_describe(url)}: {reason}; "
            "check --db / TUNEFLEET_DATABASE_URL, or start the embedded one with "
            "`tunefleet db start`"
        ) from None
    except psycopg.ProgrammingError as exc:
        raise UsageError(f"bad database URL {redact(url)!r}: {exc}") from None


@contextmanager
def connection(
    url: str, settings: DatabaseSettings | None = None
) -> Iterator[psycopg.Connection[Any]]:
    conn = connect(url, settings)
    try:
        yield conn
    finally:
        conn.close()


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


def check_at_head(conn: psycopg.Connection[Any], url_hint: str = "") -> None:
    """Refuse to work on a database that is not at the migration head."""
    from tunefleet.db.migrate import head_revision

    head = head_revision()
    current = current_revision(conn)
    if current == head:
        return
    fix = "tunefleet db upgrade" + (f" --db {url_hint}" if url_hint else "")
    if current is None:
        raise SchemaOutOfDate(
            f"the database has no tunefleet schema (expected revision {head}); run `{fix}`"
        )
    raise SchemaOutOfDate(
        f"the database schema is at revision {current}, this tunefleet needs {head}; run `{fix}`"
        " (or upgrade tunefleet if the database is newer)"
    )


def database_url(settings: DatabaseSettings) -> str:
    """The URL to use: the explicit one (checked to be at head), else the embedded server
    (started or reused, and upgraded to head)."""
    if settings.url is None:
        from tunefleet.db.embedded import ensure_embedded_url

        return ensure_embedded_url()
    with connection(settings.url, settings) as conn:
        check_at_head(conn, url_hint=redact(settings.url))
    return settings.url
