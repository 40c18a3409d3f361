"""`tunefleet db roles`: four roles with least privilege, proved on a real database.

Roles are cluster-global, so each test uses its own prefix and drops its roles afterwards
(tests/helpers/roles.py). Role sessions connect over the test server's private socket (trust
authentication); password logins are proved over TCP in test_remote_access.py. What a hostile
worker tries, and how each attempt is refused, is in test_worker_trust.py.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.helpers.roles import drop_roles, unique_prefix
from tunefleet.db.roles import (
    POLICY,
    ROLE_NAMES,
    WORKER_FUNCTIONS,
    RolesSettings,
    setup_roles,
)
from tunefleet.errors import DatabaseProblem, SchemaOutOfDate
from tunefleet.queries import roles as q

Denied = psycopg.errors.InsufficientPrivilege


def seed_run_and_trials(db: psycopg.Connection[Any], n: int = 2) -> tuple[int, list[int]]:
    """One run of the synthetic kind with ``n`` pending trials, inserted as the admin."""
    run_id = db.execute(
        "INSERT INTO tunefleet.run (problem, space, device_class, cache_key, max_trials)"
        " VALUES ('synthetic', '{}', 'any', 'k', 10) RETURNING id"
    ).fetchone()["id"]
    ids = [
        db.execute(
            "INSERT INTO tunefleet.trial (run_id, device_class, config, config_hash)"
            " VALUES (%s, 'any', %s, %s) RETURNING id",
            (run_id, f'{{"x": {i}}}', f"h{i}"),
        ).fetchone()["id"]
        for i in range(n)
    ]
    return run_id, ids


# --- the roles themselves -------------------------------------------------------------------


def test_roles_are_created_once_and_rerun_is_exact(db_url, db, tmp_path):
    prefix = unique_prefix()
    pgpass = tmp_path / "roles.pgpass"
    settings = RolesSettings(prefix=prefix, pgpass=pgpass)
    try:
        first = setup_roles(db_url, settings)
        assert [r.role for r in first] == [prefix + n for n in ROLE_NAMES]
        assert all(r.created and r.password == "generated" for r in first)
        # Generated passwords land in a private pgpass file, one line per role.
        assert pgpass.stat().st_mode & 0o777 == 0o600
        lines = pgpass.read_text().splitlines()
        assert sorted(line.split(":")[3] for line in lines) == sorted(
            prefix + n for n in ROLE_NAMES
        )
        before = {n: q.table_privileges(db, "tunefleet", prefix + n) for n in ROLE_NAMES}

        # Something granted by hand is undone by the next run; passwords are kept.
        db.execute(f"GRANT DELETE ON tunefleet.trial TO {prefix}worker")
        second = setup_roles(db_url, settings)
        assert not any(r.created for r in second)
        assert all(r.password == "unchanged" for r in second)
        assert pgpass.read_text().splitlines() == lines
        after = {n: q.table_privileges(db, "tunefleet", prefix + n) for n in ROLE_NAMES}
        assert after == before
        assert not [p for p in after["worker"] if p["privilege"] == "DELETE"]

        # --rotate replaces the generated passwords (same lines, new secrets).
        setup_roles(db_url, RolesSettings(prefix=prefix, pgpass=pgpass, rotate=True))
        rotated = pgpass.read_text().splitlines()
        assert len(rotated) == 4 and set(rotated).isdisjoint(lines)
    finally:
        drop_roles(db_url, prefix)


def test_migrator_owns_everything_and_others_get_timeouts(roles, db):
    migrator = roles.name("migrator")
    relations = q.schema_relations(db, "tunefleet")
    assert {r["name"] for r in relations} >= {"run", "trial", "measurement", "results"}
    assert {r["owner"] for r in relations} == {migrator}
    owner = db.execute(
        "SELECT pg_get_userbyid(nspowner) AS o FROM pg_namespace WHERE nspname = 'tunefleet'"
    ).fetchone()["o"]
    assert owner == migrator
    for name in ROLE_NAMES:
        attrs = q.role_attributes(db, roles.name(name))
        assert attrs is not None and attrs["login"] and not attrs["superuser"]
        settings = attrs["settings"]
        if name == "migrator":
            assert not any(s.startswith("statement_timeout") for s in settings)
        else:
            assert "statement_timeout=30000" in settings
            assert "idle_in_transaction_session_timeout=60000" in settings


def test_worker_privileges_match_the_policy(roles, db):
    """The worker reads tables and executes exactly WORKER_FUNCTIONS; it writes no table."""
    privs = q.table_privileges(db, "tunefleet", roles.name("worker"))
    assert {p["privilege"] for p in privs} == {"SELECT"}
    table_level = {(p["table"], p["privilege"]) for p in privs if p["column"] is None}
    assert {t for t, _ in table_level} == {g.table for g in POLICY["worker"]}
    executable = q.executable_functions(db, "tunefleet", roles.name("worker"))
    assert executable == sorted(f.signature for f in WORKER_FUNCTIONS)
    # Nobody else may call them, PUBLIC included.
    for name in ("coordinator", "reader"):
        assert q.executable_functions(db, "tunefleet", roles.name(name)) == []


def test_every_function_is_pinned_and_owned_by_the_migrator(roles, db):
    """The pattern later migrations follow: every function of the schema belongs to the
    migrator; the worker-callable ones are SECURITY DEFINER with search_path fixed, the
    internal helpers (names starting with _) are neither (they run inside the definer
    functions, under their path) and nobody may call them."""
    functions = q.schema_functions(db, "tunefleet")
    assert functions
    for fn in functions:
        internal = fn["name"].startswith("_")
        assert fn["owner"] == roles.name("migrator"), fn
        assert fn["definer"] == (not internal), fn
        assert fn["config"] == ([] if internal else ["search_path=pg_catalog, pg_temp"]), fn
    acl = db.execute(
        "SELECT count(*) AS n FROM pg_proc p, aclexplode(p.proacl) a"
        " WHERE p.pronamespace = 'tunefleet'::regnamespace AND a.grantee = 0"
    ).fetchone()
    assert acl["n"] == 0  # PUBLIC (grantee 0) holds no EXECUTE
    temp = db.execute(
        "SELECT has_database_privilege(%s, current_database(), 'TEMPORARY') AS worker,"
        " has_database_privilege(%s, current_database(), 'TEMPORARY') AS migrator",
        (roles.name("worker"), roles.name("migrator")),
    ).fetchone()
    assert temp == {"worker": False, "migrator": True}


# --- the worker ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM tunefleet.trial",
        "DELETE FROM tunefleet.measurement",
        "DROP TABLE tunefleet.trial",
        "DROP VIEW tunefleet.results",
        "TRUNCATE tunefleet.trial",
        "TRUNCATE tunefleet.run CASCADE",
        "ALTER TABLE tunefleet.trial ADD COLUMN sneaky int",
        "CREATE TABLE tunefleet.sneaky (i int)",
        "CREATE INDEX ON tunefleet.trial (priority)",
        "UPDATE tunefleet.trial SET config = '{}'::jsonb",
        "UPDATE tunefleet.trial SET priority = -1",
        "UPDATE tunefleet.trial SET run_id = run_id",
        "UPDATE tunefleet.trial SET reported = true",
        "UPDATE tunefleet.run SET max_trials = 1",
        "UPDATE tunefleet.run SET state = 'stopped'",
        "UPDATE tunefleet.worker SET host = 'elsewhere'",
        "UPDATE tunefleet.device SET name = 'faster gpu'",
        "DELETE FROM tunefleet.worker",
        "UPDATE tunefleet.measurement SET median_s = 1",
        "INSERT INTO tunefleet.run (problem, space, device_class, cache_key)"
        " VALUES ('x', '{}', 'any', 'k')",
        "INSERT INTO tunefleet.trial (run_id, device_class, config, config_hash)"
        " SELECT id, 'any', '{}', 'evil' FROM tunefleet.run",
        "UPDATE tunefleet.alembic_version SET version_num = 'x'",
        "ALTER TABLE tunefleet.trial DISABLE TRIGGER ALL",
        "COMMENT ON TABLE tunefleet.trial IS 'mine'",
    ],
)
def test_worker_role_cannot(roles, db, statement):
    seed_run_and_trials(db)
    with roles.connect("worker") as conn, pytest.raises(Denied, match=r"permission denied|owner"):
        conn.execute(statement)
    # Nothing changed.
    counts = db.execute(
        "SELECT (SELECT count(*) FROM tunefleet.trial) AS trials,"
        " (SELECT count(*) FROM tunefleet.run) AS runs,"
        " (SELECT max_trials FROM tunefleet.run) AS max_trials"
    ).fetchone()
    assert counts == {"trials": 2, "runs": 1, "max_trials": 10}


def test_worker_role_runs_the_real_queue_statements(roles, db):
    """The worker's own queue functions, every one of them, as the worker role."""
    queue = pytest.importorskip("tunefleet.queries.queue")
    from tunefleet.devices import DeviceInfo

    _, ids = seed_run_and_trials(db, 4)
    me = uuid.uuid4()
    info = DeviceInfo(platform="Test", vendor="Test", name="Test CPU", driver_version="1")
    with roles.connect("worker") as w:
        dev = queue.register_device(w, info)
        assert queue.register_device(w, info) == dev  # the upsert path
        secret = queue.register_worker(
            w, worker_id=me, host="node", pid=1, device_id=dev, device_class="any", version="t"
        )
        queue.listen(w)
        assert queue.take_device(w, worker_id=me, secret=secret, index=0, lease_s=30).taken
        assert queue.has_open_trials(w, ["any"])
        claimed = queue.claim_trials(
            w, worker_id=me, secret=secret, device_classes=["any"], limit=4, lease_s=30
        )
        assert sorted(c.trial_id for c in claimed) == ids
        held = [c.key for c in claimed]
        assert queue.heartbeat_trials(w, worker_id=me, held=held, lease_s=30) == set(ids)
        assert queue.heartbeat_worker(w, me, secret)
        beat = queue.heartbeat(w, worker_id=me, secret=secret, held=held, lease_s=30)
        assert beat == queue.Beat(alive=True, devices=1, kept=frozenset(ids))
        first, second, third, fourth = sorted(claimed, key=lambda c: c.trial_id)
        queue.complete_trial(
            w,
            trial_id=first.trial_id,
            attempt=first.attempt,
            token=first.lease_token,
            worker_id=me,
            state="done",
            measurement=queue.MeasurementRow(
                median_s=0.5, min_s=0.4, samples_s=[0.4, 0.5, 0.6], protocol={}
            ),
        )
        queue.complete_trial(
            w,
            trial_id=second.trial_id,
            attempt=second.attempt,
            token=second.lease_token,
            worker_id=me,
            state="invalid",
            error="illegal tile size",
        )
        assert (
            queue.attempt_outcome(w, trial_id=second.trial_id, attempt=second.attempt, worker_id=me)
            == "invalid"
        )
        assert queue.release_trials(w, worker_id=me, held=[third.key]) == {third.trial_id}
        # The fourth claim's lease runs out (its worker froze); the reaper requeues it.
        db.execute(
            "UPDATE tunefleet.trial SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = %s",
            (fourth.trial_id,),
        )
        reaped = queue.reap_expired_leases(w)
        assert reaped is not None and [r.trial_id for r in reaped] == [fourth.trial_id]
        queue.notify_new_trials(w, "any")
        queue.unlisten(w)
        assert queue.stop_worker(w, me, secret)
    states = db.execute("SELECT id, state FROM tunefleet.trial ORDER BY id").fetchall()
    assert [r["state"] for r in states] == ["done", "invalid", "pending", "pending"]
    m = db.execute("SELECT device_id, worker_id, source FROM tunefleet.measurement").fetchall()
    assert m == [{"device_id": dev, "worker_id": me, "source": "measured"}]
    assert db.execute("SELECT state FROM tunefleet.worker").fetchone()["state"] == "stopped"
    assert db.execute("SELECT count(*) AS n FROM tunefleet.device_lease").fetchone()["n"] == 0


