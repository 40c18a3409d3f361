"""The coordinator engine in-process against a real PostgreSQL, with real worker processes
(``tunefleet worker --device host``) measuring the synthetic problem."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from opentuner.search.technique import register

import tunefleet
from tests.helpers.coordinator import (
    OPTIMUM_GFLOPS,
    fleet,
    logs,
    measured_twice,
    register_worker,
    settings,
    trial_counts,
)
from tests.helpers.coordinator_problems import (
    BROKEN_FOOTPRINT,
    FOOTED,
    KERNEL,
    RULED,
    TINY,
    TINY_ONE_INVALID,
)
from tests.helpers.queue_data import first_invalid, wait_until
from tunefleet.coordinator.budget import Horizon
from tunefleet.coordinator.create import create_run
from tunefleet.coordinator.engine import Coordinator, Progress, RunResult
from tunefleet.coordinator.settings import CoordinatorSettings
from tunefleet.coordinator.techniques import UniformDraws
from tunefleet.devices import DeviceInfo
from tunefleet.errors import ProblemError, RunError, UsageError
from tunefleet.problems.synthetic import OPTIMUM
from tunefleet.queries import dashboard as dashboard_queries
from tunefleet.queries import queue, report
from tunefleet.space import config_hash
from tunefleet.text.output import finished_count
from tunefleet.text.output import trial_counts as trial_counts_text

FAULTY = {"duration": 0.005, "invalid_rate": 0.15, "seed": 3}


def drive(
    db_url: str, s: CoordinatorSettings, tmp_path: Path, workers: int = 2
) -> tuple[RunResult, dict[str, int]]:
    """Run the coordinator while ``workers`` real workers serve; return its result and the
    run's trial states as they were when it returned (a worker stopping afterwards gives its
    prefetched claims back to the queue)."""
    with fleet(db_url, workers, tmp_path / "logs") as procs:
        try:
            result = Coordinator(s, db_url).run()
        except BaseException:
            print(logs(procs))
            raise
        from tunefleet.db.engine import connect

        with connect(db_url) as conn:
            return result, trial_counts(conn, result.run_id)


def test_run_converges_to_the_known_optimum(db_url, db, tmp_path):
    seen: list[Progress] = []
    invalid = first_invalid(FAULTY)
    s = settings(
        problem_args=FAULTY,
        target_gflops=OPTIMUM_GFLOPS * 0.9999,
        max_trials=512,
        seed_configs=[invalid],
    )
    with fleet(db_url, 3, tmp_path) as procs:
        result = Coordinator(s, db_url).run(progress_callback=seen.append)
        # Read while the workers still run: stopping, they give prefetched claims back.
        counts = trial_counts(db, result.run_id)
    assert result.stop_reason == "target_gflops", (result, logs(procs))
    assert result.state == "finished"
    assert result.best_config == OPTIMUM
    # The invalid seed was learned as an outcome; nothing was measured twice.
    assert result.failed >= 1
    row = db.execute(
        "SELECT state, source FROM tunefleet.trial WHERE run_id = %s AND config_hash = %s",
        (result.run_id, config_hash(invalid)),
    ).fetchone()
    assert row == {"state": "invalid", "source": "seed"}
    assert measured_twice(db) == []
    run = db.execute("SELECT * FROM tunefleet.run WHERE id = %s", (result.run_id,)).fetchone()
    assert (run["state"], run["stop_reason"]) == ("finished", "target_gflops")
    assert run["coordinator_id"] is None and run["finished_at"] is not None
    assert counts.get("pending", 0) == 0
    # The queue followed the live workers: 2 x 3 heartbeating workers (plus what they finish
    # during one poll, which a run that may end at its first outcomes need not show: see the
    # prefetch test below).
    assert max(p.queue_target - p.queue_slack for p in seen) == 6
    assert {w["capacity"] for w in db.execute("SELECT capacity FROM tunefleet.worker")} == {2}
    best = db.execute(
        "SELECT config FROM tunefleet.best_per_run WHERE run_id = %s", (result.run_id,)
    ).fetchone()
    assert best["config"] == OPTIMUM
    # Trial timeouts: the worker default until a result exists, then the rule's floor (the
    # synthetic kernel takes milliseconds).
    timeouts = db.execute(
        "SELECT timeout_s FROM tunefleet.trial WHERE run_id = %s AND source = 'search' ORDER BY id",
        (result.run_id,),
    ).fetchall()
    assert timeouts[0]["timeout_s"] is None
    assert timeouts[-1]["timeout_s"] == pytest.approx(10.0)


def done_configs(db: Any, run_id: int) -> list[dict[str, Any]]:
    """The configurations the run's search measured, in the order it queued them."""
    rows = db.execute(
        """
        SELECT config FROM tunefleet.trial
         WHERE run_id = %s AND state = 'done' AND purpose = 'search' ORDER BY id
        """,
        (run_id,),
    ).fetchall()
    return [r["config"] for r in rows]


