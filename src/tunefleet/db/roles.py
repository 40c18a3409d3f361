"""Least-privilege database roles: the policy, and ``tunefleet db roles`` that applies it.

Four roles, each named ``<prefix><name>`` (prefix ``tunefleet_`` by default):

``migrator``     owns the ``tunefleet`` schema and everything in it; the only role that runs
                 DDL (``tunefleet db upgrade --db postgresql://tunefleet_migrator@...``).
``coordinator``  creates runs and enqueues trials; reads everything; updates run and trial
                 state; cannot delete or truncate anything, nor change the schema.
``worker``       untrusted: reads the tables, and writes nothing itself. It registers,
                 claims, heartbeats, completes and releases through the queue's database
                 functions (SECURITY DEFINER, owned by the migrator), EXECUTE on exactly
                 :data:`WORKER_FUNCTIONS`; they check its worker secret and lease tokens and
                 copy every identity column from the database's own rows.
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
covers new tables and functions and undoes anything granted by hand. ``PUBLIC`` (every role)
loses ``TEMPORARY`` on the database, ``CREATE`` on the ``public`` schema and ``EXECUTE`` on the
schema's functions; only the migrator keeps ``TEMPORARY``.
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

from tunefleet.db.engine import connect
from tunefleet.db.resolve import check_at_head
from tunefleet.db.schema import SCHEMA, VIEWS
from tunefleet.errors import DatabaseProblem, UsageError, first_line
from tunefleet.queries import roles as q

ROLE_NAMES = ("migrator", "coordinator", "worker", "reader")
DEFAULT_PREFIX = "tunefleet_"
ALEMBIC_TABLE = "alembic_version"
_PREFIX_RE = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")

# --- the policy ---------------------------------------------------------------------------

#: Columns of ``attempt`` the coordinator's reaper step closes.
COORDINATOR_ATTEMPT_COLUMNS = ("ended_at", "outcome", "error")


@dataclass(frozen=True)
class FunctionGrant:
    """EXECUTE on one function of the schema, named by its argument types (as
    ``pg_get_function_identity_arguments`` spells them, without argument names)."""

    name: str
    arg_types: tuple[str, ...]

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(self.arg_types)})"


_UUID, _TEXT, _INT, _BIGINT, _FLOAT, _JSONB = (
    "uuid",
    "text",
    "integer",
    "bigint",
    "double precision",
    "jsonb",
)

#: Every function the worker role may execute: the queue's operations, installed by
#: ``migrations/versions/0003_worker_functions.py`` (SECURITY DEFINER). The worker has no
#: other way to write. A new worker-callable function is added here, in the migration that
#: creates it, and as a wrapper in ``src/tunefleet/queries/queue.py``.
WORKER_FUNCTIONS: tuple[FunctionGrant, ...] = (
    FunctionGrant(
        "register_device", (_TEXT, _TEXT, _TEXT, _TEXT, _TEXT, _TEXT, _INT, _BIGINT, _JSONB)
    ),
    FunctionGrant("register_worker", (_UUID, _TEXT, _INT, _BIGINT, _TEXT, _TEXT, _INT)),
    FunctionGrant("heartbeat_worker", (_UUID, _TEXT)),
    FunctionGrant("stop_worker", (_UUID, _TEXT)),
    FunctionGrant("report_worker_sizing", (_UUID, _TEXT, _INT, _INT, _INT, _TEXT, _FLOAT, _FLOAT)),
    FunctionGrant(
        "claim_trials", (_UUID, _TEXT, "text[]", _INT, _FLOAT, "bigint[]", "bigint[]", _FLOAT)
    ),
    FunctionGrant("heartbeat_trials", (_UUID, "bigint[]", "integer[]", "text[]", _FLOAT)),
    # 0011_fleet_shape: the device lease, and the whole beat in one statement.
    FunctionGrant("take_device", (_UUID, _TEXT, _INT, _FLOAT)),
    FunctionGrant("heartbeat", (_UUID, _TEXT, "bigint[]", "integer[]", "text[]", _FLOAT)),
    FunctionGrant(
        "complete_trial",
        (
            *(_UUID, _BIGINT, _INT, _TEXT, _TEXT, _TEXT),  # who, which claim, how it ended
            *(_FLOAT, _FLOAT, "double precision[]", _FLOAT, _FLOAT, _FLOAT, _FLOAT),
            *(_JSONB, _FLOAT, _JSONB, _JSONB, _TEXT),
            _JSONB,  # 0015_timeline: the attempt's timeline
        ),
    ),
    FunctionGrant("release_trials", (_UUID, "bigint[]", "integer[]", "text[]", _TEXT)),
    FunctionGrant("stand_aside", (_UUID, _TEXT, _BIGINT, _TEXT)),
    FunctionGrant("reap_expired_leases", (_INT,)),
)

_ALL_TABLES = (
    "run",
    "trial",
    "attempt",
    "measurement",
    "worker",
    "device",
    "stand_aside",
    "device_lease",
)


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
        TableGrant("attempt", ("UPDATE",), COORDINATOR_ATTEMPT_COLUMNS),
    ),
    # Reads only: every write goes through WORKER_FUNCTIONS.
    "worker": _select(*_ALL_TABLES, ALEMBIC_TABLE),
    "reader": _select(ALEMBIC_TABLE, *VIEWS),
}

#: Functions each role may execute (nobody else may: PUBLIC loses EXECUTE on all of them).
FUNCTION_POLICY: dict[str, tuple[FunctionGrant, ...]] = {
    "migrator": (),  # owner
    "coordinator": (),
    "worker": WORKER_FUNCTIONS,
    "reader": (),
}

#: Database-level privileges (the migrator may create the schema on a fresh database). Nobody
#: else may create temporary tables: PUBLIC's default TEMPORARY is revoked.
DATABASE_PRIVILEGES: dict[str, tuple[str, ...]] = {
    "migrator": ("CONNECT", "CREATE", "TEMPORARY"),
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
                q.revoke_public_defaults(conn, database, SCHEMA)
                for name in ROLE_NAMES:
                    reports.append(_apply_role(conn, name, database, settings, generated))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise DatabaseProblem(
                f"cannot set up roles: {first_line(exc)}; run `tunefleet db roles` with a "
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
        # SECURITY DEFINER functions run as their owner: the migrator, never a superuser.
        for found in q.schema_functions(conn, SCHEMA):
            if found["owner"] != role:
                q.set_function_owner(conn, SCHEMA, found["name"], found["arg_types"], role)
    else:
        q.revoke_schema(conn, SCHEMA, role)
        q.grant_schema_usage(conn, SCHEMA, role)
        for grant in POLICY[name]:
            q.grant_table(conn, SCHEMA, grant.table, role, grant.privileges, grant.columns)
        for fn in FUNCTION_POLICY[name]:
            q.grant_function(conn, SCHEMA, fn.name, fn.arg_types, role)
    return RoleReport(name, role, created, password_source, _role_url(conn, role, database))


def _role_url(conn: psycopg.Connection[Any], role: str, database: str) -> str:
    host = conn.info.host or "localhost"
    if host.startswith("/"):
        host = socket.getfqdn()
    return f"postgresql://{role}@{host}:{conn.info.port}/{database}"


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
