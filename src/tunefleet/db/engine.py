"""Connections to the database: the leaf every other database module builds on.

It owns what a URL may look like (:func:`normalise_url`, :func:`redact`), the session settings
every non-migrator session carries (``statement_timeout`` and
``idle_in_transaction_session_timeout``, set at connect time), :func:`connect` (plain psycopg
connections, autocommit: the statements in ``tunefleet.queries`` run on these) with a one-line
reason and hint when it fails, and :func:`wait_for_database`, the start-up wait for a server
that is not up yet. It imports no other database module: which URL to use (explicit, else the
embedded server) and whether its schema is at head is :mod:`tunefleet.db.resolve`'s; the
SQLAlchemy engine for Alembic is :mod:`tunefleet.db.migrate`'s.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from tunefleet.backoff import Backoff
from tunefleet.errors import DatabaseProblem, DatabaseUnavailable, UsageError, first_line
from tunefleet.settings import DatabaseSettings

_log = logging.getLogger("tunefleet.db")
#: Backoff of the start-up wait for the database (``DatabaseSettings.wait_s``).
_FIRST_WAIT_S = 0.5
_MAX_WAIT_S = 10.0

T = TypeVar("T")

_SCHEME = re.compile(r"^(postgres|postgresql)(\+\w+)?://")


def normalise_url(url: str) -> str:
    """Accept ``postgresql://``, ``postgres://`` and SQLAlchemy's ``postgresql+psycopg://``
    URLs as well as libpq ``key=value`` strings; return what libpq takes.

    Raises :class:`UsageError` for anything libpq would not parse, naming the bad part.
    """
    url = url.strip()
    if not url:
        raise UsageError("empty database URL; pass --db postgresql://USER@HOST:PORT/DBNAME")
    m = _SCHEME.match(url)
    if m:
        url = "postgresql://" + url[m.end() :]
    elif "=" not in url or "://" in url:
        raise UsageError(
            f"database URL {redact(url)!r} is not a PostgreSQL URL; "
            "use postgresql://USER@HOST:PORT/DBNAME (password in PGPASSWORD or a pgpass file)"
        )
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise UsageError(
            f"database URL {redact(url)!r} is malformed ({redact(first_line(exc))}); "
            "use postgresql://USER@HOST:PORT/DBNAME"
        ) from None
    for port in str(info.get("port") or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise UsageError(
                f"database URL {redact(url)!r} has port {port!r}, which is not a TCP port; "
                "use a number from 1 to 65535"
            )
    return url


def redact(url: str) -> str:
    """Hide a password that somebody put into a URL or a key=value DSN anyway."""
    url = re.sub(r"(://[^:/@?]+:)[^@/?]*@", r"\1***@", url)
    url = re.sub(r"([?&]password=)[^&]*", r"\1***", url)
    return re.sub(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", url)


def _describe(url: str) -> str:
    try:
        info = psycopg.conninfo.conninfo_to_dict(normalise_url(url))
    except (psycopg.ProgrammingError, UsageError):
        return redact(url)
    host = info.get("host") or "local socket"
    port = info.get("port") or "5432"
    db = info.get("dbname") or "(default database)"
    return f"{host}:{port}/{db}"


# What the user can do about each way a connection fails, by a piece of libpq's message.
_HINTS: tuple[tuple[str, str], ...] = (
    (
        "no encryption",
        "the server takes only TLS connections from here: add "
        "sslmode=verify-full&sslrootcert=CA_FILE to the URL (CA_FILE: the certificate of the "
        "authority that signed the server's)",
    ),
    (
        "pg_hba.conf",
        "the server's pg_hba.conf lets no such connection in: ask its administrator for a "
        "hostssl line for this network, user and database",
    ),
    ("password authentication failed", "check the password in PGPASSWORD or the pgpass file"),
    (
        "no password supplied",
        "put the password in PGPASSWORD or a pgpass file named by PGPASSFILE "
        "(for the embedded server: the file `tunefleet db url --remote` names)",
    ),
    (
        "database",
        "create that database (createdb NAME) or fix the database name in the URL",
    ),
    ("role", "fix the user name in the URL, or create that role"),
    ("failed to resolve host", "check the host name in the URL"),
    ("timeout expired", "the host did not answer; check the host, port and firewall"),
    (
        "unsupported startup parameter",
        "a connection pooler refused the session settings tunefleet sends: add "
        "`ignore_startup_parameters = options` to its configuration (PgBouncer's [pgbouncer] "
        "section; the role's own timeouts, set by `tunefleet db roles`, then apply)",
    ),
)
_DEFAULT_HINT = (
    "is the server running there? check --db / TUNEFLEET_DATABASE_URL, "
    "or start the embedded one with `tunefleet db start`"
)


def _hint(reason: str) -> str:
    lowered = reason.lower()
    for needle, hint in _HINTS:
        if needle in lowered and (needle not in ("database", "role") or "not exist" in lowered):
            return hint
    return _DEFAULT_HINT


#: Pieces of libpq's reason that waiting never fixes: the URL or the credentials are wrong.
_PERMANENT = (
    "password",
    "authentication",
    "pg_hba.conf",
    "certificate",
    "does not exist",
    "failed to resolve host",
    "could not translate host name",
    "unsupported startup parameter",
)


def _transient(reason: str) -> bool:
    lowered = reason.lower()
    return not any(needle in lowered for needle in _PERMANENT)


def session_options(settings: DatabaseSettings) -> str:
    """libpq ``options`` that every non-migrator session of ours carries."""
    return (
        f"-c statement_timeout={int(settings.statement_timeout_ms)}"
        f" -c idle_in_transaction_session_timeout={int(settings.idle_in_transaction_timeout_ms)}"
    )


def dead_link_options(url: str, dead_link_s: float | None) -> dict[str, int]:
    """libpq's TCP settings that give a connection up once its peer has acknowledged nothing
    for about ``dead_link_s`` seconds: sent data unacknowledged (``tcp_user_timeout``), or no
    answer to keepalive probes while a reply is awaited. Settings the URL names itself win;
    libpq ignores them on a Unix socket, and ``tcp_user_timeout`` where the system lacks it.
    """
    if dead_link_s is None:
        return {}
    given = psycopg.conninfo.conninfo_to_dict(normalise_url(url))
    probe_s = max(1, round(dead_link_s / 3))
    wanted = {
        "keepalives": 1,
        "keepalives_idle": probe_s,
        "keepalives_interval": probe_s,
        "keepalives_count": 3,
        "tcp_user_timeout": max(1000, round(dead_link_s * 1000)),
    }
    return {k: v for k, v in wanted.items() if k not in given}


def connect(
    url: str,
    settings: DatabaseSettings | None = None,
    *,
    autocommit: bool = True,
    dict_rows: bool = True,
    connect_timeout: int | None = None,
) -> psycopg.Connection[Any]:
    """Open one psycopg connection with our session settings (as startup ``options``).

    With ``settings.behind_pooler`` (a worker), a pooler that refuses the ``options``
    (PgBouncer without ``ignore_startup_parameters = options``) gets a connection without
    them: the role's own settings, which ``tunefleet db roles`` gives every role, then apply.

    Raises :class:`DatabaseUnavailable` with a one-line reason on any connection failure.
    """
    settings = settings or DatabaseSettings(url=url)
    try:
        return _connect(url, settings, autocommit, dict_rows, connect_timeout, True)
    except DatabaseUnavailable as exc:
        if not (settings.behind_pooler and _REFUSED_OPTIONS in str(exc)):
            raise
        _log.info("a connection pooler refused the session options; connecting without them")
        return _connect(url, settings, autocommit, dict_rows, connect_timeout, False)


#: What PgBouncer says to startup ``options`` it was not told to ignore.
_REFUSED_OPTIONS = "unsupported startup parameter"


def _connect(
    url: str,
    settings: DatabaseSettings,
    autocommit: bool,
    dict_rows: bool,
    connect_timeout: int | None,
    send_options: bool,
) -> psycopg.Connection[Any]:
    extra: dict[str, Any] = {"options": session_options(settings)} if send_options else {}
    try:
        extra.update(dead_link_options(url, settings.dead_link_s))
        return psycopg.connect(
            normalise_url(url),
            autocommit=autocommit,
            row_factory=dict_row if dict_rows else psycopg.rows.tuple_row,  # type: ignore[arg-type]
            application_name=settings.application_name,
            connect_timeout=connect_timeout or settings.connect_timeout_s,
            **extra,
        )
    except psycopg.OperationalError as exc:
        reason = _reason(exc)
        raise DatabaseUnavailable(
            f"cannot connect to the database at {_describe(url)}: {reason}; {_hint(reason)}",
            transient=_transient(reason),
        ) from None
    except psycopg.ProgrammingError as exc:
        raise UsageError(f"bad database URL {redact(url)!r}: {redact(first_line(exc))}") from None


def _reason(exc: BaseException) -> str:
    """libpq's reason without its "connection to server at ... failed:" preamble."""
    reason = first_line(exc)
    for prefix in ("connection failed:", "connection is bad:"):
        if reason.startswith(prefix):
            reason = reason[len(prefix) :].strip()
    m = re.match(r"connection to server (?:at|on) .*? failed: (.*)$", reason)
    if m:
        reason = m.group(1)
    return reason.replace("FATAL:  ", "").strip()


