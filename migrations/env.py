"""Alembic environment: runs migrations online against the URL given by tunefleet.db.migrate,
or, from Alembic's own command line (the repository's alembic.ini), ``-x db=URL`` or
``$TUNEFLEET_DATABASE_URL``."""

from __future__ import annotations

import contextlib

from alembic import context
from sqlalchemy import text

from tunefleet.db.migrate import make_engine
from tunefleet.db.schema import SCHEMA, metadata
from tunefleet.settings import DatabaseSettings

config = context.config


def include_name(name, type_, parent_names):
    # Compare only our schema; the database may be shared with other applications.
    if type_ == "schema":
        return name == SCHEMA
    return True


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _run(connectable)
        return
    engine = make_engine(_dsn())
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _dsn() -> str:
    dsn = config.attributes.get("dsn") or context.get_x_argument(as_dictionary=True).get("db")
    dsn = dsn or DatabaseSettings.build().url
    if not dsn:
        raise SystemExit(
            "no database: set TUNEFLEET_DATABASE_URL or pass -x db=URL (alembic.ini's header)"
        )
    return dsn


# Session-level advisory lock key serialising every migration of a database ("tunefleet").
MIGRATION_LOCK_KEY = 0x74756E65666C65


def _run(connection) -> None:
    # Two `db upgrade` at once: the second waits here, then finds nothing to do. The lock is
    # taken before CREATE SCHEMA, which is not safe to run concurrently even with IF NOT EXISTS.
    connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    connection.commit()
    try:
        connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        connection.commit()
        context.configure(
            connection=connection,
            target_metadata=metadata,
            version_table_schema=SCHEMA,
            include_schemas=True,
            include_name=include_name,
            compare_type=True,
            compare_server_default=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    except BaseException:
        # Do not hide the real error behind a failing unlock; closing the session unlocks too.
        with contextlib.suppress(Exception):
            connection.rollback()
            _unlock(connection)
        raise
    _unlock(connection)


def _unlock(connection) -> None:
    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
    connection.commit()


if context.is_offline_mode():
    raise SystemExit("tunefleet migrations run online only: use `tunefleet db upgrade`")
run_migrations_online()
