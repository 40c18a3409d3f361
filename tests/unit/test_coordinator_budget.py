"""The time budget's arithmetic (coordinator.budget): the pace, the confirmation's reserve,
what fits, the confirmation's wait for another worker, the line that says what was cut, and
how far a search is through its budget (the horizon its technique plans the end by)."""

from __future__ import annotations

import pytest

from tunefleet.coordinator.budget import (
    COLD_START_S,
    Cut,
    Horizon,
    Speed,
    avoid_seconds,
    confirm_reserve,
    confirmations_that_fit,
    horizon,
    speed,
)
from tunefleet.queries.budget import Pace


def test_no_pace_before_a_worker_finished_a_trial():
    assert speed(Pace(0, None, None), in_flight=2) is None


def test_one_result_gives_the_trials_in_flight_per_turnaround():
    # (a confirmation, before the first: the cold start, no code generation, and one
    # trial's share of the device: 1 worker / the throughput, at most a turnaround)
    assert speed(Pace(1, 6.0, None), in_flight=2) == Speed(6.0, 2 / 6.0, 6.0, COLD_START_S + 3)
    assert speed(Pace(1, 6.0, None), in_flight=0) == Speed(6.0, 1 / 6.0, 6.0, COLD_START_S + 6)


def test_a_deep_prefetch_worker_does_not_stop_the_search_at_its_first_result():
    # What an H200 run did: one worker holding nine feinsum trials, the first back after
    # 30 s, 110 s of a 150 s budget left, three confirmations wanted. Counting one trial per
    # turnaround per worker, draining the other eight looked like 240 s and the search stopped
    # with nine trials; as a worker preparing nine at once, they drain in one turnaround.
    pace = speed(Pace(1, 30.0, None, compile_s=4.0), in_flight=9)
    assert pace is not None
    reserve = confirm_reserve(pace, confirm=3, running=8)
    cold = COLD_START_S + 4.0 + 1 / 0.3  # a fresh process, code generation, the device
    # The confirmation starts at once, beside the drain: the longer of the two, and one
    # trial's share of the device for the last to land.
    assert reserve == pytest.approx(max(max(8 / 0.3, 30.0), 3 * cold) + 1 / 0.3)
    assert reserve < 110.0


def test_the_throughput_is_measured_between_the_first_and_the_last_result():
    assert speed(Pace(5, 6.0, 8.0), in_flight=1) == Speed(6.0, 0.5, 6.0, COLD_START_S + 2)
    # The slow turnaround is the 90th percentile, never below the median.
    assert speed(Pace(5, 6.0, 8.0, 15.0), in_flight=1) == Speed(6.0, 0.5, 15.0, COLD_START_S + 2)


def test_the_last_trial_in_flight_drains_no_sooner_than_a_slow_one():
    # The H200 feinsum run: 16 trials held by one worker at 1.3 results/s, median turnaround
    # 9.2 s, 90th percentile 18.9 s. The throughput alone says 12 s; they took 22 s.
    pace = speed(Pace(170, 9.2, 130.0, 18.9), in_flight=16)
    assert pace is not None
    assert pace.drains(16) == pytest.approx(18.9)
    assert pace.drains(0) == 0.0
    # Many trials in flight at a low throughput: the throughput decides.
    assert pace.drains(100) == pytest.approx(100 / pace.throughput)
    step = 1 / pace.throughput
    assert confirm_reserve(pace, confirm=3, running=16) == pytest.approx(
        max(18.9, 3 * (COLD_START_S + step)) + step
    )


def test_confirmations_are_cold_builds_one_at_a_time_per_worker():
    # Before any confirmation: the cold start, the search's median code generation and
    # build, one trial's share of the device. A GEMM on an H200: 5 s of code generation at
    # 1.5 results/s; three confirmations on one worker take three cold builds, not the
    # pipelined 6 s + 2 / 1.5 s of three search trials.
    pace = speed(Pace(400, 6.0, 300.0, 14.0, compile_s=5.0), in_flight=17)
    assert pace is not None
    cold = COLD_START_S + 5.0 + 1 / pace.throughput
    assert pace.cold_s == pytest.approx(cold)
    assert pace.confirms(3) == pytest.approx(3 * cold)
    assert pace.confirms(3) > pace.takes(3)
    # Two workers take them side by side; what the run's confirmations took wins once known.
    two = speed(Pace(400, 6.0, 300.0, 14.0, compile_s=5.0, cold_s=9.0), in_flight=34, workers=2)
    assert two is not None and two.cold_s == 9.0
    assert [two.confirms(n) for n in (0, 1, 2, 3)] == [0.0, 9.0, 9.0, 18.0]
    assert confirmations_that_fit(two, 3, 17.9) == 2  # one round of two
    assert confirmations_that_fit(two, 3, 18.0) == 3
    assert confirm_reserve(two, confirm=3, running=0) == pytest.approx(18.0 + 1 / two.throughput)


def test_n_trials_take_one_turnaround_then_one_throughput_step_each():
    pace = Speed(turnaround_s=6.0, throughput=0.25)
    assert [pace.takes(n) for n in (0, 1, 3)] == [0.0, 6.0, 14.0]


