"""The coordinator survives losing its database session mid-run (server restart, failover,
``pg_terminate_backend``): it reconnects, takes its run again and resumes it; when the database
stays away it gives up with one line that says how to continue.

Regression: the coordinator used to die with a psycopg traceback on the first lost
connection, leaving the run to a human to resume.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import tunefleet.coordinator.engine as engine
from tests.helpers.coordinator import fleet, logs, measured_twice, settings
from tests.helpers.queue_data import wait_until
from tunefleet.coordinator.create import create_run
from tunefleet.coordinator.engine import Coordinator, RunResult
from tunefleet.db.engine import connect
from tunefleet.errors import DatabaseUnavailable


def coordinator_sessions(db: Any) -> list[int]:
    rows = db.execute(
        """
        SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'tunefleet-coordinator'
        """
    ).fetchall()
    return [int(r["pid"]) for r in rows]


def waiting_sessions(db: Any) -> list[int]:
    """Coordinator sessions waiting for a lock."""
    rows = db.execute(
        """
        SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'tunefleet-coordinator'
           AND wait_event_type = 'Lock'
        """
    ).fetchall()
    return [int(r["pid"]) for r in rows]


def driven(db: Any, run_id: int) -> bool:
    row = db.execute("SELECT coordinator_id FROM tunefleet.run WHERE id = %s", (run_id,))
    return row.fetchone()["coordinator_id"] is not None


def finished(db: Any, run_id: int) -> int:
    row = db.execute(
        "SELECT count(*) AS n FROM tunefleet.trial WHERE run_id = %s AND purpose = 'search' "
        "AND state IN ('done', 'invalid', 'failed', 'timed_out')",
        (run_id,),
    ).fetchone()
    return int(row["n"])


def _count(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in list(caplog.records))


class Driver(threading.Thread):
    def __init__(self, coordinator: Coordinator, run_id: int) -> None:
        super().__init__(daemon=True)
        self.coordinator, self.run_id = coordinator, run_id
        self.result: RunResult | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.coordinator.run(self.run_id)
        except BaseException as exc:
            self.error = exc


def test_terminated_sessions_are_survived_and_nothing_is_measured_twice(
    db_url, db, caplog, tmp_path
):
    caplog.set_level(logging.WARNING, logger="tunefleet.coordinator.engine")
    # 80 trials, outages at 8, 16 and 24: the third lands long before the run could end.
    s = settings(max_trials=80, min_depth=2, problem_args={"duration": 0.02})
    run_id = create_run(s, db_url)
    driver = Driver(Coordinator(s, db_url), run_id)
    with fleet(db_url, 2, tmp_path) as procs:
        driver.start()
        terminated: set[int] = set()
        for outage, due in enumerate((8, 16, 24), start=1):
            wait_until(
                lambda due=due: finished(db, run_id) >= due,
                timeout=60,
                what=f"{due} finished trials\n{logs(procs)}",
            )
            # A session opened after the last outage ended: terminating the old one again,
            # or the new one while it reconnects, would be one outage, not two (a loaded
            # fresh clone counted two losses for three terminations).
            pids = wait_until(
                lambda: [p for p in coordinator_sessions(db) if p not in terminated],
                what="the coordinator's new session",
            )
            for pid in pids:
                db.execute("SELECT pg_terminate_backend(%s)", (pid,))
            terminated.update(pids)
            wait_until(
                lambda outage=outage: _count(caplog, "reachable again") >= outage,
                timeout=60,
                what=f"the coordinator to resume after outage {outage}",
            )
        driver.join(60)
    assert not driver.is_alive()
    assert driver.error is None, repr(driver.error)
    assert driver.result is not None
    assert (driver.result.state, driver.result.stop_reason) == ("finished", "max_trials")
    assert driver.result.trials == 80
    assert finished(db, run_id) == 80 and measured_twice(db) == []
    run = db.execute("SELECT state, coordinator_id FROM tunefleet.run").fetchone()
    assert run == {"state": "finished", "coordinator_id": None}
    messages = [r.getMessage() for r in caplog.records]
    assert sum("database connection lost" in m for m in messages) == 3, messages
    assert sum("reachable again" in m for m in messages) == 3, messages


def start_driving(db_url: str, s: Any) -> tuple[Coordinator, Driver, int]:
    """A new run and a coordinator driving it in a thread."""
    run_id = create_run(s, db_url)
    coordinator = Coordinator(s, db_url)
    driver = Driver(coordinator, run_id)
    driver.start()
    return coordinator, driver, run_id


@contextlib.contextmanager
def database_away(db: Any, pg_admin_url: str, run_id: int) -> Iterator[None]:
    """Once the coordinator drives ``run_id``: refuse new connections to the database and
    terminate the coordinator's session, for the duration of the block."""
    name = db.info.dbname
    admin = psycopg.connect(pg_admin_url, autocommit=True)
    try:
        wait_until(lambda: driven(db, run_id), what="the coordinator to take its run")
        pids = wait_until(lambda: coordinator_sessions(db), what="the coordinator session")
        admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(sql.Identifier(name))
        )
        for pid in pids:
            db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        yield
    finally:
        admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(sql.Identifier(name))
        )
        admin.close()