# --- the coordinator ------------------------------------------------------------------------


def test_coordinator_role_creates_runs_and_enqueues_but_cannot_delete(roles, db):
    with roles.connect("coordinator") as c:
        run_id = c.execute(
            "INSERT INTO tunefleet.run (problem, space, device_class, cache_key, max_trials)"
            " VALUES ('synthetic', '{}', 'any', 'k', 5) RETURNING id"
        ).fetchone()["id"]
        with c.transaction():
            for i in range(3):
                c.execute(
                    "INSERT INTO tunefleet.trial (run_id, device_class, config, config_hash)"
                    " VALUES (%s, 'any', %s, %s) ON CONFLICT DO NOTHING",
                    (run_id, f'{{"x": {i}}}', f"h{i}"),
                )
            c.execute("SELECT pg_notify('tunefleet_trials', 'any')")
        c.execute("UPDATE tunefleet.trial SET reported = true WHERE run_id = %s", (run_id,))
        c.execute(
            "UPDATE tunefleet.trial SET state = 'cancelled'"
            " WHERE run_id = %s AND state = 'pending'",
            (run_id,),
        )
        c.execute(
            "UPDATE tunefleet.run SET state = 'finished', stop_reason = 'max trials',"
            " finished_at = now() WHERE id = %s",
            (run_id,),
        )
        assert c.execute("SELECT count(*) AS n FROM tunefleet.run_progress").fetchone()["n"] == 1
        for statement in (
            "DELETE FROM tunefleet.trial",
            "DELETE FROM tunefleet.run",
            "TRUNCATE tunefleet.trial",
            "DROP TABLE tunefleet.measurement",
            "ALTER TABLE tunefleet.run ADD COLUMN sneaky int",
            "UPDATE tunefleet.measurement SET median_s = 1",
            "DELETE FROM tunefleet.worker",
        ):
            with pytest.raises(Denied):
                c.execute(statement)
    rows = db.execute("SELECT state, reported FROM tunefleet.trial").fetchall()
    assert rows == [{"state": "cancelled", "reported": True}] * 3
    assert db.execute("SELECT state FROM tunefleet.run").fetchone()["state"] == "finished"


