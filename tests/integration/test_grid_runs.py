"""The ``grid`` technique against a real PostgreSQL and real workers: a space of 384 valid
configurations (the synthetic objective with tiles of 64 and more ruled out) measured each
exactly once, in the plan's order across a stop and a resume, and chosen by itself when the
valid configurations fit the trial budget."""

from __future__ import annotations

import threading
from typing import Any

import tunefleet
from tests.helpers.coordinator import fleet, logs, measured_twice, settings, trial_counts
from tests.helpers.coordinator_problems import RULED
from tests.helpers.queue_data import wait_until
from tunefleet.coordinator import grid
from tunefleet.coordinator.create import create_run
from tunefleet.coordinator.engine import Coordinator
from tunefleet.problems.synthetic import OPTIMUM
from tunefleet.space import Space, config_hash

#: RULED's space (the synthetic one) and how much of it the rules leave.
VALID, RULED_OUT = 384, 128
QUICK = {"duration": 0.002}


def measured_order(db: Any, run_id: int) -> list[str]:
    """The run's measured configurations in the order they were queued (the ruled-out ones
    of a batch are stored in a statement of their own, so they are left out)."""
    rows = db.execute(
        "SELECT config_hash FROM tunefleet.trial WHERE run_id = %s AND purpose = 'search'"
        " AND state = 'done' ORDER BY id",
        (run_id,),
    ).fetchall()
    return [r["config_hash"] for r in rows]


def plan_order(db: Any, run_id: int) -> list[str]:
    """The grid's plan of the run's stored space, its ruled-out configurations left out."""
    run = db.execute("SELECT space FROM tunefleet.run WHERE id = %s", (run_id,)).fetchone()
    space = Space.from_json(run["space"])
    return [config_hash(c) for c in grid.configurations(space) if c["tile"] < 64]


def test_a_grid_stopped_midway_resumes_and_measures_each_valid_point_once(db_url, db, tmp_path):
    # 10 ms trials: some 280 left after the 100th are seconds of work, so the stop lands
    # in the middle of the grid however late it is seen.
    s = settings(problem=RULED, problem_args={"duration": 0.01}, techniques=["grid"], confirm=0)
    run_id = create_run(s, db_url)
    first = Coordinator(s, db_url)

    def stop_midway() -> None:
        try:
            wait_until(lambda: trial_counts(db, run_id).get("done", 0) >= 100, what="100 done")
        finally:
            first.request_stop()

    with fleet(db_url, 3, tmp_path) as procs:
        stopper = threading.Thread(target=stop_midway)
        stopper.start()
        stopped = first.run(run_id)
        stopper.join()
        assert stopped.state == "stopped", logs(procs)
        midway = trial_counts(db, run_id)
        assert midway.get("done", 0) < VALID  # the stop landed in the middle of the grid
        resumed = Coordinator(settings(resume=run_id, confirm=0), db_url).run()
        counts = trial_counts(db, run_id)
    assert (resumed.state, resumed.stop_reason) == ("finished", "space_exhausted")
    assert counts == {"done": VALID, "invalid": RULED_OUT}
    assert resumed.best_config == OPTIMUM
    assert measured_twice(db) == []
    # The resumed coordinator walked on where the first stopped: one plan, in its order.
    assert measured_order(db, run_id) == plan_order(db, run_id)
    claims = db.execute(
        "SELECT count(*) AS n FROM tunefleet.attempt a JOIN tunefleet.trial t"
        " ON t.id = a.trial_id WHERE t.run_id = %s AND (t.config->>'tile')::int >= 64",
        (run_id,),
    ).fetchone()
    assert claims["n"] == 0  # the rules answered those without a worker


def test_the_grid_is_chosen_when_the_valid_space_fits_the_budget_and_tune_says_so(db_url, db):
    seen: list[tunefleet.TuneProgress] = []
    result = tunefleet.tune(
        RULED, args=QUICK, max_trials=400, workers=2, confirm=0, db=db_url, progress=seen.append
    )
    start = seen[0].line
    assert (
        "search: grid (the 384 valid configurations of the space's 512 fit --max-trials 400; "
        "each is measured once)" in start
    ), start
    run = db.execute(
        "SELECT stop_reason, search FROM tunefleet.run WHERE id = %s", (result.run_id,)
    ).fetchone()
    assert run["search"]["techniques"] == ["grid"]
    assert run["stop_reason"] == "space_exhausted"
    counts = trial_counts(db, result.run_id)
    assert (counts.get("done", 0), counts.get("invalid", 0)) == (VALID, RULED_OUT)
    assert result.config == OPTIMUM
    assert measured_twice(db) == []


def test_without_a_fitting_budget_the_default_search_runs(db_url, db):
    for budget in (None, 383):
        run_id = create_run(settings(problem=RULED, max_trials=budget), db_url)
        search = db.execute("SELECT search FROM tunefleet.run WHERE id = %s", (run_id,)).fetchone()[
            "search"
        ]
        assert (search["techniques"], search["choice"]) == ([], None)
