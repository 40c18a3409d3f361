"""Where the wall goes: evaluations per minute and the device's timing share of default
``tunefleet tune`` runs, each with a fresh home (its own embedded server, so no arm answers
another's configurations from the cache) and fresh code caches (loopy's, pyopencl's, PoCL's
and NVIDIA's), as a user on a new machine starts them.

For each case and each tree, one arm: ``tunefleet tune CASE --max-time BUDGET``. The table
gives the run's evaluations per minute (``run_progress``), its evaluations, the devices'
timing share (``run_timeline.timing_share``: the share of their window spent timing kernels),
what else the device process did and how long it stood idle, and the median of every phase of
a search evaluation (:mod:`tunefleet.timeline`). The JSON keeps every attempt's timeline.

Cases (``--cases``): ``gemm`` (float32, n = m = k = 4096), ``face_mass`` (float64, the
problem's default size), ``readme`` (the README's main job: ``gemm --size m=256,n=256,k=256
--max-trials 20``, timed by its wall clock). ``--quick`` shrinks them for a CPU (PoCL).

Trees (``--tree NAME=SITE``, repeatable): run the arm with ``SITE`` first on ``PYTHONPATH``
(an install of another tunefleet, e.g. ``pip install --no-deps --target SITE`` of an older
commit), so two versions are compared on one machine in one call; without it, the
tunefleet this script imports. ``--rounds N`` repeats the whole set, trees interleaved.

    python benchmarks/eval_rate.py --cases gemm,face_mass --budget 60 --device gpu
    python benchmarks/eval_rate.py --cases gemm --quick --budget 30     # on PoCL, to try it
    python benchmarks/eval_rate.py --cases readme --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tunefleet.db.engine import connect
from tunefleet.timeline import DEVICE_WORK, Phase, clean


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    quick_argv: tuple[str, ...]
    #: A budget of trials (the README job) instead of ``--budget`` seconds.
    max_trials: int | None = None


CASES = {
    "gemm": Case(
        "gemm",
        ("gemm", "--size", "n=4096,m=4096,k=4096", "--dtype", "float32"),
        ("gemm", "--size", "n=256,m=256,k=256", "--dtype", "float32"),
    ),
    "face_mass": Case(
        "face_mass",
        ("face_mass", "--dtype", "float64"),
        ("face_mass", "--dtype", "float64", "--size", "n_elements=8192"),
    ),
    "readme": Case(
        "readme",
        ("gemm", "--size", "m=256,n=256,k=256"),
        ("gemm", "--size", "m=64,n=64,k=64"),
        max_trials=20,
    ),
}

#: The phases shown in the table, in the order a trial meets them.
SHOWN = tuple(p for p in Phase if p not in (Phase.DEVICE_OTHER,))


tunefleet = h.tunefleet


def run_arm(
    case: Case, tree: str, site: str | None, budget: float, quick: bool, device: str | None
) -> dict[str, Any]:
    """One ``tunefleet tune`` with a fresh home and fresh code caches."""
    home = Path(tempfile.mkdtemp(prefix=f"tunefleet-rate-{case.name}-"))
    env = dict(os.environ, TUNEFLEET_HOME=str(home / "home"), PYTHONUNBUFFERED="1")
    for var, sub in (("XDG_CACHE_HOME", "cache"), ("POCL_CACHE_DIR", "pocl")):
        env[var] = str(home / sub)
    env["CUDA_CACHE_PATH"] = str(home / "nv")
    if site:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
    env.pop("TUNEFLEET_DATABASE_URL", None)
    argv = ["tune", *(case.quick_argv if quick else case.argv)]
    argv += ["--progress-every", "15", "--name", f"{case.name} {tree}"]
    if case.max_trials:
        argv += ["--max-trials", str(3 if quick else case.max_trials)]
    else:
        argv += ["--max-time", f"{budget:g}"]
    if device is not None:
        argv += ["--device", device]
    out: dict[str, Any] = {"case": case.name, "tree": tree, "site": site, "argv": argv}
    try:
        started = tunefleet(env, "db", "start", timeout=180)
        if started.returncode != 0:
            out["error"] = started.stderr.strip()[-500:]
            return out
        url = tunefleet(env, "db", "url", timeout=60).stdout.strip()
        t0 = time.perf_counter()
        proc = tunefleet(env, *argv, timeout=(900 if case.max_trials else budget) + 300)
        out["wall_s"] = time.perf_counter() - t0
        out["exit"] = proc.returncode
        out["tail"] = proc.stdout.strip().splitlines()[-3:]
        found = re.search(r"^(?:tuning|resuming) run (\d+)", proc.stdout, re.MULTILINE)
        if not found:
            out["error"] = (proc.stderr.strip().splitlines() or ["no run started"])[-1]
            return out
        out.update(run_numbers(url, int(found.group(1))))
        if proc.returncode != 0:
            out["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
    except subprocess.TimeoutExpired as exc:
        out["error"] = f"timed out after {exc.timeout:.0f} s"
    finally:
        tunefleet(env, "db", "stop", timeout=120)
        shutil.rmtree(home, ignore_errors=True)
    return out


def run_numbers(url: str, run_id: int) -> dict[str, Any]:
    """The run's rate and best, its devices' timing share and every attempt's timeline."""
    with connect(url) as conn:
        p = conn.execute(
            "SELECT done, invalid, failed, timed_out, ruled_out, best_gflops,"
            " extract(epoch FROM elapsed)::float8 AS elapsed_s, evaluations_per_minute"
            " FROM tunefleet.run_progress WHERE run_id = %s",
            (run_id,),
        ).fetchone()
        run = conn.execute(
            "SELECT * FROM tunefleet.run_timeline WHERE run_id = %s", (run_id,)
        ).fetchone()
        attempts = conn.execute(
            "SELECT t.trial_id, t.purpose, t.outcome, t.queued_s, t.wall_s, t.untracked_s,"
            " extract(epoch FROM t.claimed_at - r.created_at)::float8 AS claimed_s,"
            " extract(epoch FROM t.ended_at - r.created_at)::float8 AS ended_s, t.timeline"
            " FROM tunefleet.timeline t JOIN tunefleet.run r ON r.id = t.run_id"
            " WHERE t.run_id = %s ORDER BY t.ended_at",
            (run_id,),
        ).fetchall()
        workers = conn.execute(
            "SELECT prepare_workers, prefetch, sizing, device_busy FROM tunefleet.worker"
            " ORDER BY started_at"
        ).fetchall()
    assert p is not None
    states = ("done", "invalid", "failed", "timed_out")
    out: dict[str, Any] = {
        "run_id": run_id,
        "evaluations": sum(int(p[k]) for k in states) - int(p["ruled_out"]),
        "states": {k: int(p[k]) for k in (*states, "ruled_out")},
        "elapsed_s": float(p["elapsed_s"]),
        "evaluations_per_minute": float(p["evaluations_per_minute"]),
        "best_gflops": None if p["best_gflops"] is None else float(p["best_gflops"]),
        "attempts": [dict(a) for a in attempts],
        "workers": [dict(w) for w in workers],
    }
    if run is not None:
        window = float(run["window_s"] or 0.0)
        work = sum(float(run[f"{k}_s"] or 0.0) for k in DEVICE_WORK)
        out.update(
            window_s=window,
            timing_share=None if run["timing_share"] is None else float(run["timing_share"]),
            device_work_share=work / window if window else None,
            device_work={k: float(run[f"{k}_s"] or 0.0) for k in DEVICE_WORK},
        )
    search = [clean(a["timeline"]) for a in attempts if a["purpose"] == "search"]
    if search:
        out["median_s"] = {
            p.value: statistics.median(t.get(p.value, 0.0) for t in search) for p in Phase
        }
    return out


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.0f}%"


