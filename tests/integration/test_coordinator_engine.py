"""The coordinator engine against a real PostgreSQL, with in-test queue clients as workers."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from coordinator_support import (
    ANALYTIC,
    INVALID,
    OPTIMUM,
    OPTIMUM_GFLOPS,
    FakeWorker,
    analytic_seconds,
    wait_until,
)

from coordinator.engine import Coordinator, Progress, RunResult, create_run
from coordinator.settings import CoordinatorSettings
from tunefleet.errors import ProblemError, RunError, UsageError
from tunefleet.queries import search as q
from tunefleet.space import config_hash

FAST = {"poll_s": 0.01, "min_depth": 2}


def settings(**kw: Any) -> CoordinatorSettings:
    return CoordinatorSettings.build(**{"problem": ANALYTIC, **FAST, **kw})


def trial_counts(db: Any, run_id: int) -> Counter[str]:
    rows = db.execute(
        "SELECT state, count(*) AS n FROM tunefleet.trial WHERE run_id = %s GROUP BY state",
        (run_id,),
    ).fetchall()
    return Counter({r["state"]: r["n"] for r in rows})


def drive(
    db_url: str, s: CoordinatorSettings, workers: int = 3, **worker_kw: Any
) -> tuple[RunResult, list[tuple[int, str]]]:
    evaluated: list[tuple[int, str]] = []
    fleet = [FakeWorker(db_url, evaluated=evaluated, **worker_kw) for _ in range(workers)]
    for w in fleet:
        w.start()
    try:
        result = Coordinator(s, db_url).run()
    finally:
        for w in fleet:
            w.shutdown()
    assert all(w.error is None for w in fleet), [w.error for w in fleet]
    return result, evaluated


def test_run_converges_to_the_known_optimum(db_url, db):
    seen: list[Progress] = []
    evaluated: list[tuple[int, str]] = []
    fleet = [FakeWorker(db_url, evaluated=evaluated, batch=4) for _ in range(4)]
    for w in fleet:
        w.start()
    try:
        s = settings(target_gflops=OPTIMUM_GFLOPS * 0.9999, max_trials=2000, seed_configs=[INVALID])
        result = Coordinator(s, db_url).run(progress_callback=seen.append)
    finally:
        for w in fleet:
            w.shutdown()
    assert result.stop_reason == "target_gflops", result
    assert result.state == "finished"
    assert result.best_config == OPTIMUM
    assert result.best_median_s == pytest.approx(analytic_seconds(OPTIMUM))
    # The invalid seed was learned as an outcome, and nothing was measured twice.
    assert result.failed >= 1
    invalid = db.execute(
        "SELECT state, source FROM tunefleet.trial WHERE run_id = %s AND config_hash = %s",
        (result.run_id, config_hash(INVALID)),
    ).fetchone()
    assert invalid == {"state": "invalid", "source": "seed"}
    assert len(evaluated) == len(set(evaluated))
    run = db.execute("SELECT * FROM tunefleet.run WHERE id = %s", (result.run_id,)).fetchone()
    assert run["state"] == "finished" and run["stop_reason"] == "target_gflops"
    assert run["coordinator_id"] is None and run["finished_at"] is not None
    assert trial_counts(db, result.run_id)["pending"] == 0
    # The queue followed the live workers: 2 x 4 heartbeating workers.
    assert max(p.queue_target for p in seen) == 8
    best = db.execute(
        "SELECT config FROM tunefleet.best_per_run WHERE run_id = %s", (result.run_id,)
    ).fetchone()
    assert best["config"] == OPTIMUM
    # Trial timeouts: the worker default until a result exists, then the rule's floor here
    # (the analytic kernel takes a millisecond).
    timeouts = db.execute(
        "SELECT timeout_s FROM tunefleet.trial WHERE run_id = %s AND source = 'search' ORDER BY id",
        (result.run_id,),
    ).fetchall()
    assert timeouts[0]["timeout_s"] is None
    assert timeouts[-1]["timeout_s"] == pytest.approx(10.0)


def done_configs(db: Any, run_id: int) -> list[dict[str, Any]]:
    rows = db.execute(
        "SELECT config FROM tunefleet.trial WHERE run_id = %s AND state = 'done' ORDER BY id",
        (run_id,),
    ).fetchall()
    return [r["config"] for r in rows]


def test_cache_answers_measured_configurations_without_the_queue(db_url, db):
    first, evaluated = drive(db_url, settings(max_trials=40))
    measured = done_configs(db, first.run_id)
    assert len(measured) >= 3

    # Same problem, arguments, class and protocol, no worker at all: the seeds are answered
    # from the database and the run finishes on its trial budget.
    s = settings(max_trials=3, seed_configs=measured[:3])
    second = Coordinator(s, db_url).run()
    assert (second.state, second.stop_reason, second.trials, second.cached) == (
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
          JOIN tunefleet.measurement m
            ON m.config_hash = t.config_hash AND m.run_id = %s
         WHERE r.run_id = %s
        """,
        (first.run_id, second.run_id),
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
        "SELECT cached, done FROM tunefleet.run_progress WHERE run_id = %s", (second.run_id,)
    ).fetchone()
    assert progress == {"cached": 3, "done": 3}

    # A search that meets measured configurations answers them from the cache too: the
    # optimum found by a first converged run is never measured again.
    target = OPTIMUM_GFLOPS * 0.9999
    third, _ = drive(db_url, settings(target_gflops=target, max_trials=2000))
    fourth, again = drive(db_url, settings(target_gflops=target, max_trials=2000))
    assert fourth.stop_reason == "target_gflops" and fourth.cached > 0
    source = db.execute(
        "SELECT source FROM tunefleet.trial WHERE id = %s", (fourth.best_trial_id,)
    ).fetchone()
    assert source == {"source": "cache"}
    before = {h for run, h in evaluated} | set(
        r["config_hash"]
        for r in db.execute(
            "SELECT config_hash FROM tunefleet.measurement WHERE run_id = %s", (third.run_id,)
        ).fetchall()
    )
    assert not before & {h for run, h in again}

    # Another protocol is another cache key: the same seed goes to the queue.
    fifth = create_run(
        settings(max_trials=1, seed_configs=measured[:1], protocol={"min_launches": 9}), db_url
    )
    assert trial_counts(db, fifth) == {"pending": 1}


