"""The statements behind ``tunefleet db roles``: roles, passwords, ownership and grants.

These run on an administrator's connection (a superuser, or the database owner with
CREATEROLE), never on a worker's or coordinator's. Identifiers go through
:mod:`psycopg.sql`; privilege keywords come from the fixed policy in
:mod:`tunefleet.db.roles`, never from user input. Passwords reach the server only as SCRAM
verifiers computed on the client (libpq's ``PQencryptPasswordConn``), so the cleartext never
appears in a statement the server could log.

Catalog and DDL statements take the usual catalog locks: ``ALTER ... OWNER`` and
``GRANT``/``REVOKE`` on a table take a brief ``ACCESS EXCLUSIVE``/``SHARE UPDATE EXCLUSIVE``
lock on it, so the whole set-up runs in one transaction (a worker never sees a table between
"privileges revoked" and "privileges granted again").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

Conn = psycopg.Connection[Any]

#: Privilege keywords a policy may use (anything else is a programming error).
PRIVILEGES = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES"})
#: An argument type of a function signature, as ``format_type`` spells built-in types.
_ARG_TYPE_RE = re.compile(r"^[a-z][a-z ]*(\[\])?$")


def _privilege_list(privileges: Sequence[str]) -> sql.Composable:
    unknown = set(privileges) - PRIVILEGES
    if unknown or not privileges:
        raise ValueError(f"bad privilege list {privileges!r}")
    return sql.SQL(", ").join(sql.SQL(p) for p in privileges)


def _qualified(schema: str, table: str) -> sql.Composable:
    return sql.Identifier(schema, table)


def lock_roles_setup(conn: Conn) -> None:
    """Serialise concurrent ``tunefleet db roles`` runs: a transaction-scoped advisory lock
    (held until the set-up transaction commits), so the second run waits, then finds the roles
    and re-applies the same grants instead of failing on ``CREATE ROLE``."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('tunefleet.roles'))")


def role_exists(conn: Conn, role: str) -> bool:
    """Whether a role of this name exists in the cluster. No locks beyond a catalog read."""
    row = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    return row is not None


def role_attributes(conn: Conn, role: str) -> dict[str, Any] | None:
    """The role's login/superuser flags and per-role settings, or ``None``. Catalog read."""
    row = conn.execute(
        """
        SELECT r.rolcanlogin AS login, r.rolsuper AS superuser,
               r.rolcreaterole AS createrole, r.rolcreatedb AS createdb,
               coalesce((SELECT s.setconfig FROM pg_db_role_setting s
                          WHERE s.setrole = r.oid AND s.setdatabase = 0), '{}') AS settings
          FROM pg_roles r
         WHERE r.rolname = %s
        """,
        (role,),
    ).fetchone()
    if row is None:
        return None
    return dict(row) if isinstance(row, dict) else None


def password_verifier(conn: Conn, role: str, password: str) -> str:
    """The SCRAM-SHA-256 verifier of ``password`` for ``role``, computed by libpq on the
    client (the server's ``password_encryption`` picks the algorithm). No statement runs."""
    verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256")
    return verifier.decode()