def test_the_queue_covers_what_prefetching_workers_hold(db_url, db, tmp_path):
    """Workers started with --prefetch 4 hold up to 5 trials each: the coordinator keeps 2 x 5
    queued, not the 2 x 2 of its depth factor, so their prefetch has something to claim."""
    seen: list[Progress] = []
    s = settings(problem_args={"duration": 0.02}, max_trials=60)
    with fleet(db_url, 2, tmp_path, prefetch=4) as procs:
        result = Coordinator(s, db_url).run(progress_callback=seen.append)
    assert result.stop_reason == "max_trials", (result, logs(procs))
    rows = db.execute("SELECT capacity FROM tunefleet.worker").fetchall()
    assert [r["capacity"] for r in rows] == [5, 5]
    assert max(p.queue_target - p.queue_slack for p in seen) == 10
    # While trials finish, the queue also covers what the fleet finishes during one poll: a
    # snapshot follows every fetch that brought outcomes, and 60 trials take several fetches
    # (the queue holds far fewer), so some snapshot before the end has the slack.
    assert any(p.queue_slack >= 1 for p in seen if 0 < p.finished < 60), seen
    assert measured_twice(db) == []


def test_a_coordinator_slower_than_its_rate_window_keeps_the_poll_slack(
    db_url, db, tmp_path, monkeypatch
):
    """Telling the search can take longer than the window over which the coordinator counts
    what the fleet finishes (a loaded machine): the slack is the rate as of the poll that
    counted the outcomes, so it does not vanish exactly when the coordinator is slow."""
    from tunefleet.coordinator import engine, rules
    from tunefleet.coordinator.tuner import Tuner

    window = 0.3
    monkeypatch.setattr(engine, "Rate", lambda: rules.Rate(span_s=window))
    tell = Tuner.tell_many

    def slow_tell(self: Tuner, outcomes: Any) -> None:
        time.sleep(2 * window)  # the search's bookkeeping, on a machine short of CPU
        tell(self, outcomes)

    monkeypatch.setattr(Tuner, "tell_many", slow_tell)
    seen: list[Progress] = []
    s = settings(problem_args={"duration": 0.02}, max_trials=24)
    with fleet(db_url, 2, tmp_path) as procs:
        result = Coordinator(s, db_url).run(progress_callback=seen.append)
    assert result.stop_reason == "max_trials", (result, logs(procs))
    # The snapshots of the polls that brought outcomes (the count went up).
    after_outcomes = [p for prev, p in itertools.pairwise(seen) if prev.finished < p.finished < 24]
    assert after_outcomes, seen
    assert all(p.queue_slack >= 1 for p in after_outcomes), seen


