"""The coordinator notices a run nobody can serve (no live worker, or every live one stands
aside from it) and says so, in its progress and in ``status``; a healthy worker joining later
picks the run up and it finishes normally. In-process coordinator, real PostgreSQL, a real
worker process."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from pathlib import Path
from typing import Any

from tests.helpers.coordinator import register_worker, settings
from tests.helpers.launch import start_worker
from tests.helpers.queue_data import wait_until
from tunefleet.coordinator.create import create_run
from tunefleet.coordinator.engine import Coordinator, Progress, RunResult
from tunefleet.db.engine import connect
from tunefleet.devices import DeviceInfo
from tunefleet.queries import queue
from tunefleet.queries import search as q
from tunefleet.text.render import status_text

PROBLEM = str(Path(__file__).resolve().parents[1] / "acceptance" / "environment_problem.py")


def _drive(
    coordinator: Coordinator, run_id: int
) -> tuple[threading.Thread, list[Progress], list[RunResult]]:
    """Drive the run in a thread; its progress snapshots and (at the end) its result."""
    seen: list[Progress] = []
    outcome: list[RunResult] = []
    thread = threading.Thread(target=lambda: outcome.append(coordinator.run(run_id, seen.append)))
    thread.start()
    return thread, seen, outcome


def test_a_run_nobody_can_serve_is_reported_until_a_healthy_worker_finishes_it(
    db_url, db, tmp_path
):
    s = settings(problem=PROBLEM, problem_args={}, max_trials=8, unserved_s=0.5)
    run_id = create_run(s, db_url)
    coordinator = Coordinator(s, db_url)
    thread, seen, outcome = _drive(coordinator, run_id)
    try:
        # No worker at all, for longer than unserved_s.
        wait_until(
            lambda: any(p.unserved and "no live worker of class any" in p.unserved for p in seen),
            timeout=60,
            what="the coordinator to say no worker serves the run",
        )
        assert "nobody can serve this run: no live worker of class any" in status_text(db, run_id)

        # A live worker that stands aside from it: said at once, with its reason.
        ghost = register_worker(db, device_class="host-cpu")
        db.execute(
            "INSERT INTO tunefleet.stand_aside (worker_id, run_id, reason) VALUES (%s, %s, %s)",
            (ghost, run_id, "needs libfoo"),
        )
        assert q.count_live_workers(db, "any", 60.0, run_id) == (0, 0)
        wait_until(
            lambda: any(
                p.unserved
                and "every live worker of class any stands aside" in p.unserved
                and "cannot run this problem: needs libfoo" in p.unserved
                for p in seen
            ),
            timeout=60,
            what="the coordinator to say every live worker stands aside",
        )
        text = status_text(db, run_id)
        assert "nobody can serve this run: every live worker of its class stands aside" in text
        assert "on host test cannot run this problem: needs libfoo" in text

        healthy = start_worker(
            db_url, log_path=tmp_path / "healthy.log", drain=True, lease_s=2, poll_s=0.2
        )
        try:
            thread.join(120)
            assert not thread.is_alive(), healthy.log()
            assert healthy.wait(120) == 0, healthy.log()
        finally:
            healthy.kill()
    finally:
        coordinator.request_stop()
        thread.join(30)
    [result] = outcome
    assert (result.state, result.trials, result.failed) == ("finished", 8, 0)
    assert seen[-1].unserved is None
    counts: dict[str, Any] = {
        r["state"]: r["n"]
        for r in db.execute(
            # The search's trials; the confirmations of its best come after them by design.
            "SELECT state, count(*) AS n FROM tunefleet.trial"
            " WHERE run_id = %s AND purpose = 'search' GROUP BY state",
            (run_id,),
        )
    }
    assert counts == {"done": 8}
    measured = db.execute(
        "SELECT count(DISTINCT m.config_hash) AS configs, count(*) AS n"
        "  FROM tunefleet.measurement m JOIN tunefleet.trial t ON t.id = m.trial_id"
        " WHERE m.run_id = %s AND t.purpose = 'search'",
        (run_id,),
    ).fetchone()
    assert (measured["configs"], measured["n"]) == (8, 8)


def test_a_run_whose_last_worker_leaves_with_its_last_result_ends_served(db_url, db) -> None:
    """The worker that finishes a run's last trials may be gone (``--drain``) before the
    coordinator reads them: the run must not end saying nobody can serve it. Seen in a loaded
    fresh clone: the live-worker count, read before the outcomes, still saw the trials in
    flight and only a worker standing aside."""
    s = dataclasses.replace(settings(max_trials=2, unserved_s=0.5, confirm=0), heartbeat_s=0.02)
    run_id = create_run(s, db_url)
    ghost = register_worker(db)
    db.execute(
        "INSERT INTO tunefleet.stand_aside (worker_id, run_id, reason) VALUES (%s, %s, %s)",
        (ghost, run_id, "needs libfoo"),
    )
    worker = uuid.uuid4()
    secret = queue.register_worker(
        db,
        worker_id=worker,
        host="node",
        pid=1,
        device_id=queue.register_device(
            db, DeviceInfo(platform="P", vendor="V", name="G", driver_version="1")
        ),
        device_class="host-cpu",
        version="t",
    )
    coordinator = Coordinator(s, db_url)
    thread, seen, outcome = _drive(coordinator, run_id)
    try:
        claims = wait_until(
            lambda: (
                queue.claim_trials(
                    db,
                    worker_id=worker,
                    secret=secret,
                    device_classes=["any"],
                    limit=2,
                    lease_s=60,
                )
                or None
            ),
            timeout=60,
            what="the run's trials to be queued",
        )
        claims += queue.claim_trials(
            db, worker_id=worker, secret=secret, device_classes=["any"], limit=2, lease_s=60
        )
        assert len(claims) == 2
        wait_until(
            lambda: any(p.in_flight == 2 and p.live_workers == 1 for p in seen),
            timeout=60,
            what="the coordinator to see both trials held by a live worker",
        )
        # The last results and the worker's exit, seen by the coordinator at the same time.
        with connect(db_url) as w, w.transaction():
            for c in claims:
                queue.complete_trial(
                    w,
                    trial_id=c.trial_id,
                    attempt=c.attempt,
                    token=c.lease_token,
                    worker_id=worker,
                    state="invalid",
                    error="invalid by the test",
                )
            assert queue.stop_worker(w, worker, secret)
        thread.join(60)
        assert not thread.is_alive()
    finally:
        coordinator.request_stop()
        thread.join(30)
    [result] = outcome
    assert (result.state, result.trials) == ("finished", 2)
    assert seen[-1].in_flight == 0
    assert seen[-1].unserved is None, seen[-1].unserved