def busy_fleet(db_url: str, n: int) -> list[FakeWorker]:
    """Registered, heartbeating-recently workers that never claim: the queue sizes itself
    from them and its trials stay pending."""
    return [FakeWorker(db_url) for _ in range(n)]


@pytest.mark.parametrize(
    ("budget", "reason"),
    [
        ({"max_trials": 12}, "max_trials"),
        ({"max_seconds": 1.0}, "max_seconds"),
        ({"target_gflops": OPTIMUM_GFLOPS / 2.5}, "target_gflops"),
        ({"patience": 4}, "patience"),
    ],
)
def test_each_stop_rule_ends_the_run_and_cancels_pending_trials(db_url, db, budget, reason):
    idle = busy_fleet(db_url, 5) if reason == "max_seconds" else []
    kw: dict[str, Any] = {"min_depth": 12}
    workers = 0 if reason == "max_seconds" else 1
    try:
        result, _ = drive(db_url, settings(**budget, **kw), workers=workers, batch=1, delay_s=0.02)
    finally:
        for w in idle:
            w.shutdown()
    assert (result.state, result.stop_reason) == ("finished", reason)
    counts = trial_counts(db, result.run_id)
    assert counts["pending"] == 0
    assert counts["cancelled"] == result.cancelled
    run = db.execute("SELECT * FROM tunefleet.run WHERE id = %s", (result.run_id,)).fetchone()
    assert (run["state"], run["stop_reason"]) == ("finished", reason)
    finished = sum(counts[s] for s in ("done", "invalid", "failed", "timed_out"))
    if reason == "max_trials":
        # The budget is never overshot, so nothing was left to cancel.
        assert finished == 12 and result.trials == 12 and result.cancelled == 0
    else:
        assert result.cancelled > 0
    if reason == "max_seconds":
        assert finished == 0 and result.cancelled == 12
    if reason == "target_gflops":
        assert result.best_gflops >= OPTIMUM_GFLOPS / 2.5
    if reason == "patience":
        # Among the outcomes the coordinator read (a trial still running at the stop may land
        # later), the last four did not beat the best before them.
        seen = db.execute(
            """
            SELECT m.median_s FROM tunefleet.trial t
              LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
             WHERE t.run_id = %s AND t.reported ORDER BY t.finished_at, t.id
            """,
            (result.run_id,),
        ).fetchall()
        times = [r["median_s"] if r["median_s"] is not None else float("inf") for r in seen]
        assert len(times) >= 5
        assert min(times[-4:]) >= min(times[:-4])


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
    assert trial_counts(db, run_id)["pending"] == 0


