"""Least-privilege database roles: the policy, and ``tunefleet db roles`` that applies it.

Four roles, each named ``<prefix><name>`` (prefix ``tunefleet_`` by default):

``migrator``     owns the ``tunefleet`` schema and everything in it; the only role that runs
                 DDL (``tunefleet db upgrade --db postgresql://tunefleet_migrator@...``).
``coordinator``  creates runs and enqueues trials; reads everything; updates run and trial
                 state; cannot delete or truncate anything, nor change the schema.
``worker``       claims, heartbeats and completes trials and registers itself: it reads what it
                 needs, inserts measurements, attempts, worker, device and stand-aside rows,
                 and may UPDATE only the queue columns of ``trial`` (never ``config``,
                 ``run_id``, ...).
``reader``       SELECT on the views only. Views run with their owner's (the migrator's)
                 rights -- PostgreSQL's default, ``security_invoker`` is off -- so the reader
                 needs no privilege on the tables behind them and cannot write anything.

Every role but the migrator gets ``statement_timeout`` and
``idle_in_transaction_session_timeout`` as role defaults (queue rule 8); our own sessions set
them at connect time too.

Passwords never come from the command line: ``TUNEFLEET_<NAME>_PASSWORD`` (e.g.
``TUNEFLEET_WORKER_PASSWORD``) sets one; a new role without such a variable gets a generated
password written to a pgpass file (mode 0600) that workers use through ``PGPASSFILE``; an
existing role without a variable keeps its password (``--rotate`` generates a new one).

Re-running is safe and exact: in one transaction every privilege of the four roles on the
schema is revoked and the policy granted again, so a re-run after ``tunefleet db upgrade``
covers new tables and undoes anything granted by hand.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tunefleet.db.engine import check_at_head, connect
from tunefleet.db.schema import SCHEMA, VIEWS
from tunefleet.errors import DatabaseError, UsageError
from tunefleet.queries import roles as q

ROLE_NAMES = ("migrator", "coordinator", "worker", "reader")
DEFAULT_PREFIX = "tunefleet_"
ALEMBIC_TABLE = "alembic_version"
_PREFIX_RE = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")

# --- the policy ---------------------------------------------------------------------------

#: Columns of ``trial`` the worker's queue statements change: claim (state, attempt,
#: lease_owner, lease_expires_at, started_at), heartbeat (lease_expires_at), fenced
#: completion (state, finished_at, error, lease_expires_at), release (back to pending: state,
#: attempt, lease_owner, lease_expires_at, started_at) and the reaper step any worker may run
#: (state, lease_owner, lease_expires_at, finished_at, error).
WORKER_TRIAL_COLUMNS = (
    "state",
    "attempt",
    "lease_owner",
    "lease_expires_at",
    "started_at",
    "finished_at",
    "error",
)
#: Columns of ``attempt`` a worker closes (its own attempt, or an expired one in the reaper).
WORKER_ATTEMPT_COLUMNS = ("ended_at", "outcome", "error")
#: Columns of ``worker`` a worker process changes on its own row (heartbeat, shutdown, the
#: sizing it reports).
WORKER_WORKER_COLUMNS = (
    "heartbeat_at",
    "state",
    "stopped_at",
    "capacity",
    "prepare_workers",
    "prefetch",
    "sizing",
    "device_busy",
)
#: Columns of ``device`` refreshed when a known fingerprint registers again.
WORKER_DEVICE_COLUMNS = ("details",)

_ALL_TABLES = ("run", "trial", "attempt", "measurement", "worker", "device", "stand_aside")


@dataclass(frozen=True)
class TableGrant:
    """Privileges on one relation of the schema; ``columns`` makes them column-level."""

    table: str
    privileges: tuple[str, ...]
    columns: tuple[str, ...] | None = None


def _select(*tables: str) -> tuple[TableGrant, ...]:
    return tuple(TableGrant(t, ("SELECT",)) for t in tables)


POLICY: dict[str, tuple[TableGrant, ...]] = {
    "migrator": (),  # owner of everything: needs no grants
    "coordinator": (
        *_select(*_ALL_TABLES, ALEMBIC_TABLE, *VIEWS),
        TableGrant("run", ("INSERT", "UPDATE")),
        TableGrant("trial", ("INSERT", "UPDATE")),
        # Cache answers copy a measurement; the reaper step closes expired attempts.
        TableGrant("measurement", ("INSERT",)),
        TableGrant("attempt", ("UPDATE",), WORKER_ATTEMPT_COLUMNS),
    ),
    "worker": (
        *_select(*_ALL_TABLES, ALEMBIC_TABLE),
        TableGrant("trial", ("UPDATE",), WORKER_TRIAL_COLUMNS),
        TableGrant("attempt", ("INSERT",)),
        TableGrant("attempt", ("UPDATE",), WORKER_ATTEMPT_COLUMNS),
        TableGrant("measurement", ("INSERT",)),
        TableGrant("worker", ("INSERT",)),
        TableGrant("worker", ("UPDATE",), WORKER_WORKER_COLUMNS),
        TableGrant("device", ("INSERT",)),
        TableGrant("device", ("UPDATE",), WORKER_DEVICE_COLUMNS),
        # A worker records that it stands aside from a run (its own row; never updated).
        TableGrant("stand_aside", ("INSERT",)),
    ),
    "reader": _select(ALEMBIC_TABLE, *VIEWS),
}

#: Database-level privileges (the migrator may create the schema on a fresh database).
DATABASE_PRIVILEGES: dict[str, tuple[str, ...]] = {
    "migrator": ("CONNECT", "CREATE"),
    "coordinator": ("CONNECT",),
    "worker": ("CONNECT",),
    "reader": ("CONNECT",),
}


# --- settings and results -----------------------------------------------------------------


@dataclass(frozen=True)
class RolesSettings:
    """What ``tunefleet db roles`` does; built once from flags and the environment."""

    prefix: str = DEFAULT_PREFIX
    pgpass: Path | None = None
    rotate: bool = False
    statement_timeout_ms: int = 30_000
    idle_in_transaction_timeout_ms: int = 60_000
    #: Passwords from ``TUNEFLEET_<NAME>_PASSWORD``, by role name (unprefixed).
    passwords: dict[str, str] = field(default_factory=dict)

    def role(self, name: str) -> str:
        return self.prefix + name

    @classmethod
    def build(
        cls,
        prefix: str | None = None,
        pgpass: Path | None = None,
        rotate: bool = False,
        statement_timeout_ms: int = 30_000,
        idle_in_transaction_timeout_ms: int = 60_000,
    ) -> RolesSettings:
        from tunefleet.settings import home_dir, resolve

        chosen = resolve(prefix, "ROLE_PREFIX", DEFAULT_PREFIX, str)
        if not _PREFIX_RE.match(chosen):
            raise UsageError(
                f"role prefix {chosen!r} is not valid; use lower-case letters, digits and "
                "underscores, starting with a letter or underscore (e.g. tunefleet_)"
            )
        passwords = {}
        for name in ROLE_NAMES:
            value = os.environ.get(password_variable(name))
            if value:
                passwords[name] = value
        return cls(
            prefix=chosen,
            pgpass=pgpass or home_dir() / "roles.pgpass",
            rotate=rotate,
            statement_timeout_ms=statement_timeout_ms,
            idle_in_transaction_timeout_ms=idle_in_transaction_timeout_ms,
            passwords=passwords,
        )


def password_variable(name: str) -> str:
    """Environment variable that carries the password of role ``name``."""
    return f"TUNEFLEET_{name.upper()}_PASSWORD"


@dataclass(frozen=True)
class RoleReport:
    name: str
    role: str
    created: bool
    #: ``environment``, ``generated`` (written to the pgpass file) or ``unchanged``.
    password: str
    url: str


# --- applying it --------------------------------------------------------------------------


def setup_roles(admin_url: str, settings: RolesSettings) -> list[RoleReport]:
    """Create or update the four roles and apply the policy, all in one transaction; then
    write generated passwords to the pgpass file. Returns what was done per role."""
    conn = connect(admin_url)
    try:
        check_at_head(conn, url_hint="")
        database = q.current_database(conn)
        generated: dict[str, str] = {}
        reports: list[RoleReport] = []
        try:
            with conn.transaction():
                q.lock_roles_setup(conn)
                for name in ROLE_NAMES:
                    reports.append(_apply_role(conn, name, database, settings, generated))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise DatabaseError(
                f"cannot set up roles: {_first_line(exc)}; run `tunefleet db roles` with a "
                "superuser's --db URL (or the database owner with CREATEROLE)"
            ) from None
        if generated and settings.pgpass is not None:
            write_pgpass(settings.pgpass, database, generated)
        return reports
    finally:
        conn.close()


def _apply_role(
    conn: psycopg.Connection[Any],
    name: str,
    database: str,
    settings: RolesSettings,
    generated: dict[str, str],
) -> RoleReport:
    role = settings.role(name)
    created = not q.role_exists(conn, role)
    if created:
        q.create_role(conn, role)
    else:
        q.reset_role_attributes(conn, role)

    if name in settings.passwords:
        password_source = "environment"
        q.set_password(conn, role, q.password_verifier(conn, role, settings.passwords[name]))
    elif created or settings.rotate:
        password_source = "generated"
        generated[role] = secrets.token_urlsafe(24)
        q.set_password(conn, role, q.password_verifier(conn, role, generated[role]))
    else:
        password_source = "unchanged"

    if name == "migrator":
        q.reset_role_setting(conn, role, "statement_timeout")
        q.reset_role_setting(conn, role, "idle_in_transaction_session_timeout")
    else:
        q.set_role_setting(conn, role, "statement_timeout", settings.statement_timeout_ms)
        q.set_role_setting(
            conn,
            role,
            "idle_in_transaction_session_timeout",
            settings.idle_in_transaction_timeout_ms,
        )

    q.revoke_database(conn, database, role)
    q.grant_database(conn, database, role, DATABASE_PRIVILEGES[name])
    if name == "migrator":
        q.set_schema_owner(conn, SCHEMA, role)
        for rel in q.schema_relations(conn, SCHEMA):
            if rel["owner"] != role:
                q.set_relation_owner(conn, SCHEMA, rel["name"], rel["kind"], role)
    else:
        q.revoke_schema(conn, SCHEMA, role)
        q.grant_schema_usage(conn, SCHEMA, role)
        for grant in POLICY[name]:
            q.grant_table(conn, SCHEMA, grant.table, role, grant.privileges, grant.columns)
    return RoleReport(name, role, created, password_source, _role_url(conn, role, database))


def _role_url(conn: psycopg.Connection[Any], role: str, database: str) -> str:
    host = conn.info.host or "localhost"
    if host.startswith("/"):
        host = socket.getfqdn()
    return f"postgresql://{role}@{host}:{conn.info.port}/{database}"


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _pgpass_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(":", "\\:")


def write_pgpass(path: Path, database: str, passwords: dict[str, str]) -> None:
    """Add or replace ``*:*:database:role:password`` lines in a pgpass file (mode 0600),
    keeping every other line. Any host and port: the same file serves every node."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = {f"*:*:{_pgpass_escape(database)}:{_pgpass_escape(role)}:" for role in passwords}
    kept: list[str] = []
    if path.exists():
        kept = [
            line
            for line in path.read_text().splitlines()
            if not any(line.startswith(k) for k in keys)
        ]
    lines = kept + [
        f"*:*:{_pgpass_escape(database)}:{_pgpass_escape(role)}:{_pgpass_escape(pw)}"
        for role, pw in sorted(passwords.items())
    ]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    path.chmod(0o600)