def test_cache_answers_measured_configurations_without_the_queue(db_url, db, tmp_path):
    target = settings(target_gflops=OPTIMUM_GFLOPS * 0.9999, max_trials=512)
    with fleet(db_url, 2, tmp_path) as procs:
        first = Coordinator(target, db_url).run()
        # A second search meets measured configurations: the cache answers them. It reaches
        # the target through the optimum the first run measured, never measuring it again.
        second = Coordinator(target, db_url).run()
    assert first.stop_reason == second.stop_reason == "target_gflops", logs(procs)
    assert second.cached > 0
    source = db.execute(
        "SELECT source FROM tunefleet.trial WHERE id = %s", (second.best_trial_id,)
    ).fetchone()
    assert source == {"source": "cache"}
    assert measured_twice(db) == []

    # Seeds measured before, and no worker at all: answered from the database, the run
    # finishes on its trial budget.
    measured = done_configs(db, first.run_id)[:3]
    third = Coordinator(settings(max_trials=3, seed_configs=measured), db_url).run()
    assert (third.state, third.stop_reason, third.trials, third.cached) == (
        "finished",
        "max_trials",
        3,
        3,
    )
    rows = db.execute(
        """
        SELECT t.state, t.source, t.attempt, t.lease_owner, t.reported, r.median_s,
               m.median_s AS original
          FROM tunefleet.results r
          JOIN tunefleet.trial t ON t.id = r.trial_id
          JOIN tunefleet.measurement m ON m.config_hash = t.config_hash AND m.run_id = %s
          -- the search's measurement: a seed among the first run's best was measured again
          -- by its confirmation, and the cache answers with the earliest
          JOIN tunefleet.trial mt ON mt.id = m.trial_id AND mt.purpose = 'search'
         WHERE r.run_id = %s
        """,
        (first.run_id, third.run_id),
    ).fetchall()
    assert len(rows) == 3
    for row in rows:
        assert (row["state"], row["source"], row["attempt"], row["lease_owner"]) == (
            "done",
            "cache",
            0,
            None,
        )
        assert row["reported"] and row["median_s"] == row["original"]
    progress = db.execute(
        "SELECT cached, done FROM tunefleet.run_progress WHERE run_id = %s", (third.run_id,)
    ).fetchone()
    assert progress == {"cached": 3, "done": 3}

    # Another protocol is another cache key: the same seed goes to the queue.
    other = settings(max_trials=1, seed_configs=measured[:1], protocol={"min_launches": 2})
    assert trial_counts(db, create_run(other, db_url)) == {"pending": 1}


def test_cache_answers_configurations_a_worker_found_invalid(db_url, db, tmp_path):
    """An invalid verdict is a property of the configuration under the cache key: a later run
    records it ``invalid`` from the cache (seed or search), and no worker builds it again."""
    invalid = first_invalid(FAULTY)
    first_settings = settings(problem_args=FAULTY, max_trials=1, seed_configs=[invalid])
    with fleet(db_url, 1, tmp_path) as procs:
        first = Coordinator(first_settings, db_url).run()
    assert trial_counts(db, first.run_id) == {"invalid": 1}, logs(procs)

    # No worker at all: the seed is answered from the first run's verdict.
    second = Coordinator(first_settings, db_url).run()
    assert (second.state, second.stop_reason, second.cached) == ("finished", "max_trials", 1)
    row = db.execute(
        "SELECT state, source, attempt, reported, error FROM tunefleet.trial"
        " WHERE run_id = %s AND config_hash = %s",
        (second.run_id, config_hash(invalid)),
    ).fetchone()
    assert (row["state"], row["source"], row["attempt"], row["reported"]) == (
        "invalid",
        "cache",
        0,
        True,
    )
    assert row["error"].startswith(f"invalid in run {first.run_id}: ")
    attempts = db.execute(
        "SELECT count(*) AS n FROM tunefleet.attempt a JOIN tunefleet.trial t"
        " ON t.id = a.trial_id WHERE t.run_id = %s",
        (second.run_id,),
    ).fetchone()
    assert attempts["n"] == 0

    # Another protocol is another cache key: the verdict does not carry over.
    other = settings(
        problem_args=FAULTY, max_trials=1, seed_configs=[invalid], protocol={"min_launches": 2}
    )
    assert trial_counts(db, create_run(other, db_url)) == {"pending": 1}