def test_coordinator_role_runs_the_real_search_statements(roles, db):
    """The coordinator's own statements, as the coordinator role: create, drive, enqueue,
    answer from the cache, read outcomes, cancel and finish."""
    search = pytest.importorskip("tunefleet.queries.search")

    # A measurement from an earlier run, for the cache to find.
    old_run, (old_trial, _) = seed_run_and_trials(db)
    db.execute(
        "INSERT INTO tunefleet.measurement (trial_id, run_id, attempt, cache_key, config_hash,"
        " problem, problem_args, config, median_s, min_s, samples_s, protocol)"
        " VALUES (%s, %s, 1, 'ck', 'hot', 'synthetic', '{}', '{\"x\": 9}', 0.2, 0.1,"
        " ARRAY[0.1, 0.2], '{}')",
        (old_trial, old_run),
    )
    me = uuid.uuid4()
    with roles.connect("coordinator") as c:
        run_id = search.insert_run(
            c,
            problem="synthetic",
            problem_args={},
            space={},
            device_class="any",
            protocol={},
            cache_key="ck",
            search={},
            name="least-privilege",
            max_trials=5,
        )
        assert search.try_lock_run(c, run_id)
        assert search.take_run(c, run_id, me, max_trials=6) is not None
        assert search.heartbeat_run(c, run_id, me) is not None
        queued = search.insert_trials(
            c,
            run_id,
            "any",
            [{"config": {"x": i}, "config_hash": f"c{i}", "source": "search"} for i in range(3)],
        )
        assert len(queued) == 3
        hits = search.insert_cached_trials(c, run_id, "any", "ck", ["hot", "cold"])
        assert [h.config_hash for h in hits] == ["hot"]
        search.count_live_workers(c, "any", 60.0)
        search.queue_depth(c, run_id)
        search.fetch_unreported(c, run_id)
        search.best_of_run(c, run_id)
        assert search.cancel_pending(c, run_id) == 3
        assert search.finish_run(c, run_id, me, "max_trials")
        search.unlock_run(c, run_id)
    states = db.execute(
        "SELECT state, source FROM tunefleet.trial WHERE run_id = %s ORDER BY id", (run_id,)
    ).fetchall()
    assert [r["state"] for r in states] == ["cancelled"] * 3 + ["done"]
    assert states[-1]["source"] == "cache"
    run = db.execute("SELECT state, max_trials FROM tunefleet.run WHERE id = %s", (run_id,))
    assert run.fetchone() == {"state": "finished", "max_trials": 6}


