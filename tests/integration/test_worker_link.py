"""The worker's database links: session limits, reconnect with backoff after the server drops
the session, session state (LISTEN, device lock) re-established, a lost device lock is fatal."""

from __future__ import annotations

import time

import pytest

from tests.helpers.queue_data import wait_until
from tunefleet.devices import DeviceInfo
from tunefleet.errors import DeviceError
from tunefleet.queries import queue
from tunefleet.settings import DatabaseSettings
from tunefleet.worker.link import DatabaseDown, Link
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