@contextmanager
def connection(
    url: str, settings: DatabaseSettings | None = None
) -> Iterator[psycopg.Connection[Any]]:
    conn = connect(url, settings)
    try:
        yield conn
    finally:
        conn.close()


def wait_for_database(
    url: str, settings: DatabaseSettings, check: Callable[[psycopg.Connection[Any]], T]
) -> T:
    """Connect to ``url`` and return what ``check`` finds on that connection (closed after).

    With ``settings.wait_s`` a database problem that says waiting may fix it (an unreachable
    server, a schema another process is migrating) is retried, with backoff, until that many
    seconds have passed; problems that waiting cannot fix (a wrong password, database or host
    name) are raised at once.
    """
    deadline = time.monotonic() + settings.wait_s
    pause = Backoff(_FIRST_WAIT_S, _MAX_WAIT_S)
    said = ""
    while True:
        try:
            with connection(url, settings) as conn:
                return check(conn)
        except DatabaseProblem as exc:
            left = deadline - time.monotonic()
            if not exc.transient or left <= 0:
                if settings.wait_s and exc.transient:
                    waited = f"{exc} (still so after waiting {settings.wait_s:g} s)"
                    raise type(exc)(waited) from None
                raise
            if str(exc) != said:  # once per reason, not once per try
                _log.warning("waiting up to %.0f s more for the database: %s", left, exc)
                said = str(exc)
            time.sleep(min(pause.next(), left))