@pytest.mark.parametrize(
    ("budget", "reason"),
    [
        ({"max_trials": 12}, "max_trials"),
        # Since the run was created: the search's start-up and its first fill of the queue
        # count, and took more than 5 s on a machine whose every core was busy twice over.
        ({"max_seconds": 15.0}, "max_seconds"),
        ({"target_gflops": OPTIMUM_GFLOPS / 1.6}, "target_gflops"),
        ({"patience": 4}, "patience"),
    ],
)
def test_each_stop_rule_ends_the_run_and_cancels_pending_trials(
    db_url, db, tmp_path, budget, reason
):
    # A queue deeper than one worker takes, so a stop finds pending trials to cancel.
    s = settings(**budget, min_depth=12, problem_args={"duration": 0.02})
    if reason == "max_seconds":
        for _ in range(5):  # live, but never claiming: every trial stays pending
            register_worker(db)
        result = Coordinator(s, db_url).run()
        counts = trial_counts(db, result.run_id)
    else:
        result, counts = drive(db_url, s, tmp_path, workers=1)
    assert (result.state, result.stop_reason) == ("finished", reason)
    assert counts.get("pending", 0) == 0
    assert counts.get("cancelled", 0) == result.cancelled
    run = db.execute("SELECT * FROM tunefleet.run WHERE id = %s", (result.run_id,)).fetchone()
    assert (run["state"], run["stop_reason"]) == ("finished", reason)
    finished = sum(counts.get(s, 0) for s in ("done", "invalid", "failed", "timed_out"))
    if reason == "max_trials":
        # The budget is never overshot, so nothing was left to cancel.
        assert finished == 12 and result.trials == 12 and result.cancelled == 0
    # Whether a target or patience stop still finds trials pending depends on how many the
    # worker had claimed by then; the stop with nobody claiming cancels all of them.
    if reason == "max_seconds":
        assert finished == 0 and result.cancelled == 12
    if reason == "target_gflops":
        assert result.best_gflops >= OPTIMUM_GFLOPS / 1.6
    if reason == "patience":
        # The search's outcomes in the order they finished (confirmations re-measure the
        # best after the stop and are no part of the search). A trial still running when
        # the rule fired lands after it and may improve, and so may the queued trials the
        # worker claims before the stop's cancellation reaches them. So the rule is checked
        # where it fired: some window of four, after at least one earlier outcome, beat
        # nothing before it.
        seen = db.execute(
            """
            SELECT m.median_s FROM tunefleet.trial t
              LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
             WHERE t.run_id = %s AND t.reported AND t.purpose = 'search'
             ORDER BY t.finished_at, t.id
            """,
            (result.run_id,),
        ).fetchall()
        times = [r["median_s"] if r["median_s"] is not None else float("inf") for r in seen]
        fired = [
            k for k in range(5, len(times) + 1) if min(times[k - 4 : k]) >= min(times[: k - 4])
        ]
        assert fired, times


def test_a_second_coordinator_on_a_driven_run_is_refused(db_url, db):
    run_id = create_run(settings(), db_url)
    first = Coordinator(settings(), db_url)
    outcome: list[RunResult] = []
    thread = threading.Thread(target=lambda: outcome.append(first.run(run_id)))
    thread.start()
    try:
        wait_until(
            lambda: db.execute(
                "SELECT coordinator_id FROM tunefleet.run WHERE id = %s", (run_id,)
            ).fetchone()["coordinator_id"],
            what="the first coordinator to take the run",
        )
        with pytest.raises(RunError, match=f"run {run_id} is already driven by coordinator"):
            Coordinator(settings(resume=run_id), db_url).run()
    finally:
        first.request_stop()
        thread.join(30)
    # The refused one changed nothing; the user stop cancels the queue and allows a resume.
    assert outcome[0].state == "stopped" and outcome[0].stop_reason == "user"
    run = db.execute("SELECT * FROM tunefleet.run WHERE id = %s", (run_id,)).fetchone()
    assert (run["state"], run["stop_reason"]) == ("stopped", "user")
    assert trial_counts(db, run_id).get("pending", 0) == 0