def create_role(conn: Conn, role: str) -> None:
    """``CREATE ROLE`` with LOGIN and no special powers. Takes the cluster-wide role lock
    briefly; fails with ``DuplicateObject`` if the role appeared meanwhile."""
    conn.execute(
        sql.SQL(
            "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        ).format(sql.Identifier(role))
    )


def set_login_superuser(conn: Conn, role: str, password: str) -> None:
    """Create ``role`` as a login superuser with ``password``, or make the existing one so
    (the embedded server's own role for remote workers; the server is private to its user).
    Catalog row lock on the role, for the statement."""
    verb = "ALTER" if role_exists(conn, role) else "CREATE"
    conn.execute(
        sql.SQL("{} ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            sql.SQL(verb), sql.Identifier(role), sql.Literal(password)
        )
    )


def reset_role_attributes(conn: Conn, role: str) -> None:
    """Make an existing role a plain login role again (idempotent re-runs undo any widening
    done by hand). Catalog row lock on the role."""
    conn.execute(
        sql.SQL(
            "ALTER ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        ).format(sql.Identifier(role))
    )


def set_password(conn: Conn, role: str, verifier: str) -> None:
    """Store a pre-computed SCRAM verifier as the role's password. Catalog row lock."""
    conn.execute(
        sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(verifier))
    )


def set_role_setting(conn: Conn, role: str, name: str, value: int) -> None:
    """A per-role default for a server setting (``ALTER ROLE ... SET``), e.g.
    ``statement_timeout``. Applies to new sessions of the role. Catalog row lock."""
    conn.execute(
        sql.SQL("ALTER ROLE {} SET {} = {}").format(
            sql.Identifier(role), sql.Identifier(name), sql.Literal(int(value))
        )
    )


def reset_role_setting(conn: Conn, role: str, name: str) -> None:
    """Drop a per-role default (the migrator runs long DDL without timeouts). Catalog lock."""
    conn.execute(
        sql.SQL("ALTER ROLE {} RESET {}").format(sql.Identifier(role), sql.Identifier(name))
    )


def current_database(conn: Conn) -> str:
    """The database this connection is in. No locks."""
    row = conn.execute("SELECT current_database() AS db").fetchone()
    return str(row["db"] if isinstance(row, dict) else row[0])  # type: ignore[index]


def grant_database(conn: Conn, database: str, role: str, privileges: Sequence[str]) -> None:
    """``GRANT CONNECT/CREATE/TEMPORARY ON DATABASE``. Catalog row lock on the database."""
    allowed = {"CONNECT", "CREATE", "TEMPORARY"}
    if not privileges or set(privileges) - allowed:
        raise ValueError(f"bad database privileges {privileges!r}")
    conn.execute(
        sql.SQL("GRANT {} ON DATABASE {} TO {}").format(
            sql.SQL(", ").join(sql.SQL(p) for p in privileges),
            sql.Identifier(database),
            sql.Identifier(role),
        )
    )


def revoke_database(conn: Conn, database: str, role: str) -> None:
    """``REVOKE ALL ON DATABASE`` from the role (re-runs start from nothing). Catalog lock."""
    conn.execute(
        sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(
            sql.Identifier(database), sql.Identifier(role)
        )
    )


def schema_exists(conn: Conn, schema: str) -> bool:
    """Whether the schema exists. Catalog read."""
    row = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return row is not None


def set_schema_owner(conn: Conn, schema: str, owner: str) -> None:
    """``ALTER SCHEMA ... OWNER TO``. Catalog row lock on the schema."""
    conn.execute(
        sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(sql.Identifier(schema), sql.Identifier(owner))
    )


def schema_relations(conn: Conn, schema: str) -> list[dict[str, Any]]:
    """Tables, views and free-standing sequences of the schema, with their kind and owner.

    Identity/serial sequences are left out: they follow their table's owner. Catalog read.
    """
    rows = conn.execute(
        """
        SELECT c.relname AS name,
               c.relkind AS kind,
               pg_get_userbyid(c.relowner) AS owner
          FROM pg_class c
         WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %s)
           AND (c.relkind IN ('r', 'p', 'v', 'm', 'f')
                OR (c.relkind = 'S' AND NOT EXISTS (
                      SELECT 1 FROM pg_depend d
                       WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                         AND d.deptype IN ('a', 'i'))))
         ORDER BY c.relname
        """,
        (schema,),
    ).fetchall()
    return [dict(r) for r in rows]


_ALTER_KIND = {
    "r": "TABLE",
    "p": "TABLE",
    "f": "FOREIGN TABLE",
    "v": "VIEW",
    "m": "MATERIALIZED VIEW",
    "S": "SEQUENCE",
}


def set_relation_owner(conn: Conn, schema: str, name: str, kind: str, owner: str) -> None:
    """``ALTER TABLE|VIEW|SEQUENCE ... OWNER TO``: takes an ACCESS EXCLUSIVE lock on the
    relation until the surrounding transaction ends (a queue statement waits meanwhile)."""
    conn.execute(
        sql.SQL("ALTER {} {} OWNER TO {}").format(
            sql.SQL(_ALTER_KIND[kind]), _qualified(schema, name), sql.Identifier(owner)
        )
    )


def revoke_schema(conn: Conn, schema: str, role: str) -> None:
    """Take every privilege on the schema and on all its tables, views, sequences and
    functions from the role (table-level REVOKE ALL also removes column grants). Brief locks
    on each relation."""
    for stmt in (
        "REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role}",
        "REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM {role}",
        "REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {schema} FROM {role}",
        "REVOKE ALL ON SCHEMA {schema} FROM {role}",
    ):
        conn.execute(sql.SQL(stmt).format(schema=sql.Identifier(schema), role=sql.Identifier(role)))


def revoke_public_defaults(conn: Conn, database: str, schema: str) -> None:
    """What PostgreSQL grants every role (``PUBLIC``) by default and our roles must not have:
    ``TEMPORARY`` on the database, ``CREATE`` on the ``public`` schema (granted before
    PostgreSQL 15) and ``EXECUTE`` on the functions of our schema. This changes the database
    for every role in it; one that needs temporary tables gets TEMPORARY granted by name.
    Catalog row locks on the database, the schemas and the functions."""
    conn.execute(
        sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC").format(sql.Identifier(database))
    )
    if schema_exists(conn, "public"):
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    conn.execute(
        sql.SQL("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {} FROM PUBLIC").format(
            sql.Identifier(schema)
        )
    )


def schema_functions(conn: Conn, schema: str) -> list[dict[str, Any]]:
    """Functions of the schema: ``name``, ``arg_types`` (the identity argument types, e.g.
    ``['uuid', 'text']``), ``owner``, ``definer`` (SECURITY DEFINER) and ``config`` (its
    SET clauses). Catalog read."""
    rows = conn.execute(
        """
        SELECT p.proname AS name,
               coalesce((SELECT array_agg(format_type(a.t, NULL) ORDER BY a.n)
                           FROM unnest(p.proargtypes) WITH ORDINALITY AS a(t, n)),
                        '{}') AS arg_types,
               pg_get_userbyid(p.proowner) AS owner,
               p.prosecdef AS definer,
               coalesce(p.proconfig, '{}') AS config
          FROM pg_proc p
         WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = %s)
         ORDER BY p.proname, 2
        """,
        (schema,),
    ).fetchall()
    return [dict(r) for r in rows]


def _function(schema: str, name: str, arg_types: Sequence[str]) -> sql.Composable:
    bad = [t for t in arg_types if not _ARG_TYPE_RE.match(t)]
    if bad:
        raise ValueError(f"bad argument types {bad!r} of function {name!r}")
    return sql.SQL("{}({})").format(
        sql.Identifier(schema, name), sql.SQL(", ").join(sql.SQL(t) for t in arg_types)
    )


def set_function_owner(
    conn: Conn, schema: str, name: str, arg_types: Sequence[str], owner: str
) -> None:
    """``ALTER FUNCTION ... OWNER TO``: a SECURITY DEFINER function then runs with the new
    owner's rights. Catalog row lock on the function."""
    conn.execute(
        sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(
            _function(schema, name, arg_types), sql.Identifier(owner)
        )
    )


def grant_function(conn: Conn, schema: str, name: str, arg_types: Sequence[str], role: str) -> None:
    """``GRANT EXECUTE ON FUNCTION schema.name(types) TO role``; fails when no such function
    exists (a policy naming a function the migrations did not install). Catalog row lock."""
    conn.execute(
        sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(
            _function(schema, name, arg_types), sql.Identifier(role)
        )
    )


def executable_functions(conn: Conn, schema: str, role: str) -> list[str]:
    """Signatures (``name(type, ...)``) of the schema's functions the role may execute,
    directly or through PUBLIC. Catalog read."""
    rows = conn.execute(
        """
        SELECT p.proname || '(' || coalesce((
                 SELECT string_agg(format_type(a.t, NULL), ', ' ORDER BY a.n)
                   FROM unnest(p.proargtypes) WITH ORDINALITY AS a(t, n)), '') || ')' AS sig
          FROM pg_proc p
         WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = %s)
           AND has_function_privilege(%s, p.oid, 'EXECUTE')
         ORDER BY 1
        """,
        (schema, role),
    ).fetchall()
    return [str(r["sig"] if isinstance(r, dict) else r[0]) for r in rows]


def grant_schema_usage(conn: Conn, schema: str, role: str) -> None:
    """``GRANT USAGE ON SCHEMA`` (look up objects, no creating). Catalog row lock."""
    conn.execute(
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(schema), sql.Identifier(role)
        )
    )


