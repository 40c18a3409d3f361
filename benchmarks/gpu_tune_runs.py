"""Independent default tuning runs of GEMM on a GPU, each against cuBLAS in the same call.

Runs ``tunefleet tune gemm --size m=4096,n=4096,k=4096 --dtype float32 --max-time 300``
``--runs`` times exactly as a user would (defaults: the embedded server, local workers), each
in a fresh tunefleet home so no run answers another's configurations from the cache. After
each, ``tunefleet best RUN --json`` gives the best GFLOP/s; cuBLAS (through PyTorch, TF32 off,
in a child process: ``gpu_tuning.torch_numbers``) is timed once per run, right after it.
Prints best GFLOP/s, the ratio to cuBLAS and the elapsed seconds per run; writes JSON.

    python benchmarks/gpu_tune_runs.py --runs 3 --out gpu_tune_runs.json

``--dry-run`` prints the commands and writes the JSON plan without running anything (no GPU
needed); ``--max-time`` and ``--extra`` (more ``tune`` arguments) change the command.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import fmt, machine, table, write_json

GEMM = {"m": 4096, "n": 4096, "k": 4096, "dtype": "float32"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-time", type=float, default=300.0)
    p.add_argument("--extra", default="", help="more `tune` arguments, one shell-quoted string")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def tune_command(max_time: float, extra: str) -> list[str]:
    size = ",".join(f"{k}={GEMM[k]}" for k in ("m", "n", "k"))
    return [
        sys.executable, "-m", "tunefleet", "tune", "gemm", "--size", size,
        "--dtype", str(GEMM["dtype"]), "--max-time", f"{max_time:g}", *shlex.split(extra),
    ]  # fmt: skip


def best_gflops(env: dict[str, str], run_id: int) -> float | None:
    proc = subprocess.run(
        [sys.executable, "-m", "tunefleet", "best", str(run_id), "--json"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        return None
    best = json.loads(proc.stdout)["best"]
    row = best[0] if isinstance(best, list) else best
    value = row.get("gflops") if isinstance(row, dict) else None
    return float(value) if value is not None else None


def one_run(i: int, args: argparse.Namespace) -> dict[str, Any]:
    command = tune_command(args.max_time, args.extra)
    out: dict[str, Any] = {"run": i, "command": shlex.join(command)}
    if args.dry_run:
        return out
    from gpu_tuning import torch_numbers

    with tempfile.TemporaryDirectory(prefix="tunefleet-gpu-run-") as home:
        env = {**os.environ, "TUNEFLEET_HOME": home, "PYTHONUNBUFFERED": "1"}
        started = time.monotonic()
        proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        out["elapsed_s"] = time.monotonic() - started
        out["exit"] = proc.returncode
        out["tail"] = (proc.stdout + proc.stderr)[-3000:]
        out["best_gflops"] = best_gflops(env, 1) if proc.returncode == 0 else None
        subprocess.run(
            [sys.executable, "-m", "tunefleet", "db", "stop"],
            env=env, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
    out["cublas"] = torch_numbers({"gemm": GEMM})
    cublas = out["cublas"].get("cublas_gflops")
    best = out["best_gflops"]
    out["ratio_to_cublas"] = best / cublas if best and cublas else None
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data: dict[str, Any] = {
        "machine": machine(),
        "problem": "gemm",
        "problem_args": GEMM,
        "max_time_s": args.max_time,
        "dry_run": args.dry_run,
        "runs": [],
    }
    for i in range(1, args.runs + 1):
        res = one_run(i, args)
        data["runs"].append(res)
        print(res["command"] if args.dry_run else {k: res.get(k) for k in ("run", "best_gflops",
              "ratio_to_cublas", "elapsed_s", "exit")}, flush=True)  # fmt: skip
        write_json("gpu_tune_runs", data, args.out)  # a run cut short keeps the others
    rows = [
        [
            r["run"],
            fmt(r.get("best_gflops"), 0),
            fmt((r.get("cublas") or {}).get("cublas_gflops"), 0),
            fmt(r.get("ratio_to_cublas")),
            fmt(r.get("elapsed_s"), 0),
        ]
        for r in data["runs"]
    ]
    print(table(["run", "best GFLOP/s", "cuBLAS GFLOP/s", "ratio", "elapsed s"], rows))
    ratios = [r["ratio_to_cublas"] for r in data["runs"] if r.get("ratio_to_cublas")]
    data["worst_ratio"] = min(ratios) if ratios else None
    write_json("gpu_tune_runs", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