def test_resume_after_a_stop_continues_without_measuring_anything_twice(db_url, db, tmp_path):
    # A queue deeper than the workers take (they prefetch), so the stop has pending trials
    # to cancel: the workers are held (SIGSTOP) from the moment 10 are done until the stop
    # has cancelled what was pending. Without that, a loaded machine let the workers drain
    # the queue before the stop landed (nothing to cancel).
    s = settings(min_depth=30, problem_args={"duration": 0.02})
    run_id = create_run(s, db_url)
    first = Coordinator(s, db_url)

    def stop_after_some() -> None:
        try:
            wait_until(lambda: trial_counts(db, run_id).get("done", 0) >= 10, what="10 done")
            for w in procs:
                os.kill(w.pid, signal.SIGSTOP)
            wait_until(
                lambda: trial_counts(db, run_id).get("pending", 0) > 0, what="a pending trial"
            )
            first.request_stop()
            wait_until(
                lambda: trial_counts(db, run_id).get("pending", 0) == 0,
                what="the stop to cancel the pending trials",
            )
        finally:
            for w in procs:
                os.kill(w.pid, signal.SIGCONT)
            first.request_stop()  # also when a wait above failed: the run must end

    # Leases far longer than the workers are held: on a loaded machine the hold lasted past
    # the 5 s default, the held trials' leases expired and were claimed a second time.
    with fleet(db_url, 2, tmp_path, lease_s=120) as procs:
        stopper = threading.Thread(target=stop_after_some)
        stopper.start()
        stopped = first.run(run_id)
        stopper.join()
        assert stopped.state == "stopped" and stopped.cancelled > 0, logs(procs)
        budget = stopped.trials + 15
        resumed = Coordinator(settings(resume=run_id, max_trials=budget), db_url).run()
    assert (resumed.state, resumed.stop_reason) == ("finished", "max_trials")
    assert resumed.trials == budget
    assert measured_twice(db) == []
    counts = trial_counts(db, run_id)
    assert counts.get("pending", 0) == counts.get("running", 0) == 0


def test_warm_start_seeds_the_best_configurations_of_another_class(db_url, db, tmp_path):
    first, _ = drive(db_url, settings(max_trials=20), tmp_path)
    measured = {
        config_hash(r["config"]): r["median_s"]
        for r in db.execute(
            "SELECT config, median_s FROM tunefleet.results WHERE run_id = %s AND state = 'done'",
            (first.run_id,),
        ).fetchall()
    }
    run_id = create_run(settings(device_class="other-gpu", warm_start_from="any"), db_url)
    seeds = db.execute(
        "SELECT config, state, source, device_class FROM tunefleet.trial WHERE run_id = %s",
        (run_id,),
    ).fetchall()
    # The five fastest (ties may be broken either way, so compare their times).
    assert (
        sorted(measured[config_hash(s["config"])] for s in seeds) == sorted(measured.values())[:5]
    )
    assert {(s["state"], s["source"], s["device_class"]) for s in seeds} == {
        ("pending", "seed", "other-gpu")
    }
    with pytest.raises(
        UsageError, match=r"no measurements of .*\(classes with results: any, host-cpu\)"
    ):
        create_run(settings(warm_start_from="nvidia-h100"), db_url)


