"""The search-quality and ModelSearch proposal benchmarks end to end with tiny parameters (no
database, no device: both replay device-free landscapes). Marked ``benchmark`` like the other
scripts' smoke tests; no timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tunefleet.settings import DEFAULT_TECHNIQUE

pytestmark = [pytest.mark.acceptance, pytest.mark.benchmark]

ROOT = Path(__file__).resolve().parents[2]


def script(name: str, out: Path, *args: str) -> tuple[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), "--out", str(out), *args],
        env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"wrote {out}" in proc.stdout and "|" in proc.stdout
    return proc.stdout, json.loads(out.read_text())


def test_search_quality_smoke(tmp_path: Path) -> None:
    _, data = script(
        "search_quality.py", tmp_path / "quality.json",
        "--techniques", "PureRandom,ModelSearch", "--workers", "1,4", "--seeds", "2",
        "--variants", "2", "--evals", "5,15", "--basin-techniques", "ModelSearch",
        "--basin-workers", "2", "--basin-runs", "2", "--basin-evals", "15",
    )  # fmt: skip
    cells = data["fleet"]["techniques"]
    assert set(cells) == {"PureRandom", "ModelSearch"}
    for by_workers in cells.values():
        assert set(by_workers) == {"1", "4"}
        for cell in by_workers.values():
            assert set(cell["at"]) == {"5", "15"}
            for at in cell["at"].values():
                assert 0 < at["worst"] <= at["median"] <= at["best"] <= 1.0
            assert cell["at"]["5"]["median"] <= cell["at"]["15"]["median"]
    basin = data["basin"]["techniques"]["ModelSearch"]["2"]
    assert len(basin["finals"]) == 2
    assert basin["within_5pct"] == sum(f >= 0.95 for f in basin["finals"])


def test_model_proposal_smoke(tmp_path: Path) -> None:
    _, data = script(
        "model_proposal.py", tmp_path / "proposal.json",
        "--observations", "60", "--workers", "8", "--rounds", "2",
    )  # fmt: skip
    cells = data["techniques"]
    assert set(cells) == {"NeighbourhoodSearch", "ModelSearch"}
    for cell in cells.values():
        assert [r["proposals"] for r in cell["rounds"]] == [8, 8]
        assert cell["distinct"] is True
        assert cell["per_proposal_median_s"] > 0
    assert cells["NeighbourhoodSearch"]["ratio_to_baseline"] == 1.0


def test_default_technique_smoke(tmp_path: Path) -> None:
    _, data = script("default_technique.py", tmp_path / "default.json", "--quick")
    land = data["landscapes"]
    assert land["landscapes"]["set"] == "held-out" and land["landscapes"]["first_variant"] == 1000
    cells = land["techniques"]
    expected = {DEFAULT_TECHNIQUE, "ModelSearch", "NeighbourhoodSearch"}
    try:
        import optuna  # noqa: F401
    except ImportError:
        pass
    else:
        expected.add("optuna-tpe")
    assert set(cells) == expected
    for by_workers in cells.values():
        assert set(by_workers) == {"1", "4"}
        for cell in by_workers.values():
            assert len(cell["finals"]) == 2 and all(0 < f <= 1.0 for f in cell["finals"])
            assert cell["within_5pct"] == sum(f >= 0.95 for f in cell["finals"])
            assert cell["search_s_per_eval"]["median"] > 0
    importance = data["importance"]
    assert importance["technique"] == data["default"] == DEFAULT_TECHNIQUE == "ModelSearchFinish"
    for by_workers in importance["workers"].values():
        (run,) = by_workers["runs"]
        assert set(run["ranks"]) == {"reg_i", "reg_j"} and len(run["first_three"]) == 3
