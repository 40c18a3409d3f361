"""Shared fixtures: a real PostgreSQL server for the whole session, a fresh database per test.

The server is ``$TUNEFLEET_TEST_ADMIN_URL`` when set (any PostgreSQL you can create databases
on), else a private server started for this test session in a temporary directory with the
embedded-server code the product itself uses. Each test that asks for ``db_url`` gets its own
database cloned from a template that was migrated to head once, so tests never see each
other's rows and can run in any order.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_DB = "tunefleet_test_template"
_counter = itertools.count()
_DROP = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A superuser DSN on a running PostgreSQL server."""
    explicit = os.environ.get("TUNEFLEET_TEST_ADMIN_URL")
    if explicit:
        yield explicit
        return
    from tunefleet.db.embedded import EmbeddedServer

    server = EmbeddedServer(tmp_path_factory.mktemp("pg") / "data")
    server.start()
    try:
        yield server.admin_url()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str) -> str:
    """Name of a database migrated to head, used as the template of every test database."""
    from tunefleet.db.migrate import upgrade

    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(TEMPLATE_DB)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DB)))
    upgrade(make_conninfo(pg_admin_url, dbname=TEMPLATE_DB))
    return TEMPLATE_DB


def _create_db(admin_url: str, name: str, template: str | None) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        if template:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        else:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(admin_url, dbname=name)


def _drop_db(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def db_url(pg_admin_url: str, pg_template: str) -> Iterator[str]:
    """DSN of a fresh database at the migration head, dropped after the test."""
    name = f"tf_test_{os.getpid()}_{next(_counter)}"
    url = _create_db(pg_admin_url, name, pg_template)
    yield url
    _drop_db(pg_admin_url, name)


@pytest.fixture
def empty_db_url(pg_admin_url: str) -> Iterator[str]:
    """DSN of a fresh, empty database (no tunefleet schema)."""
    name = f"tf_empty_{os.getpid()}_{next(_counter)}"
    url = _create_db(pg_admin_url, name, None)
    yield url
    _drop_db(pg_admin_url, name)


@pytest.fixture
def db(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection (dict rows) to the test database."""
    from tunefleet.db.engine import connect

    conn = connect(db_url)
    yield conn
    conn.close()


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for CLI subprocesses: isolated TUNEFLEET_HOME, unbuffered output."""
    env = dict(os.environ)
    env["TUNEFLEET_HOME"] = str(tmp_path / "home")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TUNEFLEET_DATABASE_URL", None)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env
