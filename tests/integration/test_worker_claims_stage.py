"""The claim stage alone (``tunefleet.worker.claims``) against a real PostgreSQL: no worker
process, no children; the claims, the queue and its rows are real.

Failure modes named here: claiming past the capacity (the suspects not counted against it);
a claim that holds a trial without its lease (the heartbeat would not renew it); claiming
past ``--max-trials``; a draining worker that ends while work of its classes is open, or
never ends once there is none; a refused claim that kills the worker or is retried at full
width for ever instead of finding its one bad row; a notification for another device class
that wakes the claim."""

from __future__ import annotations

import time
import uuid
from typing import Any

from tests.helpers.queue_data import (
    insert_run,
    insert_trials,
    refuse_claims,
    synthetic_configs,
    trial_states,
)
from tunefleet.queries import queue
from tunefleet.settings import DatabaseSettings
from tunefleet.worker.claims import Claims
from tunefleet.worker.holding import Holding
from tunefleet.worker.judge import Judge
from tunefleet.worker.link import Link
from tunefleet.worker.settings import WorkerSettings
from tunefleet.worker.vocabulary import Stage
from tunefleet.worker.wake import Wakeups


def claims_of(db: Any, db_url: str, **settings: Any) -> tuple[Claims, list[str]]:
    """A claim stage of a freshly registered worker; the list gathers why it settled
    suspects."""
    worker = uuid.uuid4()
    secret = queue.register_worker(
        db, worker_id=worker, host="test", pid=1, device_id=None, device_class="host-cpu",
        version="test",
    )  # fmt: skip
    config = WorkerSettings.build(db=db_url, poll_s=0.2, lease_s=30.0, **settings)
    settled: list[str] = []
    claims = Claims(
        config, Link(db_url, DatabaseSettings(url=db_url), "main"),
        Wakeups(config.poll_s, listen=False), Judge(config.stand_aside_after), Holding(),
        worker, "test", settle=settled.append,
    )  # fmt: skip
    claims.secret = secret
    return claims, settled


def test_claims_fill_the_capacity_with_leased_trials_and_no_more(db, db_url) -> None:
    run = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(4))
    claims, _ = claims_of(db, db_url)
    try:
        taken = claims.step(capacity=2)
        assert [h.claim.trial_id for h in taken] == ids[:2] and claims.claimed == 2
        assert trial_states(db, ids) == {ids[0]: "running", ids[1]: "running",
                                         ids[2]: "pending", ids[3]: "pending"}  # fmt: skip
        assert sorted(k.trial_id for k in claims.holding.leases.snapshot()) == ids[:2]
        claims.due()
        assert claims.step(capacity=2) == []  # full: nothing more claimed
        # A suspect waits for a verdict and uses nothing: it does not count against it.
        claims.holding[ids[0]].stage = Stage.SUSPECT
        claims.due()
        assert [h.claim.trial_id for h in claims.step(capacity=2)] == [ids[2]]
        assert trial_states(db, [ids[3]]) == {ids[3]: "pending"}
    finally:
        claims.link.close()


def test_max_trials_ends_claiming_and_settles_the_suspects(db, db_url) -> None:
    run = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(3))
    claims, settled = claims_of(db, db_url, max_trials=2)
    try:
        assert len(claims.step(capacity=5)) == 2 and claims.exhausted
        claims.due()
        assert claims.step(capacity=5) == []
        assert settled and "--max-trials" in settled[-1]
        assert trial_states(db, [ids[2]]) == {ids[2]: "pending"}
    finally:
        claims.link.close()


def test_a_draining_worker_is_drained_only_when_no_work_of_its_classes_is_open(db, db_url) -> None:
    run = insert_run(db)
    (tid,) = insert_trials(db, run, synthetic_configs(1))
    claims, settled = claims_of(db, db_url, drain=True)
    try:
        (held,) = claims.step(capacity=1)
        claims.due()
        claims.step(capacity=2)  # nothing pending, but it holds a trial: not drained
        assert not claims.drained and settled  # the suspects were looked at
        claims.holding.forget(held)
        claims.due()
        claims.step(capacity=2)  # the trial still runs (its lease is live): open work
        assert not claims.drained and claims.idle
        db.execute("UPDATE tunefleet.trial SET state = 'cancelled' WHERE id = %s", (tid,))
        claims.due()
        claims.step(capacity=2)
        assert claims.drained
    finally:
        claims.link.close()


def test_a_refused_claim_finds_its_bad_row_and_claiming_goes_on(db, db_url, caplog) -> None:
    run = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(3))
    refuse_claims(db, only_the_first=True)
    claims, _ = claims_of(db, db_url)
    try:
        assert claims.step(capacity=3) == [] and claims.failures == 1  # all three refused
        assert claims.step(capacity=3) == []  # one at a time now: the bad row is found
        assert claims.skipped.keys() == {ids[0]} and claims.failures == 0
        assert "cannot be claimed (this row is broken)" in caplog.text
        claims.due()
        assert [h.claim.trial_id for h in claims.step(capacity=3)] == ids[1:]
        assert trial_states(db, ids) == {ids[0]: "pending", ids[1]: "running", ids[2]: "running"}
    finally:
        claims.link.close()


def test_a_refusal_that_is_not_one_row_backs_off_instead_of_failing(db, db_url) -> None:
    run = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(6))
    refuse_claims(db, only_the_first=False)
    claims, _ = claims_of(db, db_url)
    try:
        for _ in range(6):  # refused, then refused alone: a bad row, three times over
            claims.next_at = 0.0
            claims.step(capacity=2)
        assert sorted(claims.skipped) == ids[:3]
        waits = []
        for _ in range(3):  # three bad rows in a row are not one bad row: it waits instead
            claims.next_at = 0.0
            now = time.monotonic()
            claims.step(capacity=2)
            waits.append(claims.next_at - now)
        assert sorted(claims.skipped) == ids[:3]
        assert waits[0] < waits[1] < waits[2] and waits[2] > 0  # longer each time
        assert claims.holding.counted() == []
        assert set(trial_states(db, ids).values()) == {"pending"}
    finally:
        claims.link.close()


def test_only_a_notification_for_its_classes_makes_the_next_claim_due(db, db_url) -> None:
    claims, _ = claims_of(db, db_url)
    claims.classes = ["any", "host-cpu"]
    seen: list[str] = []
    read = claims.link.notifies

    def notifies() -> list[str]:
        got = read()
        seen.extend(got)
        return got

    claims.link.notifies = notifies  # type: ignore[method-assign]

    def pump_until(done: Any, what: str) -> None:
        deadline = time.monotonic() + 30.0
        while not done():
            assert time.monotonic() < deadline, f"no {what} within 30 s (seen: {seen})"
            claims.link.run(lambda c: c.execute("SELECT 1"))  # delivers what has arrived
            claims.pump_notifications()

    try:
        queue.listen(claims.link.connect_now())
        later = time.monotonic() + 3600
        claims.next_at = later
        queue.notify_new_trials(db, "gpu-nvidia")
        pump_until(lambda: "gpu-nvidia" in seen, "notification for another class")
        assert claims.next_at == later
        queue.notify_new_trials(db, "host-cpu")
        pump_until(lambda: claims.next_at < later, "wake-up for its own class")
        assert claims.next_at <= time.monotonic() + claims.wake.spread_s
    finally:
        claims.link.close()
