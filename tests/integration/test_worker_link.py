"""The worker's database link: session limits, reconnect with backoff after the server drops
the session, LISTEN re-established; the device lease (a second worker refuses in one line, a
crashed holder's lease runs out, a lease lost during an outage stops the worker); a call the
database aborted as a deadlock is made again on the same connection; one session shared by
the main loop and the heartbeat, which goes first."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

from tests.helpers.queue_data import (
    insert_run,
    insert_trials,
    synthetic_configs,
    wait_until,
    waiting_on_a_lock,
)
from tunefleet.backoff import Backoff
from tunefleet.devices import DeviceInfo
from tunefleet.errors import DeviceError
from tunefleet.queries import queue
from tunefleet.settings import DatabaseSettings
from tunefleet.worker.heartbeat import Heartbeat, Liveness
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
        # A 3 s first pause (not 0.2 s): the "inside the backoff window" check below must
        # not depend on this thread being scheduled within 0.2 s.
        link.backoff = Backoff(3.0, 3.0)
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


GPU = DeviceInfo(platform="P", vendor="V", name="GPU", driver_version="1", index=0)


def registered_worker(db_url: str, *, lease_s: float = 30.0) -> Worker:
    """A worker of this host serving ``GPU``, connected and registered (no device process:
    only its database side runs)."""
    worker = Worker(WorkerSettings.build(db=db_url, device="0", lease_s=lease_s), db_url)
    worker.device = GPU
    conn = worker.link.connect_now()
    worker.device_id = queue.register_device(conn, GPU)
    worker.worker_secret = queue.register_worker(
        conn,
        worker_id=worker.worker_id,
        host=worker.host,
        pid=worker.pid,
        device_id=worker.device_id,
        device_class=GPU.device_class,
        version="test",
    )
    return worker


def device_holder(db) -> Any:
    row = db.execute("SELECT worker_id FROM tunefleet.device_lease").fetchone()
    return None if row is None else row["worker_id"]


def worker_state(db, worker: Worker) -> str:
    row = db.execute("SELECT state FROM tunefleet.worker WHERE id = %s", (worker.worker_id,))
    return str(row.fetchone()["state"])


def test_a_second_worker_on_the_device_refuses_with_one_line_and_stops_its_row(db_url, db):
    first, second = registered_worker(db_url), registered_worker(db_url)
    try:
        first._take_device(first.link.connect_now())
        assert first.holds_device and device_holder(db) == first.worker_id
        # The holder runs (this very process): the second refuses at once.
        with pytest.raises(DeviceError, match="already used by another tunefleet worker") as e:
            second._take_device(second.link.connect_now())
        assert "\n" not in str(e.value) and f"pid {first.pid}" in str(e.value)
        assert not second.holds_device and device_holder(db) == first.worker_id
        assert worker_state(db, second) == "stopped"
        # The holder stops: the device is free at once.
        assert queue.stop_worker(first.link.connect_now(), first.worker_id, first.worker_secret)
        assert device_holder(db) is None
    finally:
        first.close()
        second.close()


def test_a_crashed_holder_keeps_the_device_until_its_lease_runs_out(db_url, db, caplog):
    crashed = registered_worker(db_url, lease_s=2.0)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(gone.stdout)
    restarted = registered_worker(db_url, lease_s=2.0)
    try:
        crashed._take_device(crashed.link.connect_now())
        db.execute(
            "UPDATE tunefleet.worker SET pid = %s WHERE id = %s", (dead_pid, crashed.worker_id)
        )
        caplog.set_level(logging.WARNING, logger="tunefleet.worker")
        restarted._take_device(restarted.link.connect_now())  # waits for the lease, then takes
        assert restarted.holds_device and device_holder(db) == restarted.worker_id
        assert "which no longer runs here" in caplog.text
    finally:
        crashed.close()
        restarted.close()


def test_device_lease_lost_during_an_outage_stops_the_worker(db_url, db):
    worker = registered_worker(db_url)
    other = registered_worker(db_url)
    lost = threading.Event()
    try:
        conn = worker.link.connect_now()
        worker._take_device(conn)
        beat = Heartbeat(
            worker.link,
            worker_id=worker.worker_id,
            worker_secret=worker.worker_secret,
            lease_s=30.0,
            interval_s=10.0,
            held=worker.leases,
            on_lost=lambda: None,
            holds_device=True,
            on_device_lost=lost.set,
        )
        beat.beat()
        assert not beat.device_lost  # extended
        # An outage longer than the lease: the session is cut, the lease runs out and another
        # worker of the host takes the device meanwhile.
        db.execute("SELECT pg_terminate_backend(%s)", (backend_pid(conn),))
        db.execute("UPDATE tunefleet.device_lease SET expires_at = now() - interval '1 second'")
        assert queue.take_device(
            other.link.connect_now(), worker_id=other.worker_id, secret=other.worker_secret,
            index=0, lease_s=30,
        ).taken  # fmt: skip
        wait_until(lambda: beat.beat() or beat.device_lost, 30, what="a beat after reconnect")
        assert lost.is_set() and device_holder(db) == other.worker_id
        worker.heartbeat = beat
        with pytest.raises(DeviceError, match="lost its lease on the device"):
            worker.step_abandon_lost()
    finally:
        worker.close()
        other.close()


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


# --- one session for the main loop and the heartbeat -------------------------------------------


def test_a_beat_goes_before_calls_waiting_behind_a_long_statement(db_url, db):
    """The heartbeat waits for the one call in flight, never for the queue behind it."""
    link = Link(db_url, DatabaseSettings(url=db_url), "main")
    order: list[str] = []
    key = 0x7466_7473  # an advisory lock the test holds: the long call waits for it

    def long_call(conn) -> None:
        conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        order.append("long")

    def queued(name: str, urgent: bool) -> threading.Thread:
        def call() -> None:
            link.run(lambda conn: order.append(name), urgent=urgent)

        t = threading.Thread(target=call, daemon=True)
        t.start()
        return t

    try:
        pid = backend_pid(link.connect_now())
        db.execute("SELECT pg_advisory_lock(%s)", (key,))
        first = threading.Thread(target=link.run, args=(long_call,), daemon=True)
        first.start()
        wait_until(lambda: waiting_on_a_lock(db, pid), 30, what="the long call to wait")
        behind = [queued(f"main {i}", urgent=False) for i in range(3)]
        wait_until(lambda: len(waiters(link)) >= 3, 30, what="three callers waiting")
        beat = queued("beat", urgent=True)
        wait_until(lambda: len(waiters(link)) >= 4, 30, what="the beat waiting too")
        db.execute("SELECT pg_advisory_unlock(%s)", (key,))
        for t in [first, *behind, beat]:
            t.join(30)
        assert order[:2] == ["long", "beat"], order
        assert sorted(order[2:]) == ["main 0", "main 1", "main 2"]
        assert backend_pid(link.connect_now()) == pid  # one session throughout
    finally:
        link.close()


def waiters(link: Link) -> list[threading.Thread]:
    """Threads blocked in ``Link.held`` (the link's condition's waiters)."""
    return list(getattr(link._cond, "_waiters", []))


def test_a_stuck_main_loop_stops_its_beats_and_a_moving_one_resumes_them(db_url, db):
    run = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(1))
    worker = registered_worker(db_url)
    now = [1000.0]
    liveness = Liveness(allowance_s=30.0, clock=lambda: now[0])
    try:
        conn = worker.link.connect_now()
        (claim,) = queue.claim_trials(
            conn, worker_id=worker.worker_id, secret=worker.worker_secret,
            device_classes=["any"], limit=1, lease_s=30,
        )  # fmt: skip
        worker.leases.add(claim.key)
        beat = Heartbeat(
            worker.link, worker_id=worker.worker_id, worker_secret=worker.worker_secret,
            lease_s=30.0, interval_s=10.0, held=worker.leases, on_lost=lambda: None,
            liveness=liveness,
        )  # fmt: skip
        db.execute("UPDATE tunefleet.trial SET lease_expires_at = now() + interval '5 s'")
        now[0] += 31.0  # the main loop has not moved for longer than its allowance
        beat.beat()
        assert beat.withheld == 1 and seconds_left(db, ids[0]) < 6  # not extended
        # Inside a declared long step (opening the device) it is not stuck.
        with liveness.blocking(120.0):
            now[0] += 100.0
            beat.beat()
        assert beat.withheld == 0 and seconds_left(db, ids[0]) > 25
        now[0] += 31.0
        beat.beat()
        assert beat.withheld == 1
        liveness.stamp()  # a turn of the main loop (this thread is the liveness owner)
        db.execute("UPDATE tunefleet.trial SET lease_expires_at = now() + interval '5 s'")
        beat.beat()
        assert beat.withheld == 0 and seconds_left(db, ids[0]) > 25
    finally:
        worker.close()


def seconds_left(db, trial_id: int) -> float:
    row = db.execute(
        "SELECT extract(epoch FROM lease_expires_at - now()) AS s FROM tunefleet.trial"
        " WHERE id = %s",
        (trial_id,),
    ).fetchone()
    return float(row["s"])
