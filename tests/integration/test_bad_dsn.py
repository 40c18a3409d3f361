"""A database URL that cannot work gives one line naming the problem and the fix, a non-zero
exit and no traceback (through ``tunefleet db upgrade --db``)."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.helpers.ports import free_port
from tunefleet.db.engine import connect, normalise_url, redact
from tunefleet.errors import DatabaseUnavailable, UsageError


def test_nothing_listening_on_the_port(cli) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/tunefleet"
    line = cli.fails("db", "upgrade", "--db", url, code=1)
    assert "Connection refused" in line
    assert "is the server running" in line and "tunefleet db start" in line


def test_host_name_that_does_not_resolve(cli) -> None:
    line = cli.fails("db", "upgrade", "--db", "postgresql://u@no-such-host.invalid/db", code=1)
    assert "no-such-host.invalid" in line and "check the host name" in line


def test_host_that_does_not_answer(cli) -> None:
    """192.0.2.1 is reserved for documentation: never routed. Either the network says so at
    once or the connect timeout (set low here) expires."""
    line = cli.fails(
        "db",
        "upgrade",
        "--db",
        "postgresql://u@192.0.2.1:5432/db",
        env={"TUNEFLEET_CONNECT_TIMEOUT_S": "2"},
        code=1,
    )
    assert "cannot connect to the database at 192.0.2.1:5432/db" in line


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://u@h/db", "is not a PostgreSQL URL"),
        ("just some words", "is not a PostgreSQL URL"),
        ("postgresql://u@[::1/db", "is malformed"),
        ("postgresql://u@h/db?nonsense=1", "is malformed"),
        ("postgresql://u@h:notaport/db", "port 'notaport'"),
        ("postgresql://u@h:99999/db", "port '99999'"),
        ("host=h port=x dbname=db", "port 'x'"),
        ("   ", "empty database URL"),
    ],
)
def test_malformed_url_is_a_usage_error(cli, url: str, expected: str) -> None:
    line = cli.fails("db", "upgrade", "--db", url, code=2)
    assert expected in line
    assert "postgresql://USER@HOST:PORT/DBNAME" in line or "TCP port" in line


def test_unknown_database(cli, pg_admin_url: str) -> None:
    url = make_conninfo(pg_admin_url, dbname="tf_no_such_database")
    line = cli.fails("db", "upgrade", "--db", url, code=1)
    assert 'database "tf_no_such_database" does not exist' in line
    assert "createdb" in line


def test_unknown_role(cli, pg_admin_url: str) -> None:
    url = make_conninfo(pg_admin_url, user="tf_no_such_role")
    line = cli.fails("db", "upgrade", "--db", url, code=1)
    assert 'role "tf_no_such_role" does not exist' in line
    assert "user name" in line


def test_password_in_the_url_never_shows_up(cli) -> None:
    url = f"postgresql://u:s3cr3t-pw@127.0.0.1:{free_port()}/db"
    proc = cli.run("db", "upgrade", "--db", url)
    assert proc.returncode == 1
    assert "s3cr3t-pw" not in proc.stderr + proc.stdout
    proc = cli.run("db", "upgrade", "--db", "postgresql://u:s3cr3t-pw@[::1/db")
    assert proc.returncode == 2
    assert "s3cr3t-pw" not in proc.stderr + proc.stdout


def test_bad_url_in_the_environment(cli) -> None:
    line = cli.fails("db", "upgrade", env={"TUNEFLEET_DATABASE_URL": "mysql://x@y/z"}, code=2)
    assert "not a PostgreSQL URL" in line


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:pw@h:5/db",
        "postgresql://u@h/db?password=pw&sslmode=require",
        "host=h password=pw dbname=db",
        "host=h password='p w' dbname=db",
    ],
)
def test_redact_hides_passwords(url: str) -> None:
    hidden = redact(url)
    assert "pw" not in hidden.replace("password", "")
    assert "***" in hidden


def test_accepted_url_spellings() -> None:
    for url in (
        "postgres://u@h:5433/db",
        "postgresql+psycopg://u@h:5433/db",
        "postgresql://u@h:5433/db",
        "host=h port=5433 user=u dbname=db",
    ):
        info = conninfo_to_dict(normalise_url(url))
        assert (info["host"], info["port"], info["dbname"]) == ("h", "5433", "db")


def test_library_errors_are_typed(pg_admin_url: str) -> None:
    with pytest.raises(DatabaseUnavailable):
        connect(make_conninfo(pg_admin_url, dbname="tf_no_such_database"))
    with pytest.raises(UsageError):
        connect("mysql://u@h/db")
