"""The migration chain: up, down, up again; agrees with the schema module; one readable head;
ships in the wheel; safe to run twice at once."""

from __future__ import annotations

import multiprocessing
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from tests.helpers.build import project_wheel
from tunefleet.db.engine import connect
from tunefleet.db.migrate import downgrade, head_revision, make_engine, script_directory, upgrade
from tunefleet.db.resolve import current_revision
from tunefleet.db.schema import SCHEMA, VIEWS, metadata

ROOT = Path(__file__).resolve().parents[2]


def _relations(url: str) -> dict[str, set[str]]:
    """Tables and views of the tunefleet schema, by kind."""
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname, c.relkind FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind IN ('r', 'v')",
            (SCHEMA,),
        ).fetchall()
    out: dict[str, set[str]] = {"tables": set(), "views": set()}
    for row in rows:
        out["tables" if row["relkind"] == "r" else "views"].add(row["relname"])
    return out


def _diff(url: str, target: sa.MetaData = metadata) -> list[Any]:
    """Alembic's autogenerate comparison of ``target`` with the database, our schema only."""

    def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
        return name == SCHEMA if type_ == "schema" else True

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "include_schemas": True,
                    "include_name": include_name,
                    "compare_type": True,
                    "compare_server_default": True,
                    "version_table_schema": SCHEMA,
                },
            )
            return list(compare_metadata(ctx, target))
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(empty_db_url: str) -> None:
    tables = {t.name for t in metadata.sorted_tables}
    assert _relations(empty_db_url) == {"tables": set(), "views": set()}

    upgrade(empty_db_url)
    rel = _relations(empty_db_url)
    assert rel["tables"] == tables | {"alembic_version"}
    assert rel["views"] == set(VIEWS)
    with connect(empty_db_url) as conn:
        assert current_revision(conn) == head_revision()

    downgrade(empty_db_url, "base")
    assert _relations(empty_db_url) == {"tables": {"alembic_version"}, "views": set()}
    with connect(empty_db_url) as conn:
        assert current_revision(conn) is None

    upgrade(empty_db_url)
    rel = _relations(empty_db_url)
    assert rel["tables"] == tables | {"alembic_version"}
    assert rel["views"] == set(VIEWS)
    assert _diff(empty_db_url) == []


def test_each_revision_downgrades_to_its_predecessor(empty_db_url: str) -> None:
    """Walk the chain down one step at a time, then back up: every step is reversible."""
    upgrade(empty_db_url)
    revisions = [r.revision for r in script_directory().walk_revisions()]  # head first
    for expected_after in [*revisions[1:], None]:
        downgrade(empty_db_url, "-1")
        with connect(empty_db_url) as conn:
            assert current_revision(conn) == expected_after
    upgrade(empty_db_url)
    assert _diff(empty_db_url) == []


def test_schema_module_and_migrations_agree(db_url: str) -> None:
    assert _diff(db_url) == []


def test_comparison_detects_a_drift(db_url: str) -> None:
    """The comparison above can fail: a column the migrations lack shows up as a difference."""
    drifted = sa.MetaData(schema=SCHEMA)
    for table in metadata.sorted_tables:
        table.to_metadata(drifted)
    drifted.tables[f"{SCHEMA}.run"].append_column(sa.Column("drift", sa.Text))
    diffs = _diff(db_url, drifted)
    assert [d[0] for d in diffs] == ["add_column"]
    assert diffs[0][3].name == "drift"


def test_views_match_the_schema_module(db_url: str) -> None:
    """Views are not tables to autogenerate: compare each view's definition as PostgreSQL
    stores it with the same body from ``schema.VIEWS`` created in a scratch schema."""
    with connect(db_url) as conn:
        conn.execute("CREATE SCHEMA scratch")
        for name, body in VIEWS.items():
            conn.execute(
                psycopg.sql.SQL("CREATE VIEW scratch.{} AS {}").format(
                    psycopg.sql.Identifier(name),
                    psycopg.sql.SQL(body),  # type: ignore[arg-type]
                )
            )
        for name in VIEWS:
            row = conn.execute(
                "SELECT pg_get_viewdef(%s::regclass) AS db, pg_get_viewdef(%s::regclass) AS module",
                (f"{SCHEMA}.{name}", f"scratch.{name}"),
            ).fetchone()
            assert row is not None
            assert row["db"] == row["module"], f"view {name} differs from schema.VIEWS"


