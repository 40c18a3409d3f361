"""Queue depth, trial timeouts and stop rules as plain arithmetic."""

from __future__ import annotations

import pytest

from tunefleet.coordinator.rules import (
    Budget,
    Rate,
    RunStats,
    poll_slack,
    queue_target,
    stop_reason,
    trial_timeout,
)

PROTOCOL = {"warmup": 2, "max_launches": 200}


@pytest.mark.parametrize(
    ("live", "factor", "minimum", "left", "expected"),
    [
        (0, 2.0, 1, None, 1),  # nobody yet: one trial waits for the first worker
        (4, 2.0, 1, None, 8),
        (100, 2.0, 1, None, 200),
        (3, 1.5, 1, None, 5),  # rounds up
        (0, 2.0, 6, None, 6),
        (50, 2.0, 1, 7, 7),  # never beyond the trial budget
        (50, 2.0, 1, 0, 0),
    ],
)
def test_queue_target_follows_the_live_workers(live, factor, minimum, left, expected):
    assert queue_target(live, factor, minimum, left) == expected


def test_queue_target_covers_what_prefetching_workers_hold():
    # Two workers with --prefetch 8 hold up to 9 trials each.
    assert queue_target(2, 2.0, 1, None, capacity=18) == 18
    assert queue_target(2, 2.0, 1, None, capacity=4) == 4  # the defaults: factor 2 decides
    assert queue_target(2, 2.0, 1, 10, capacity=18) == 10  # still within the trial budget


def test_the_queue_also_covers_what_the_fleet_finishes_during_one_poll():
    # 40 trials a second and a 0.2 s poll: 8 more queued, so no worker finds it empty.
    assert poll_slack(40.0, 0.2) == 8
    assert poll_slack(0.5, 0.2) == 1
    assert poll_slack(0.0, 0.2) == 0 and poll_slack(float("inf"), 0.2) == 0
    assert queue_target(4, 2.0, 1, None, capacity=10, rate=40.0, poll_s=0.2) == 18
    assert queue_target(4, 2.0, 1, 12, capacity=10, rate=40.0, poll_s=0.2) == 12  # budget


def test_rate_is_outcomes_per_second_over_a_sliding_window():
    r = Rate(span_s=10.0)
    assert r.per_second(0.0) == 0.0
    r.add(0.0, 5)
    assert r.per_second(0.5) == 5.0  # a first burst counts over one second, not 0.5
    r.add(4.0, 15)
    assert r.per_second(4.0) == 5.0  # 20 outcomes over 4 s
    assert r.per_second(12.0) == pytest.approx(15 / 8)  # the first batch left the window
    assert r.per_second(30.0) == 0.0


def test_trial_timeout_is_the_default_until_a_result_then_scales_with_the_best_time():
    assert trial_timeout(None, None, PROTOCOL, 10.0, 600.0) is None
    assert trial_timeout(1e-3, 0.5, PROTOCOL, 10.0, 600.0) == 10.0  # floor
    # 20 x 0.01 s x 202 launches + 3 x 2 s of code generation
    assert trial_timeout(0.01, 2.0, PROTOCOL, 10.0, 600.0) == pytest.approx(46.4)
    assert trial_timeout(1.0, 2.0, PROTOCOL, 10.0, 600.0) == 600.0  # ceiling


def stats_of(times, gflops=None):
    stats = RunStats()
    for i, t in enumerate(times):
        stats.record(f"h{i}", {"i": i}, t, trial_id=i, gflops=gflops and gflops[i])
    return stats


def test_run_stats_track_best_failures_and_the_streak_without_improvement():
    stats = stats_of([3.0, None, 2.0, 2.5, None, 2.0])
    assert (stats.finished, stats.failed, stats.best_seconds) == (6, 2, 2.0)
    assert stats.best_trial_id == 2 and stats.best_config == {"i": 2}
    assert stats.since_improvement == 3  # an equal time is no improvement
    assert not stats.record("h0", {"i": 0}, 0.1)  # a repeat of a known outcome is ignored
    assert stats.finished == 6


@pytest.mark.parametrize(
    ("budget", "elapsed", "expected"),
    [
        (Budget(), 1e9, None),
        (Budget(max_trials=5), 0.0, "max_trials"),
        (Budget(max_trials=6), 0.0, None),
        (Budget(max_seconds=10.0), 10.0, "max_seconds"),
        (Budget(max_seconds=10.0), 9.9, None),
        (Budget(target_gflops=4.0), 0.0, "target_gflops"),
        (Budget(target_gflops=4.1), 0.0, None),
        (Budget(patience=3), 0.0, "patience"),
        (Budget(patience=4), 0.0, None),
    ],
)
def test_each_stop_rule(budget, elapsed, expected):
    stats = stats_of([4.0, 1.0, 2.0, 3.0, 1.5], gflops=[1.0, 4.0, 2.0, 1.0, 2.0])
    assert stop_reason(budget, stats, elapsed, space_size=100, in_flight=3) == expected


def test_an_exhausted_space_stops_once_nothing_is_in_flight():
    stats = stats_of([1.0, 2.0])
    assert stop_reason(Budget(), stats, 0.0, space_size=2, in_flight=1) is None
    assert stop_reason(Budget(), stats, 0.0, space_size=2, in_flight=0) == "space_exhausted"
