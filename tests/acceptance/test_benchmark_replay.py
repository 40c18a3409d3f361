"""The replay benchmark and the GPU tuning-runs script, end to end with tiny parameters (no
database, no device: the replay reads the published recordings, the GPU script only plans).
Marked ``benchmark`` like the other scripts' smoke tests; no timing is asserted."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.acceptance, pytest.mark.benchmark]

ROOT = Path(__file__).resolve().parents[2]


def script(name: str, out: Path, *args: str, cwd: Path | None = None) -> tuple[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), "--out", str(out), *args],
        env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
        check=False, cwd=cwd,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"wrote {out}" in proc.stdout and "|" in proc.stdout
    return proc.stdout, json.loads(out.read_text())


def test_replay_techniques_smoke(tmp_path: Path) -> None:
    _, data = script(
        "replay_techniques.py", tmp_path / "replay.json",
        "--seeds", "2", "--evals", "5,20", "--short-evals", "5",
        "--long", "PureRandom", "--short", "NeighbourhoodSearch", "--workers", "1,4",
    )  # fmt: skip
    assert {"gemm", "face_mass"} <= set(data["recordings"])
    for rec in data["recordings"].values():
        cells = rec["techniques"]
        assert set(cells) == {
            "PureRandom", "PureRandom x4", "NeighbourhoodSearch", "NeighbourhoodSearch x4"
        }  # fmt: skip
        assert set(cells["PureRandom"]["at"]) == set(cells["PureRandom x4"]["at"]) == {"5", "20"}
        assert set(cells["NeighbourhoodSearch"]["at"]) == {"5"}
        # Four virtual workers finish 20 evaluations in less virtual time than one.
        assert cells["PureRandom x4"]["virtual_s"]["20"] < cells["PureRandom"]["virtual_s"]["20"]
        for cell in cells.values():
            for at in cell["at"].values():
                # 0: a seed whose few evaluations all came back invalid (the face-mass
                # region's device rejects half of what its rules allow).
                assert 0 <= at["worst"] <= at["median"] <= at["best"] <= 1.0
                assert at["best"] > 0


def test_gpu_tune_runs_plans_without_a_gpu(tmp_path: Path) -> None:
    _, data = script("gpu_tune_runs.py", tmp_path / "gpu.json", "--dry-run", "--runs", "3")
    assert [r["run"] for r in data["runs"]] == [1, 2, 3]
    assert all(
        "tune gemm --size m=4096,n=4096,k=4096 --dtype float32 --max-time 300" in r["command"]
        for r in data["runs"]
    )


def test_a_region_is_recorded_gzipped_and_replayed_from_any_directory(tmp_path: Path) -> None:
    """record_space.py measures a narrowed built-in (benchmarks/inputs/regions.py) with the
    grid on the CPU's OpenCL device for 20 s into a gzipped recording with the device's limits,
    and replay_techniques replays it from another directory with the region's own rules (the
    problem file is named relative to the repository)."""
    pytest.importorskip("pyopencl")
    recording = tmp_path / "recording_transpose_region.json.gz"
    env = dict(os.environ, TUNEFLEET_HOME=str(tmp_path / "home"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "record_space.py"),
         "benchmarks/inputs/regions.py:TransposeRegion", "--size", "n=64,m=64",
         "--phase", "grid:20", "--out", str(recording)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"wrote {recording}" in proc.stdout and "fastest" in proc.stdout
    data = json.loads(gzip.decompress(recording.read_bytes()))
    assert data["problem"] == "benchmarks/inputs/regions.py:TransposeRegion"
    assert 0 < sum(row[1] == "done" for row in data["rows"]) <= len(data["rows"]) <= 1440
    # The device's limits, for replays to rule out what it would refuse (PoCL's, here).
    limits = data["device_limits"]
    assert limits["local_mem_bytes"] > 0 and limits["max_work_group_size"] > 0, limits
    _, replayed = script(
        "replay_techniques.py", tmp_path / "replay.json", "--recording", str(recording),
        "--seeds", "2", "--evals", "10", "--long", "ModelSearchFinish", "--short", "",
        cwd=tmp_path,
    )  # fmt: skip
    [cell] = replayed["recordings"]["transpose_region"]["techniques"].values()
    assert replayed["recordings"]["transpose_region"]["space_size"] == 1440
    assert 0 < cell["at"]["10"]["worst"] <= 1.0
    # The seeds that reached 0.97 of the recording's fastest, counted apart from the range.
    at, reached = cell["at"]["10"], cell["reached"]["10"]
    assert reached == (2 if at["worst"] >= 0.97 else 0 if at["best"] < 0.97 else 1)
