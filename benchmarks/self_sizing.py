"""Defaults against hand-set sizing: does a worker that sizes itself deliver what the best
flags do? Each arm is one ``tunefleet tune`` run, as a user types it, on a fresh embedded
server (so no arm answers another's configurations from the cache), one after the other.

Suites (``--suite``):

``cpu``  this machine (PoCL or the host pseudo-device):
         ``synthetic-codegen``: the synthetic problem with ``prepare_duration`` 0.5 s and
         ``duration`` 0.01 s (code generation 50x the device time) for ``--budget`` seconds,
         defaults against the sizing every worker had before it sized itself
         (``--prepare-workers 1 --prefetch 1``); target ratio >= 1.6.
         ``readme-gemm``: the README main job, ``tunefleet tune gemm --size m=256,n=256,k=256
         --max-trials 20``, same two arms: wall time of the command (target: no slower).
``gpu``  one GPU node, back to back: the built-in ``face_mass`` (float64), feinsum's shipped
         ``ifj_fe_fej_to_ei.py`` space (the batched face-mass einsum, 4 fields, 100000
         elements) and GEMM float32 n = m = k = 4096, each for ``--budget`` seconds with
         defaults and with the best hand-set flags known (``--prefetch 8 --prepare-workers
         12``); target: defaults >= 0.9x the hand-set evaluations per minute, best kernel no
         worse. The feinsum case is skipped (and says why) where feinsum cannot be imported.

``--quick`` shrinks every case (tiny budgets and sizes) to check that the script itself runs,
e.g. on PoCL: ``python benchmarks/self_sizing.py --suite gpu --quick``.
``--max-trials N`` ends every arm after N trials instead of a wall budget (the suite's smoke
test: it finishes however loaded the machine is).

``--same-configs`` makes the comparison fair where the search's path decides the time (the
README job: one slow configuration, a timed-out one, can cost more than any sizing saves).
The defaults arm searches as usual; then both sizings measure exactly the configurations it
searched, in its order, as seed configurations (``--seed-config``, ``--max-trials`` their
number): "today (same configs)" and "defaults (same configs)". The ratio of those two is the
fair one; the search arm is reported beside them. ``--configs-from JSON`` replays the
search of an earlier ``--same-configs`` run instead of searching again.

Prints one table (evaluations per minute, ratio defaults / other arm, best GFLOP/s, the
sizing each worker ended with and its device busy fraction) and writes
``self_sizing_<suite>.json`` (with the machine's load) to ``--out``, else ``$OUT``, else
``benchmarks/results``.

    python benchmarks/self_sizing.py --suite cpu --budget 40
    python benchmarks/self_sizing.py --suite gpu --out results/
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tunefleet.db.engine import connect

#: The flags every worker ran with before it sized itself.
TODAY = ("--prepare-workers", "1", "--prefetch", "1")
#: The best hand-set flags found on a 16-core H200 node.
BEST = ("--prefetch", "8", "--prepare-workers", "12")
FEINSUM_SPACE = "ifj_fe_fej_to_ei.py"


@dataclass(frozen=True)
class Case:
    """One problem tuned twice: with defaults, and with ``other`` flags."""

    name: str
    problem_argv: tuple[str, ...]
    other_label: str
    other: tuple[str, ...]
    #: A budget of trials instead of seconds (the README job); ``None``: ``--budget``.
    max_trials: int | None = None
    needs: str | None = None  # a module the case needs (skipped without it)
    quick_argv: tuple[str, ...] | None = None


def feinsum_argv(elements: int) -> tuple[str, ...]:
    return (
        "feinsum", "--arg", f"space=feinsum:{FEINSUM_SPACE}", "--arg", "einsum=ifj,fe,fej->ei",
        "--size", "i=35,f=4,j=15", "--arg", "batch=4", "--arg", "operands=L,J,v*",
        "--size", f"long_dim_length={elements}", "--dtype", "float64",
    )  # fmt: skip


SUITES: dict[str, tuple[Case, ...]] = {
    "cpu": (
        Case(
            "synthetic-codegen",
            ("synthetic", "--arg", "prepare_duration=0.5", "--arg", "duration=0.01"),
            "today",
            TODAY,
        ),
        Case(
            "readme-gemm",
            ("gemm", "--size", "m=256,n=256,k=256"),
            "today",
            TODAY,
            max_trials=20,
            quick_argv=("gemm", "--size", "m=64,n=64,k=64"),
        ),
    ),
    "gpu": (
        Case(
            "face_mass",
            ("face_mass", "--dtype", "float64"),
            "best",
            BEST,
            quick_argv=("face_mass", "--dtype", "float64", "--size", "n_elements=1024"),
        ),
        Case(
            "feinsum",
            feinsum_argv(100_000),
            "best",
            BEST,
            needs="feinsum",
            quick_argv=feinsum_argv(512),
        ),
        Case(
            "gemm-4096",
            ("gemm", "--size", "n=4096,m=4096,k=4096", "--dtype", "float32"),
            "best",
            BEST,
            quick_argv=("gemm", "--size", "n=128,m=128,k=128", "--dtype", "float32"),
        ),
    ),
}


@dataclass
class Arm:
    case: str
    label: str
    argv: list[str]
    out: dict[str, Any] = field(default_factory=dict)
    #: Its search configurations seed the replay arms (``--same-configs``).
    capture: bool = False
    #: The configurations its run measured, in trial order (also in the JSON: ``configs``).
    configs: list[dict[str, Any]] = field(default_factory=list)


tunefleet = h.tunefleet


def run_arm(arm: Arm, budget: float, max_trials: int | None, device: str | None) -> None:
    """One ``tunefleet tune`` on a fresh embedded server; the numbers go to ``arm.out``."""
    home = Path(tempfile.mkdtemp(prefix=f"tunefleet-sizing-{arm.case}-"))
    env = dict(os.environ, TUNEFLEET_HOME=str(home), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(h.ROOT), env.get("PYTHONPATH")) if p)
    env.pop("TUNEFLEET_DATABASE_URL", None)
    argv = ["tune", *arm.argv, "--progress-every", "15", "--name", f"{arm.case} {arm.label}"]
    argv += ["--max-trials", str(max_trials)] if max_trials else ["--max-time", f"{budget:g}"]
    if device is not None:
        argv += ["--device", device]
    arm.out.update({"argv": argv})
    try:
        started = tunefleet(env, "db", "start", timeout=180)
        if started.returncode != 0:
            arm.out["error"] = started.stderr.strip()[-500:]
            return
        url = tunefleet(env, "db", "url", timeout=60).stdout.strip()
        t0 = time.perf_counter()
        proc = tunefleet(env, *argv, timeout=(budget if not max_trials else 900) + 300)
        arm.out["wall_s"] = time.perf_counter() - t0
        arm.out["exit"] = proc.returncode
        found = re.search(r"^(?:tuning|resuming) run (\d+)", proc.stdout, re.MULTILINE)
        if not found:
            arm.out["error"] = (proc.stderr.strip().splitlines() or ["no run started"])[-1]
            return
        arm.out.update(run_numbers(url, int(found.group(1))))
        arm.configs = search_configs(url, int(found.group(1)))
        arm.out["configs"] = arm.configs
        if proc.returncode != 0:
            arm.out["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
    except subprocess.TimeoutExpired as exc:
        arm.out["error"] = f"timed out after {exc.timeout:.0f} s"
    finally:
        tunefleet(env, "db", "stop", timeout=120)
        shutil.rmtree(home, ignore_errors=True)


def run_numbers(url: str, run_id: int) -> dict[str, Any]:
    with connect(url) as conn:
        p = conn.execute(
            "SELECT done, invalid, failed, timed_out, cached, best_gflops,"
            " extract(epoch FROM elapsed)::float8 AS elapsed_s, evaluations_per_minute"
            " FROM tunefleet.run_progress WHERE run_id = %s",
            (run_id,),
        ).fetchone()
        workers = conn.execute(
            "SELECT prepare_workers, prefetch, sizing, device_busy FROM tunefleet.worker"
            " ORDER BY started_at"
        ).fetchall()
    assert p is not None
    evaluations = sum(int(p[k]) for k in ("done", "invalid", "failed", "timed_out"))
    return {
        "run_id": run_id,
        "evaluations": evaluations,
        "states": {k: int(p[k]) for k in ("done", "invalid", "failed", "timed_out", "cached")},
        "elapsed_s": float(p["elapsed_s"]),
        "evaluations_per_minute": float(p["evaluations_per_minute"]),
        "best_gflops": None if p["best_gflops"] is None else float(p["best_gflops"]),
        "workers": [dict(w) for w in workers],
    }


def search_configs(url: str, run_id: int) -> list[dict[str, Any]]:
    """The configurations the run's search measured, first trial first: not its
    confirmations (re-measurements of the best), nor the trials its stop cancelled, nor
    those the coordinator refused without a worker (a constraint of the space says invalid;
    as seed configurations they would be refused as bad input)."""
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT config FROM tunefleet.trial t WHERE run_id = %s AND purpose = 'search'"
            " AND state IN ('done', 'invalid', 'failed', 'timed_out')"
            " AND EXISTS (SELECT 1 FROM tunefleet.attempt a WHERE a.trial_id = t.id)"
            " ORDER BY id",
            (run_id,),
        ).fetchall()
    return [dict(r["config"]) for r in rows]


def earlier_search(path: Path, case: str) -> Arm:
    """The search arm of an earlier ``--same-configs`` run of ``case``, from its JSON."""
    earlier = json.loads(path.read_text())
    for entry in earlier.get("cases", []):
        if entry.get("case") == case and entry.get("search", {}).get("configs"):
            out = dict(entry["search"])
            return Arm(case, "defaults", out.get("argv", []), out=out, configs=out["configs"])
    raise SystemExit(f"--configs-from {path}: no searched configurations of case {case!r}")


def replay_arms(
    case: str,
    problem: list[str],
    other_label: str,
    other: tuple[str, ...],
    configs: list[dict[str, Any]],
    folder: Path,
) -> list[Arm]:
    """Both sizings over exactly ``configs``: the other arm first, defaults last (a machine
    that warms up or slows down over the runs then works against defaults, not for them)."""
    seeds = folder / f"{case}-configs.json"
    seeds.write_text(json.dumps(configs))
    replay = ["--seed-config", str(seeds)]
    return [
        Arm(case, f"{other_label} (same configs)", [*problem, *other, *replay]),
        Arm(case, "defaults (same configs)", [*problem, *replay]),
    ]  # fmt: skip


def sizing_text(out: dict[str, Any]) -> str:
    ws = out.get("workers") or []
    return ", ".join(
        f"{w['prepare_workers']}/{w['prefetch']} {w['sizing']}"
        + (f" busy {100 * w['device_busy']:.0f}%" if w.get("device_busy") is not None else "")
        for w in ws
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=sorted(SUITES), default="cpu")
    p.add_argument("--budget", type=float, default=None, help="seconds per arm (cpu 40, gpu 60)")
    p.add_argument("--cases", default=None, help="comma list of case names (default: all)")
    p.add_argument("--device", default=None, help="tune --device (default: tune's choice)")
    p.add_argument("--quick", action="store_true", help="tiny budgets and sizes: a smoke run")
    p.add_argument(
        "--max-trials",
        type=int,
        default=None,
        help="end every arm after this many trials instead of a wall budget (a smoke run "
        "that finishes on a loaded machine too)",
    )
    p.add_argument(
        "--same-configs",
        action="store_true",
        help="then measure the defaults arm's configurations again with both sizings (the "
        "fair comparison where the search's path decides the time)",
    )
    p.add_argument(
        "--configs-from",
        default=None,
        metavar="JSON",
        help="with --same-configs: replay the search arm's configurations of this earlier "
        "self_sizing JSON instead of searching again (one case)",
    )
    p.add_argument("--out", default=None, help="JSON file or folder")
    args = p.parse_args(argv)
    if args.configs_from and not args.same_configs:
        p.error("--configs-from replays an earlier search: add --same-configs")
    if args.max_trials is not None and args.max_trials < 1:
        p.error(f"--max-trials {args.max_trials}: use a positive number of trials")
    budget = args.budget or (20.0 if args.quick else 40.0 if args.suite == "cpu" else 60.0)
    cases = [c for c in SUITES[args.suite] if not args.cases or c.name in args.cases.split(",")]
    info = h.machine()
    load = info["load_average"]
    print(f"suite {args.suite}: {len(cases)} case(s), {budget:g} s per arm; load {load}")
    results: list[dict[str, Any]] = []
    for case in cases:
        entry: dict[str, Any] = {"case": case.name, "other": case.other_label}
        if case.needs:
            try:
                __import__(case.needs)
            except Exception as exc:
                entry["skipped"] = f"{case.needs} cannot be imported here: {exc!r}"
                print(f"{case.name}: skipped ({entry['skipped']})", flush=True)
                results.append(entry)
                continue
        problem = list(case.quick_argv if args.quick and case.quick_argv else case.problem_argv)
        max_trials = (3 if args.quick else case.max_trials) if case.max_trials else None
        if args.max_trials is not None:
            max_trials = args.max_trials
        arms = [Arm(case.name, "defaults", problem, capture=args.same_configs)]
        if not args.same_configs:
            arms.append(Arm(case.name, case.other_label, [*problem, *case.other]))
        with tempfile.TemporaryDirectory(prefix="tunefleet-sizing-configs-") as tmp:
            scratch = Path(tmp)
            if args.configs_from:
                arms[0] = earlier_search(Path(args.configs_from), case.name)
                arms += replay_arms(case.name, problem, case.other_label, case.other,
                                    arms[0].configs, scratch)  # fmt: skip
                entry["search_configs"] = len(arms[0].configs)
                entry["defaults"] = arms[0].out
                entry["search_from"] = args.configs_from
            for arm in arms[1:] if args.configs_from else arms:
                trials = max_trials
                if arm.label.endswith("(same configs)"):
                    trials = len(arms[0].configs)
                print(f"{case.name} / {arm.label}: tunefleet {' '.join(arm.argv)}", flush=True)
                run_arm(arm, budget, trials, args.device)
                if arm.capture:
                    if arm.configs:
                        arms += replay_arms(case.name, problem, case.other_label, case.other,
                                            arm.configs, scratch)  # fmt: skip
                    # The search's own row, beside the fair pair (same JSON key as without
                    # --same-configs, so the table reads the same).
                    entry["search_configs"] = len(arm.configs)
                o = arm.out
                print(
                    f"  {o.get('evaluations', '-')} evaluations, "
                    f"{h.fmt(o.get('evaluations_per_minute'), 1)}/min, "
                    f"wall {h.fmt(o.get('wall_s'), 1)} s,"
                    f" best {h.fmt(o.get('best_gflops'), 1)} GFLOP/s; sizing {sizing_text(o)}"
                    + (f"; error: {o['error']}" if o.get("error") else ""),
                    flush=True,
                )
                entry[arm.label] = o
        if args.same_configs:
            # The fair pair replaces the plain comparison: same configurations, both sizings.
            entry["search"] = entry.pop("defaults")
            entry["defaults"] = entry.pop("defaults (same configs)", {"error": "no replay"})
            entry["other"] = f"{case.other_label} (same configs)"
            entry.setdefault(entry["other"], {"error": "no replay"})
        d, o = entry["defaults"], entry[entry["other"]]
        if d.get("evaluations_per_minute") and o.get("evaluations_per_minute"):
            entry["rate_ratio"] = d["evaluations_per_minute"] / o["evaluations_per_minute"]
        if d.get("wall_s") and o.get("wall_s"):
            entry["wall_ratio"] = d["wall_s"] / o["wall_s"]
        results.append(entry)

    rows = []
    for e in results:
        if "skipped" in e:
            rows.append([e["case"], "skipped", "-", "-", "-", "-", "-", "-"])
            continue
        d, o = e["defaults"], e[e["other"]]
        rows.append(
            [
                e["case"],
                e["other"],
                h.fmt(d.get("evaluations_per_minute"), 1),
                h.fmt(o.get("evaluations_per_minute"), 1),
                h.fmt(e.get("rate_ratio"), 2),
                f"{h.fmt(d.get('wall_s'), 1)} / {h.fmt(o.get('wall_s'), 1)}",
                f"{h.fmt(d.get('best_gflops'), 1)} / {h.fmt(o.get('best_gflops'), 1)}",
                sizing_text(d) or "-",
            ]
        )
        if "search" in e:
            sr = e["search"]
            rows.append(
                [
                    e["case"],
                    f"(the search: {e['search_configs']} configs)",
                    h.fmt(sr.get("evaluations_per_minute"), 1),
                    "-",
                    "-",
                    h.fmt(sr.get("wall_s"), 1),
                    h.fmt(sr.get("best_gflops"), 1),
                    sizing_text(sr) or "-",
                ]
            )
    print()
    print(
        h.table(
            [
                "case",
                "vs",
                "defaults eval/min",
                "vs eval/min",
                "ratio",
                "wall s (d / vs)",
                "best GFLOP/s (d / vs)",
                "defaults sizing (pool/prefetch)",
            ],
            rows,
        )
    )
    data = {
        "suite": args.suite,
        "budget_s": budget,
        "max_trials": args.max_trials,
        "same_configs": args.same_configs,
        "quick": args.quick,
        "machine": info,
    }
    data["cases"] = results
    data["load_average_after"] = os.getloadavg()
    h.write_json(f"self_sizing_{args.suite}", data, args.out or os.environ.get("OUT"))
    failed = [e["case"] for e in results if "skipped" not in e and (
        e["defaults"].get("error") or e[e["other"]].get("error")
        or e.get("search", {}).get("error"))]  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    # Each arm's embedded server is a daemon: a SIGTERM must unwind to its `db stop`.
    with h.sigterm_unwinds():
        sys.exit(main())
