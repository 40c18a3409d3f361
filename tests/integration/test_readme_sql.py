"""Every ```sql block of the README runs against the database of a real run and returns what
its prose promises.

The database holds run 1 (filled by ``runfill``) plus a second run of the same problem on
another device class, so the side-by-side queries have two classes to compare.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from runfill import fill

README = Path(__file__).resolve().parents[2] / "README.md"

#: First-line comment of a block -> columns it must return (every block must return rows).
EXPECTED: dict[str, set[str]] = {
    "best configuration per problem and device": {"problem", "device_class", "config", "gflops"},
    "GFLOP/s distribution of a run": {"measured", "median", "p90", "best"},
    "GFLOP/s histogram of a run": {"bucket", "configurations"},
    "failure reasons": {"state", "reason", "trials"},
    "throughput per worker": {"worker_host", "evaluations", "per_minute", "busy_fraction"},
    "same problem on two devices side by side": {"device_a", "gflops_a", "device_b", "gflops_b"},
    "one configuration on two devices": {"config", "class_a", "class_b"},
    "progress of running runs": {"run_id", "done", "best_gflops", "per_minute"},
    "top configurations of a run": {"trial_id", "config", "gflops"},
}


def sql_blocks() -> list[str]:
    return re.findall(r"^```sql\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def _title(block: str) -> str:
    first = block.strip().splitlines()[0]
    assert first.startswith("-- "), f"a README SQL block must start with a '-- title': {first}"
    return first[3:].strip()


def test_the_readme_documents_at_least_five_queries():
    titles = [_title(b) for b in sql_blocks()]
    assert len(titles) >= 5
    assert set(EXPECTED) <= set(titles), "a documented query disappeared from the README"


@pytest.mark.parametrize("block", sql_blocks(), ids=_title)
def test_readme_sql_returns_rows(db: Any, block: str) -> None:
    filled = fill(db)
    assert filled.cpu_run == 1  # the README's examples query run 1
    cur = db.execute(block)
    rows = cur.fetchall()
    columns = {c.name for c in cur.description}
    assert rows, f"README query {_title(block)!r} returned no rows"
    assert EXPECTED.get(_title(block), set()) <= columns
    title = _title(block)
    if title == "best configuration per problem and device":
        assert {r["device_class"] for r in rows} == {
            "pthread-intel-r-xeon-r-processor",
            "nvidia-h200",
        }
        assert max(float(r["gflops"]) for r in rows) == 410.0
    if title == "GFLOP/s distribution of a run":
        assert rows[0]["measured"] == 6 and float(rows[0]["best"]) == 12.5
    if title == "same problem on two devices side by side":
        assert len(rows) == 1 and float(rows[0]["gflops_a"]) == 410.0
    if title == "failure reasons":
        assert sum(r["trials"] for r in rows) == 4
    if title == "throughput per worker":
        assert sum(r["evaluations"] for r in rows) == 10