def test_exactly_one_head_and_readable_revision_ids() -> None:
    scripts = script_directory()
    assert len(scripts.get_heads()) == 1
    revisions = list(scripts.walk_revisions())
    assert revisions[-1].revision == "0001_initial"
    # Numbers are handed out per piece of work ahead of time, so a higher one may land
    # before a lower one: numbered and unique, gaps and order as they landed.
    numbers = [rev.revision[:4] for rev in revisions]
    assert len(set(numbers)) == len(numbers), "each revision number once"
    for rev in reversed(revisions):
        assert re.fullmatch(r"\d{4}_[a-z0-9_]+", rev.revision), rev.revision
        assert Path(rev.path).name == f"{rev.revision}.py", "file named after its revision"
        assert not isinstance(rev.down_revision, tuple), "a linear chain: no merges"


def test_upgrade_of_a_database_at_head_is_a_no_op(db: psycopg.Connection[Any], db_url: str) -> None:
    db.execute(
        "INSERT INTO tunefleet.run (problem, space, device_class, cache_key)"
        " VALUES ('p', '{}'::jsonb, 'any', 'k')"
    )
    upgrade(db_url)
    row = db.execute("SELECT count(*) AS n FROM tunefleet.run").fetchone()
    assert row is not None and row["n"] == 1, "nothing stored is lost"


def _upgrade_after(barrier: Any, url: str) -> None:
    barrier.wait(timeout=60)
    upgrade(url)


def test_concurrent_upgrades_of_one_database(empty_db_url: str) -> None:
    """Four upgrades released at the same instant: all succeed, the database ends at head.

    Without the advisory lock in migrations/env.py, ``CREATE SCHEMA IF NOT EXISTS`` and the
    version table race and some of them fail with a unique violation.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_upgrade_after, args=(barrier, empty_db_url)) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=180)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    assert _diff(empty_db_url) == []
    with connect(empty_db_url) as conn:
        row = conn.execute("SELECT version_num FROM tunefleet.alembic_version").fetchall()
    assert [r["version_num"] for r in row] == [head_revision()]


def test_cli_upgrade_reports_the_revision(cli, empty_db_url: str) -> None:
    out = cli.ok("db", "upgrade", "--db", empty_db_url)
    assert out.strip() == f"database at revision {head_revision()} (head is {head_revision()})"
    assert _diff(empty_db_url) == []


def test_alembic_command_line_for_contributors(empty_db_url: str, tmp_path: Path) -> None:
    """The repository's alembic.ini: Alembic's usual commands against a scratch database."""
    import os

    alembic = [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEFLEET_")}

    def run(*args: str, url: str | None) -> subprocess.CompletedProcess[str]:
        extra = {} if url is None else {"TUNEFLEET_DATABASE_URL": url}
        return subprocess.run(
            [*alembic, *args],
            cwd=tmp_path,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    missing = run("upgrade", "head", url=None)
    assert missing.returncode != 0
    assert "no database: set TUNEFLEET_DATABASE_URL" in missing.stderr
    assert run("upgrade", "head", url=empty_db_url).returncode == 0
    with connect(empty_db_url) as conn:
        assert current_revision(conn) == head_revision()
    # Autogenerate finds nothing to add: the models and the migrated schema agree.
    checked = run("check", url=empty_db_url)
    assert checked.returncode == 0, checked.stderr
    assert "No new upgrade operations detected" in checked.stdout + checked.stderr


def test_migrations_ship_in_the_wheel(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, empty_db_url: str
) -> None:
    """`tunefleet db upgrade` works from the built wheel, not only from a checkout."""
    wheel = project_wheel(tmp_path_factory)
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "tunefleet/migrations/env.py",
        "tunefleet/migrations/script.py.mako",
        "tunefleet/migrations/versions/0001_initial.py",
        "tunefleet/db/functions.sql",
        # The dashboard's page serves from the wheel on a cluster without network access.
        "tunefleet/dashboard/static/index.html",
        "tunefleet/dashboard/static/app.js",
        "tunefleet/dashboard/static/style.css",
        "tunefleet/dashboard/static/icon.svg",
    ):
        assert needed in names, f"{needed} missing from {wheel.name}"
    versions = {Path(r.path).name for r in script_directory().walk_revisions()}
    assert {f"tunefleet/migrations/versions/{v}" for v in versions} <= names

    # Install it alone (dependencies come from this interpreter) and migrate from there,
    # in a directory without any checkout.
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "-q"]
    installed = subprocess.run(
        [*pip, "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    env = {**cli_env_without_checkout(), "PYTHONPATH": str(site)}
    code = (
        "from tunefleet import migrations; import sys; from tunefleet.cli import main;"
        "print(migrations.__file__, file=sys.stderr); sys.exit(main(sys.argv[1:]))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code, "db", "upgrade", "--db", empty_db_url],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=180,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr.strip() == str(site / "tunefleet" / "migrations" / "__init__.py")
    assert f"database at revision {head_revision()}" in ran.stdout


def cli_env_without_checkout() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
