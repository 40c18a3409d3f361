"""``benchmarks/fleet_scaling.py`` attributes queue statement latencies from worker logs to
trials: a claim's latency is shared by the trials it handed out, a completion belongs to the
trial whose outcome line follows it, heartbeats are spread over the worker's trials, and trials
outside the batch or lines before the batch's offset do not count."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import fleet_scaling  # noqa: E402

T = "2026-01-01 00:00:00,000"


def line(level: str, message: str) -> str:
    return f"{T} {level} tunefleet.worker: {message}\n"


def test_statement_latencies_are_attributed_to_trials(tmp_path: Path) -> None:
    before = line("DEBUG", "main connection: claim_trials took 100.000 ms") + line(
        "INFO", "claimed trial 1 (run 1, attempt 1/3)"
    )
    log = tmp_path / "w.log"
    log.write_text(
        before
        + line("DEBUG", "main connection: claim_trials took 4.000 ms")
        + line("INFO", "claimed trial 7 (run 2, attempt 1/3)")
        + line("DEBUG", "heartbeat connection: heartbeat_trials took 2.000 ms")
        + line("INFO", "claimed trial 8 (run 2, attempt 1/3)")
        + line("DEBUG", "main connection: complete_trial took 1.500 ms")
        + line("INFO", "trial 7 attempt 1: done -> trial done")
        + line("DEBUG", "heartbeat connection: heartbeat_worker took 1.000 ms")
        + line("DEBUG", "main connection: claim_trials took 0.500 ms")
        + line("DEBUG", "main connection: complete_trial took 2.500 ms")
        + line("INFO", "trial 8 attempt 1: done -> trial done")
        + line("DEBUG", "main connection: complete_trial took 9.000 ms")
        + line("INFO", "trial 99 attempt 1: done -> trial done")
    )
    overhead, statements, parts = fleet_scaling.parse_logs([log], [len(before)], {7, 8})
    # claim 4 ms shared by trials 7 and 8; heartbeats 3 ms over 2 trials; own completions.
    assert sorted(parts["claim"]) == [2.0, 2.0]
    assert sorted(parts["complete"]) == [1.5, 2.5]
    assert parts["heartbeat"] == [1.5, 1.5]
    assert sorted(overhead) == pytest.approx([5.0, 6.0])
    assert statements["claim_trials"] == [4.0, 0.5]
    assert statements["complete_trial"] == [1.5, 2.5, 9.0]
    assert statements["heartbeat_trials"] == [2.0]


def test_a_log_without_debug_lines_yields_no_overhead(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text(
        line("INFO", "claimed trial 7 (run 2, attempt 1/3)")
        + line("INFO", "trial 7 attempt 1: done -> trial done")
    )
    overhead, statements, _ = fleet_scaling.parse_logs([log], [0], {7})
    assert overhead == [] and statements == {}


def test_table_cells_never_use_exponents() -> None:
    import _harness

    assert _harness.fmt(37876.4, 1) == "37,876"
    assert _harness.fmt(1924.73, 1) == "1924.7"
    assert _harness.fmt(None) == "-" and _harness.fmt(float("nan")) == "-"
    assert _harness.fmt(7) == "7"
