"""Programmatic Alembic: upgrade, downgrade, current and head, for the installed package.

The migration scripts ship inside the ``tunefleet.migrations`` package, so ``tunefleet db upgrade``
works from any directory without an ``alembic.ini``. The version table lives in the
``tunefleet`` schema next to our tables. ``migrations/env.py`` holds an advisory lock for the
whole migration, so concurrent upgrades of one database run one after the other.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from tunefleet.db.engine import normalise_url
from tunefleet.errors import DatabaseProblem, UsageError, first_line

#: Seconds to wait for the server to answer a connection attempt before giving up.
CONNECT_TIMEOUT_S = 10


def migrations_dir() -> Path:
    # Found, not imported: the migrations import this package, never the other way round.
    spec = importlib.util.find_spec("tunefleet.migrations")
    if spec is None or spec.origin is None:
        raise RuntimeError("the tunefleet.migrations package is not installed")
    return Path(spec.origin).resolve().parent


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        cfg.attributes["dsn"] = normalise_url(url)
    return cfg


def script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def make_engine(url: str) -> sa.Engine:
    """A SQLAlchemy engine for ``url`` (URL or key=value DSN); libpq parses the DSN."""
    import psycopg

    dsn = normalise_url(url)
    return sa.create_engine(
        "postgresql+psycopg://",
        poolclass=sa.pool.NullPool,
        creator=lambda: psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S),
    )


def head_revision() -> str:
    heads = script_directory().get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations must have exactly one head, found {heads}")
    return heads[0]


def is_known_revision(revision: str) -> bool:
    """Whether this tunefleet's migrations contain ``revision`` (else the database is newer)."""
    try:
        return script_directory().get_revision(revision) is not None
    except CommandError:
        return False


def upgrade(url: str, revision: str = "head") -> None:
    _run(url, lambda cfg: command.upgrade(cfg, revision))


def downgrade(url: str, revision: str) -> None:
    _run(url, lambda cfg: command.downgrade(cfg, revision))


def _run(url: str, action: Callable[[Config], None]) -> None:
    import psycopg

    cfg = alembic_config(url)
    try:
        action(cfg)
    except CommandError as exc:
        raise UsageError(
            f"migration refused: {first_line(exc)}; see `tunefleet db upgrade --help`"
        ) from None
    except sa.exc.DBAPIError as exc:
        orig = getattr(exc, "orig", exc)
        if isinstance(orig, psycopg.OperationalError) and not isinstance(
            orig, psycopg.errors.QueryCanceled
        ):
            from tunefleet.db.engine import connect

            connect(url).close()  # raises DatabaseUnavailable with the one-line reason
        raise DatabaseProblem(
            f"migration failed: {first_line(orig)}; nothing was changed (each migration "
            "runs in one transaction); fix the cause and run `tunefleet db upgrade` again"
        ) from None