def test_a_second_search_is_answered_by_measurements_and_invalid_verdicts(db_url, db, tmp_path):
    first, _ = drive(db_url, settings(problem=TINY_ONE_INVALID), tmp_path, workers=1)
    assert (first.stop_reason, first.trials) == ("space_exhausted", 6)
    assert trial_counts(db, first.run_id) == {"done": 5, "invalid": 1}
    # No worker: every configuration the search proposes is answered from the first run.
    second = Coordinator(settings(problem=TINY_ONE_INVALID), db_url).run()
    assert (second.state, second.stop_reason, second.cached) == ("finished", "space_exhausted", 6)
    assert trial_counts(db, second.run_id) == {"done": 5, "invalid": 1}
    assert second.best_config == first.best_config
    assert measured_twice(db) == []


def test_a_small_space_is_evaluated_completely_once_and_the_run_ends(db_url, db, tmp_path):
    result, _ = drive(db_url, settings(problem=TINY), tmp_path)
    assert (result.state, result.stop_reason, result.trials) == ("finished", "space_exhausted", 6)
    assert result.best_config == {"unroll": 4, "vector": True}
    assert measured_twice(db) == []


def test_configurations_the_problem_rules_out_never_reach_a_worker(db_url, db, tmp_path):
    illegal = {**OPTIMUM, "tile": 128}
    # Uniform proposals: the default search clusters near the optimum's tile of 16 and may
    # never try 64 or 128 in 40 trials; PureRandom tries them with odds 1 in 4 each.
    s = settings(problem=RULED, max_trials=40, techniques=["PureRandom"], search_seed=11)
    with pytest.raises(UsageError, match="seed configuration 1: tile=128 needs too much local"):
        create_run(settings(problem=RULED, seed_configs=[illegal]), db_url)
    result, _ = drive(db_url, s, tmp_path)
    assert result.trials == 40
    rows = db.execute(
        """
        SELECT t.config, t.state, t.attempt, t.error,
               (SELECT count(*) FROM tunefleet.attempt a WHERE a.trial_id = t.id) AS claims
          FROM tunefleet.trial t WHERE t.run_id = %s
        """,
        (result.run_id,),
    ).fetchall()
    ruled_out = [r for r in rows if r["config"]["tile"] >= 64]
    assert ruled_out, "the search proposed no large tile in 40 trials"
    for row in ruled_out:
        assert (row["state"], row["attempt"], row["claims"]) == ("invalid", 0, 0)
        assert "needs too much local memory" in row["error"]
    assert all(r["claims"] == 1 for r in rows if r["config"]["tile"] < 64)
    # What the rules rejected cost no evaluation: the 40 of the budget were all measured.
    measured = [r for r in rows if r["claims"] == 1 and r["state"] in ("done", "invalid")]
    assert len(measured) >= 40
    # ...and every report counts the budget the same way, the rejected ones apart (a
    # 20-trial run once read "21/20 finished" with one of them counted in).
    progress = report.run_progress(db, result.run_id)
    assert progress is not None and progress["ruled_out"] == len(ruled_out)
    assert finished_count(progress) == result.trials
    assert trial_counts_text(progress).startswith(f"{result.trials}/40 finished ("), progress
    assert trial_counts_text(progress).endswith(f", {len(ruled_out)} ruled out by the rules")
    summary = dashboard_queries.run_summary(db, result.run_id)
    assert summary is not None and summary["ruled_out"] == len(ruled_out)
    (api_run,) = [r for r in tunefleet.runs(db=db_url) if r.run_id == result.run_id]
    assert api_run.ruled_out == len(ruled_out)
    # Plain SQL says the same: results flags each rejected row, run_progress counts them and
    # leaves them out of its evaluations per minute (finished, so its clock has stopped).
    flagged = db.execute(
        "SELECT count(*) FILTER (WHERE ruled_out) AS n, count(*) AS finished "
        "FROM tunefleet.results WHERE run_id = %s",
        (result.run_id,),
    ).fetchone()
    assert flagged["n"] == len(ruled_out)
    view = db.execute(
        "SELECT ruled_out, invalid, evaluations_per_minute, "
        "greatest(extract(epoch FROM elapsed) / 60.0, 1e-9) AS minutes "
        "FROM tunefleet.run_progress WHERE run_id = %s",
        (result.run_id,),
    ).fetchone()
    assert view["ruled_out"] == len(ruled_out) and view["invalid"] >= len(ruled_out)
    assert float(view["evaluations_per_minute"]) == pytest.approx(
        (flagged["finished"] - len(ruled_out)) / float(view["minutes"]), rel=1e-9
    )


