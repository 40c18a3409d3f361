"""Does ``--max-time`` hold? Each case is one ``tunefleet tune synthetic --max-time B`` as a new
user types it, timed from the shell's side (the command's start to its exit), on a fresh
embedded server in a temporary home (its first start, initdb included, is inside the budget:
the clock starts when ``tune`` starts), or on ``--db``. The synthetic problem's
``prepare_duration`` (code generation) and ``duration`` (device time) are real seconds, so a
budget ends with trials in flight.

Prints one table (budget, wall time, ``(wall - budget) / budget``, trials, confirmations,
what the budget cut) and writes ``budget_overrun.json`` (with the machine's load) to
``--out``, else ``$OUT``, else ``benchmarks/results``.

    python benchmarks/budget_overrun.py                      # budgets 15, 30, 60 s; 4 s + 2 s
    python benchmarks/budget_overrun.py --budgets 30 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tunefleet.db.engine import connect


def tune_once(budget: float, prepare: float, duration: float, db: str | None) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="tunefleet-budget-"))
    env = dict(os.environ, TUNEFLEET_HOME=str(home), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(h.ROOT), env.get("PYTHONPATH")) if p)
    env.pop("TUNEFLEET_DATABASE_URL", None)
    argv = [sys.executable, "-m", "tunefleet", "tune", "synthetic"]
    argv += ["--arg", f"prepare_duration={prepare:g}", "--arg", f"duration={duration:g}"]
    argv += ["--max-time", f"{budget:g}", "--progress-every", "60"]
    if db is not None:
        argv += ["--db", db]
    out: dict[str, Any] = {"budget_s": budget, "argv": argv[2:]}
    try:
        t0 = time.perf_counter()
        proc = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=budget * 3 + 120,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        out["wall_s"] = time.perf_counter() - t0
        out["overrun"] = (out["wall_s"] - budget) / budget
        out["exit"] = proc.returncode
        cut = re.search(r"^stopped at the .* budget: .*$", proc.stdout, re.MULTILINE)
        out["cut"] = cut.group(0) if cut else None
        found = re.search(r"^tuning run (\d+)", proc.stdout, re.MULTILINE)
        if proc.returncode != 0 or not found:
            out["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
        else:
            out.update(_counts(db or _url(env), int(found.group(1))))
    except subprocess.TimeoutExpired as exc:
        out["error"] = f"timed out after {exc.timeout:.0f} s"
    finally:
        if db is None:
            subprocess.run(
                [sys.executable, "-m", "tunefleet", "db", "stop"], env=env, capture_output=True,
                timeout=120, check=False, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        shutil.rmtree(home, ignore_errors=True)
    return out


def _url(env: dict[str, str]) -> str:
    return subprocess.run(
        [sys.executable, "-m", "tunefleet", "db", "url"], env=env, capture_output=True,
        text=True, timeout=60, check=True, stdin=subprocess.DEVNULL,
    ).stdout.strip()  # fmt: skip


def _counts(url: str, run_id: int) -> dict[str, Any]:
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT purpose, state, count(*) AS n FROM tunefleet.trial WHERE run_id = %s"
            " GROUP BY purpose, state",
            (run_id,),
        ).fetchall()
    counts = {f"{r['purpose']}_{r['state']}": int(r["n"]) for r in rows}
    return {
        "search_done": counts.get("search_done", 0),
        "confirmed": counts.get("confirm_done", 0),
        "cancelled": counts.get("search_cancelled", 0) + counts.get("confirm_cancelled", 0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default="15,30,60", help="comma-separated --max-time values")
    ap.add_argument("--prepare-duration", type=float, default=4.0, help="code generation, s")
    ap.add_argument("--duration", type=float, default=2.0, help="device time per trial, s")
    ap.add_argument("--repeat", type=int, default=1, help="runs per budget")
    ap.add_argument("--db", default=None, help="run against this database (default: fresh ones)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="JSON file or folder")
    args = ap.parse_args()
    budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
    started = time.monotonic()
    cases = []
    for budget in budgets:
        for i in range(args.repeat):
            case = tune_once(budget, args.prepare_duration, args.duration, args.db)
            case["repeat"] = i
            cases.append(case)
            print(
                f"[{h.elapsed(started)}] --max-time {budget:g}: "
                f"{h.fmt(case.get('wall_s'))} s, {case.get('error') or case.get('cut') or 'ok'}",
                flush=True,
            )
    rows = [
        [
            f"{c['budget_s']:g}",
            h.fmt(c.get("wall_s")),
            h.fmt(c.get("overrun")),
            c.get("search_done", "-"),
            c.get("confirmed", "-"),
            c.get("error") or c.get("cut") or "nothing",
        ]
        for c in cases
    ]
    headers = ["budget s", "wall s", "(wall - budget) / budget", "trials", "confirmed", "cut"]
    print(h.table(headers, rows))
    h.write_json(
        "budget_overrun",
        {
            "prepare_duration_s": args.prepare_duration,
            "duration_s": args.duration,
            "cases": cases,
            "machine": h.machine(),
        },
        args.out,
    )
    return 0 if all("error" not in c for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
