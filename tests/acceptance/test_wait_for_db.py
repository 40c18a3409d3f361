"""``--wait-for-db``: a worker or coordinator started before its database is ready (a batch job
that starts while the server restarts, a compose stack still migrating) waits for it instead
of exiting, and still fails at once on mistakes that waiting cannot fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

from tests.helpers.launch import start_worker
from tests.helpers.ports import free_port
from tests.helpers.queue_data import insert_run, insert_trials, synthetic_configs, wait_until
from tunefleet.db.engine import connect
from tunefleet.db.migrate import upgrade

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]


def test_worker_started_while_the_server_is_down_waits_and_then_drains(tmp_path, cli_env):
    from tunefleet.db.embedded import EmbeddedServer

    server = EmbeddedServer(tmp_path / "pg" / "data")
    server.start()
    worker = None
    try:
        url = server.local_url()
        port = server.status().port
        upgrade(url)
        with connect(url) as db:
            ids = insert_trials(db, insert_run(db), synthetic_configs(4))
        server.stop()
        worker = start_worker(
            url, log_path=tmp_path / "worker.log", env=cli_env, lease_s=2, poll_s=0.2,
            extra=("--wait-for-db", "120"),
        )  # fmt: skip
        wait_until(lambda: "waiting up to" in worker.log(), what="the worker to wait")
        assert worker.alive, worker.log()
        server.start(port=port)
        assert worker.wait(90) == 0, worker.log()
        with connect(url) as db:
            states = db.execute(
                "SELECT state, count(*) AS n FROM tunefleet.trial WHERE id = ANY(%s) GROUP BY 1",
                (ids,),
            ).fetchall()
            measured = db.execute("SELECT count(*) AS n FROM tunefleet.measurement").fetchone()
        assert [(r["state"], r["n"]) for r in states] == [("done", 4)]
        assert measured["n"] == 4
    finally:
        if worker is not None and worker.alive:
            worker.kill()
        server.stop()


def test_coordinator_waits_for_the_schema_another_process_migrates(empty_db_url, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNEFLEET_POLL_S": "0.05"}
    log = tmp_path / "coordinator.log"
    with open(log, "wb") as out:
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "tunefleet", "coordinator", "synthetic", "--max-trials", "3",
             "--wait-for-db", "120", "--db", empty_db_url],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    worker = None
    try:
        wait_until(
            lambda: "has no tunefleet schema" in log.read_text(), what="the coordinator to wait"
        )
        assert coordinator.poll() is None, log.read_text()
        upgrade(empty_db_url)
        with connect(empty_db_url) as db:
            wait_until(
                lambda: db.execute("SELECT 1 FROM tunefleet.run").fetchone(),
                timeout=60,
                what="the coordinator to create its run",
            )
        worker = start_worker(empty_db_url, log_path=tmp_path / "worker.log", lease_s=2)
        assert coordinator.wait(120) == 0, log.read_text()
        assert worker.wait(60) == 0, worker.log()
        with connect(empty_db_url) as db:
            run = db.execute("SELECT state FROM tunefleet.run").fetchone()
            done = db.execute(
                "SELECT count(*) AS n FROM tunefleet.trial WHERE state = 'done'"
            ).fetchone()
        assert run["state"] == "finished" and done["n"] >= 3
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
        if worker is not None and worker.alive:
            worker.kill()


def test_waiting_never_hides_a_wrong_database_name(cli, pg_admin_url):
    missing = make_conninfo(pg_admin_url, dbname="tf_never_created")
    # A 600 s wait would outlive the CLI helper's timeout: the error must come at once.
    line = cli.fails(
        "worker", "--device", "host", "--drain", "--wait-for-db", "600", "--db", missing, code=1
    )
    assert 'database "tf_never_created" does not exist' in line
    assert "after waiting" not in line


def test_a_wait_that_runs_out_says_how_long_it_waited(cli):
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/tunefleet"
    proc = cli.run("coordinator", "synthetic", "--wait-for-db", "1", "--db", url)
    assert proc.returncode == 1, proc.stderr
    said = proc.stderr.strip().splitlines()
    # One warning when the wait starts (the reason does not change), then the error.
    assert len(said) == 2 and "WARNING" in said[0] and "waiting up to 1 s" in said[0], said
    assert said[1].startswith("tunefleet: error: cannot connect"), said
    assert "Connection refused" in said[1] and "still so after waiting 1 s" in said[1]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("--wait-for-db", "-5"), {}, "--wait-for-db -5: use zero or a positive number"),
        (("--wait-for-db", "nan"), {}, "--wait-for-db nan: use zero or a positive number"),
        ((), {"TUNEFLEET_WAIT_FOR_DB_S": "soon"}, "TUNEFLEET_WAIT_FOR_DB_S='soon' is not valid"),
    ],
)
def test_a_bad_wait_is_a_usage_error(cli, db_url, args, env, message):
    for command in (("worker", "--device", "host"), ("coordinator", "synthetic")):
        line = cli.fails(*command, *args, "--db", db_url, env=env, code=2)
        assert message in line
