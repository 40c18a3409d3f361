"""An embedded data directory made by an older PostgreSQL major is carried forward: every row
of every run survives, the old directory is kept, and nothing is touched when it cannot be.

The old directories are made the way users got them: by the PostgreSQL 16 binaries (what the
``pgserver`` wheel shipped, and what the ``embedded`` extra's wheel still ships beside 18) and,
where a distribution's PostgreSQL 15 is installed, by that (the fallback on Pythons the old
wheel did not cover).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tunefleet.db.embedded import EmbeddedServer, find_binaries, find_old_binaries
from tunefleet.db.embedded import upgrade as embedded_upgrade
from tunefleet.db.migrate import upgrade
from tunefleet.errors import EmbeddedServerError

TABLES = ("run", "trial", "attempt", "measurement", "worker", "device", "alembic_version")


def everything(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every tunefleet table, in a fixed order, as text (the comparison must not
    depend on how a driver parses a type)."""
    rows = {}
    with psycopg.connect(url) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        for table in TABLES:
            rows[table] = conn.execute(
                f"SELECT t::text FROM tunefleet.{table} AS t ORDER BY 1"
            ).fetchall()
    return rows


def make_old_home(home: Path, major: int) -> dict[str, Any]:
    """A tunefleet home whose embedded data directory PostgreSQL ``major`` made, with a real
    tuning run in it (and a user's own table); returns every row."""
    old = find_old_binaries(major)
    if old is None:
        pytest.skip(f"no PostgreSQL {major} server binaries on this machine")
    server = EmbeddedServer(home / "postgres" / "data", bin_dir=old.bin_dir)
    server.start()
    try:
        url = server.local_url()
        upgrade(url)
        env = {**os.environ, "TUNEFLEET_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(
            [sys.executable, "-m", "tunefleet", "tune", "synthetic", "--db", url,
             "--workers", "1", "--max-trials", "6", "--arg", "duration=0.01"],
            env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.notes (id int PRIMARY KEY, body text)")
            conn.execute("INSERT INTO public.notes VALUES (1, 'fastest on Tuesdays')")
        rows = everything(url)
    finally:
        server.stop()
    assert len(rows["measurement"]) >= 6 and len(rows["run"]) == 1
    assert (server.data_dir / "PG_VERSION").read_text().strip() == str(major)
    return rows


@pytest.fixture(scope="module")
def old_home(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``old_home(major, home)`` copies a home made by PostgreSQL ``major`` (built once per
    module) to ``home`` and returns its rows."""
    made: dict[int, tuple[Path, dict[str, Any]]] = {}

    def copy(major: int, home: Path) -> dict[str, Any]:
        if major not in made:
            source = tmp_path_factory.mktemp(f"pg{major}") / "home"
            made[major] = (source, make_old_home(source, major))
        source, rows = made[major]
        # cp -a keeps the owner (the server's user, when we are root) and the modes.
        subprocess.run(["cp", "-a", str(source), str(home)], check=True)
        return rows

    return copy


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNEFLEET_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("TUNEFLEET_DATABASE_URL", None)
    env.pop("TUNEFLEET_PG_BIN", None)
    return subprocess.run(
        [sys.executable, "-m", "tunefleet", *args],
        env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize("major", [16, 15])
def test_old_data_directory_is_carried_forward_with_every_row(
    tmp_path: Path, major: int, old_home: Any
) -> None:
    home = tmp_path / "home"
    before = old_home(major, home)
    new_major = find_binaries().major
    assert new_major is not None and new_major > major
    try:
        started = cli(home, "db", "start")
        assert started.returncode == 0, started.stderr
        # One line says what happened and where the old directory is.
        notes = [ln for ln in started.stderr.splitlines() if "pg_upgrade" in ln]
        assert len(notes) == 1, started.stderr
        kept = home / "postgres" / f"data.pg{major}"
        assert f"from PostgreSQL {major}" in notes[0] and str(kept) in notes[0]

        status = json.loads(cli(home, "db", "status", "--json").stdout)
        assert status["running"] is True
        assert status["data_version"] == new_major
        assert status["server_version"].startswith(f"PostgreSQL {new_major}.")
        assert status["binaries_from"] == find_binaries().origin
        after = everything(status["url"])
        assert after == before, "every row of every table survived"
        with psycopg.connect(status["url"]) as conn:
            assert conn.execute("SELECT body FROM public.notes").fetchall() == [
                ("fastest on Tuesdays",)
            ]
        assert cli(home, "db", "check").returncode == 0, "still at the schema head"
        # The old directory is kept, untouched, and could still be served by its binaries.
        assert (kept / "PG_VERSION").read_text().strip() == str(major)
        assert not (home / "postgres" / "upgrade").exists()
    finally:
        cli(home, "db", "stop", "--force")
    assert everything_old(kept, major) == before


def everything_old(kept: Path, major: int) -> dict[str, Any]:
    old = find_old_binaries(major)
    assert old is not None
    server = EmbeddedServer(kept, bin_dir=old.bin_dir)
    server.start()
    try:
        return everything(server.local_url())
    finally:
        server.stop()


def test_failed_verification_and_interruptions_leave_the_old_directory_in_charge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_home: Any
) -> None:
    home = tmp_path / "home"
    before = old_home(16, home)
    data = home / "postgres" / "data"

    # A carry-forward that finds a different row set refuses, changing nothing.
    real = embedded_upgrade._fingerprint
    calls: list[int] = []

    def second_differs(dsn: Any) -> dict[str, tuple[int, str]]:
        found = real(dsn)
        calls.append(1)
        if len(calls) == 2:
            found.pop(next(iter(found)))
        return found

    monkeypatch.setattr(embedded_upgrade, "_fingerprint", second_differs)
    server = EmbeddedServer(data)
    with pytest.raises(EmbeddedServerError, match=r"different rows.*old directory is unchanged"):
        server.start()
    assert (data / "PG_VERSION").read_text().strip() == "16"
    assert not (home / "postgres" / "upgrade").exists()
    assert not (home / "postgres" / "data.pg16").exists()
    monkeypatch.setattr(embedded_upgrade, "_fingerprint", real)

    # A leftover of an attempt killed half-way (not verified) is thrown away and redone.
    (home / "postgres" / "upgrade" / "data").mkdir(parents=True)
    (home / "postgres" / "upgrade" / "data" / "junk").write_text("half-made")
    try:
        server.start()
        assert everything(server.local_url()) == before
    finally:
        server.stop()
    assert (home / "postgres" / "data.pg16" / "PG_VERSION").read_text().strip() == "16"

    # Killed between moving the old directory aside and moving the verified one in: the next
    # start finishes the swap instead of making an empty database.
    work = home / "postgres" / "upgrade"
    work.mkdir()
    os.rename(data, work / "data")
    (work / "verified").touch()
    try:
        server.start()
        assert everything(server.local_url()) == before
    finally:
        server.stop()
    assert not work.exists()


def test_no_binaries_for_the_old_major_is_one_line_naming_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    major = 13
    if find_old_binaries(major) is not None:
        pytest.skip(f"PostgreSQL {major} binaries are installed here")
    monkeypatch.delenv("TUNEFLEET_PG_OLD_BIN", raising=False)
    server = EmbeddedServer(tmp_path / "pg" / "data")
    server.data_dir.mkdir(parents=True)
    (server.data_dir / "PG_VERSION").write_text(f"{major}\n")
    (server.data_dir / "base").mkdir()
    with pytest.raises(EmbeddedServerError) as info:
        server.start()
    message = str(info.value)
    assert "\n" not in message
    assert f"PostgreSQL {major} server" in message and "TUNEFLEET_PG_OLD_BIN" in message
    assert f"postgresql-{major}" in message and "nothing was changed" in message
    assert sorted(p.name for p in server.data_dir.iterdir()) == ["PG_VERSION", "base"]
    assert not server.upgrade_dir.exists()

    # TUNEFLEET_PG_OLD_BIN naming binaries of another major does not count.
    monkeypatch.setenv("TUNEFLEET_PG_OLD_BIN", str(find_binaries().bin_dir))
    with pytest.raises(EmbeddedServerError, match=f"PostgreSQL {major} server binaries"):
        server.start()


def test_data_directory_of_a_newer_major_is_refused(tmp_path: Path) -> None:
    newer = (find_binaries().major or 0) + 1
    server = EmbeddedServer(tmp_path / "pg" / "data")
    server.data_dir.mkdir(parents=True)
    (server.data_dir / "PG_VERSION").write_text(f"{newer}\n")
    with pytest.raises(EmbeddedServerError, match=rf"made by PostgreSQL {newer}, newer"):
        server.start()
    assert (server.data_dir / "PG_VERSION").read_text() == f"{newer}\n"
