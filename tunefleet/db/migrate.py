"""Programmatic Alembic: upgrade, downgrade, current and head, for the installed package.

The migration scripts ship inside the ``migrations`` package, so ``tunefleet db upgrade``
works from any directory without an ``alembic.ini``. The version table lives in the
``tunefleet`` schema next to our tables.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from tunefleet.db.engine import normalise_url
from tunefleet.errors import DatabaseUnavailable


def migrations_dir() -> Path:
    import migrations

    return Path(migrations.__file__).resolve().parent


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        cfg.attributes["dsn"] = normalise_url(url)
    return cfg


def make_engine(url: str) -> sa.Engine:
    """A SQLAlchemy engine for ``url`` (URL or key=value DSN); libpq parses the DSN."""
    import psycopg

    dsn = normalise_url(url)
    return sa.create_engine(
        "postgresql+psycopg://",
        poolclass=sa.pool.NullPool,
        creator=lambda: psycopg.connect(dsn),
    )


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations must have exactly one head, found {heads}")
    return heads[0]


def upgrade(url: str, revision: str = "head") -> None:
    _run(url, lambda cfg: command.upgrade(cfg, revision))


def downgrade(url: str, revision: str) -> None:
    _run(url, lambda cfg: command.downgrade(cfg, revision))


def _run(url: str, action: object) -> None:
    import psycopg

    cfg = alembic_config(url)
    try:
        action(cfg)  # type: ignore[operator]
    except sa.exc.OperationalError as exc:
        orig = getattr(exc, "orig", exc)
        if isinstance(orig, psycopg.OperationalError):
            from tunefleet.db.engine import connect

            connect(url).close()  # raises DatabaseUnavailable with the one-line reason
        raise DatabaseUnavailable(
            f"migration failed: {str(orig).strip().splitlines()[0]}"
        ) from None
