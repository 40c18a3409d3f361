"""Dashboard API: how long each of ``tunefleet dashboard``'s JSON calls takes on a big run.

One synthetic run of ``--trials`` trials (default 20,000: done, invalid, failed, timed out,
some running and pending) with their measurements, finished over ten hours by ``--workers``
workers, is inserted with the administrator's connection in ONE statement (no worker, no
coordinator), beside four small runs. The dashboard is served from this process (the real
``DashboardServer``, its read-only sessions, its connection pool) and every API call and page
is requested ``--repeats`` times over one keep-alive HTTP connection after three warm-ups.
The table shows the median and the 95th percentile per call, the answer's size, whether the
median and p95 are under the 200 ms a page needs to feel responsive, and the ratio to the
baseline of the same run: a static asset (the same HTTP path, no database).

    python benchmarks/dashboard_api.py
    python benchmarks/dashboard_api.py --trials 2000 --repeats 10

Writes ``benchmarks/results/dashboard_api.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import http.client
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tunefleet.dashboard.server import DashboardServer
from tunefleet.dashboard.settings import DashboardSettings
from tunefleet.db.engine import connect

#: What "responsive" means for one API call of the page.
BUDGET_MS = 200.0

# One statement: the workers' device, the workers, the trials (states by position), and a
# measurement for every done trial.
FILL = """
WITH dev AS (
  INSERT INTO tunefleet.device (fingerprint, device_class, platform, vendor, name,
                                driver_version)
  VALUES ('bench-' || %(run)s, 'bench-gpu', 'Bench Platform', 'Bench', 'Bench GPU', '1.0')
  RETURNING id),
wk AS (
  INSERT INTO tunefleet.worker (id, host, pid, device_id, device_class, version, started_at,
                                heartbeat_at)
  SELECT gen_random_uuid(), 'node-' || lpad(g::text, 2, '0'), 1000 + g, dev.id, 'bench-gpu',
         'bench', now() - interval '10 hours', now()
    FROM dev, generate_series(1, %(workers)s) g
  RETURNING id, pid),
ranked AS (SELECT id, row_number() OVER (ORDER BY pid) - 1 AS k FROM wk),
tr AS (
  INSERT INTO tunefleet.trial (run_id, device_class, config, config_hash, state, attempt,
                               lease_owner, lease_expires_at, started_at, finished_at, error,
                               reported)
  SELECT %(run)s, 'bench-gpu', jsonb_build_object('i', g, 'tile', 1 << (g %% 7)),
         md5(g::text),
         s.state, CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END,
         CASE WHEN s.state <> 'pending' THEN ranked.id END,
         CASE WHEN s.state = 'running' THEN now() + interval '1 minute' END,
         CASE WHEN s.state <> 'pending' THEN r.created_at + make_interval(secs => g * %(step)s) END,
         CASE WHEN s.state NOT IN ('pending', 'running')
              THEN r.created_at + make_interval(secs => g * %(step)s + %(step)s * 0.9) END,
         CASE s.state WHEN 'invalid' THEN 'work-group size ' || (64 << (g %% 3)) || ' too large'
                      WHEN 'failed' THEN 'worker lost: evaluation process killed by signal 9'
                      WHEN 'timed_out' THEN 'evaluation exceeded 60 s' END,
         s.state NOT IN ('pending', 'running')
    FROM generate_series(1, %(trials)s) g
    JOIN tunefleet.run r ON r.id = %(run)s
    JOIN ranked ON ranked.k = g %% %(workers)s
    CROSS JOIN LATERAL (SELECT CASE
           WHEN g > %(trials)s - %(pending)s THEN 'pending'
           WHEN g > %(trials)s - %(pending)s - %(running)s THEN 'running'
           WHEN g %% 20 = 1 THEN 'invalid'
           WHEN g %% 50 = 2 THEN 'failed'
           WHEN g %% 97 = 3 THEN 'timed_out'
           ELSE 'done' END AS state) s
  RETURNING id, run_id, attempt, config, config_hash, lease_owner, state)
INSERT INTO tunefleet.measurement (trial_id, run_id, attempt, cache_key, config_hash, problem,
                                   problem_args, config, device_id, worker_id, median_s, min_s,
                                   samples_s, gflops, flop_count, protocol, compile_s, code)
SELECT tr.id, tr.run_id, tr.attempt, r.cache_key, tr.config_hash, r.problem, r.problem_args,
       tr.config, dev.id, tr.lease_owner, x.t, x.t * 0.97, ARRAY[x.t * 0.97, x.t, x.t * 1.02],
       2e9 / x.t / 1e9, 2e9, r.protocol, 0.5, '__kernel void k() { /* ' || tr.id || ' */ }'
  FROM tr JOIN tunefleet.run r ON r.id = tr.run_id
  CROSS JOIN dev
  CROSS JOIN LATERAL (SELECT 1e-3 * (1 + abs(sin(tr.id::float8)) * 20) AS t) x
 WHERE tr.state = 'done'
