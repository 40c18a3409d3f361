"""The worker's last stage (``tunefleet.worker.outbox``) against a real PostgreSQL: a finished
trial's fenced completion, a result the database refuses (sent again as a failure), a
completion the fence rejects (dropped and counted), a hand-back after an environment fault,
a database that is away (kept for later), and the books (outcomes, seconds timed, best per
run). The claims are real; no worker process."""

from __future__ import annotations

import uuid
from typing import Any

from tests.helpers.queue_data import insert_run, insert_trials, synthetic_configs, trial_states
from tunefleet.queries import queue
from tunefleet.queries.queue import MeasurementRow
from tunefleet.settings import DatabaseSettings
from tunefleet.timeline import Phase
from tunefleet.worker.link import Link
from tunefleet.worker.outbox import Outbox, Sent
from tunefleet.worker.results import Held
from tunefleet.worker.vocabulary import Stage, Verdict


def _row(median_s: float) -> MeasurementRow:
    return MeasurementRow(
        median_s=median_s, min_s=median_s, samples_s=[median_s] * 3, protocol={"seed": 0}
    )


def _outbox(db: Any, db_url: str) -> tuple[Outbox, list[queue.ClaimedTrial], int, str]:
    """An outbox of a registered worker that holds two claimed trials of a fresh run."""
    run_id = insert_run(db)
    insert_trials(db, run_id, synthetic_configs(2))
    worker = uuid.uuid4()
    secret = queue.register_worker(
        db, worker_id=worker, host="test", pid=1, device_id=None, device_class="host-cpu",
        version="test",
    )  # fmt: skip
    claims = queue.claim_trials(
        db, worker_id=worker, secret=secret, device_classes=["any"], limit=2, lease_s=300
    )
    assert len(claims) == 2
    outbox = Outbox(Link(db_url, DatabaseSettings(url=db_url), "main"), worker)
    return outbox, claims, run_id, secret


def _finished(claim: queue.ClaimedTrial, state: Verdict, **kw: Any) -> Held:
    """A held trial that finished, its device having timed it for 0.25 s of a 0.5 s
    request (the timeline the outbox sends and books)."""
    held = Held(claim)
    marks = held.marks
    marks.measure_sent, marks.measured, marks.measure_child_s = (
        marks.claimed,
        marks.claimed + 0.5,
        0.5,
    )
    marks.device = {Phase.TIMING.value: 0.25}
    held.finish(state, kw.get("error"), kw.get("measurement"))
    assert held.stage == Stage.FINISHED
    return held


def test_a_done_result_is_written_behind_the_fence_and_booked(db: Any, db_url: str) -> None:
    outbox, (first, second), run_id, _ = _outbox(db, db_url)
    try:
        assert outbox.send(_finished(first, Verdict.DONE, measurement=_row(2e-3))) is Sent.GONE
        assert outbox.send(_finished(second, Verdict.DONE, measurement=_row(1e-3))) is Sent.GONE
        assert trial_states(db, [first.trial_id, second.trial_id]) == {
            first.trial_id: "done",
            second.trial_id: "done",
        }
        assert outbox.outcomes == {"done": 2}
        assert outbox.best_s == {run_id: 1e-3}
        assert outbox.timed_s == 0.5  # the two timelines' timing
        stored = db.execute(
            "SELECT timeline FROM tunefleet.attempt WHERE trial_id = %s", (first.trial_id,)
        ).fetchone()
        assert stored is not None and stored["timeline"][Phase.TIMING.value] == 0.25
    finally:
        outbox.link.close()


def test_a_refused_result_becomes_a_failure_sent_next_turn(db: Any, db_url: str) -> None:
    outbox, (first, _), _, _ = _outbox(db, db_url)
    try:
        held = _finished(first, Verdict.DONE, measurement=_row(float("inf")))
        assert outbox.send(held) is Sent.AGAIN  # the table refuses an infinite median
        assert held.state == Verdict.FAILED and "could not be stored" in (held.error or "")
        assert trial_states(db, [first.trial_id]) == {first.trial_id: "running"}
        assert outbox.send(held) is Sent.GONE
        assert trial_states(db, [first.trial_id])[first.trial_id] in ("pending", "failed")
        assert outbox.outcomes == {"failed": 1}
    finally:
        outbox.link.close()


def test_a_completion_the_fence_rejects_is_dropped_and_counted(db: Any, db_url: str) -> None:
    outbox, (first, _), run_id, _ = _outbox(db, db_url)
    try:
        # Someone else's now: the lease was released (as a reaper or a stop would).
        queue.release_trials(db, worker_id=outbox.worker_id, held=[first.key], reason="test")
        held = _finished(first, Verdict.DONE, measurement=_row(1e-3))
        assert outbox.send(held) is Sent.GONE
        assert trial_states(db, [first.trial_id]) == {first.trial_id: "pending"}
        assert outbox.outcomes == {"dropped": 1} and run_id not in outbox.best_s
    finally:
        outbox.link.close()


def test_a_hand_back_releases_the_trial_uncounted(db: Any, db_url: str) -> None:
    outbox, (first, _), _, _ = _outbox(db, db_url)
    try:
        held = _finished(first, Verdict.HANDBACK, error="no OpenCL device here")
        assert outbox.hand_back(held) is Sent.GONE
        assert trial_states(db, [first.trial_id]) == {first.trial_id: "pending"}
        assert outbox.outcomes == {"handed back": 1}
    finally:
        outbox.link.close()


def test_a_database_that_is_away_keeps_the_result_for_later(db: Any, db_url: str) -> None:
    outbox, (first, _), _, secret = _outbox(db, db_url)
    outbox.link.close()
    away = "postgresql://nobody@127.0.0.1:9/none?connect_timeout=1"
    outbox.link = Link(away, DatabaseSettings(url=away), "main", statement_tries=1)
    try:
        held = _finished(first, Verdict.DONE, measurement=_row(1e-3))
        assert outbox.send(held) is Sent.LATER
        assert outbox.hand_back(_finished(first, Verdict.HANDBACK, error="x")) is Sent.LATER
        outbox.unrecorded[7] = "cannot run this problem"
        assert not outbox.record_stand_asides(secret) and outbox.unrecorded == {
            7: "cannot run this problem"
        }
        assert trial_states(db, [first.trial_id]) == {first.trial_id: "running"}
        assert not outbox.outcomes
    finally:
        outbox.link.close()