# --- the reader ---------------------------------------------------------------------------


def test_reader_reads_the_views_and_cannot_write_anything(roles, db):
    run_id, _ = seed_run_and_trials(db)
    with roles.connect("reader") as r:
        for view in ("results", "best_per_run", "best_per_problem_device", "run_progress"):
            r.execute(f"SELECT * FROM tunefleet.{view}").fetchall()
        progress = r.execute("SELECT run_id, pending FROM tunefleet.run_progress").fetchall()
        assert progress == [{"run_id": run_id, "pending": 2}]
        for statement in (
            "SELECT * FROM tunefleet.trial",  # tables stay hidden: views only
            "SELECT samples_s FROM tunefleet.measurement",
            "INSERT INTO tunefleet.run (problem, space, device_class, cache_key)"
            " VALUES ('x', '{}', 'any', 'k')",
            "UPDATE tunefleet.trial SET state = 'cancelled'",
            "DELETE FROM tunefleet.trial",
            "TRUNCATE tunefleet.trial",
            "DROP VIEW tunefleet.results",
            "CREATE TABLE tunefleet.mine (i int)",
        ):
            with pytest.raises(Denied):
                r.execute(statement)
    assert db.execute("SELECT count(*) AS n FROM tunefleet.trial").fetchone()["n"] == 2
    # No write privilege of any kind on any table or view of the schema.
    writable = db.execute(
        "SELECT c.relname, p.priv FROM pg_class c,"
        " unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER', 'REFERENCES']) p(priv)"
        " WHERE c.relnamespace = 'tunefleet'::regnamespace AND c.relkind IN ('r', 'v')"
        " AND has_table_privilege(%s, c.oid, p.priv)",
        (roles.name("reader"),),
    ).fetchall()
    assert writable == []