"""


def fill(conn: Any, trials: int, workers: int, name: str) -> tuple[int, int]:
    run = h.create_synthetic_run(conn, {}, name, device_class="bench-gpu")
    conn.execute(
        "UPDATE tunefleet.run SET created_at = now() - interval '10 hours' WHERE id = %s", (run,)
    )
    conn.execute(
        FILL,
        {
            "run": run,
            "trials": trials,
            "workers": workers,
            "pending": min(50, trials // 10),
            "running": min(workers, trials // 10),
            "step": 36000.0 / trials,
        },
    )
    row = conn.execute(
        "SELECT max(trial_id) AS t FROM tunefleet.results WHERE run_id = %s AND state = 'done'",
        (run,),
    ).fetchone()
    return run, int(row["t"])


def timed(conn: http.client.HTTPConnection, path: str, repeats: int) -> dict[str, Any]:
    times, size = [], 0
    for i in range(3 + repeats):
        start = time.perf_counter()
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        took = (time.perf_counter() - start) * 1000
        if r.status != 200:
            raise SystemExit(f"GET {path}: {r.status} {body[:300]!r}")
        size = len(body)
        if i >= 3:
            times.append(took)
    return {
        "median_ms": h.quantile(times, 0.5),
        "p95_ms": h.quantile(times, 0.95),
        "max_ms": max(times),
        "bytes": size,
        "n": len(times),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", help="PostgreSQL URL (default: a private embedded server)")
    p.add_argument("--trials", type=int, default=20_000, help="trials of the big run")
    p.add_argument("--workers", type=int, default=16, help="workers that served it")
    p.add_argument("--repeats", type=int, default=30, help="timed requests per call")
    p.add_argument("--out", help="JSON file or folder (default benchmarks/results/)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    with h.database(args.db) as url:
        with connect(url) as conn:
            for k in range(4):
                fill(conn, 100, 2, f"dashboard-small-{k}")
            t0 = time.monotonic()
            run, trial = fill(conn, args.trials, args.workers, "dashboard-big")
            fill_s = time.monotonic() - t0
            conn.execute("ANALYZE")
        print(f"filled run {run} with {args.trials} trials in {fill_s:.1f} s", flush=True)
        server = DashboardServer(DashboardSettings(port=0), lambda: connect(url)).start()
        calls = [
            ("baseline: /static/style.css (no database)", "/static/style.css"),
            ("all runs", "/api/runs"),
            ("one run (the polled summary)", f"/api/runs/{run}"),
            ("best configuration", f"/api/runs/{run}/best"),
            ("speed charts and failures", f"/api/runs/{run}/charts"),
            ("worker timeline", f"/api/runs/{run}/timeline"),
            ("configurations, by GFLOP/s", f"/api/runs/{run}/trials"),
            (
                "configurations, by median, page 200",
                f"/api/runs/{run}/trials?sort=median_s&order=asc&offset=10000&limit=50",
            ),
            ("one trial with code", f"/api/runs/{run}/trials/{trial}"),
            ("fleet", "/api/fleet"),
            ("page /runs/RUN (checks the run)", f"/runs/{run}"),
        ]
        results = []
        try:
            http_conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            for label, path in calls:
                r = timed(http_conn, path, args.repeats)
                results.append({"call": label, "path": path, **r})
                print(f"  {label}: median {r['median_ms']:.1f} ms", flush=True)
            http_conn.close()
        finally:
            server.close()
        version = h.server_version(url)
    base = results[0]["median_ms"]
    for r in results:
        r["vs_baseline"] = r["median_ms"] / base if base > 0 else None
        r["under_budget"] = r["p95_ms"] < BUDGET_MS
    rows = [
        [
            r["call"],
            h.fmt(r["median_ms"], 1),
            h.fmt(r["p95_ms"], 1),
            f"{r['bytes']:,}",
            h.fmt(r["vs_baseline"], 1),
            "yes" if r["under_budget"] else "NO",
        ]
        for r in results
    ]
    print()
    print(
        f"Dashboard API on a run of {args.trials:,} trials ({args.workers} workers), "
        f"{args.repeats} requests each, PostgreSQL {version}:"
    )
    print(
        h.table(
            ["call", "median ms", "p95 ms", "bytes", "x baseline", f"p95 < {BUDGET_MS:g} ms"], rows
        )
    )
    slow = [r["call"] for r in results if not r["under_budget"]]
    print("every call under budget" if not slow else f"over budget: {', '.join(slow)}")
    data = {
        "benchmark": "dashboard_api",
        "trials": args.trials,
        "workers": args.workers,
        "repeats": args.repeats,
        "budget_ms": BUDGET_MS,
        "fill_s": fill_s,
        "postgres": version,
        "machine": h.machine(),
        "calls": results,
        "all_under_budget": not slow,
        "elapsed": h.elapsed(started),
    }
    h.write_json("dashboard_api", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