def test_resume_after_a_stop_continues_without_measuring_anything_twice(db_url, db):
    evaluated: list[tuple[int, str]] = []
    fleet = [FakeWorker(db_url, evaluated=evaluated, delay_s=0.01) for _ in range(2)]
    for w in fleet:
        w.start()
    try:
        # A queue deeper than the two workers take, so the stop has pending trials to cancel.
        run_id = create_run(settings(min_depth=8), db_url)
        first = Coordinator(settings(min_depth=8), db_url)

        def stop_after_some() -> None:
            wait_until(lambda: trial_counts(db, run_id)["done"] >= 15, what="15 done")
            first.request_stop()

        stopper = threading.Thread(target=stop_after_some)
        stopper.start()
        stopped = first.run(run_id)
        stopper.join()
        assert stopped.state == "stopped" and stopped.cancelled > 0
        budget = stopped.trials + 20
        resumed = Coordinator(settings(resume=run_id, max_trials=budget), db_url).run()
    finally:
        for w in fleet:
            w.shutdown()
    assert (resumed.state, resumed.stop_reason) == ("finished", "max_trials")
    assert resumed.trials == budget
    assert len(evaluated) == len(set(evaluated))
    counts = trial_counts(db, run_id)
    assert counts["pending"] == counts["running"] == 0


def test_warm_start_seeds_the_best_configurations_of_another_class(db_url, db):
    first, _ = drive(db_url, settings(max_trials=30))
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
    with pytest.raises(UsageError, match=r"no measurements of .*\(classes with results: any\)"):
        create_run(settings(warm_start_from="nvidia-h100"), db_url)


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"problem": "no-such-problem"}, ProblemError, "unknown problem 'no-such-problem'"),
        ({"problem_args": {"n": "big"}}, ProblemError, "n='big' must be a positive integer"),
        ({"problem_args": {"m": 3}}, ProblemError, "unknown argument 'm'"),
        ({"seed_configs": [{"x": 99}]}, UsageError, "seed configuration 1: .*missing"),
        ({"seed_configs": [{**OPTIMUM, "x": 99}]}, UsageError, "x=99 is outside the space"),
        ({"protocol": {"launches": 3}}, UsageError, "unknown measurement protocol"),
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
    spec = ANALYTIC.replace(":Analytic", ":Kernel")
    with pytest.raises(UsageError, match=r"--device-class .*no live workers yet"):
        create_run(settings(problem=spec), db_url)
    workers = [FakeWorker(db_url, device_class="nvidia-h200")]
    run_id = create_run(settings(problem=spec), db_url)
    assert db.execute(
        "SELECT device_class FROM tunefleet.run WHERE id = %s", (run_id,)
    ).fetchone() == {"device_class": "nvidia-h200"}
    workers.append(FakeWorker(db_url, device_class="amd-mi300"))
    with pytest.raises(UsageError, match="live workers serve amd-mi300, nvidia-h200"):
        create_run(settings(problem=spec), db_url)
    for w in workers:
        w.shutdown()


def test_progress_counts_are_those_in_the_database(db_url, db):
    seen: list[Progress] = []
    evaluated: list[tuple[int, str]] = []
    with FakeWorker(db_url, evaluated=evaluated):
        result = Coordinator(settings(max_trials=10), db_url).run(progress_callback=seen.append)
    last = seen[-1]
    assert (last.run_id, last.finished, last.in_flight) == (result.run_id, 10, 0)
    assert len(evaluated) == 10
    assert Counter(q.fetch_unreported(db, result.run_id)) == Counter()


def test_a_small_space_is_evaluated_completely_once_and_the_run_ends(db_url, db):
    s = settings(problem=ANALYTIC.replace(":Analytic", ":Tiny"))
    result, evaluated = drive(db_url, s, workers=3)
    assert (result.state, result.stop_reason, result.trials) == ("finished", "space_exhausted", 6)
    assert len(evaluated) == len(set(evaluated)) == 6
    assert result.best_config == {"x": 11, "flag": True}
