"""Claims the database refuses or did not expect, with real ``python -m tunefleet.worker``
processes against a real PostgreSQL: a trial reset by hand with its attempt recorded, a row
the database refuses to claim. The worker goes on in both."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.coordinator import register_worker
from tests.helpers.launch import start_worker
from tests.helpers.queue_data import (
    attempts_of,
    insert_run,
    insert_trials,
    refuse_claims,
    synthetic_configs,
    trial_states,
    wait_until,
)

pytestmark = pytest.mark.acceptance

OPTS: dict[str, Any] = {"lease_s": 2, "poll_s": 0.2}
#: Generous: the machine may be loaded; every wait ends on a process exit or a database state.
EXIT_S = 120


def counted(db: Any, tid: int) -> list[tuple[int, str]]:
    return [
        (a["attempt"], a["outcome"]) for a in attempts_of(db, tid) if a["outcome"] != "released"
    ]


def attempt_counter(db: Any, tid: int) -> int:
    row = db.execute("SELECT attempt FROM tunefleet.trial WHERE id = %s", (tid,)).fetchone()
    return int(row["attempt"])


def test_a_trial_reset_by_hand_with_its_attempt_recorded_is_claimed_and_measured(
    db_url, db, tmp_path
):
    """Reported: a trial put back to pending with its attempt counter at 0 while its history
    holds attempt 1 made every worker that claimed it exit with a UniqueViolation."""
    run = insert_run(db, problem_args={"duration": 0.01})
    ids = insert_trials(db, run, synthetic_configs(3))
    ghost = register_worker(db, device_class="host-cpu")
    db.execute(
        "INSERT INTO tunefleet.attempt (trial_id, attempt, worker_id, ended_at, outcome, error)"
        " VALUES (%s, 1, %s, now(), 'failed', 'worker lost')",
        (ids[0], ghost),
    )
    w = start_worker(db_url, log_path=tmp_path / "w.log", drain=True, **OPTS)
    try:
        assert w.wait(EXIT_S) == 0, w.log()
    finally:
        w.kill()
    assert set(trial_states(db, ids).values()) == {"done"}, w.log()
    assert counted(db, ids[0]) == [(1, "failed"), (2, "done")]
    assert attempt_counter(db, ids[0]) == 2
    assert "Traceback" not in w.log()


def test_a_trial_the_database_refuses_to_claim_is_left_alone_and_the_worker_goes_on(
    db_url, db, tmp_path
):
    """An unexpected database error about one trial (here a trigger refusing its attempt
    row, as a broken row or a foreign constraint would): logged, that trial left alone, the
    others measured, the worker drains with status 0."""
    run = insert_run(db, problem_args={"duration": 0.01})
    ids = insert_trials(db, run, synthetic_configs(4))
    assert ids[0] == min(ids)  # a fresh database: the trigger below picks it by that
    refuse_claims(db, only_the_first=True)
    w = start_worker(db_url, log_path=tmp_path / "w.log", drain=False, **OPTS)
    try:
        wait_until(
            lambda: set(trial_states(db, ids[1:]).values()) == {"done"},
            timeout=EXIT_S,
            what="the other trials to be measured",
        )
        assert w.alive, w.log()
        w.stop()
        assert w.wait(EXIT_S) == 0, w.log()
    finally:
        w.kill()
    assert trial_states(db, [ids[0]]) == {ids[0]: "pending"}
    assert f"trial {ids[0]} cannot be claimed (this row is broken)" in w.log()
    assert "Traceback" not in w.log()
