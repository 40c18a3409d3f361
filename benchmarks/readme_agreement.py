"""Does the README main job's best, as the run quotes it, hold when measured alone?

Issue 51's criterion, measured: for each load condition (``--load quiet``, and ``busy``:
one core kept busy by a spinning process of this script for the whole condition, the
reproductions included) and each of ``--runs`` fresh runs (a fresh ``TUNEFLEET_HOME``: a
fresh embedded database and an empty measurement cache) of the README main job
(``tunefleet tune gemm --size m=256,n=256,k=256 --max-trials 20``, on the machine's CPU
OpenCL device unless ``--device``):

1. **headline**: the run's best is one whose processes agree (``standing`` agrees), or the
   run says plainly that it could not separate its finalists;
2. **spread**: the best's reproduce command, run alone in ``--repeats`` fresh processes
   (default 3), lands within the spread the run printed: the median of those processes is
   within the run's figure ± ``spread_tolerance``, as the line reads, or within where the
   line says to expect it alone when one of the best's own processes or a tenth of their
   launches lay beyond that ± (the range they measured, ``process_range_s``, widened by the
   ±, with the range their launches ran at, ``launch_range_s``: ``landing_range_s``);
3. **top**: each of the ``--top`` best (default 5), measured alone the same way, is within
   ``--tolerance`` (default 15 %) of its in-run figure, or carries the run's own warning
   (its status is not ``confirmed``, its samples stayed noisy, or the run says its figures
   are good to more than ± 15 % only: ``imprecise``).

Beside the verdicts it records what the protocol study needs (docs/protocol.md, *Timing on
a CPU device*): every process's samples (the search's, each confirmation's and each alone
run's) of those configurations, and from them, per estimator (the median of a process's
samples, its 10th percentile, its minimum), how far apart processes of one configuration
measure (the median relative difference of two) and how far the in-run figure is from the
alone one; and what the confirmation cost (its phase's wall time, the shoot-out's extra
processes and their seconds).

Prints tables and writes ``--out`` (JSON). ``--quick`` is a smoke run (one run, a 64-cube
GEMM, three trials, one alone process, top 2). Usage::

    python benchmarks/readme_agreement.py --load quiet --load busy --runs 5

Other load on the machine moves every figure: say so next to the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tunefleet.spread import landing_range
from tunefleet.vocabulary import BestStatus, best_status

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "benchmarks" / "published"
#: How a process's samples become one figure (the study's candidates).
ESTIMATORS: dict[str, Callable[[Sequence[float]], float]] = {
    "median": lambda s: h.quantile(s, 0.5),
    "q10": lambda s: h.quantile(s, 0.1),
    "min": min,
}


def _run(argv: list[str], env: dict[str, str], timeout: float) -> str:
    done = h.tunefleet(env, *argv, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"tunefleet {shlex.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done.stdout


@contextlib.contextmanager
def load(kind: str) -> Iterator[None]:
    """``busy``: one spinning process (one core kept busy) while the block runs."""
    if kind == "quiet":
        yield
        return
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spin.terminate()
        spin.wait(timeout=30)


def alone(command: str, env: dict[str, str], repeats: int) -> list[list[float]]:
    """The samples of ``repeats`` fresh processes of a reproduce command, one after another."""
    words = shlex.split(command)
    if words[:2] != ["tunefleet", "measure"]:
        raise RuntimeError(f"not a reproduce command: {command}")
    out = []
    for _ in range(repeats):
        data = json.loads(_run([*words[1:], "--json"], env, timeout=600))
        if data.get("state") != "done":
            raise RuntimeError(f"{command} ended {data.get('state')}: {data.get('error')}")
        out.append([float(x) for x in data["samples_s"]])
    return out


def in_run_processes(env: dict[str, str], trial_ids: Sequence[int]) -> dict[int, list[dict]]:
    """Every process that timed these search trials in the run: the search's (round 0) and
    each done confirmation's, with its samples and its wall seconds."""
    from tunefleet.db.engine import connect

    url = _run(["db", "url"], env, timeout=120).strip()
    with connect(url) as conn:
        rows = conn.execute(
            """
            SELECT coalesce(t.confirms_trial_id, t.id) AS trial_id,
                   coalesce(t.confirm_round, 0) AS round, m.samples_s AS samples,
                   extract(epoch FROM t.finished_at - t.started_at) AS wall_s
              FROM tunefleet.trial t
              JOIN tunefleet.measurement m ON m.trial_id = t.id
             WHERE t.run_id = 1 AND t.state = 'done'
               AND coalesce(t.confirms_trial_id, t.id) = ANY(%s)
             ORDER BY 1, 2
            """,
            (list(trial_ids),),
        ).fetchall()
        cost = conn.execute(
            """
            SELECT count(*) FILTER (WHERE confirm_round = 1) AS confirmations,
                   count(*) FILTER (WHERE confirm_round > 1) AS shootout,
                   coalesce(sum(extract(epoch FROM finished_at - started_at))
                            FILTER (WHERE confirm_round > 1), 0) AS shootout_s,
                   extract(epoch FROM max(finished_at) - min(created_at)) AS phase_s
              FROM tunefleet.trial WHERE run_id = 1 AND purpose = 'confirm'
            """
        ).fetchone()
    out: dict[int, list[dict]] = {}
    for r in rows:
        out.setdefault(int(r["trial_id"]), []).append(
            {
                "round": int(r["round"]),
                "samples": list(r["samples"]),
                "wall_s": None if r["wall_s"] is None else float(r["wall_s"]),
            }
        )
    assert cost is not None  # an aggregate always returns its row
    out[-1] = [{k: (None if v is None else float(v)) for k, v in dict(cost).items()}]
    return out


