"""Dashboard page load: how long a run's page takes to be drawn in a real browser, with the
parameter-importance views, on a run of ``--trials`` finished trials (default 10,000).

The run (a GEMM-like space of ten parameters, 5 % invalid, 1 % timed out, the rest measured;
:mod:`tests.helpers.importance_fill`) is inserted in three statements beside a second run of
the same cache key. The dashboard is served from this process (the real ``DashboardServer``)
and Debian's headless Chromium opens the run's page ``--repeats`` times, each in a fresh tab
after two warm-ups: the time is from the navigation's start to the page's own mark that
everything is drawn (``performance.mark("tunefleet-ready")``, set once the counts, best,
speed charts, worker timeline, configuration table and importance views are in the page).
Then each API call behind the importance views is timed alone over one keep-alive HTTP
connection, the forest's first fit apart from the answers given again while the trials are
unchanged.

    python benchmarks/dashboard_page.py
    python benchmarks/dashboard_page.py --trials 2000 --repeats 5

Writes ``benchmarks/results/dashboard_page.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tests.helpers.browser import CHROMIUM, Chromium
from tests.helpers.importance_fill import insert_run, wide_trials
from tunefleet import importance
from tunefleet.dashboard.server import DashboardServer
from tunefleet.dashboard.settings import DashboardSettings
from tunefleet.db.engine import connect
from tunefleet.queries import dashboard as q
from tunefleet.text.output import jsonable

#: What "loads in under a second" means, for the page drawn whole.
BUDGET_MS = 1000.0
READY = (
    "document.body.dataset.ready === '1' && document.querySelector('#importance')"
    " && document.querySelector('#importance').dataset.method === '%s'"
)


def timed(conn: http.client.HTTPConnection, path: str, repeats: int, warm: int) -> dict[str, Any]:
    times, size = [], 0
    for i in range(warm + repeats):
        start = time.perf_counter()
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        took = (time.perf_counter() - start) * 1000
        if r.status != 200:
            raise SystemExit(f"GET {path}: {r.status} {body[:300]!r}")
        size = len(body)
        if i >= warm:
            times.append(took)
    return {
        "median_ms": h.quantile(times, 0.5),
        "p95_ms": h.quantile(times, 0.95),
        "max_ms": max(times),
        "bytes": size,
        "n": len(times),
    }


def page_loads(
    server: DashboardServer, run: int, repeats: int, query: str, method: str, cold: bool
) -> dict[str, Any]:
    """Open the run's page in fresh tabs; milliseconds from navigation to drawn. ``cold``:
    the server forgets its importance reports before each load, so each is computed."""
    port = server.port
    times = []
    with tempfile.TemporaryDirectory(prefix="tf-bench-chromium-") as tmp:
        browser = Chromium(Path(tmp) / "profile", Path(tmp) / "chromium.log")
        try:
            browser.send("Browser.getVersion", timeout=60)
            for i in range(2 + repeats):
                if cold:
                    server.app.importance.clear()
                page = browser.page()
                try:
                    page.goto(f"http://localhost:{port}/runs/{run}{query}")
                    page.wait_for(READY % method, 120, "the run page to be drawn")
                    took = page.evaluate(
                        "performance.getEntriesByName('tunefleet-ready')[0].startTime"
                    )
                    if page.exceptions():
                        raise SystemExit(f"the page threw: {page.exceptions()}")
                finally:
                    page.close()
                if i >= 2:
                    times.append(float(took))
        finally:
            browser.close()
    return {
        "median_ms": h.quantile(times, 0.5),
        "p95_ms": h.quantile(times, 0.95),
        "max_ms": max(times),
        "n": len(times),
    }


def cpu_times(url: str, run: int, repeats: int) -> dict[str, float]:
    """Median CPU milliseconds of this process for each step of one importance answer (the
    server's work is not in it): reading the rows, the analysis, encoding the JSON. On a
    shared machine wall-clock times grow with the load; these do far less."""
    steps: dict[str, list[float]] = {"read": [], "analyse": [], "encode": []}
    with connect(url) as conn:
        for _ in range(repeats):
            c0 = time.process_time()
            rows = q.importance_trials(conn, run)
            c1 = time.process_time()
            rep = importance.report(rows, run_id=run, method="variance")
            c2 = time.process_time()
            json.dumps(jsonable({"importance": rep}), separators=(",", ":"), allow_nan=False)
            c3 = time.process_time()
            for k, a, b in (("read", c0, c1), ("analyse", c1, c2), ("encode", c2, c3)):
                steps[k].append(1000 * (b - a))
    return {k: h.quantile(v, 0.5) for k, v in steps.items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", help="PostgreSQL URL (default: a private embedded server)")
    p.add_argument("--trials", type=int, default=10_000, help="finished trials of the run")
    p.add_argument("--repeats", type=int, default=10, help="page loads and requests per call")
    p.add_argument("--out", help="JSON file or folder (default benchmarks/results/)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is not installed (Debian: apt-get install chromium)")
    started = time.monotonic()
    with h.database(args.db) as url:
        with connect(url) as conn:
            t0 = time.monotonic()
            trials = wide_trials(args.trials, seed=1)
            run = insert_run(conn, trials, name="page-big", problem_args={"n": 256})
            insert_run(
                conn, trials[: args.trials // 10], name="page-again", problem_args={"n": 256}
            )
            fill_s = time.monotonic() - t0
            conn.execute("ANALYZE")
        print(f"filled run {run} with {args.trials} trials in {fill_s:.1f} s", flush=True)
        server = DashboardServer(DashboardSettings(port=0), lambda: connect(url)).start()
        try:
            loads = [
                ("run page, importance computed for the load (cold)", "", "variance", True),
                ("run page, importance kept (run unchanged since)", "", "variance", False),
                ("run page, forest asked for in the address (kept)", "?method=forest", "forest",
                 False),
            ]  # fmt: skip
            page_rows = []
            for label, query, method, cold in loads:
                r = page_loads(server, run, args.repeats, query, method, cold)
                page_rows.append({"load": label, "query": query, **r})
                print(f"  {label}: median {r['median_ms']:.0f} ms", flush=True)
            calls = [
                ("importance, variance (kept)", f"/api/runs/{run}/importance", 2),
                ("importance, variance, every run of the key (kept)",
                 f"/api/runs/{run}/importance?scope=key", 2),
                ("importance, forest (kept)", f"/api/runs/{run}/importance?method=forest", 1),
                ("speed charts (for comparison)", f"/api/runs/{run}/charts", 2),
            ]  # fmt: skip
            http_conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
            # The forest's first fit on these trials (the page loads above already fitted it
            # for scope=run; scope=key is fitted here, once).
            first_fit = timed(
                http_conn, f"/api/runs/{run}/importance?method=forest&scope=key&top=11", 1, 0
            )
            cold = []
            for _ in range(args.repeats):
                server.app.importance.clear()
                cold.append(timed(http_conn, f"/api/runs/{run}/importance", 1, 0)["median_ms"])
            call_rows = [
                {
                    "call": "importance, variance, computed (cold)",
                    "median_ms": h.quantile(cold, 0.5),
                    "p95_ms": h.quantile(cold, 0.95),
                    "max_ms": max(cold),
                    "bytes": first_fit["bytes"],
                    "n": len(cold),
                },
                {"call": "importance, forest, first fit (every run of the key)", **first_fit},
            ]
            for label, path, warm in calls:
                r = timed(http_conn, path, args.repeats, warm)
                call_rows.append({"call": label, "path": path, **r})
                print(f"  {label}: median {r['median_ms']:.1f} ms", flush=True)
            http_conn.close()
        finally:
            server.close()
        cpu = cpu_times(url, run, args.repeats)
        version = h.server_version(url)
    for r in page_rows:
        r["under_budget"] = r["p95_ms"] < BUDGET_MS
    print()
    print(
        f"Run page with parameter importance, {args.trials:,} finished trials, "
        f"{args.repeats} loads each in headless Chromium, PostgreSQL {version}:"
    )
    print(
        h.table(
            ["page load", "median ms", "p95 ms", "max ms", f"p95 < {BUDGET_MS:g} ms"],
            [
                [r["load"], h.fmt(r["median_ms"], 0), h.fmt(r["p95_ms"], 0),
                 h.fmt(r["max_ms"], 0), "yes" if r["under_budget"] else "NO"]
                for r in page_rows
            ],
        )
    )  # fmt: skip
    print()
    print(
        h.table(
            ["call", "median ms", "p95 ms", "bytes", "n"],
            [
                [r["call"], h.fmt(r["median_ms"], 1), h.fmt(r["p95_ms"], 1),
                 f"{r['bytes']:,}", r["n"]]
                for r in call_rows
            ],
        )
    )  # fmt: skip
    print()
    print(
        "CPU time of one importance answer in this process (ms, median): "
        + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items())
        + f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    data = {
        "benchmark": "dashboard_page",
        "importance_cpu_ms": cpu,
        "trials": args.trials,
        "repeats": args.repeats,
        "budget_ms": BUDGET_MS,
        "fill_s": fill_s,
        "postgres": version,
        "machine": h.machine(),
        "page_loads": page_rows,
        "calls": call_rows,
        "all_under_budget": all(r["under_budget"] for r in page_rows),
        "elapsed": h.elapsed(started),
    }
    h.write_json("dashboard_page", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
