"""Does a run's best reproduce alone? Tuning runs as a user starts them, then each run's top
configurations re-measured by ``tunefleet measure`` in fresh processes, one after another.

For each of ``--runs`` runs (each in a fresh tunefleet home, so no run answers another from the
cache): ``tunefleet tune PROBLEM ARGS...`` exactly as given after ``--``, then ``tunefleet best
1 --json --top K`` for the run's top ``K`` configurations (their in-run median and, where the
run confirmed them, the confirmation's), then for each of them ``--alone`` fresh processes of
the command ``tunefleet best`` prints to reproduce it, with ``--json``. The table shows in-run
against alone (the median of the fresh processes), their ratio, and whether the fresh processes
built the same OpenCL source as the run (sha256 of the stored code). With ``--cublas`` (a GPU
with PyTorch), cuBLAS SGEMM of the GEMM sizes is timed after each run in the same call.

    python benchmarks/reproduce.py --runs 3 --top 5 --alone 3 --out reproduce.json -- \\
        gemm --size m=4096,n=4096,k=4096 --dtype float32 --device gpu --max-time 300

Writes the JSON (every run's tune tail, each trial's figures and every fresh process's
samples) after each run, so a call cut short keeps what it measured. ``--dry-run`` prints
the plan only.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import fmt, machine, table, write_json

TUNEFLEET = [sys.executable, "-m", "tunefleet"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="independent tuning runs (default 3)")
    p.add_argument("--top", type=int, default=5, help="configurations per run (default 5)")
    p.add_argument("--alone", type=int, default=3, help="fresh processes per configuration")
    p.add_argument("--cublas", action="store_true", help="time cuBLAS SGEMM after each run")
    p.add_argument("--smi", action="store_true", help="log nvidia-smi clocks and power")
    p.add_argument(
        "--variant",
        metavar="JSON",
        help="also run the fresh processes with these protocol overrides (e.g. a long warm-up)",
    )
    p.add_argument("--export", action="store_true", help="keep every trial of each run (JSON)")
    p.add_argument("--log", action="store_true", help="keep each run's whole tune output")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--out", default=None)
    p.add_argument("tune", nargs=argparse.REMAINDER, help="after --: PROBLEM and tune's flags")
    args = p.parse_args(argv)
    if args.tune and args.tune[0] == "--":
        args.tune = args.tune[1:]
    if not args.tune:
        p.error("give the tune command's PROBLEM and flags after --")
    for flag in ("runs", "top", "alone"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} {getattr(args, flag)}: give 1 or more")
    return args


def _run(command: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def source_sha256(env: dict[str, str], trial_id: int) -> str | None:
    proc = _run([*TUNEFLEET, "show", "1", str(trial_id), "--code"], env, 120)
    if proc.returncode != 0:
        return None
    return hashlib.sha256(proc.stdout.rstrip("\n").encode()).hexdigest()


def alone(
    command: str, env: dict[str, str], times: int, variant: str | None = None
) -> list[dict[str, Any]]:
    """``times`` fresh processes of a reproduce command, each with --json (and with the
    ``variant`` protocol overrides merged into its own)."""
    words = shlex.split(command)
    if words[:2] == ["tunefleet", "measure"]:
        words = [*TUNEFLEET, *words[1:]]
    if variant:
        protocol = {}
        if "--protocol" in words:
            at = words.index("--protocol")
            protocol = json.loads(words[at + 1])
            del words[at : at + 2]
        words += ["--protocol", json.dumps({**protocol, **json.loads(variant)})]
    out = []
    for _ in range(times):
        started = time.monotonic()
        proc = _run([*words, "--json"], env, 900)
        row: dict[str, Any] = {"exit": proc.returncode, "wall_s": time.monotonic() - started}
        try:
            row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        except (json.JSONDecodeError, IndexError):
            row["error"] = (proc.stderr or proc.stdout).strip()[-800:]
        out.append(row)
    return out


def one_run(i: int, args: argparse.Namespace, save: Any) -> dict[str, Any]:
    """One run and its reproductions; ``save(partial)`` after each configuration, so a call
    cut short keeps what it measured."""
    command = [*TUNEFLEET, "tune", *args.tune]
    out: dict[str, Any] = {"run": i, "command": shlex.join(["tunefleet", "tune", *args.tune])}
    if args.dry_run:
        return out
    with tempfile.TemporaryDirectory(prefix="tunefleet-reproduce-") as home:
        env = {**os.environ, "TUNEFLEET_HOME": home, "PYTHONUNBUFFERED": "1"}
        started = time.monotonic()
        proc = _run(command, env, 24 * 3600)
        out["elapsed_s"] = time.monotonic() - started
        out["exit"] = proc.returncode
        out["tail"] = (proc.stdout + proc.stderr)[-4000:]
        if args.log:
            out["output"] = proc.stdout + proc.stderr
        # The run's rate and where its wall went (the devices' timing share), as users see it.
        status = _run([*TUNEFLEET, "status", "1"], env, 300)
        out["status"] = (status.stdout + status.stderr)[-4000:]
        best = _run([*TUNEFLEET, "best", "1", "--json", "--top", str(args.top)], env, 300)
        rows = json.loads(best.stdout)["best"] if best.returncode == 0 else []
        out["top"] = []
        for rank, row in enumerate(rows, 1):
            entry = {
                "rank": rank,
                "trial_id": row["trial_id"],
                "config": row["config"],
                "in_run_median_s": row["median_s"],
                "confirmed_median_s": row.get("confirmed_median_s"),
                "reproduce": row["reproduce"],
                "source_sha256": source_sha256(env, row["trial_id"]),
            }
            entry["alone"] = alone(row["reproduce"], env, args.alone)
            if args.variant:
                entry["variant"] = alone(row["reproduce"], env, args.alone, args.variant)
            medians = [a["median_s"] for a in entry["alone"] if a.get("median_s")]
            entry["alone_median_s"] = statistics.median(medians) if medians else None
            if entry["alone_median_s"] and entry["in_run_median_s"]:
                entry["alone_over_in_run"] = entry["alone_median_s"] / entry["in_run_median_s"]
            hashes = {a.get("source_sha256") for a in entry["alone"]}
            entry["same_source"] = hashes == {entry["source_sha256"]}
            out["top"].append(entry)
            save(out)
        if args.export:
            exported = _run([*TUNEFLEET, "export", "1", "--format", "json"], env, 300)
            out["trials"] = json.loads(exported.stdout) if exported.returncode == 0 else None
        _run([*TUNEFLEET, "db", "stop"], env, 120)
    if args.cublas:
        from gpu_tuning import torch_numbers

        sizes = _gemm_sizes(args.tune)
        out["cublas"] = torch_numbers({"gemm": sizes}) if sizes else {"error": "not gemm"}
    return out


def _gemm_sizes(tune: list[str]) -> dict[str, Any] | None:
    if not tune or tune[0] != "gemm":
        return None
    sizes: dict[str, Any] = {"dtype": "float32"}
    for flag, value in itertools.pairwise(tune):
        if flag == "--size":
            sizes.update({k: int(v) for k, v in (kv.split("=") for kv in value.split(","))})
        elif flag == "--dtype":
            sizes["dtype"] = value
    return sizes


def _ms(measured: list[dict[str, Any]]) -> str:
    return " ".join(fmt(1e3 * a["median_s"], 3) for a in measured if a.get("median_s")) or "-"


def start_smi(path: Path) -> subprocess.Popen[bytes] | None:
    query = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu"
    try:
        return subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv", "-lms", "200", "-f", str(path)]
        )
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data: dict[str, Any] = {
        "machine": machine(),
        "tune": args.tune,
        "top": args.top,
        "alone": args.alone,
        "dry_run": args.dry_run,
        "runs": [],
    }
    smi = None
    if args.smi and not args.dry_run:
        smi = start_smi(Path(args.out or "reproduce").with_suffix(".smi.csv"))
    try:
        for i in range(1, args.runs + 1):
            data["runs"].append({"run": i})

            def save(partial: dict[str, Any]) -> None:
                data["runs"][-1] = partial
                write_json("reproduce", data, args.out)

            res = one_run(i, args, save)
            data["runs"][-1] = res
            write_json("reproduce", data, args.out)
            if args.dry_run:
                print(res["command"])
    finally:
        if smi is not None:
            smi.terminate()
    rows = []
    for r in data["runs"]:
        cublas = (r.get("cublas") or {}).get("cublas_gflops")
        for t in r.get("top", []):
            alone_gflops = [a.get("gflops") for a in t["alone"] if a.get("gflops")]
            rows.append(
                [
                    r["run"],
                    t["rank"],
                    t["trial_id"],
                    fmt(1e3 * t["in_run_median_s"], 3) if t["in_run_median_s"] else "-",
                    fmt(1e3 * t["confirmed_median_s"], 3) if t["confirmed_median_s"] else "-",
                    _ms(t["alone"]),
                    fmt(t.get("alone_over_in_run")),
                    _ms(t.get("variant", [])),
                    "yes" if t["same_source"] else "NO",
                    fmt(statistics.median(alone_gflops) / cublas)
                    if cublas and alone_gflops
                    else "-",
                ]
            )
    headers = ["run", "rank", "trial", "in-run ms", "confirmed ms", "alone ms", "alone/in-run"]
    headers.append("variant ms")
    print(table([*headers, "same source", "speed / cuBLAS"], rows))
    write_json("reproduce", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