def figure(row: dict[str, Any]) -> float:
    """The time a run quotes for a row of ``tunefleet best --json``."""
    for key in ("figure_s", "confirmed_median_s"):
        if row.get(key) is not None and (key == "figure_s" or row.get("confirm_state") == "done"):
            return float(row[key])
    return float(row["median_s"])


def relative(a: float, b: float) -> float:
    return (max(a, b) - min(a, b)) / min(a, b)


def one_run(index: int, condition: str, opts: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"tunefleet-agreement-{index}-") as tmp:
        env = dict(os.environ)
        env["TUNEFLEET_HOME"] = str(Path(tmp) / "home")
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("TUNEFLEET_DATABASE_URL", None)
        size = "m=64,n=64,k=64" if opts.quick else "m=256,n=256,k=256"
        job = ["tune", "gemm", "--size", size, "--max-trials", str(opts.max_trials)]
        if opts.device:
            job += ["--device", opts.device]
        started = time.monotonic()
        try:
            report = _run(job, env, timeout=3600)
            tune_s = time.monotonic() - started
            data = json.loads(_run(["best", "1", "--top", str(opts.top), "--json"], env, 300))
            top = data["best"]
            processes = in_run_processes(env, [int(b["trial_id"]) for b in top])
        finally:
            pgdata = Path(env["TUNEFLEET_HOME"]) / "postgres" / "data"
            if (pgdata / "postmaster.pid").exists():
                from tunefleet.db.embedded import EmbeddedServer

                EmbeddedServer(pgdata).stop()
        rows = []
        for rank, b in enumerate(top, start=1):
            # Each of the top alone: fresh processes, one after another.
            runs = alone(b["reproduce"], env, opts.repeats)
            alone_median = statistics.median(h.quantile(s, 0.5) for s in runs)
            in_run = figure(b)
            # The run's own warning: its status says other than confirmed, its samples stayed
            # noisy, or the run's processes differ too much to quote any figure to 15 %.
            status = best_status(b.get("confirm_state"), b.get("disagrees"), b.get("standing"))
            warned = status != BestStatus.CONFIRMED or bool(b.get("noisy") or b.get("imprecise"))
            ratio = in_run / alone_median
            rows.append(
                {
                    "rank": rank,
                    "trial_id": b["trial_id"],
                    "config": b["config"],
                    "standing": b.get("standing"),
                    "status": str(status),
                    "processes": b.get("processes"),
                    "in_run_s": in_run,
                    "search_median_s": b["median_s"],
                    "alone_medians_s": [h.quantile(s, 0.5) for s in runs],
                    "alone_median_s": alone_median,
                    "ratio": ratio,
                    "warned": warned,
                    "within": abs(ratio - 1.0) <= opts.tolerance,
                    "reproduce": b["reproduce"],
                    "in_run_samples": processes.get(int(b["trial_id"]), []),
                    "alone_samples": runs,
                }
            )
        best = top[0]
        tolerance = best.get("spread_tolerance")
        printed_range = best.get("process_range_s")
        alone_best = rows[0]["alone_median_s"]
        launches = best.get("launch_range_s")
        landing = landing_range(printed_range, tolerance, launches, best.get("figure_s"))
        last = [ln for ln in report.strip().splitlines() if ln.startswith("run 1: best")]
        said_unsettled = "could not separate" in report or "could NOT be separated" in report
        return {
            "condition": condition,
            "run": index,
            "tune_s": tune_s,
            "final_line": last[-1] if last else None,
            "best_line": next((ln for ln in report.splitlines() if ln.startswith("best:")), None),
            "standing": best.get("standing"),
            "spread_tolerance": tolerance,
            "spread_typical": best.get("spread_typical"),
            "spread_within": best.get("spread_within"),
            "unseparated_trial_id": best.get("unseparated_trial_id"),
            "headline_ok": best.get("standing") == "agrees" or said_unsettled,
            "process_range_s": printed_range,
            "launch_range_s": launches,
            "landing_range_s": landing,
            "within_spread": (
                None
                if tolerance is None
                else abs(alone_best / rows[0]["in_run_s"] - 1.0) <= float(tolerance)
                or (landing is not None and landing[0] <= alone_best <= landing[1])
            ),
            "top_ok": all(r["within"] or r["warned"] for r in rows),
            "cost": processes.get(-1, [{}])[0],
            "top": rows,
        }