@pytest.mark.parametrize(
    ("problem", "registered"),
    [(FOOTED, True), (FOOTED, False), (BROKEN_FOOTPRINT, True)],
    ids=["limits known", "no device yet", "the footprint raises"],
)
def test_configurations_over_the_devices_limits_never_reach_a_worker(
    db_url, db, caplog, problem, registered
):
    """A problem that states each configuration's footprint (work-group, local memory) gets
    the ones its run's devices cannot launch ruled out by the coordinator, like those its
    rules reject: ``invalid`` at once, never claimed, no evaluation of the budget. The limits
    are the loosest any device of the class registered (a worker registers what it says of
    its device: one cannot make the coordinator rule out more); before any device of the class
    has registered, nothing is ruled out for them. A footprint that raises (a user problem's
    bug) is logged once and leaves every configuration to the workers."""
    gpu = DeviceInfo(
        platform="P",
        vendor="V",
        name="Footed GPU",
        driver_version="1",
        local_mem_bytes=8192,
        max_work_group_size=64,
        max_work_item_sizes=(64, 64, 64),
    )
    if registered:  # as workers register their devices (what each says of its own)
        queue.register_device(db, gpu)
        # The same model on a newer driver, with more local memory: 16 KiB is the limit.
        queue.register_device(
            db, dataclasses.replace(gpu, driver_version="2", local_mem_bytes=16384)
        )
    register_worker(db, gpu.device_class)  # serves the run (never claims): the queue fills
    s = settings(
        problem=problem,
        device_class=gpu.device_class,
        min_depth=30,
        techniques=["PureRandom"],
        search_seed=5,
        confirm=0,
    )
    run_id = create_run(s, db_url)
    coordinator = Coordinator(s, db_url)
    thread = threading.Thread(target=coordinator.run, args=(run_id,))
    thread.start()
    try:
        wait_until(
            lambda: trial_counts(db, run_id).get("pending", 0) >= 30,
            what="the queue to fill with 30 pending trials",
        )
    finally:
        coordinator.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    rows = db.execute(
        "SELECT config, state, attempt, error FROM tunefleet.trial WHERE run_id = %s",
        (run_id,),
    ).fetchall()
    over = [r for r in rows if r["config"]["tile"] >= 32]
    fits = [r for r in rows if r["config"]["tile"] <= 16]
    assert over and fits, "PureRandom proposed tiles of one side only"
    assert {r["state"] for r in fits} == {"cancelled"}  # the stop cancelled the pending ones
    unchecked = [
        r.getMessage() for r in caplog.records if "go to the workers unchecked" in r.getMessage()
    ]
    if problem == BROKEN_FOOTPRINT:
        assert len(unchecked) == 1 and "KeyError" in unchecked[0], unchecked
    else:
        assert unchecked == []
    if not registered or problem == BROKEN_FOOTPRINT:
        assert {r["state"] for r in over} == {"cancelled"}
        return
    for row in over:
        assert (row["state"], row["attempt"]) == ("invalid", 0), row
        tile = row["config"]["tile"]
        if tile == 128:
            why = "work-group of 128 work-items (128, 1) exceeds the device's maximum of 64"
        else:
            why = f"needs {1024 * tile} bytes of local memory; the device has 16384"
        assert row["error"] == f"{why} ({gpu.device_class}, ruled out by the coordinator)"
    progress = report.run_progress(db, run_id)
    assert progress is not None and progress["ruled_out"] == len(over)
    assert finished_count(progress) == 0  # ruled out, not evaluated


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"problem": "no-such-problem"}, ProblemError, "unknown problem 'no-such-problem'"),
        ({"problem_args": {"duration": "long"}}, ProblemError, "duration='long' must be"),
        ({"problem_args": {"m": 3}}, ProblemError, r"unknown argument\(s\) \['m'\]"),
        ({"seed_configs": [{"tile": 16}]}, UsageError, "seed configuration 1: .*missing"),
        ({"seed_configs": [{**OPTIMUM, "tile": 3}]}, UsageError, "tile=3 is outside the space"),
        ({"protocol": {"launches": 3}}, UsageError, "unknown measurement protocol"),
        ({"protocol": {"min_launches": 0}}, ProblemError, "bad protocol"),
    ],
)
def test_bad_input_is_refused_before_anything_is_stored(db_url, db, kw, error, match):
    with pytest.raises(error, match=match):
        create_run(settings(**kw), db_url)
    assert db.execute("SELECT count(*) AS n FROM tunefleet.run").fetchone()["n"] == 0