def test_a_database_that_stays_away_ends_the_coordinator_with_one_line(
    db_url, db, pg_admin_url, monkeypatch
):
    monkeypatch.setattr(engine, "RECONNECT_FOR_S", 1.0)
    _, driver, run_id = start_driving(db_url, settings(max_trials=1000))
    with database_away(db, pg_admin_url, run_id):
        driver.join(30)
        assert not driver.is_alive()
    assert isinstance(driver.error, DatabaseUnavailable), repr(driver.error)
    message = str(driver.error)
    assert "\n" not in message
    assert f"lost the database while driving run {run_id}" in message
    assert f"--resume {run_id}" in message
    # The run was left as a crash leaves it: resumable, nothing cancelled.
    run = db.execute("SELECT state FROM tunefleet.run WHERE id = %s", (run_id,)).fetchone()
    assert run["state"] == "running"
    assert not db.execute("SELECT 1 FROM tunefleet.trial WHERE state = 'cancelled'").fetchall()


def test_a_stop_during_a_lost_session_still_records_the_stop(
    db_url, db, pg_admin_url, caplog, monkeypatch
):
    """Ctrl-C (or SIGTERM) while the coordinator is reconnecting: it keeps trying for a few
    seconds, and once the database answers it marks the run stopped and cancels what is
    pending, instead of leaving the run to look driven."""
    # Those few seconds must outlast this outage however slow the machine: giving up is the
    # next test's subject.
    monkeypatch.setattr(engine, "_STOP_RECONNECT_S", 60.0)
    caplog.set_level(logging.WARNING, logger="tunefleet.coordinator.engine")
    coordinator, driver, run_id = start_driving(db_url, settings(max_trials=1000))
    with database_away(db, pg_admin_url, run_id):
        coordinator.request_stop()
        wait_until(
            lambda: any("connection lost" in r.getMessage() for r in caplog.records),
            what="the coordinator to notice the lost session",
        )
        time.sleep(0.5)  # a few reconnection attempts fail while the stop is pending
    driver.join(30)
    assert not driver.is_alive()
    assert driver.error is None, repr(driver.error)
    assert driver.result is not None and driver.result.state == "stopped"
    run = db.execute(
        "SELECT state, coordinator_id FROM tunefleet.run WHERE id = %s", (run_id,)
    ).fetchone()
    assert run == {"state": "stopped", "coordinator_id": None}
    pending = db.execute(
        "SELECT count(*) AS n FROM tunefleet.trial WHERE run_id = %s AND state = 'pending'",
        (run_id,),
    ).fetchone()
    assert pending["n"] == 0


def test_a_stop_while_the_database_stays_away_gives_up_within_seconds(
    db_url, db, pg_admin_url, monkeypatch
):
    monkeypatch.setattr(engine, "_STOP_RECONNECT_S", 1.0)
    coordinator, driver, run_id = start_driving(db_url, settings(max_trials=1000))
    with database_away(db, pg_admin_url, run_id):
        coordinator.request_stop()
        driver.join(30)
        assert not driver.is_alive()
    assert isinstance(driver.error, DatabaseUnavailable), repr(driver.error)
    assert "a stop was requested" in str(driver.error) and f"--resume {run_id}" in str(driver.error)
    run = db.execute("SELECT state FROM tunefleet.run WHERE id = %s", (run_id,)).fetchone()
    assert run["state"] == "running"  # as a crash leaves it: resumable


def test_an_unreachable_database_before_the_run_is_taken_fails_at_once(db_url):
    s = settings(max_trials=5)
    run_id = create_run(s, db_url)
    bad = db_url.replace("dbname=", "dbname=no_such_db_")
    with pytest.raises(DatabaseUnavailable, match="no_such_db_"):
        Coordinator(s, bad).run(run_id)


def test_a_session_lost_before_the_run_is_taken_is_retried(db_url, db, tmp_path):
    """Between connecting and taking the run's lock the session may die too: that is a lost
    connection like any other, retried, never a raw driver error."""
    s = settings(max_trials=4)
    run_id = create_run(s, db_url)
    driver = Driver(Coordinator(s, db_url), run_id)
    blocker = connect(db_url)
    try:
        with blocker.transaction():
            # The coordinator's first read of the run waits behind this lock...
            blocker.execute("LOCK TABLE tunefleet.run IN ACCESS EXCLUSIVE MODE")
            driver.start()
            [first] = wait_until(lambda: waiting_sessions(db), what="the coordinator to wait")
            db.execute("SELECT pg_terminate_backend(%s)", (first,))  # ...and dies there.
            wait_until(
                lambda: [p for p in waiting_sessions(db) if p != first],
                what="the coordinator to come back",
            )
    finally:
        blocker.close()
    with fleet(db_url, 1, tmp_path):
        driver.join(60)
    assert driver.error is None, repr(driver.error)
    assert driver.result is not None and driver.result.stop_reason == "max_trials"
