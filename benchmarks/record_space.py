"""Record a problem's search space on a real device: the data that ``tunefleet replay`` replays.

Runs ``tunefleet tune`` once per phase (a technique and a number of seconds; ``PureRandom``
samples the space uniformly, the other techniques add what real searches visit) against one
database, so every phase shares the measurement cache: a configuration is measured once. Then
it writes every configuration measured for the problem's cache key, one row each, as compact
JSON: the parameter values, the state (``done``, ``invalid``, ...), median and min seconds,
the code-generation seconds and the seconds of timed launches, plus the order in which each
phase's run finished its trials.

    python benchmarks/record_space.py gemm --size m=4096,n=4096,k=4096 --dtype float32 \\
        --phase PureRandom:240 --phase AUCBanditMetaTechniqueA:120 --out recording-gemm.json

A dense recording measures a whole region with the grid (``--phase grid:SECONDS``; the
regions are narrowed built-ins, ``benchmarks/inputs/regions.py``), gzipped when ``--out``
ends ``.gz``; on one H100 the GEMM region's 2,304 configurations took 439 s:

    python benchmarks/record_space.py benchmarks/inputs/regions.py:GemmRegion \\
        --size m=4096,n=4096,k=4096 --dtype float32 --phase grid:520 \\
        --tune-flag=--device --tune-flag=gpu --out recording_gemm_region_h100.json.gz

``--db URL`` records into an existing database (and includes what it already holds for the
key); without it a private embedded server is used and removed afterwards.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg.rows
from _harness import database, machine

from tunefleet.db.engine import connect

FORMAT = "tunefleet-recording/1"

_RUNS = """
SELECT r.id, r.problem, r.problem_args, r.space, r.device_class, r.protocol, r.cache_key,
       r.search, r.stop_reason, r.name
FROM tunefleet.run r WHERE r.cache_key = %(key)s ORDER BY r.id
"""

# One row per configuration of the cache key: its measurement when it has one (the cache is
# per key, so one is enough), else the latest finished search trial's state and error.
_ROWS = """
SELECT DISTINCT ON (t.config_hash)
       t.config_hash, t.config, t.state, t.error,
       m.median_s, m.min_s, m.gflops, m.gbps, m.compile_s,
       (SELECT sum(s) FROM unnest(m.samples_s) s) AS timing_s,
       cardinality(m.samples_s) AS launches
FROM tunefleet.trial t
JOIN tunefleet.run r ON r.id = t.run_id
LEFT JOIN tunefleet.measurement m
       ON m.cache_key = r.cache_key AND m.config_hash = t.config_hash
WHERE r.cache_key = %(key)s AND t.purpose = 'search'
  AND t.state IN ('done', 'invalid', 'failed', 'timed_out')
ORDER BY t.config_hash, (m.id IS NULL), m.id, t.finished_at DESC
"""

#: The device's limits a recording keeps (``DeviceInfo.to_json()`` names).
_LIMITS = ("local_mem_bytes", "max_work_group_size", "max_work_item_sizes")

_ORDER = """
SELECT t.config_hash FROM tunefleet.trial t
WHERE t.run_id = %(run)s AND t.purpose = 'search'
  AND t.state IN ('done', 'invalid', 'failed', 'timed_out')
ORDER BY t.finished_at, t.id
"""

_DEVICE = """
SELECT d.name, d.vendor, d.driver_version, d.platform, d.details FROM tunefleet.measurement m
JOIN tunefleet.device d ON d.id = m.device_id
WHERE m.cache_key = %(key)s LIMIT 1
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("problem")
    p.add_argument("--size", action="append", default=[])
    p.add_argument("--dtype")
    p.add_argument("--arg", action="append", default=[])
    p.add_argument(
        "--phase",
        action="append",
        default=[],
        metavar="TECHNIQUE:SECONDS",
        help="one tune run (repeatable, in order); default PureRandom:60",
    )
    p.add_argument("--db", help="record into this database (default: a private embedded one)")
    p.add_argument("--out", required=True, help="the recording's JSON file (.json.gz: gzipped)")
    p.add_argument("--tune-flag", action="append", default=[], help="passed to every tune")
    return p.parse_args(argv)