def report(arms: list[dict[str, Any]]) -> str:
    headers = ["case", "tree", "eval/min", "evals", "timing", "device work", "idle"]
    headers += [p.value for p in SHOWN]
    rows = []
    for a in arms:
        med = a.get("median_s") or {}
        timing, work = a.get("timing_share"), a.get("device_work_share")
        idle = None if timing is None or work is None else max(1 - timing - work, 0.0)
        rows.append(
            [
                a["case"],
                a["tree"],
                h.fmt(a.get("evaluations_per_minute"), 4),
                a.get("evaluations", "-"),
                _pct(timing),
                _pct(work),
                _pct(idle),
                *(h.fmt(med.get(p.value), 2) if p.value in med else "-" for p in SHOWN),
            ]
        )
    return h.table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="gemm,face_mass", help="comma list: " + ", ".join(CASES))
    p.add_argument("--budget", type=float, default=60.0, help="seconds per arm (default 60)")
    p.add_argument("--device", default=None, help="tune --device (default: tune's choice)")
    p.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=SITE",
        help="run every case again with SITE first on PYTHONPATH (another tunefleet)",
    )
    p.add_argument("--rounds", type=int, default=1, help="repeat the set, trees interleaved")
    p.add_argument("--quick", action="store_true", help="small sizes: a run on a CPU device")
    p.add_argument("--out", default=None, help="JSON file or folder")
    args = p.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        p.error(f"--cases {','.join(unknown)}: unknown; choose from {', '.join(CASES)}")
    trees: list[tuple[str, str | None]] = []
    for spec in args.tree:
        name, sep, site = spec.partition("=")
        if not sep or not name or not Path(site).is_dir():
            p.error(f"--tree {spec!r}: give NAME=SITE with SITE an existing folder")
        trees.append((name, site))
    trees.append(("current", None))
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: use at least 1")
    info = h.machine()
    print(f"{len(names)} case(s) x {len(trees)} tree(s) x {args.rounds} round(s), "
          f"{args.budget:g} s per arm; load {info['load_average']}", flush=True)  # fmt: skip
    arms: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        for name in names:
            order = trees if round_no % 2 == 0 else list(reversed(trees))
            for tree, site in order:
                arm = run_arm(CASES[name], tree, site, args.budget, args.quick, args.device)
                arm["round"] = round_no
                arms.append(arm)
                print(
                    f"{name} [{tree}]: {h.fmt(arm.get('evaluations_per_minute'), 4)} eval/min,"
                    f" timing {_pct(arm.get('timing_share'))}"
                    + (f"; error: {arm['error']}" if arm.get("error") else ""),
                    flush=True,
                )
    print(report(arms))
    h.write_json(
        "eval_rate",
        {"machine": info, "budget_s": args.budget, "quick": args.quick, "arms": arms},
        args.out,
    )
    return 0 if all(not a.get("error") for a in arms) else 1


if __name__ == "__main__":
    raise SystemExit(main())
