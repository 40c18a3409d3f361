"""The worker's database links: session limits, reconnect with backoff after the server drops
the session, session state (LISTEN, device lock) re-established, a lost device lock is fatal;
a call the database aborted as a deadlock is made again on the same connection."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
import pytest

from tests.helpers.queue_data import wait_until, waiting_on_a_lock
from tunefleet.devices import DeviceInfo
from tunefleet.errors import DeviceError
from tunefleet.queries import queue
from tunefleet.settings import DatabaseSettings
from tunefleet.worker.link import DatabaseDown, Link, StatementAborted
from tunefleet.worker.loop import Worker
from tunefleet.worker.settings import WorkerSettings


def backend_pid(conn) -> int:
    return int(conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"])


def test_link_sessions_carry_statement_and_idle_transaction_timeouts(db_url):
    settings = DatabaseSettings(
        url=db_url, statement_timeout_ms=1234, idle_in_transaction_timeout_ms=5678
    )
    link = Link(db_url, settings, "main")
    try:
        conn = link.connect_now()
        assert conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "1234ms"
        idle = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        assert idle["idle_in_transaction_session_timeout"] == "5678ms"
    finally:
        link.close()


def test_link_reconnects_with_backoff_and_reruns_on_connect(db_url, db):
    connects: list[int] = []

    def on_connect(conn) -> None:
        queue.listen(conn)
        connects.append(backend_pid(conn))

    link = Link(db_url, DatabaseSettings(url=db_url), "main", on_connect=on_connect)
    try:
        first = link.connect_now()
        db.execute("SELECT pg_terminate_backend(%s)", (backend_pid(first),))
        with pytest.raises(DatabaseDown):
            link.run(lambda c: c.execute("SELECT 1").fetchone())
        assert not link.up and link.down_since is not None
        assert link.get() is None  # inside the backoff window: no reconnect storm
        time.sleep((link.wait_s() or 0) + 0.05)
        again = link.get()
        assert again is not None and link.down_since is None
        assert len(connects) == 2 and connects[0] != connects[1]
        queue.notify_new_trials(db, "any")  # LISTEN was re-established on the new session
        got = [n.payload for n in again.notifies(timeout=30.0, stop_after=1)]
        assert got == ["any"]
    finally:
        link.close()


def test_device_lock_taken_during_an_outage_is_fatal_on_reconnect(db_url, db):
    worker = Worker(WorkerSettings.build(db=db_url, device="0"), db_url)
    worker.device = DeviceInfo(platform="P", vendor="V", name="GPU", driver_version="1", index=0)
    try:
        conn = worker.link.connect_now()  # takes the lock through on_connect
        key = {"host": worker.host, "fingerprint": worker.device.fingerprint, "index": 0}
        assert not queue.try_lock_device(db, **key)  # held by the worker's session
        db.execute("SELECT pg_terminate_backend(%s)", (backend_pid(conn),))
        # Another worker grabs the device meanwhile (once the killed backend has exited).
        wait_until(lambda: queue.try_lock_device(db, **key), timeout=10, what="the lock")
        with pytest.raises(DatabaseDown):
            worker.link.run(lambda c: c.execute("SELECT 1"))
        time.sleep((worker.link.wait_s() or 0) + 0.05)
        with pytest.raises(DeviceError, match="already used by another tunefleet worker"):
            worker.link.get()
    finally:
        worker.close()


# --- a deadlock is a statement failure, not a lost connection -------------------------------

DEADLINE_S = 60.0


class OppositeOrder(threading.Thread):
    """A second session that locks row 2, then, once the link's session waits for row 2,
    row 1: a real deadlock with a call that locks row 1 then row 2. Its own deadlock check
    is put off (deadlock_timeout), so PostgreSQL aborts the link's transaction."""

    def __init__(self, db_url: str, db: Any, link_pid: int) -> None:
        super().__init__(daemon=True)
        self.db_url, self.db, self.link_pid = db_url, db, link_pid
        self.holds_row_2 = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.db_url) as other:
                other.execute("SET deadlock_timeout = '60s'")
                other.execute("UPDATE lock_demo SET n = n + 1 WHERE id = 2")
                self.holds_row_2.set()
                wait_until(
                    lambda: waiting_on_a_lock(self.db, self.link_pid),
                    DEADLINE_S,
                    what="the link's call to wait for row 2",
                )
                other.execute("UPDATE lock_demo SET n = n + 1 WHERE id = 1")
                other.commit()
        except BaseException as exc:
            self.error = exc
            self.holds_row_2.set()


