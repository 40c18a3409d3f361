"""Shared fixtures: a real PostgreSQL server for the whole session, a fresh database per test.

The server is ``$TUNEFLEET_TEST_ADMIN_URL`` when set (any PostgreSQL you can create databases
on), else a private server started for this test session in a temporary directory with the
embedded-server code the product itself uses. Each test that asks for ``db_url`` gets its own
database cloned from a template that was migrated to head once, so tests never see each
other's rows and can run in any order.

``TUNEFLEET_TEST_SHUFFLE=SEED`` runs the tests in an order shuffled by ``SEED`` (modules
shuffled, then the tests within each module), which proves that they can: ``tests/stability.py``
sets it for every run it makes, and prints the seed.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
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


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """This interpreter's commands first on ``PATH``; throw-away embedded servers; our code
    compiled once; as root, this session's temporary files out of the shared ``pytest-of-root``.

    Tests start the installed commands by name (``tunefleet``, and the deployment scripts'
    ``python3``), as users do. Run as ``.venv/bin/python -m pytest`` without activating the
    environment, the names would otherwise find another installation or none.

    The embedded server runs as an unprivileged user when we are root, and it must traverse
    the parents of its data directory. Every pytest session that starts resets
    ``pytest-of-root`` to mode 0700, which would cut off the servers of sessions running in
    parallel on the same machine. A private base directory per session avoids that.

    Nothing a test's server holds must survive an operating-system crash, so every embedded
    server the tests start, in this process or in the commands they run, never waits for the
    disk (``TUNEFLEET_PG_NO_SYNC``): on a slow or shared disk each initdb's flush and every
    commit's stalled the tests (a test that needs the durable default says so).

    The suite starts thousands of Python processes (commands, workers, their device and
    code-generation children). With ``PYTHONDONTWRITEBYTECODE`` set (as on CI machines) each
    of them compiled our modules from source again, seconds of CPU per test on two cores; so
    the checkout's own packages are compiled to ``__pycache__`` once, before any test starts.
    """
    bin_dir = str(Path(sys.executable).parent)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    os.environ.setdefault("TUNEFLEET_PG_NO_SYNC", "1")
    if not hasattr(config, "workerinput"):
        _compile_our_packages()
    if os.geteuid() != 0 or config.option.basetemp or hasattr(config, "workerinput"):
        return
    base = tempfile.mkdtemp(prefix="tunefleet-pytest-")
    config.option.basetemp = base
    config.add_cleanup(lambda: shutil.rmtree(base, ignore_errors=True))


def _compile_our_packages() -> None:
    # py_compile writes even where sys.dont_write_bytecode is set; the processes that import
    # the modules only need to read the files.
    import compileall

    for package in ("src/tunefleet", "coordinator", "worker", "benchmarks", "tests/helpers"):
        compileall.compile_dir(ROOT / package, quiet=1, workers=1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many parallel sessions ``-n auto`` (the default, see pyproject.toml) starts: one
    more than the usable cores, at most 8; none for the GPU tests.

    The process tests spend much of their time waiting on other processes (a lease to
    expire, a worker to start, a deadline), so one session per core leaves cores idle; more
    than a few only adds embedded servers, one per session. GPU tests time kernels on one
    device, which parallel sessions would share, so they run in this process.
    """
    if re.search(r"(?<!not )\bgpu\b", config.option.markexpr or ""):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min((cores or 1) + 1, 8)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Shuffle the order under ``TUNEFLEET_TEST_SHUFFLE`` (see the module docstring). Tests
    stay grouped by module, so module-scoped fixtures are still set up once."""
    seed = os.environ.get("TUNEFLEET_TEST_SHUFFLE")
    if not seed:
        return
    rng = random.Random(seed)
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(modules.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    items[:] = [item for group in groups for item in group]


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Which PostgreSQL the session's server runs on, and where its binaries come from; the
    shuffle seed when the order is shuffled."""
    lines = [_postgres_header()]
    seed = os.environ.get("TUNEFLEET_TEST_SHUFFLE")
    if seed:
        lines.append(f"tests shuffled with TUNEFLEET_TEST_SHUFFLE={seed}")
    return lines


def _postgres_header() -> str:
    if os.environ.get("TUNEFLEET_TEST_ADMIN_URL"):
        return "PostgreSQL: TUNEFLEET_TEST_ADMIN_URL"
    from tunefleet.db.embedded import find_binaries
    from tunefleet.errors import TunefleetError

    try:
        binaries = find_binaries()
    except TunefleetError as exc:
        return f"PostgreSQL: {exc}"
    return f"PostgreSQL {binaries.version}: {binaries.describe()}"


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A superuser DSN on a running PostgreSQL server."""
    explicit = os.environ.get("TUNEFLEET_TEST_ADMIN_URL")
    if explicit:
        yield explicit
        return
    from tunefleet.db.embedded import EmbeddedServer

    # Throw-away (see pytest_configure): each test's CREATE DATABASE and every commit would
    # otherwise flush to the disk, which on a shared or slow one stalled workers' heartbeats.
    server = EmbeddedServer(tmp_path_factory.mktemp("pg") / "data", no_sync=True)
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
def cli_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Environment for CLI subprocesses: isolated TUNEFLEET_HOME, unbuffered output.

    An embedded server that a test started under this home is stopped afterwards.
    """
    env = dict(os.environ)
    home = tmp_path / "home"
    env["TUNEFLEET_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TUNEFLEET_DATABASE_URL", None)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    yield env
    data = home / "postgres" / "data"
    if (data / "postmaster.pid").exists():
        from tunefleet.db.embedded import EmbeddedServer

        EmbeddedServer(data).stop()


class CLI:
    """Runs ``python -m tunefleet ...`` in a subprocess with the test's environment."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tunefleet", *args],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    def ok(self, *args: str, env: dict[str, str] | None = None) -> str:
        """Run, expect exit 0, return stdout."""
        proc = self.run(*args, env=env)
        assert proc.returncode == 0, f"tunefleet {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    def fails(self, *args: str, env: dict[str, str] | None = None, code: int | None = None) -> str:
        """Run, expect a non-zero exit with exactly one line on stderr; return that line."""
        proc = self.run(*args, env=env)
        assert proc.returncode != 0, f"tunefleet {' '.join(args)} succeeded: {proc.stdout}"
        if code is not None:
            assert proc.returncode == code, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("tunefleet: error: "), lines[0]
        return lines[0]


@pytest.fixture
def cli(cli_env: dict[str, str]) -> CLI:
    """The ``tunefleet`` command with an isolated home (see :class:`CLI`)."""
    return CLI(cli_env)