# --- the migrator ---------------------------------------------------------------------------


def test_migrator_runs_the_migrations_and_a_rerun_restores_grants(roles, db, db_url):
    from tunefleet.db.migrate import downgrade, upgrade

    migrator_url = make_conninfo(db_url, user=roles.name("migrator"))
    downgrade(migrator_url, "base")
    assert db.execute("SELECT to_regclass('tunefleet.trial') AS t").fetchone()["t"] is None
    upgrade(migrator_url)
    # New tables: the worker sees nothing until the roles are applied again.
    with roles.connect("worker") as w, pytest.raises(Denied):
        w.execute("SELECT 1 FROM tunefleet.trial")
    setup_roles(db_url, roles.settings)
    with roles.connect("worker") as w:
        assert w.execute("SELECT count(*) AS n FROM tunefleet.trial").fetchone()["n"] == 0


# --- failure modes ------------------------------------------------------------------------


def test_roles_refused_on_a_database_behind_head(empty_db_url, tmp_path):
    settings = RolesSettings(prefix=unique_prefix(), pgpass=tmp_path / "p")
    with pytest.raises(SchemaOutOfDate, match="tunefleet db upgrade"):
        setup_roles(empty_db_url, settings)


def test_roles_need_an_administrator(roles, db_url, tmp_path):
    as_reader = make_conninfo(db_url, user=roles.name("reader"))
    other = RolesSettings(prefix=unique_prefix(), pgpass=tmp_path / "p")
    try:
        with pytest.raises(DatabaseProblem, match="superuser"):
            setup_roles(as_reader, other)
    finally:
        drop_roles(db_url, other.prefix)


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunefleet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_roles_takes_passwords_from_the_environment(db_url, cli_env, tmp_path):
    prefix = unique_prefix()
    env = dict(cli_env)
    env["TUNEFLEET_WORKER_PASSWORD"] = "from-the-environment"
    pgpass = tmp_path / "gen.pgpass"
    try:
        out = _cli(
            ["db", "roles", "--db", db_url, "--prefix", prefix, "--pgpass", str(pgpass)], env
        )
        assert out.returncode == 0, out.stderr
        lines = {
            line.split()[0]: line for line in out.stdout.splitlines() if line.startswith(prefix)
        }
        assert "environment" in lines[prefix + "worker"]
        assert "generated" in lines[prefix + "reader"]
        # Only generated passwords are written; the environment's never touches the disk.
        text = pgpass.read_text()
        assert prefix + "reader" in text and prefix + "worker" not in text
        assert "from-the-environment" not in text
    finally:
        drop_roles(db_url, prefix)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prefix", "Bad-Prefix"], "role prefix 'Bad-Prefix' is not valid"),
        (["--password", "x"], "unrecognized arguments"),
    ],
)
def test_cli_roles_bad_input_is_one_line(db_url, cli_env, args, message):
    out = _cli(["db", "roles", "--db", db_url, *args], cli_env)
    assert out.returncode == 2
    assert message in out.stderr
    assert len([ln for ln in out.stderr.splitlines() if "error" in ln]) == 1


def test_cli_roles_on_a_database_behind_head_names_the_fix(empty_db_url, cli_env):
    out = _cli(["db", "roles", "--db", empty_db_url, "--prefix", unique_prefix()], cli_env)
    assert out.returncode == 1
    assert out.stderr.startswith("tunefleet: error:") and "tunefleet db upgrade" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_cli_roles_on_the_embedded_server(cli_env, tmp_path):
    """The README's head-node path: no --db, the embedded server is started, migrated and
    given its roles; generated passwords land in the pgpass file."""
    pgpass = tmp_path / "roles.pgpass"
    try:
        out = _cli(["db", "roles", "--pgpass", str(pgpass)], cli_env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("created  password generated") == 4
        assert f"generated passwords written to {pgpass}" in out.stdout
        users = sorted(line.split(":")[3] for line in pgpass.read_text().splitlines())
        assert users == sorted(f"tunefleet_{n}" for n in ROLE_NAMES)
        again = _cli(["db", "roles", "--pgpass", str(pgpass)], cli_env)
        assert again.returncode == 0 and again.stdout.count("updated  password unchanged") == 4
    finally:
        _cli(["db", "stop"], cli_env)