def grant_table(
    conn: Conn,
    schema: str,
    table: str,
    role: str,
    privileges: Sequence[str],
    columns: Sequence[str] | None = None,
) -> None:
    """``GRANT privileges [(columns)] ON schema.table TO role``. With ``columns`` the grant is
    column-level (only those columns may be named in an UPDATE's SET). Brief relation lock."""
    target = _privilege_list(privileges)
    if columns:
        column_list = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        target = sql.SQL(", ").join(
            sql.SQL("{} ({})").format(sql.SQL(p), column_list) for p in privileges
        )
    conn.execute(
        sql.SQL("GRANT {} ON TABLE {} TO {}").format(
            target, _qualified(schema, table), sql.Identifier(role)
        )
    )


def table_privileges(conn: Conn, schema: str, role: str) -> list[dict[str, Any]]:
    """Every table- and column-level privilege the role holds in the schema, for reports and
    tests: rows of (table, privilege, column or NULL for the whole table). Catalog read."""
    rows = conn.execute(
        """
        SELECT table_name AS table, privilege_type AS privilege, NULL::text AS column
          FROM information_schema.role_table_grants
         WHERE table_schema = %(schema)s AND grantee = %(role)s
        UNION ALL
        SELECT table_name, privilege_type, column_name
          FROM information_schema.column_privileges
         WHERE table_schema = %(schema)s AND grantee = %(role)s
        ORDER BY 1, 2, 3
        """,
        {"schema": schema, "role": role},
    ).fetchall()
    return [dict(r) for r in rows]


def drop_owned_and_role(conn: Conn, role: str, reassign_to: str | None = None) -> None:
    """``DROP OWNED BY`` (in this database) then ``DROP ROLE IF EXISTS``: for tests and for
    tearing a deployment down. With ``reassign_to`` the role's objects are first handed to that
    role (``REASSIGN OWNED``) and survive; without it they are destroyed. Takes ACCESS
    EXCLUSIVE locks on every object concerned."""
    if not role_exists(conn, role):
        return
    if reassign_to is not None:
        conn.execute(
            sql.SQL("REASSIGN OWNED BY {} TO {}").format(
                sql.Identifier(role), sql.Identifier(reassign_to)
            )
        )
    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