@pytest.mark.parametrize(
    ("pace", "confirm", "running", "reserve"),
    [
        (None, 3, 2, 0.0),  # nothing to plan from: the deadline alone bounds the run
        (Speed(6.0, 0.25), 0, 2, 0.0),  # no confirmation: the search may run to the end
        (Speed(6.0, 0.25), 3, 0, 14.0 + 4.0),
        # The running trials drain while the confirmation runs: the longer of 8 s and 14 s.
        (Speed(6.0, 0.25), 3, 2, 14.0 + 4.0),
        (Speed(6.0, 0.25), 3, 20, 80.0 + 4.0),  # a long drain decides
    ],
)
def test_the_search_stops_the_reserve_before_the_deadline(pace, confirm, running, reserve):
    assert confirm_reserve(pace, confirm, running) == pytest.approx(reserve)


@pytest.mark.parametrize(
    ("pace", "want", "left_s", "fits"),
    [
        (Speed(6.0, 0.25), 3, 30.0, 3),
        (Speed(6.0, 0.25), 3, 10.0, 2),  # 6 s, then 4 s for the next
        (Speed(6.0, 0.25), 3, 9.9, 1),
        (Speed(6.0, 0.25), 3, 5.9, 0),  # not even one: the run says so and finishes
        (Speed(6.0, 0.25), 3, -1.0, 0),
        (None, 3, 5.0, 3),  # no pace: queue them, the deadline cuts what does not finish
        (None, 3, 0.0, 0),
        (Speed(6.0, 0.25), 0, 30.0, 0),
    ],
)
def test_confirmations_that_fit_the_time_left(pace, want, left_s, fits):
    assert confirmations_that_fit(pace, want, left_s) == fits


@pytest.mark.parametrize(
    ("live", "slack", "avoid"),
    [
        (2, None, 60.0),  # no time budget: the usual wait for another worker
        (1, None, 60.0),
        (1, 100.0, 0.0),  # a lone worker within a budget: nobody else would take it
        (3, 100.0, 50.0),  # half of the time to spare
        (3, 500.0, 60.0),
        (3, -5.0, 0.0),
    ],
)
def test_a_confirmation_waits_for_another_worker_only_within_the_time_to_spare(live, slack, avoid):
    assert avoid_seconds(60.0, live, slack) == avoid


def test_the_cut_line_names_what_was_handed_back_and_how_to_resume():
    cut = Cut(max_seconds=30.0, handed_back=3, confirm_wanted=3, confirm_queued=1)
    assert cut.anything
    assert cut.sentence("`tunefleet tune --resume 7`") == (
        "stopped at the 30 s budget: 3 trials in flight handed back (resume with "
        "`tunefleet tune --resume 7`); confirmation shortened to 1 of 3"
    )


def test_the_cut_line_says_when_no_confirmation_fitted():
    cut = Cut(max_seconds=5.0, confirm_wanted=3, confirm_queued=0)
    assert cut.sentence("x") == (
        "stopped at the 5 s budget: no time left to confirm the best (3 wanted); give a "
        "longer --max-time"
    )


def test_a_budget_that_cut_nothing_says_nothing():
    assert not Cut(max_seconds=30.0, confirm_wanted=3, confirm_queued=3).anything


@pytest.mark.parametrize(
    ("max_trials", "finished", "flying", "search_left_s", "pace", "expected"),
    [
        (None, 5, 2, None, None, None),  # no budget: no end in sight
        (300, 100, 16, None, None, Horizon(116, 184)),
        (300, 290, 16, None, None, Horizon(306, 0)),  # past the budget: nothing left
        # A time budget alone: the trials the fleet starts before the search must stop.
        (None, 40, 4, 60.0, Speed(6.0, 0.5), Horizon(44, 30)),
        (None, 40, 4, -3.0, Speed(6.0, 0.5), Horizon(44, 0)),
        (None, 0, 4, 60.0, None, None),  # no pace yet: no estimate, no end in sight
        (300, 0, 4, 60.0, None, Horizon(4, 296)),  # ... but the trial budget still counts
        (300, 100, 16, 60.0, Speed(6.0, 0.5), Horizon(116, 30)),  # the nearer end decides
        (120, 100, 16, 60.0, Speed(6.0, 0.5), Horizon(116, 4)),
    ],
)
def test_the_horizon_is_what_is_left_of_the_nearer_budget(
    max_trials, finished, flying, search_left_s, pace, expected
):
    assert horizon(max_trials, finished, flying, search_left_s, pace) == expected


@pytest.mark.parametrize(
    ("spent", "left", "share", "in_flight", "near"),
    [
        (255, 45, 0.15, 0, True),  # 15 % of 300 left
        (254, 46, 0.15, 0, False),
        (100, 200, 0.0, 0, False),
        # 64 proposals in flight: what is proposed now comes back after 64 others, so the
        # end game starts when 130 are left, not 45.
        (170, 130, 0.15, 64, True),
        (169, 131, 0.15, 64, False),
        (0, 0, 0.15, 0, True),
    ],
)
def test_the_end_is_near_at_a_share_of_the_budget_or_twice_the_proposals_in_flight(
    spent, left, share, in_flight, near
):
    assert Horizon(spent, left).near_end(share, in_flight) is near
