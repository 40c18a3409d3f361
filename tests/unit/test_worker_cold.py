"""How many cold builds (a confirmation's fresh process) a worker prepares at once
(``tunefleet.worker.cold.at_once``): one per four cores beside the search's trials, more
where its code-generation processes stand idle, never more than COLD_AT_ONCE."""

from __future__ import annotations

import pytest

from tunefleet.worker.cold import COLD_AT_ONCE, at_once


@pytest.mark.parametrize(
    ("cores", "idle", "want", "why"),
    [
        (2, 0, 1, "a laptop in the middle of a search: one, beside its code generation"),
        (2, 1, 2, "a laptop whose search is over: its code-generation core takes one too"),
        (16, 0, 4, "a GPU node: one per four cores"),
        (16, 14, COLD_AT_ONCE, "never more than COLD_AT_ONCE, however idle"),
        (1, 0, 1, "one core: still one"),
        (8, -1, 2, "a negative idle count counts as none"),
    ],
)
def test_cold_builds_at_once(cores: float, idle: int, want: int, why: str) -> None:
    assert at_once(cores, idle) == want, why
