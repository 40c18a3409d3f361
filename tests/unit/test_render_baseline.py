"""The run report's line on what tuning gained (``render.baseline_text``): the best against
the problem's default configuration, each case worded, none when no default was measured."""

from __future__ import annotations

from tunefleet.text.render import baseline_text

BEST = {"trial_id": 9, "median_s": 2.0e-3, "confirm_state": "done", "confirmed_median_s": 2.5e-3}


def test_the_gain_is_the_defaults_median_over_the_bests_quoted_figure() -> None:
    default = {"trial_id": 1, "state": "done", "median_s": 3.0e-3}
    # The best's quoted figure is its re-measurement (2.5 ms), not the search's 2.0 ms.
    assert baseline_text(BEST, default) == (
        "over the default configuration: 1.20x faster (the default, trial 1: median 3 ms)"
    )
    unconfirmed = {"trial_id": 9, "median_s": 2.0e-3}
    assert "1.50x faster" in (baseline_text(unconfirmed, default) or "")


def test_the_default_itself_a_broken_default_and_none_measured_are_said_so() -> None:
    assert baseline_text(BEST, {"trial_id": 9, "state": "done", "median_s": 2e-3}) == (
        "over the default configuration: the best is the default itself"
    )
    invalid = {"trial_id": 1, "state": "invalid", "median_s": None}
    assert baseline_text(BEST, invalid) == (
        "over the default configuration: not comparable (its trial 1 is invalid)"
    )
    assert baseline_text(BEST, None) is None