def in_order(calls: list[int]) -> Any:
    def lock_1_then_2(conn: Any) -> int:
        calls.append(backend_pid(conn))
        with conn.transaction():
            conn.execute("UPDATE lock_demo SET n = n + 1 WHERE id = 1")
            conn.execute("UPDATE lock_demo SET n = n + 1 WHERE id = 2")
        return len(calls)

    return lock_1_then_2


def counts(db: Any) -> dict[int, int]:
    rows = db.execute("SELECT id, n FROM lock_demo ORDER BY id").fetchall()
    return {int(r["id"]): int(r["n"]) for r in rows}


@pytest.fixture
def lock_demo(db: Any) -> None:
    db.execute("CREATE TABLE lock_demo (id integer PRIMARY KEY, n integer NOT NULL)")
    db.execute("INSERT INTO lock_demo VALUES (1, 0), (2, 0)")


def run_against_a_deadlock(db_url: str, db: Any, link: Link, calls: list[int]) -> Any:
    conn = link.connect_now()
    other = OppositeOrder(db_url, db, backend_pid(conn))
    other.start()
    assert other.holds_row_2.wait(DEADLINE_S) and other.error is None
    try:
        return link.run(in_order(calls))
    finally:
        other.join(DEADLINE_S)
        assert not other.is_alive() and other.error is None


def test_a_deadlocked_call_is_made_again_on_the_same_connection(db_url, db, lock_demo, caplog):
    link = Link(db_url, DatabaseSettings(url=db_url), "main")
    calls: list[int] = []
    try:
        conn = link.connect_now()
        with caplog.at_level(logging.INFO, logger="tunefleet.worker"):
            result = run_against_a_deadlock(db_url, db, link, calls)
        assert result == 2  # aborted once, then committed
        assert link.conn is conn and link.up and link.down_since is None
        assert len(set(calls)) == 1 and link.retried == 1  # one server session throughout
        messages = [r.getMessage() for r in caplog.records]
        assert any("aborted (deadlock detected)" in m for m in messages), messages
        assert not any("lost" in m or "reconnect" in m for m in messages), messages
        # The other session's increments and exactly one of the link's.
        assert counts(db) == {1: 2, 2: 2}
    finally:
        link.close()


def test_a_call_aborted_on_every_try_fails_clearly_and_writes_nothing(
    db_url, db, lock_demo, caplog
):
    link = Link(db_url, DatabaseSettings(url=db_url), "main", statement_tries=1)
    calls: list[int] = []
    try:
        conn = link.connect_now()
        with caplog.at_level(logging.INFO, logger="tunefleet.worker"):
            with pytest.raises(StatementAborted, match="lock_1_then_2 was aborted by the database"):
                run_against_a_deadlock(db_url, db, link, calls)
        # A DatabaseDown for the caller (try on a later turn), but the connection is kept.
        assert issubclass(StatementAborted, DatabaseDown)
        assert link.conn is conn and link.up and link.down_since is None
        messages = [r.getMessage() for r in caplog.records]
        assert not any("lost" in m or "reconnect" in m for m in messages), messages
        assert counts(db) == {1: 1, 2: 1}  # only the other session's rows: nothing of ours
        assert link.run(in_order(calls)) == 2  # the same connection serves the next call
        assert counts(db) == {1: 2, 2: 2}
    finally:
        link.close()


def test_statement_tries_must_be_positive(db_url):
    with pytest.raises(ValueError, match="statement_tries must be at least 1"):
        Link(db_url, DatabaseSettings(url=db_url), "main", statement_tries=0)
