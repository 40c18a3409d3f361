"""A real PgBouncer between tunefleet and PostgreSQL (skipped where the ``pgbouncer`` binary is
not installed).

A worker holds one session, directly (8 workers, 8 server sessions) or through any pooler.
Behind **transaction pooling** (PgBouncer ``pool_mode = transaction``) it keeps no session
state: its device is a leased row, exclusive though every client shares one server
connection; it polls, sends no SET and prepares nothing, so 8 workers on a pool of 3 server
connections finish a run with every trial measured once. Behind **session pooling** a worker
with ``--listen`` is woken by notifications as on a direct connection. A pooler that refuses the
startup ``options`` (no ``ignore_startup_parameters = options``) does not stop a worker: it
connects without them (the role's settings apply). A coordinator still needs a session: behind
transaction pooling it exits at once with one line naming the fix, before it writes anything.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import CLI
from tests.helpers.launch import WorkerProcess, start_worker, wait_all
from tests.helpers.pgbouncer import PgBouncer, find_pgbouncer, pgbouncer
from tests.helpers.queue_data import (
    insert_run,
    insert_trials,
    synthetic_configs,
    trial_states,
    wait_until,
)
from tunefleet.db import pooler
from tunefleet.db.engine import connect
from tunefleet.db.pooler import PooledPerTransaction, require_session_pooling
from tunefleet.devices import DeviceInfo
from tunefleet.errors import DatabaseUnavailable
from tunefleet.queries import queue

pytestmark = pytest.mark.skipif(find_pgbouncer() is None, reason="pgbouncer is not installed")

WORKER_APP = "tunefleet-worker"


@pytest.fixture
def session_pooler(pg_admin_url: str) -> Iterator[PgBouncer]:
    with pgbouncer(pg_admin_url, "session") as bouncer:
        yield bouncer


@pytest.fixture
def transaction_pooler(pg_admin_url: str) -> Iterator[PgBouncer]:
    # One server connection: every client shares it, so what transaction pooling does to
    # session state is certain rather than likely.
    with pgbouncer(pg_admin_url, "transaction", pool_size=1) as bouncer:
        yield bouncer


def worker_sessions(db: psycopg.Connection[Any]) -> int:
    """Server sessions of this database that serve workers (a pooler's server connections
    carry the application name of the client they last served)."""
    row = db.execute(
        "SELECT count(*) AS n FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s",
        (WORKER_APP,),
    ).fetchone()
    return int(row["n"]) if row else 0


def registered(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT count(*) AS n FROM tunefleet.worker WHERE state = 'active'")
    return int(row.fetchone()["n"])


def done_once(db: psycopg.Connection[Any], run: int) -> dict[str, int]:
    """Per run: trials, trials done, measurements, 'done' attempts, trials measured twice."""
    return dict(
        db.execute(
            """
            SELECT count(*) AS trials,
                   count(*) FILTER (WHERE t.state = 'done') AS done,
                   (SELECT count(*) FROM tunefleet.measurement m WHERE m.run_id = %(run)s)
                       AS measurements,
                   (SELECT count(*) FROM tunefleet.attempt a JOIN tunefleet.trial x
                        ON x.id = a.trial_id
                     WHERE x.run_id = %(run)s AND a.outcome = 'done') AS done_attempts,
                   (SELECT count(*) FROM (SELECT trial_id FROM tunefleet.measurement
                                           WHERE run_id = %(run)s GROUP BY trial_id
                                          HAVING count(*) > 1) AS twice) AS measured_twice
              FROM tunefleet.trial t WHERE t.run_id = %(run)s
            """,
            {"run": run},
        ).fetchone()
    )


class SessionWatch(threading.Thread):
    """The most worker server sessions seen, sampled until stopped."""

    def __init__(self, db_url: str) -> None:
        super().__init__(daemon=True)
        self.conn = connect(db_url)
        self.most = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.05):
            self.most = max(self.most, worker_sessions(self.conn))

    def stop(self) -> int:
        self.halt.set()
        self.join(10)
        self.conn.close()
        return self.most


EIGHT = 8
TRIALS = 120


def test_eight_direct_workers_hold_eight_sessions(db_url: str, db: Any, tmp_path: Path) -> None:
    run = insert_run(db, problem_args={"duration": 0.01})
    ids = insert_trials(db, run, synthetic_configs(16))
    with workers(db_url, EIGHT, tmp_path, drain=False) as fleet:
        wait_until(lambda: registered(db) == EIGHT, 120, what="eight workers to register")
        wait_until(lambda: set(trial_states(db, ids).values()) == {"done"}, 120, what="done")
        # One session each, heartbeats included, while they serve and while they wait.
        assert worker_sessions(db) == EIGHT
        for w in fleet:
            assert "database route: a direct connection" in w.log(), w.log()
            w.stop()
        assert wait_all(fleet, 60) == [0] * EIGHT


def test_eight_workers_behind_transaction_pooling_with_three_server_connections_measure_each_trial_once(  # noqa: E501
    db_url: str, db: Any, pg_admin_url: str, tmp_path: Path
) -> None:
    # 50 ms trials: six seconds of work in all, longer than the eight workers' start-up skew
    # on a loaded machine, so the first to start cannot drain the run alone.
    run = insert_run(db, problem_args={"duration": 0.05})
    insert_trials(db, run, synthetic_configs(TRIALS))
    watch = SessionWatch(db_url)
    # No ignore_startup_parameters: the workers connect without their options.
    with pgbouncer(pg_admin_url, "transaction", pool_size=3, ignore_options=False) as bouncer:
        watch.start()
        with workers(bouncer.url(db_url), EIGHT, tmp_path, drain=True, poll_s=0.5) as fleet:
            codes = wait_all(fleet, 300)
            logs = [w.log() for w in fleet]
        most = watch.stop()
    assert codes == [0] * EIGHT, logs
    for log in logs:
        assert "database route: a connection pooler in transaction mode" in log, log
        assert "refused the session options; connecting without them" in log, log
    assert done_once(db, run) == {
        "trials": TRIALS,
        "done": TRIALS,
        "measurements": TRIALS,
        "done_attempts": TRIALS,
        "measured_twice": 0,
    }
    served = db.execute(
        "SELECT count(DISTINCT worker_id) AS n FROM tunefleet.measurement WHERE run_id = %s",
        (run,),
    ).fetchone()
    assert served["n"] > 1  # a fleet, not one worker that took everything
    assert 1 <= most <= 3  # never more server sessions than the pool
    assert (
        db.execute(
            "SELECT count(*) AS n FROM tunefleet.worker WHERE state <> 'stopped'"
        ).fetchone()["n"]
        == 0
    )


GPU = DeviceInfo(platform="P", vendor="V", name="GPU", driver_version="1", index=0)


def test_the_device_lease_is_exclusive_through_one_shared_server_connection(
    db_url: str, db: Any, transaction_pooler: PgBouncer
) -> None:
    url = transaction_pooler.url(db_url)
    first, second = connect(url), connect(url)
    try:
        # Both clients are served by the one server connection: a session lock would be
        # "held" by both (the failure mode of the advisory lock); the leased row is not.
        assert pooler.detect(first, lambda: connect(url)).per_transaction
        ids = []
        for conn in (first, second):
            me = uuid.uuid4()
            secret = queue.register_worker(
                conn, worker_id=me, host="node-1", pid=1,
                device_id=queue.register_device(conn, GPU), device_class=GPU.device_class,
                version="t",
            )  # fmt: skip
            ids.append((me, secret))
        (a, a_secret), (b, b_secret) = ids
        assert queue.take_device(first, worker_id=a, secret=a_secret, index=0, lease_s=30).taken
        refused = queue.take_device(second, worker_id=b, secret=b_secret, index=0, lease_s=30)
        assert not refused.taken and refused.holder == a
        assert queue.stop_worker(first, a, a_secret)  # gives it back
        assert queue.take_device(second, worker_id=b, secret=b_secret, index=0, lease_s=30).taken
    finally:
        first.close()
        second.close()


def test_routes_are_told_apart(db_url: str, session_pooler: PgBouncer) -> None:
    with connect(db_url) as direct:
        assert pooler.detect(direct, lambda: connect(db_url)) == pooler.DIRECT
    url = session_pooler.url(db_url)
    with connect(url) as pooled:
        route = pooler.detect(pooled, lambda: connect(url))
    assert route == pooler.Route(pooler=True, per_transaction=False) and route.keeps_session


def test_worker_behind_session_pooling_is_woken_and_serves(
    db_url: str, session_pooler: PgBouncer, tmp_path: Path
) -> None:
    # An hour's polling, listening while idle: only a notification can wake it for the
    # trials inserted below.
    with workers(session_pooler.url(db_url), 1, tmp_path, poll_s=3600, listen=True) as (w,):
        wait_until(lambda: "waiting for work" in w.log() or not w.alive, 120, what="idle worker")
        assert w.alive, w.log()
        assert "a connection pooler in session mode" in w.log()
        with connect(db_url) as conn:
            run = insert_run(conn, problem_args={"duration": 0.01})
            ids = insert_trials(conn, run, synthetic_configs(3))
            queue.notify_new_trials(conn, "any")
            wait_until(
                lambda: set(trial_states(conn, ids).values()) == {"done"}, 120, what="trials done"
            )
        w.stop()
        assert w.wait(60) == 0, w.log()


def test_transaction_pooling_is_refused_where_a_session_is_needed(
    db_url: str, transaction_pooler: PgBouncer
) -> None:
    url = transaction_pooler.url(db_url)
    with connect(db_url) as direct:
        require_session_pooling(direct, lambda: connect(db_url))  # a direct session passes
    with connect(url) as conn, pytest.raises(PooledPerTransaction, match="pool_mode = session"):
        require_session_pooling(conn, lambda: connect(url))


def test_coordinator_behind_transaction_pooling_exits_with_one_line_and_writes_nothing(
    db_url: str, transaction_pooler: PgBouncer, cli: CLI
) -> None:
    url = transaction_pooler.url(db_url)
    line = cli.fails("coordinator", "synthetic", "--max-trials", "4", "--db", url)
    assert "pool_mode = session" in line and "coordinators" in line
    with connect(db_url) as conn:
        assert run_rows(conn) == 0  # refused before it created a run

        # Resuming a run is refused the same way, and the run is left as it was.
        run = insert_run(conn, problem_args={"duration": 0.01})
        ids = insert_trials(conn, run, synthetic_configs(2))
        line = cli.fails("coordinator", "--resume", str(run), "--db", url)
        assert "pool_mode = session" in line
        row = conn.execute(
            "SELECT state, coordinator_id FROM tunefleet.run WHERE id = %s", (run,)
        ).fetchone()
        assert row is not None and row["coordinator_id"] is None
        assert set(trial_states(conn, ids).values()) == {"pending"}


def test_coordinator_behind_session_pooling_drives_its_run(
    db_url: str, session_pooler: PgBouncer, cli: CLI, tmp_path: Path
) -> None:
    url = session_pooler.url(db_url)
    with workers(url, 1, tmp_path):
        out = cli.ok("coordinator", "synthetic", "--max-trials", "4", "--db", url)
    assert out.startswith("run ") and " finished: " in out.splitlines()[0], out
    with connect(db_url) as conn:
        states = conn.execute("SELECT state FROM tunefleet.trial").fetchall()
        assert len(states) >= 4 and {r["state"] for r in states} <= {"done", "invalid"}


def test_pooler_refusing_the_session_options_is_a_permanent_one_line_error_for_a_plain_connect(
    db_url: str, pg_admin_url: str
) -> None:
    with pgbouncer(pg_admin_url, "session", ignore_options=False) as bouncer:
        with pytest.raises(DatabaseUnavailable) as caught:
            connect(bouncer.url(db_url))
    assert "ignore_startup_parameters = options" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not caught.value.transient  # waiting never fixes it: no endless reconnect


@contextlib.contextmanager
def workers(
    url: str, n: int, tmp_path: Path, *, drain: bool = False, **kwargs: Any
) -> Iterator[list[WorkerProcess]]:
    """``n`` host worker processes on ``url`` (no code-generation pool), killed if still
    alive after."""
    fleet = [
        start_worker(
            url,
            log_path=tmp_path / f"w{i}.log",
            device="host",
            drain=drain,
            prepare_workers=0,
            verbose=True,
            **kwargs,
        )
        for i in range(n)
    ]
    try:
        yield fleet
    finally:
        for w in fleet:
            w.kill()


def run_rows(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) AS n FROM tunefleet.run").fetchone()
    return int(row["n"]) if row else 0
