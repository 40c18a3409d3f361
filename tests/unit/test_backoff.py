"""The one backoff the worker's links, the start-up wait and the coordinator's reconnect use."""

from __future__ import annotations

import pytest

from tunefleet.backoff import RECONNECT_FIRST_S, RECONNECT_MAX_S, Backoff


def test_doubles_up_to_the_cap_and_starts_over_after_a_reset() -> None:
    b = Backoff(0.5, 3.0)
    assert [b.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    b.reset()
    assert b.next() == 0.5


def test_the_reconnect_defaults() -> None:
    b = Backoff()
    pauses = [b.next() for _ in range(10)]
    assert pauses[0] == RECONNECT_FIRST_S and max(pauses) == pauses[-1] == RECONNECT_MAX_S


@pytest.mark.parametrize(("first", "cap"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_a_backoff_that_would_not_back_off_is_refused(first: float, cap: float) -> None:
    with pytest.raises(ValueError, match="0 < first_s <= max_s"):
        Backoff(first, cap)
