"""A real worker sizes itself: under a code-generation-bound synthetic run it grows its
code-generation pool up to the cores it was given (and no further), reports the sizing and
its device's busy fraction in its database row; explicit flags keep it fixed. Plus the
statement that reports the sizing and counts the workers sharing a host."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from tests.helpers.launch import start_worker
from tests.helpers.queue_data import insert_run, insert_trials, synthetic_configs, wait_until
from tunefleet.queries import queue

pytestmark = pytest.mark.acceptance

#: Code generation 40x slower than timing: one process starves the device.
CODEGEN_BOUND = {"prepare_duration": 0.4, "duration": 0.01}


def sizing_row(db: Any, pid: int) -> dict[str, Any] | None:
    return db.execute(  # type: ignore[no-any-return]
        "SELECT prepare_workers, prefetch, capacity, sizing, device_busy"
        " FROM tunefleet.worker WHERE pid = %s",
        (pid,),
    ).fetchone()


def pool_sizes(log: str) -> list[int]:
    """Every pool size the worker logged: the initial one, then each change."""
    first = re.findall(r"sizing \(\w+\): (\d+) code-generation", log)
    changes = re.findall(r"sizing: \d+ -> (\d+) code-generation", log)
    return [int(n) for n in [*first, *changes]]


def test_a_worker_grows_its_pool_to_its_cores_under_code_generation_bound_trials(
    db_url, db, tmp_path
):
    run = insert_run(db, problem_args=CODEGEN_BOUND)
    insert_trials(db, run, synthetic_configs(200))
    # Four cores given explicitly: the worker counts only its own processes' use of them, so
    # the decision does not depend on what else loads this machine.
    w = start_worker(
        db_url, log_path=tmp_path / "w.log", drain=False, lease_s=5, poll_s=0.2,
        extra=["--cores", "4"],
    )  # fmt: skip
    try:
        grown = wait_until(
            lambda: (row := sizing_row(db, w.pid)) and row["prepare_workers"] == 4 and row,
            timeout=90,
            what="the worker to report a pool of 4 code-generation processes",
        )
        w.stop()
        code = w.wait(60)
    finally:
        w.kill()
    assert code == 0, w.log()
    sizes = pool_sizes(w.log())
    assert sizes[0] == 2, w.log()  # half of its 4 cores to start with
    assert sizes[-1] == 4 and max(sizes) == 4, w.log()  # grown, never beyond its cores
    assert sizes == sorted(sizes), w.log()  # only grew: the device kept waiting
    assert (grown["prefetch"], grown["capacity"], grown["sizing"]) == (4, 5, "auto")
    final = sizing_row(db, w.pid)
    assert final is not None and 0.0 < final["device_busy"] < 1.0
    done = db.execute(
        "SELECT count(*) AS n FROM tunefleet.trial WHERE run_id = %s AND state = 'done'", (run,)
    ).fetchone()
    assert done["n"] > 0


def test_explicit_flags_keep_the_sizing_fixed(db_url, db, tmp_path):
    run = insert_run(db, problem_args=CODEGEN_BOUND)
    ids = insert_trials(db, run, synthetic_configs(12))
    w = start_worker(
        db_url, log_path=tmp_path / "w.log", drain=True, lease_s=5, poll_s=0.2,
        prepare_workers=1, prefetch=1, extra=["--cores", "4"],
    )  # fmt: skip
    try:
        code = w.wait(120)
    finally:
        w.kill()
    assert code == 0, w.log()
    assert pool_sizes(w.log()) == [1], w.log()
    row = sizing_row(db, w.pid)
    assert row is not None
    assert (row["prepare_workers"], row["prefetch"], row["capacity"], row["sizing"]) == (
        1,
        1,
        2,
        "flags",
    )
    states = db.execute(
        "SELECT DISTINCT state FROM tunefleet.trial WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    assert [r["state"] for r in states] == ["done"]


def test_sizing_report_counts_the_live_workers_of_the_same_host(db):
    def worker_row(host: str, age_s: float = 0.0, state: str = "active") -> uuid.UUID:
        wid = uuid.uuid4()
        db.execute(
            "INSERT INTO tunefleet.worker (id, host, pid, device_class, version, heartbeat_at,"
            " state) VALUES (%s, %s, 1, 'x', 't', now() - make_interval(secs => %s), %s)",
            (wid, host, age_s, state),
        )
        return wid

    def registered(host: str) -> tuple[uuid.UUID, str]:
        wid = uuid.uuid4()
        secret = queue.register_worker(
            db, worker_id=wid, host=host, pid=1, device_id=None, device_class="x", version="t"
        )
        return wid, secret

    me, secret = registered("node-a")
    worker_row("node-a")
    worker_row("node-a")
    worker_row("node-a", age_s=600)  # killed long ago without a goodbye
    worker_row("node-a", state="stopped")
    worker_row("node-b")
    peers = queue.report_worker_sizing(
        db, me, secret, capacity=9, prepare_workers=8, prefetch=8, sizing="auto", device_busy=0.75,
        peer_alive_s=60,
    )  # fmt: skip
    assert peers == 3
    row = db.execute(
        "SELECT capacity, prepare_workers, prefetch, sizing, device_busy FROM tunefleet.worker"
        " WHERE id = %s",
        (me,),
    ).fetchone()
    assert row == {
        "capacity": 9,
        "prepare_workers": 8,
        "prefetch": 8,
        "sizing": "auto",
        "device_busy": 0.75,
    }
    # A stopped worker reports nothing and counts only itself.
    gone, gone_secret = registered("node-a")
    assert queue.stop_worker(db, gone, gone_secret)
    alone = queue.report_worker_sizing(
        db, gone, gone_secret, capacity=2, prepare_workers=1, prefetch=1, sizing="auto",
        device_busy=None, peer_alive_s=60,
    )  # fmt: skip
    assert alone == 1
    assert sizing_row_by_id(db, gone) == {"prepare_workers": None, "capacity": 2}


def sizing_row_by_id(db: Any, wid: uuid.UUID) -> dict[str, Any] | None:
    return db.execute(  # type: ignore[no-any-return]
        "SELECT prepare_workers, capacity FROM tunefleet.worker WHERE id = %s", (wid,)
    ).fetchone()
