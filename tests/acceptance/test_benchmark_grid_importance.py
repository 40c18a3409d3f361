"""The grid-order and importance-after-search benchmarks, end to end with tiny parameters
(no device, no database). Marked ``benchmark`` like the other scripts' smoke tests; no timing
is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.test_benchmark_replay import script

pytestmark = [pytest.mark.acceptance, pytest.mark.benchmark]


def test_grid_order_smoke(tmp_path: Path) -> None:
    out, data = script(
        "grid_order.py", tmp_path / "grid.json", "--seeds", "2", "--landscape", "ruled"
    )
    ruled = data["landscapes"]["ruled"]
    assert (ruled["points"], ruled["valid"]) == (512, 384)
    assert set(ruled["orders"]) == {
        "interleaved", "rings", "shuffled", "lexicographic", "random (median)", "random (worst)"
    }  # fmt: skip
    # Every order ends at the optimum: it visits every valid configuration.
    assert all(r["100%"] == 1.0 for r in ruled["orders"].values())
    assert "best at 10%" in out


def test_importance_search_smoke(tmp_path: Path) -> None:
    out, data = script(
        "importance_search.py", tmp_path / "imp.json",
        "--seeds", "2", "--trials", "60", "--workers", "1,4",
    )  # fmt: skip
    assert set(data["workers"]) == {"1", "4"}
    for per in data["workers"].values():
        assert len(per["runs"]) == 2 and 0 <= per["both_after"] <= 2
        assert {"before", "after", "ranked_by"} <= set(per["runs"][0])
    assert "both in first 3" in out
