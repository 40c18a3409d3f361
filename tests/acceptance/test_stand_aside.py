"""A worker whose environment cannot run a problem stands aside instead of failing the run:
real ``python -m tunefleet.worker`` processes against a real PostgreSQL. The broken node is
simulated by ``TUNEFLEET_TEST_BROKEN`` in one worker's environment (see environment_problem.py);
the healthy worker started afterwards runs the same code without it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.coordinator import register_worker
from tests.helpers.launch import WorkerProcess, start_worker
from tests.helpers.queue_data import (
    attempts_of,
    insert_run,
    insert_trials,
    synthetic_configs,
    trial_states,
    wait_until,
)
from tunefleet.cli.front import status_text
from tunefleet.cli.output import short_id

pytestmark = pytest.mark.acceptance

PROBLEM = str(Path(__file__).with_name("environment_problem.py"))
CONFIGS = [{"x": i} for i in range(8)]
OPTS: dict[str, Any] = {"lease_s": 2, "poll_s": 0.2}
#: Generous: the machine may be loaded; every wait ends on a process exit or a database state.
EXIT_S = 120


def broken_env(mode: str) -> dict[str, str]:
    return {**os.environ, "TUNEFLEET_TEST_BROKEN": mode}


def worker_row(db: Any, w: WorkerProcess) -> dict[str, Any]:
    row = wait_until(
        lambda: db.execute(
            "SELECT id, host FROM tunefleet.worker WHERE pid = %s", (w.pid,)
        ).fetchone(),
        what=f"worker pid {w.pid} to register",
    )
    return dict(row)


def trial_rows(db: Any, ids: list[int]) -> dict[int, dict[str, Any]]:
    rows = db.execute(
        "SELECT id, state, attempt, error FROM tunefleet.trial WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    return {int(r["id"]): dict(r) for r in rows}


def counted(db: Any, tid: int) -> list[tuple[int, str]]:
    return [
        (a["attempt"], a["outcome"]) for a in attempts_of(db, tid) if a["outcome"] != "released"
    ]


def measured_once(db: Any, ids: list[int]) -> bool:
    rows = db.execute(
        "SELECT trial_id, count(*) AS n FROM tunefleet.measurement WHERE trial_id = ANY(%s) "
        "GROUP BY trial_id",
        (ids,),
    ).fetchall()
    return {int(r["trial_id"]): int(r["n"]) for r in rows} == dict.fromkeys(ids, 1)


@pytest.mark.parametrize(
    ("mode", "prepare_workers", "drain", "reason"),
    [
        # The user problem file does not import on this node (the code-generation process
        # loads it).
        ("import", 1, True, "tunefleet_test_module_missing_on_this_node"),
        # prepare raises a missing-module error for every configuration (feinsum's case).
        ("needs_module", 0, False, "No module named 'libfoo'"),
        # prepare raises the same unexplained error for every configuration: K = 3 in a row.
        ("same_error", 1, True, "the same error on 3 configurations in a row"),
        # The device process dies as it loads the problem.
        ("die", 0, False, "device process killed by SIGSEGV loading the problem"),
    ],
)
def test_a_broken_node_stands_aside_and_a_healthy_one_then_finishes_the_run(
    db_url, db, tmp_path, mode, prepare_workers, drain, reason
):
    run = insert_run(db, problem=PROBLEM)
    ids = insert_trials(db, run, CONFIGS)
    broken = start_worker(
        db_url,
        log_path=tmp_path / "broken.log",
        env=broken_env(mode),
        drain=drain,
        prepare_workers=prepare_workers,
        **OPTS,
    )
    try:
        me = worker_row(db, broken)
        # It cannot serve anything: it exits 1 with the reason, drained or not.
        assert broken.wait(EXIT_S) == 1, broken.log()
    finally:
        broken.kill()
    last = broken.log().strip().splitlines()[-1]
    assert last.startswith("tunefleet: error: worker "), last
    assert "cannot serve any run with work" in last and reason in last, last

    # Nothing was counted against the configurations.
    rows = trial_rows(db, ids)
    assert {r["state"] for r in rows.values()} == {"pending"}, rows
    assert {r["attempt"] for r in rows.values()} == {0}
    history = db.execute(
        "SELECT outcome, error FROM tunefleet.attempt WHERE trial_id = ANY(%s)", (ids,)
    ).fetchall()
    assert history, "the broken worker did claim"
    assert {h["outcome"] for h in history} == {"released"}
    assert all(h["error"].startswith("environment: ") for h in history), history

    # One row says why, and status names it.
    aside = db.execute("SELECT * FROM tunefleet.standing_aside").fetchall()
    assert [(a["worker_id"], a["run_id"]) for a in aside] == [(me["id"], run)]
    assert reason in aside[0]["reason"]
    text = status_text(db, run)
    assert (
        f"worker {short_id(me['id'])} on host {me['host']} (gone) cannot run this problem: " in text
    ), text
    assert reason in text
    assert "nobody can serve this run" in text

    healthy = start_worker(db_url, log_path=tmp_path / "healthy.log", drain=True, **OPTS)
    try:
        assert healthy.wait(EXIT_S) == 0, healthy.log()
    finally:
        healthy.kill()
    assert set(trial_states(db, ids).values()) == {"done"}, healthy.log()
    assert measured_once(db, ids)
    assert all(counted(db, tid) == [(1, "done")] for tid in ids)
    assert "nobody can serve this run" not in status_text(db, run)


def test_a_worker_standing_aside_from_one_run_keeps_serving_the_others(db_url, db, tmp_path):
    broken_run = insert_run(db, problem=PROBLEM)
    broken_ids = insert_trials(db, broken_run, CONFIGS)
    fine_run = insert_run(db, problem_args={"duration": 0.01})
    fine_ids = insert_trials(db, fine_run, synthetic_configs(4), priority=1)
    w = start_worker(
        db_url,
        log_path=tmp_path / "w.log",
        env=broken_env("needs_module"),
        drain=True,
        prepare_workers=1,
        **OPTS,
    )
    try:
        assert w.wait(EXIT_S) == 1, w.log()
    finally:
        w.kill()
    assert set(trial_states(db, fine_ids).values()) == {"done"}, w.log()
    assert set(trial_states(db, broken_ids).values()) == {"pending"}
    assert {r["attempt"] for r in trial_rows(db, broken_ids).values()} == {0}
    aside = db.execute("SELECT run_id FROM tunefleet.stand_aside").fetchall()
    assert [a["run_id"] for a in aside] == [broken_run]


def test_an_error_of_some_configurations_counts_against_them_only(db_url, db, tmp_path):
    """Configurations 6 and 7 raise the same error on every node: once the run has worked on
    this worker (x = 0 first), their errors are theirs, failed at once."""
    run = insert_run(db, problem=PROBLEM)
    ids = insert_trials(db, run, CONFIGS, max_attempts=1)
    w = start_worker(
        db_url, log_path=tmp_path / "w.log", env=broken_env("config_error"), drain=True, **OPTS
    )
    try:
        assert w.wait(EXIT_S) == 0, w.log()
    finally:
        w.kill()
    states = trial_states(db, ids)
    assert [states[t] for t in ids] == ["done"] * 6 + ["failed"] * 2, w.log()
    assert not db.execute("SELECT 1 FROM tunefleet.stand_aside").fetchall()


def test_fewer_erring_configurations_than_the_streak_are_counted_when_nothing_else_is_left(
    db_url, db, tmp_path
):
    """Two erring configurations and nothing else of the run: the streak of 3 cannot be
    reached, so they are judged one by one (failed), and the worker drains normally."""
    run = insert_run(db, problem=PROBLEM)
    ids = insert_trials(db, run, CONFIGS[6:], max_attempts=1)
    w = start_worker(
        db_url, log_path=tmp_path / "w.log", env=broken_env("config_error"), drain=True, **OPTS
    )
    try:
        assert w.wait(EXIT_S) == 0, w.log()
    finally:
        w.kill()
    assert set(trial_states(db, ids).values()) == {"failed"}, w.log()
    assert not db.execute("SELECT 1 FROM tunefleet.stand_aside").fetchall()


def test_an_error_that_follows_configurations_to_another_worker_is_theirs(db_url, db, tmp_path):
    """With a streak of 2, configurations 6 and 7 queued first make the first worker stand
    aside; the second meets the same error on the same trials it handed back, so it counts
    them (and does not stand aside in turn), then measures the rest."""
    run = insert_run(db, problem=PROBLEM)
    ids = insert_trials(db, run, [*CONFIGS[6:], *CONFIGS[:6]], max_attempts=1)
    opts = {**OPTS, "drain": True, "stand_aside_after": 2, "prepare_workers": 0}
    env = broken_env("config_error")
    first = start_worker(db_url, log_path=tmp_path / "first.log", env=env, **opts)
    try:
        first_id = worker_row(db, first)["id"]
        assert first.wait(EXIT_S) == 1, first.log()
    finally:
        first.kill()
    second = start_worker(db_url, log_path=tmp_path / "second.log", env=env, **opts)
    try:
        assert second.wait(EXIT_S) == 0, second.log()
    finally:
        second.kill()
    states = trial_states(db, ids)
    assert [states[t] for t in ids] == ["failed"] * 2 + ["done"] * 6, second.log()
    aside = db.execute("SELECT worker_id FROM tunefleet.stand_aside").fetchall()
    assert [a["worker_id"] for a in aside] == [first_id]
    assert "the configuration's" in second.log()


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
    assert trial_rows(db, [ids[0]])[ids[0]]["attempt"] == 2
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
    db.execute(
        """
        CREATE FUNCTION tunefleet.refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.trial_id = (SELECT min(id) FROM tunefleet.trial) THEN
                RAISE EXCEPTION 'this row is broken';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    db.execute(
        "CREATE TRIGGER refuse_one BEFORE INSERT ON tunefleet.attempt FOR EACH ROW "
        "EXECUTE FUNCTION tunefleet.refuse_one()"
    )
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
