"""``benchmarks/dashboard_page.py`` end to end in its smoke size (a run of 300 trials, two
loads each, headless Chromium): it writes the JSON its tables show. No timing is asserted.
Marked ``benchmark`` like the other scripts' smoke tests (opt-in: ``pytest -m benchmark``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.test_benchmarks import run_script
from tests.helpers.browser import CHROMIUM

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.benchmark,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed"),
]


def test_dashboard_page_smoke(db_url: str, tmp_path: Path) -> None:
    data = run_script(
        "dashboard_page.py", db_url, tmp_path / "page.json", "--trials", "300", "--repeats", "2"
    )
    assert data["trials"] == 300
    loads = {r["load"]: r for r in data["page_loads"]}
    assert len(loads) == 3 and all(r["n"] == 2 and r["median_ms"] > 0 for r in loads.values())
    calls = {c["call"]: c for c in data["calls"]}
    assert len(calls) == 6 and all(c["bytes"] > 1000 for c in calls.values())
