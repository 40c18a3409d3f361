"""A database that is not at the migration head is refused, naming the command that fixes it.

The coordinator and the worker open their database through ``tunefleet.db.resolve
.database_url``; ``tunefleet db check`` runs that same check from the command line.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from tunefleet.db.engine import connect
from tunefleet.db.migrate import downgrade, head_revision, upgrade
from tunefleet.db.resolve import check_at_head, current_revision, database_url
from tunefleet.errors import SchemaOutOfDate
from tunefleet.settings import DatabaseSettings


def _fix_command(line: str) -> list[str]:
    """The command quoted in backticks in the message, as argv."""
    match = re.search(r"`(tunefleet [^`]+)`", line)
    assert match, f"no fixing command in: {line}"
    return shlex.split(match.group(1))


def _run_fix(cli: Any, line: str) -> None:
    argv = _fix_command(line)
    assert argv[:3] == ["tunefleet", "db", "upgrade"]
    proc = subprocess.run(
        [sys.executable, "-m", "tunefleet", *argv[1:]],
        env=cli.env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_head_constant_is_the_migrations_one_head() -> None:
    from tunefleet.migrations import HEAD

    assert HEAD == head_revision(), (
        f"src/tunefleet/db/head.py says HEAD = {HEAD!r} but the newest migration is "
        f"{head_revision()!r}: update HEAD"
    )


# Blocks SQLAlchemy and Alembic, then checks the database given as argv[1] against the head.
_CHECK_WITHOUT_ALEMBIC = r"""
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"sqlalchemy", "alembic"}:
            raise ImportError(f"import of {name!r} is forbidden here")
sys.meta_path.insert(0, Blocker())
from tunefleet.db.engine import connect
from tunefleet.db.resolve import check_at_head
with connect(sys.argv[1]) as conn:
    print(check_at_head(conn))
"""


def test_a_database_at_head_is_checked_without_alembic_or_sqlalchemy(db_url: str) -> None:
    """Every worker (and each of its children) and every command checks the database at
    start: at the head, the check costs no Alembic (0.9 s of CPU per process)."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK_WITHOUT_ALEMBIC, db_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == head_revision()


# Blocks Alembic, then runs the command line given as argv[1:].
_COMMAND_WITHOUT_ALEMBIC = r"""
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "alembic":
            raise ImportError(f"import of {name!r} is forbidden here")
sys.meta_path.insert(0, Blocker())
from tunefleet.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_embedded_server_at_head_costs_a_command_no_alembic_and_one_behind_is_upgraded(
    cli,
) -> None:
    """Every command on the embedded server (``runs``, ``tune``, ``db start``, ...) makes
    sure its schema is at head: there it checks with one query (Alembic was 0.6 s of a
    report's 0.9 s of CPU); a schema behind, as a newer tunefleet finds an older one's, is
    migrated by the command that finds it."""

    def without_alembic(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _COMMAND_WITHOUT_ALEMBIC, *argv],
            env=cli.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    cli.ok("db", "start")
    url = cli.ok("db", "url").strip()
    for argv in (["runs"], ["db", "start"], ["db", "url"]):
        proc = without_alembic(*argv)
        assert proc.returncode == 0, (argv, proc.stderr)
    downgrade(url, "-1")
    with connect(url) as conn:
        behind = current_revision(conn)
    assert behind not in (None, head_revision())
    assert without_alembic("runs").returncode != 0  # a migration needs Alembic
    assert "no runs yet" in cli.ok("runs")
    with connect(url) as conn:
        assert current_revision(conn) == head_revision()


def test_database_at_head_passes(cli, db_url: str) -> None:
    assert database_url(DatabaseSettings(url=db_url)) == db_url
    assert cli.ok("db", "check", "--db", db_url).strip() == (
        f"database at revision {head_revision()} (head)"
    )


def test_database_without_schema_is_refused_and_the_named_command_fixes_it(
    cli, empty_db_url: str
) -> None:
    with pytest.raises(SchemaOutOfDate, match="no tunefleet schema"):
        database_url(DatabaseSettings(url=empty_db_url))

    line = cli.fails("db", "check", "--db", empty_db_url, code=1)
    assert "no tunefleet schema" in line
    assert f"expected revision {head_revision()}" in line
    _run_fix(cli, line)
    assert cli.ok("db", "check", "--db", empty_db_url).startswith("database at revision")


def test_downgraded_database_is_refused_and_the_named_command_fixes_it(cli, db_url: str) -> None:
    downgrade(db_url, "-1")
    with connect(db_url) as conn:
        behind = current_revision(conn)
    line = cli.fails("db", "check", "--db", db_url, code=1)
    if behind is None:
        assert "no tunefleet schema" in line
    else:
        assert f"at revision {behind}, this tunefleet needs {head_revision()}" in line
    with pytest.raises(SchemaOutOfDate):
        database_url(DatabaseSettings(url=db_url))
    _run_fix(cli, line)
    assert cli.ok("db", "check", "--db", db_url).startswith("database at revision")


def test_database_behind_an_older_revision_names_both_revisions(empty_db_url: str) -> None:
    """A database one migration behind (at 0001_initial, with a run stored): refused with both
    revisions and the fix; the fix keeps what is stored."""
    upgrade(empty_db_url, "0001_initial")
    with connect(empty_db_url) as conn:
        conn.execute(
            "INSERT INTO tunefleet.run (problem, space, device_class, cache_key)"
            " VALUES ('p', '{}'::jsonb, 'any', 'k')"
        )
        with pytest.raises(SchemaOutOfDate) as info:
            check_at_head(conn, url_hint="postgresql://u@h/db")
    message = str(info.value)
    assert f"at revision 0001_initial, this tunefleet needs {head_revision()}" in message
    assert "`tunefleet db upgrade --db postgresql://u@h/db`" in message
    upgrade(empty_db_url)
    with connect(empty_db_url) as conn:
        check_at_head(conn, url_hint="postgresql://u@h/db")
        row = conn.execute("SELECT count(*) AS n FROM tunefleet.run").fetchone()
    assert row is not None and row["n"] == 1


def test_database_newer_than_this_tunefleet_is_refused_and_not_touched(
    cli, db: psycopg.Connection[Any], db_url: str
) -> None:
    db.execute("UPDATE tunefleet.alembic_version SET version_num = '0999_from_the_future'")
    line = cli.fails("db", "check", "--db", db_url, code=1)
    assert "0999_from_the_future" in line and "upgrade tunefleet" in line
    line = cli.fails("db", "upgrade", "--db", db_url, code=1)
    assert "does not know" in line and "upgrade tunefleet" in line
    assert current_revision(db) == "0999_from_the_future"


def test_database_url_from_the_environment_is_checked(cli, empty_db_url: str) -> None:
    line = cli.fails("db", "check", env={"TUNEFLEET_DATABASE_URL": empty_db_url})
    assert "no tunefleet schema" in line


def test_fix_command_quotes_a_key_value_dsn(empty_db_url: str) -> None:
    """A libpq key=value DSN has spaces: the command in the message must stay one argument."""
    assert " " in empty_db_url and "://" not in empty_db_url
    with pytest.raises(SchemaOutOfDate) as info:
        database_url(DatabaseSettings(url=empty_db_url))
    argv = _fix_command(str(info.value))
    assert argv == ["tunefleet", "db", "upgrade", "--db", empty_db_url]