def study(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per condition and estimator: the median relative difference of two processes of one
    configuration (in-run and alone processes alike) and the worst in-run-over-alone ratio of
    the configurations' estimator medians."""
    out = []
    for condition in sorted({r["condition"] for r in runs}):
        mine = [r for r in runs if r["condition"] == condition]
        for name, est in ESTIMATORS.items():
            pairs, ratios = [], []
            for r in mine:
                for row in r["top"]:
                    inside = [est(p["samples"]) for p in row["in_run_samples"]]
                    outside = [est(s) for s in row["alone_samples"]]
                    values = inside + outside
                    pairs += [relative(a, b) for a, b in itertools.combinations(values, 2)]
                    if inside and outside:
                        ratios.append(statistics.median(inside) / statistics.median(outside))
            out.append(
                {
                    "condition": condition,
                    "estimator": name,
                    "pairs": len(pairs),
                    "typical_between_process": h.quantile(pairs, 0.5) if pairs else None,
                    "p90_between_process": h.quantile(pairs, 0.9) if pairs else None,
                    "worst_in_run_over_alone": max(ratios, key=lambda x: abs(x - 1), default=None),
                }
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", action="append", choices=("quiet", "busy"), default=None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--max-trials", type=int, default=20)
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--device", default=None, help="device pattern (default: tune's default)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 run, 64-cube, 3 trials")
    ap.add_argument("--out", type=Path, default=PUBLISHED / "readme_agreement.json")
    opts = ap.parse_args()
    conditions = opts.load or ["quiet"]
    if opts.quick:
        opts.runs, opts.repeats, opts.top, opts.max_trials = 1, 1, 2, 3
    info = h.machine()

    runs = []
    for condition in conditions:
        with load(condition):
            for i in range(1, opts.runs + 1):
                r = one_run(i, condition, opts)
                runs.append(r)
                print(
                    f"{condition} run {i}: {r['tune_s']:.0f} s; {r['final_line']}",
                    flush=True,
                )
    print()
    print(
        h.table(
            ["load", "run", "tune s", "best", "standing", "±", "alone/in", "headline", "spread",
             "top", "shoot-out", "shoot-out s", "confirm s"],
            [
                [
                    r["condition"], r["run"], h.fmt(r["tune_s"], 0), r["top"][0]["trial_id"],
                    r["standing"] or "-",
                    "-" if r["spread_tolerance"] is None else f"{100 * r['spread_tolerance']:.0f}%",
                    h.fmt(1 / r["top"][0]["ratio"]), "ok" if r["headline_ok"] else "NO",
                    {None: "-", True: "ok", False: "NO"}[r["within_spread"]],
                    "ok" if r["top_ok"] else "NO", h.fmt(r["cost"].get("shootout"), 0),
                    h.fmt(r["cost"].get("shootout_s"), 1), h.fmt(r["cost"].get("phase_s"), 1),
                ]
                for r in runs
            ],
        )
    )  # fmt: skip
    print()
    print(
        h.table(
            ["load", "run", "rank", "trial", "standing", "in run ms", "alone ms", "ratio", "ok"],
            [
                [
                    r["condition"], r["run"], t["rank"], t["trial_id"], t["standing"] or "-",
                    h.fmt(1e3 * t["in_run_s"]), h.fmt(1e3 * t["alone_median_s"]),
                    h.fmt(t["ratio"]),
                    "ok" if t["within"] else ("warned" if t["warned"] else "NO"),
                ]
                for r in runs
                for t in r["top"]
            ],
        )
    )  # fmt: skip
    estimators = study(runs)
    print()
    print(
        h.table(
            ["load", "estimator", "pairs", "typical diff", "p90 diff", "worst in/alone"],
            [
                [
                    e["condition"], e["estimator"], e["pairs"],
                    h.fmt(e["typical_between_process"]), h.fmt(e["p90_between_process"]),
                    h.fmt(e["worst_in_run_over_alone"]),
                ]
                for e in estimators
            ],
        )
    )  # fmt: skip
    passed = all(r["headline_ok"] and r["within_spread"] is not False and r["top_ok"] for r in runs)
    print(f"\n{'every run meets' if passed else 'NOT every run meets'} issue 51's criterion")
    result = {
        "benchmark": "readme_agreement",
        "job": f"tunefleet tune gemm --size m=256,n=256,k=256 --max-trials {opts.max_trials}",
        "quick": opts.quick,
        "conditions": conditions,
        "tolerance": opts.tolerance,
        "repeats": opts.repeats,
        "top": opts.top,
        "cores": len(os.sched_getaffinity(0)),
        "machine": info,
        "runs": runs,
        "estimators": estimators,
        "passed": passed,
    }
    h.write_json("readme_agreement", result, opts.out)
    return 0 if passed or opts.quick else 1


if __name__ == "__main__":
    raise SystemExit(main())