def test_resuming_a_run_that_does_not_exist_names_it(db_url):
    with pytest.raises(RunError, match="run 42 does not exist"):
        Coordinator(settings(resume=42), db_url).run()


def test_opencl_problems_need_a_device_class_unless_the_live_workers_agree(db_url, db):
    with pytest.raises(UsageError, match=r"--device-class .*no live workers yet"):
        create_run(settings(problem=KERNEL), db_url)
    register_worker(db, "nvidia-h200")
    register_worker(db, "amd-mi300", age_s=3600)  # gone quiet: not live
    run_id = create_run(settings(problem=KERNEL), db_url)
    assert db.execute(
        "SELECT device_class FROM tunefleet.run WHERE id = %s", (run_id,)
    ).fetchone() == {"device_class": "nvidia-h200"}
    register_worker(db, "amd-mi300")
    with pytest.raises(UsageError, match="live workers serve amd-mi300, nvidia-h200"):
        create_run(settings(problem=KERNEL), db_url)


class _HorizonProbe(UniformDraws):
    """Uniform draws that note the horizon the engine gave each proposal."""

    seen: list[Horizon | None] = []

    def desired_configuration(self) -> Any:
        _HorizonProbe.seen.append(self.driver.horizon)
        return super().desired_configuration()


register(_HorizonProbe(name="HorizonProbe"))


@pytest.mark.parametrize("budget", [{"max_trials": 24}, {"max_seconds": 6.0, "confirm": 0}])
def test_the_search_is_told_how_much_of_its_budget_is_left(db_url, db, tmp_path, budget):
    """Every proposal knows its horizon (ModelSearchFinish sweeps near the end by it): under
    a trial budget exactly what is left of it, counting the trials in flight as spent; under
    a time budget none until a worker finished a trial (no pace to estimate from), then an
    estimate that shrinks as the search's time runs out (no confirmation here: with one,
    the search's time ends that much sooner)."""
    _HorizonProbe.seen.clear()
    s = settings(**budget, techniques=("HorizonProbe",), problem_args={"duration": 0.02})
    result, _ = drive(db_url, s, tmp_path, workers=2)
    seen = _HorizonProbe.seen
    assert result.state == "finished" and len(seen) >= result.trials > 0
    known = [h for h in seen if h is not None]
    if "max_trials" in budget:
        assert len(known) == len(seen)
        assert all(h.spent + h.left == 24 for h in known)
        lefts = [h.left for h in known]
        assert lefts[0] == 24 and lefts == sorted(lefts, reverse=True)
    else:
        assert seen[0] is None  # the first proposals: no trial finished yet
        assert len(known) >= 10 and all(h.left >= 0 for h in known)
        # The last proposal came with less than half the most it was ever told was left.
        assert known[-1].left < 0.5 * max(h.left for h in known)
