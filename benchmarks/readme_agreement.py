"""Does the README main job's best, as measured inside the run, hold when measured alone?

For each of ``--runs`` fresh runs (a fresh ``TUNEFLEET_HOME``, so a fresh embedded database
and an empty measurement cache): run the README main job (``tunefleet tune gemm --size
m=256,n=256,k=256 --max-trials 20``, on the machine's CPU OpenCL device unless ``--device``),
read its best trial (``tunefleet best 1 --json``: the median measured inside the run, its
confirmation and whether its samples were noisy), then run its reproduce command exactly as
printed, alone, ``--repeats`` times (default 3), and compare the run's median with the
median of those. A run agrees when the two are within ``--tolerance`` (default 15 %).

Prints a table and writes ``--out`` (JSON). Usage::

    python benchmarks/readme_agreement.py --runs 3

Other load on the machine moves both figures: say so next to the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PUBLISHED = ROOT / "benchmarks" / "published"
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
MEDIAN = re.compile(r"median ([0-9.]+) (us|ms|s)\b")


def _tunefleet() -> list[str]:
    return [sys.executable, "-m", "tunefleet"]


def _run(argv: list[str], env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done.stdout


def measured_alone(command: str, env: dict[str, str]) -> float:
    """The median a reproduce command prints (seconds)."""
    words = shlex.split(command)
    if words[:2] != ["tunefleet", "measure"]:
        raise RuntimeError(f"not a reproduce command: {command}")
    out = _run([*_tunefleet(), *words[1:]], env, timeout=600)
    found = MEDIAN.search(out)
    if found is None:
        raise RuntimeError(f"no median in the output of {command}:\n{out}")
    return float(found.group(1)) * UNITS[found.group(2)]


def one_run(index: int, opts: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"tunefleet-agreement-{index}-") as tmp:
        env = dict(os.environ)
        env["TUNEFLEET_HOME"] = str(Path(tmp) / "home")
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("TUNEFLEET_DATABASE_URL", None)
        job = [
            *_tunefleet(),
            "tune",
            "gemm",
            "--size",
            "m=256,n=256,k=256",
            "--max-trials",
            str(opts.max_trials),
        ]
        if opts.device:
            job += ["--device", opts.device]
        started = time.monotonic()
        try:
            _run(job, env, timeout=3600)
            tune_s = time.monotonic() - started
            data = json.loads(_run([*_tunefleet(), "best", "1", "--json"], env, timeout=300))
        finally:
            pgdata = Path(env["TUNEFLEET_HOME"]) / "postgres" / "data"
            if (pgdata / "postmaster.pid").exists():
                from tunefleet.db.embedded import EmbeddedServer

                EmbeddedServer(pgdata).stop()
        best = data["best"][0]
        alone = [measured_alone(best["reproduce"], env) for _ in range(opts.repeats)]
        alone_median = statistics.median(alone)
        ratio = best["median_s"] / alone_median
        return {
            "run": index,
            "tune_s": tune_s,
            "trial_id": best["trial_id"],
            "config": best["config"],
            "in_run_median_s": best["median_s"],
            "confirmed_median_s": best.get("confirmed_median_s"),
            "disagrees": best.get("disagrees"),
            "measured_noise": best.get("measured_noise"),
            "noisy": best.get("noisy"),
            "reproduce": best["reproduce"],
            "alone_medians_s": alone,
            "alone_median_s": alone_median,
            "ratio": ratio,
            "agrees": abs(ratio - 1.0) <= opts.tolerance,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-trials", type=int, default=20)
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--device", default=None, help="device pattern (default: tune's default)")
    ap.add_argument("--out", type=Path, default=PUBLISHED / "readme_agreement.json")
    opts = ap.parse_args()

    rows = []
    for i in range(1, opts.runs + 1):
        row = one_run(i, opts)
        rows.append(row)
        print(
            f"run {i}: in the run {1e3 * row['in_run_median_s']:.3f} ms, alone "
            f"{1e3 * row['alone_median_s']:.3f} ms (median of {opts.repeats}), ratio "
            f"{row['ratio']:.3f}",
            flush=True,
        )
    header = f"{'run':>3} {'trial':>5} {'in run':>10} {'alone':>10} {'ratio':>6} {'noise':>6}"
    print(f"\n{header}  agrees")
    for r in rows:
        noise = "-" if r["measured_noise"] is None else f"{100 * r['measured_noise']:.0f}%"
        print(
            f"{r['run']:>3} {r['trial_id']:>5} {1e3 * r['in_run_median_s']:>8.3f}ms "
            f"{1e3 * r['alone_median_s']:>8.3f}ms {r['ratio']:>6.3f} {noise:>6}  "
            f"{'yes' if r['agrees'] else 'NO'}"
        )
    agreed = sum(r["agrees"] for r in rows)
    print(f"{agreed} of {len(rows)} runs agree within {100 * opts.tolerance:g} %")
    result = {
        "benchmark": "readme_agreement",
        "job": f"tunefleet tune gemm --size m=256,n=256,k=256 --max-trials {opts.max_trials}",
        "tolerance": opts.tolerance,
        "repeats": opts.repeats,
        "cores": len(os.sched_getaffinity(0)),
        "load_average": list(os.getloadavg()),
        "python": platform.python_version(),
        "runs": rows,
        "agreed": agreed,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {opts.out}")
    return 0 if agreed == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