def tune_command(args: argparse.Namespace, url: str, technique: str, seconds: float) -> list[str]:
    cmd = [sys.executable, "-m", "tunefleet", "tune", args.problem, "--db", url]
    for size in args.size:
        cmd += ["--size", size]
    for extra in args.arg:
        cmd += ["--arg", extra]
    if args.dtype:
        cmd += ["--dtype", args.dtype]
    cmd += ["--technique", technique, "--max-time", str(seconds), "--confirm", "0"]
    cmd += ["--name", f"record {technique} {seconds:g}s", *args.tune_flag]
    return cmd


def collect(url: str, run_ids: list[int]) -> dict[str, Any]:
    with connect(url) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        cur.execute("SELECT cache_key FROM tunefleet.run WHERE id = %(id)s", {"id": run_ids[-1]})
        key = (cur.fetchone() or {})["cache_key"]
        runs = cur.execute(_RUNS, {"key": key}).fetchall()
        rows = cur.execute(_ROWS, {"key": key}).fetchall()
        device = cur.execute(_DEVICE, {"key": key}).fetchone()
        # What the device allowed, for replays to rule out what it refused (as the
        # coordinator does): tunefleet.recording reads it back.
        details = (device or {}).pop("details", None) or {}
        limits = {k: details.get(k) for k in _LIMITS if details.get(k)}
        orders = {}
        for run in runs:
            orders[run["id"]] = [r["config_hash"] for r in cur.execute(_ORDER, {"run": run["id"]})]
    first = runs[-1]
    params = [p["name"] for p in first["space"]["params"]]
    index = {r["config_hash"]: i for i, r in enumerate(rows)}
    columns = ["values", "state", "median_s", "min_s", "gflops", "gbps", "compile_s", "timing_s"]
    columns += ["launches", "error"]
    table = [
        [
            [r["config"].get(name) for name in params],
            r["state"] if r["median_s"] is None else "done",
            *(r[c] for c in columns[2:-1]),
            None if r["median_s"] is not None else (r["error"] or "")[:200],
        ]
        for r in rows
    ]
    return {
        "format": FORMAT,
        "problem": first["problem"],
        "problem_args": first["problem_args"],
        "device_class": first["device_class"],
        "device": device,
        "device_limits": limits or None,
        "protocol": first["protocol"],
        "cache_key": key,
        "space": first["space"],
        "params": params,
        "columns": columns,
        "rows": table,
        "runs": [
            {
                "run_id": run["id"],
                "name": run["name"],
                "search": run["search"],
                "stop_reason": run["stop_reason"],
                "order": [index[h] for h in orders[run["id"]] if h in index],
            }
            for run in runs
        ],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    phases = []
    for phase in args.phase or ["PureRandom:60"]:
        technique, _, seconds = phase.rpartition(":")
        phases.append((technique, float(seconds)))
    started = time.monotonic()
    with database(args.db) as url:
        run_ids = []
        for technique, seconds in phases:
            cmd = tune_command(args, url, technique, seconds)
            print("+", " ".join(cmd[2:]), flush=True)
            done = subprocess.run(cmd, check=False, capture_output=True, text=True)
            sys.stderr.write(done.stderr[-3000:])
            if done.returncode != 0:
                print(f"tune exited {done.returncode}", file=sys.stderr)
                return done.returncode
            with connect(url) as conn:
                last = conn.execute("SELECT max(id) AS id FROM tunefleet.run").fetchone()
            run_ids.append(int(last["id"]))
        recording = collect(url, run_ids)
    recording["machine"] = machine()
    recording["seconds"] = round(time.monotonic() - started, 1)
    recording["phases"] = [{"technique": t, "seconds": s} for t, s in phases]
    text = json.dumps(recording, separators=(",", ":")) + "\n"
    if args.out.endswith(".gz"):  # a dense recording: a tenth of the size
        Path(args.out).write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        Path(args.out).write_text(text)
    states: dict[str, int] = {}
    for row in recording["rows"]:
        states[row[1]] = states.get(row[1], 0) + 1
    best = min((r[2] for r in recording["rows"] if r[2] is not None), default=None)
    fastest = "none timed" if best is None else f"fastest {best * 1e3:.4g} ms"
    print(f"wrote {args.out}: {len(recording['rows'])} configurations {states}, {fastest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
