"""A worker whose environment cannot run a problem stands aside instead of failing the run:
real ``python -m tunefleet.worker`` processes against a real PostgreSQL. The broken node is
simulated by ``TUNEFLEET_TEST_BROKEN`` in one worker's environment (see environment_problem.py);
the healthy worker started afterwards runs the same code without it.

The policy itself is pure (tunefleet.worker.judge) and tested case by case in
tests/unit/test_worker_judge.py: a missing module, the same error on every configuration, a
process dying as it loads the problem, standing aside from one run while serving the others,
errors of some configurations counted against them only (what each broken node's children
answer: tests/unit/test_supervise.py). Here, end to end: a problem that cannot load (the trials
are handed back, not failed, the row and status say why, a healthy worker finishes the run),
errors of some configurations counted against them (at once in a run that works here, once
nothing can settle them in a run of nothing else), and an error that follows configurations
from worker to worker (the database's record of other workers' hand-backs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.launch import WorkerProcess, start_worker
from tests.helpers.queue_data import (
    attempts_of,
    insert_run,
    insert_trials,
    trial_states,
    wait_until,
)
from tunefleet.text.output import short_id
from tunefleet.text.render import status_text

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


#: The user problem file does not import on this node (the code-generation process loads it).
REASON = "tunefleet_test_module_missing_on_this_node"


def test_a_broken_node_stands_aside_and_a_healthy_one_then_finishes_the_run(db_url, db, tmp_path):
    run = insert_run(db, problem=PROBLEM)
    ids = insert_trials(db, run, CONFIGS)
    broken = start_worker(
        db_url,
        log_path=tmp_path / "broken.log",
        env=broken_env("import"),
        drain=False,
        prepare_workers=1,
        **OPTS,
    )
    try:
        me = worker_row(db, broken)
        # It cannot serve anything: it exits 1 with the reason, even without --drain.
        assert broken.wait(EXIT_S) == 1, broken.log()
    finally:
        broken.kill()
    last = broken.log().strip().splitlines()[-1]
    assert last.startswith("tunefleet: error: worker "), last
    assert "cannot serve any run with work" in last and REASON in last, last

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
    assert REASON in aside[0]["reason"]
    text = status_text(db, run)
    assert (
        f"worker {short_id(me['id'])} on host {me['host']} (gone) cannot run this problem: " in text
    ), text
    assert REASON in text
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


def test_errors_of_some_configurations_count_against_them_only(db_url, db, tmp_path):
    """Configurations 6 and 7 raise the same error on every node. In a run that has worked on
    this worker (x = 0 first) their errors are theirs, failed at once; in a run of only those
    two the streak of 3 cannot be reached, so once nothing else is left they are judged one
    by one (failed). The worker stands aside from neither and drains normally."""
    worked = insert_run(db, problem=PROBLEM)
    worked_ids = insert_trials(db, worked, CONFIGS, max_attempts=1)
    only_errors = insert_run(db, problem=PROBLEM)
    error_ids = insert_trials(db, only_errors, CONFIGS[6:], max_attempts=1)
    w = start_worker(
        db_url, log_path=tmp_path / "w.log", env=broken_env("config_error"), drain=True, **OPTS
    )
    try:
        assert w.wait(EXIT_S) == 0, w.log()
    finally:
        w.kill()
    states = trial_states(db, worked_ids)
    assert [states[t] for t in worked_ids] == ["done"] * 6 + ["failed"] * 2, w.log()
    assert set(trial_states(db, error_ids).values()) == {"failed"}, w.log()
    assert "counted as failed (no other trial of the run to compare with)" in w.log()
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
