"""Alembic environment: runs migrations online against the URL given by tunefleet.db.migrate."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from tunefleet.db.migrate import make_engine
from tunefleet.db.schema import SCHEMA, metadata

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
    engine = make_engine(config.attributes["dsn"])
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _run(connection) -> None:
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
        # Two `db upgrade` at once: the second waits, then finds nothing to do.
        connection.execute(text("SELECT pg_advisory_xact_lock(hashtext('tunefleet.migrate'))"))
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("tunefleet migrations run online only: use `tunefleet db upgrade`")
run_migrations_online()
