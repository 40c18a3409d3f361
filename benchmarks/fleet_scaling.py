"""Fleet scaling: N real worker processes against one PostgreSQL, synthetic trials of a fixed
duration T. How close does the fleet get to N trials every T seconds, and what does the queue
cost per trial?

For each N (a fresh fleet of ``python -m tunefleet.worker --device host`` processes, default
settings unless overridden) and each T:

1. start the N workers and wait until every one is idle (``waiting for work`` in its log);
2. warm up: small batches until every worker has finished a trial, so every worker's child
   processes are running (their start-up is not what this measures);
3. enqueue ``N x k`` trials of duration T (``k = --ideal-seconds / T``) in one transaction
   with one NOTIFY, exactly as the coordinator does, and wait until all are done.

``efficiency = ideal / wall`` with ``ideal = trials x T / N`` and ``wall`` = first enqueue to
last completion, both on the database clock (``trial.created_at``, ``trial.finished_at``).

Per-trial queue overhead = the trial's share of the claim statement that handed it out
(claim latency / trials claimed) + its completion statement + its worker's heartbeat
statements during the batch divided by that worker's trials. Latencies are timed in the
worker around each statement, round trip included (the worker logs them at debug level, ``-vv``;
they are read back from the worker logs). The heartbeat runs on its own connection and thread
and never delays the device; it is counted anyway.

    python benchmarks/fleet_scaling.py                      # N = 1..64, T = 0.2 s and 1 s
    python benchmarks/fleet_scaling.py --workers 1,4 --durations 0.2 --ideal-seconds 2

Writes ``benchmarks/results/fleet_scaling.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tests.helpers.launch import WorkerProcess, start_workers
from tunefleet.db.engine import connect
from tunefleet.queries import bench as bq

NAME = "fleet_scaling"
_STATEMENT = re.compile(r" DEBUG tunefleet\.worker: (\w+) connection: (\w+) took ([0-9.]+) ms")
_CLAIMED = re.compile(r" INFO tunefleet\.worker: claimed trial (\d+) ")
_ENDED = re.compile(r" INFO tunefleet\.worker: trial (\d+) attempt \d+: ")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2,4,8,16,32,64", help="fleet sizes N (comma list)")
    p.add_argument("--durations", default="0.2,1", help="trial durations T in seconds")
    p.add_argument(
        "--ideal-seconds",
        type=float,
        default=10.0,
        help="ideal length of each batch: every worker gets ideal/T trials (default 10)",
    )
    p.add_argument("--prefetch", type=int, default=None, help="worker --prefetch (default: its)")
    p.add_argument(
        "--prepare-workers", type=int, default=None, help="worker --prepare-workers (default: its)"
    )
    p.add_argument("--lease", type=float, default=None, help="worker --lease (default: its)")
    p.add_argument(
        "--memory-share",
        type=float,
        default=0.7,
        help="skip an N whose estimated memory exceeds this share of the available memory",
    )
    p.add_argument(
        "--db",
        default=None,
        help="a scratch database URL (default: a private embedded server in a temporary directory)",
    )
    p.add_argument("--out", default=None, help="JSON file or folder (default benchmarks/results)")
    p.add_argument("--keep-logs", default=None, help="keep the worker logs in this folder")
    return p.parse_args(argv)


# --- the fleet --------------------------------------------------------------------------------
def wait_ready(fleet: list[WorkerProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        dead = [w for w in fleet if not w.alive]
        if dead:
            tail = "\n".join(dead[0].log().splitlines()[-5:])
            raise SystemExit(f"a worker exited during start-up (status {dead[0].poll()}):\n{tail}")
        ready = sum("waiting for work" in w.log() for w in fleet)
        if ready == len(fleet):
            return
        if time.monotonic() > deadline:
            raise SystemExit(
                f"only {ready} of {len(fleet)} workers became ready in {timeout:.0f} s"
            )
        time.sleep(0.5)


def wait_done(conn: Any, runs: list[int], fleet: list[WorkerProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while bq.open_trials(conn, runs):
        if time.monotonic() > deadline:
            raise SystemExit(f"batch not finished after {timeout:.0f} s")
        if any(not w.alive for w in fleet):
            raise SystemExit("a worker died during the batch; see its log")
        time.sleep(0.05)


def warm_up(conn: Any, fleet: list[WorkerProcess], rounds: int = 8) -> int:
    """Small batches until every worker has finished at least one trial; returns the rounds."""
    served: set[Any] = set()
    for r in range(1, rounds + 1):
        runs = h.enqueue_synthetic(conn, 2 * len(fleet), {"duration": 0.05}, f"warm-up {r}")
        wait_done(conn, runs, fleet, 120 + 2 * len(fleet))
        served |= {row["worker_id"] for row in bq.trials_per_worker(conn, runs)}
        if len(served) >= len(fleet):
            return r
    return rounds


def stop_fleet(fleet: list[WorkerProcess]) -> None:
    for w in fleet:
        w.stop()
    deadline = time.monotonic() + 30
    for w in fleet:
        try:
            w.wait(max(deadline - time.monotonic(), 0.1))
        except Exception:
            w.kill()


# --- worker logs ------------------------------------------------------------------------------
def parse_logs(
    paths: list[Path], offsets: list[int], trial_ids: set[int]
) -> tuple[list[float], dict[str, list[float]], dict[str, list[float]]]:
    """Per-trial queue overhead (ms) of ``trial_ids`` from the worker logs written after
    ``offsets``, the latency of every statement by name, and the parts of the overhead."""
    overhead: list[float] = []
    parts: dict[str, list[float]] = defaultdict(list)
    statements: dict[str, list[float]] = defaultdict(list)
    for path, offset in zip(paths, offsets, strict=True):
        with open(path, errors="replace") as fh:
            fh.seek(offset)
            lines = fh.read().splitlines()
        claim_ms: float | None = None
        complete_ms: float | None = None
        claims: list[tuple[float, list[int]]] = []
        completes: dict[int, float] = {}
        heartbeat_ms = 0.0
        for line in lines:
            m = _STATEMENT.search(line)
            if m:
                link, fn, ms = m.group(1), m.group(2), float(m.group(3))
                statements[fn].append(ms)
                if link == "heartbeat":
                    heartbeat_ms += ms
                elif fn == "claim_trials":
                    claim_ms = ms
                    claims.append((ms, []))
                elif fn == "complete_trial":
                    complete_ms = ms
                continue
            m = _CLAIMED.search(line)
            if m and claim_ms is not None and claims:
                claims[-1][1].append(int(m.group(1)))
                continue
            m = _ENDED.search(line)
            if m and complete_ms is not None:
                completes[int(m.group(1))] = complete_ms
                complete_ms = None
        claim_share = {t: ms / len(ids) for ms, ids in claims for t in ids if ids}
        mine = [t for t in completes if t in trial_ids]
        hb_share = heartbeat_ms / len(mine) if mine else 0.0
        for t in mine:
            c = claim_share.get(t, 0.0)
            parts["claim"].append(c)
            parts["complete"].append(completes[t])
            parts["heartbeat"].append(hb_share)
            overhead.append(c + completes[t] + hb_share)
    return overhead, statements, parts


# --- one fleet size ---------------------------------------------------------------------------
def measure_fleet(url: str, n: int, args: argparse.Namespace, log_root: Path) -> dict[str, Any]:
    started = time.monotonic()
    log_dir = log_root / f"n{n}"
    fleet = start_workers(
        url,
        n,
        log_dir=log_dir,
        drain=False,
        prefetch=args.prefetch,
        prepare_workers=args.prepare_workers,
        lease_s=args.lease,
        extra=["-v"],  # with launch's own -v: debug level, statement latencies logged
    )
    result: dict[str, Any] = {"workers": n, "batches": []}
    try:
        with connect(url) as conn:
            wait_ready(fleet, 120 + 3 * n)
            result["start_s"] = time.monotonic() - started
            result["warm_up_rounds"] = warm_up(conn, fleet)
            mem = [h.tree_memory(w.pid) for w in fleet]
            result["memory_mib"] = {
                "processes_per_worker": max(m["count"] for m in mem),
                "rss_total": sum(m["rss"] for m in mem),
                "pss_total": sum(m["pss"] for m in mem),
                "pss_per_worker": sum(m["pss"] for m in mem) / n,
                "rss_per_worker": sum(m["rss"] for m in mem) / n,
                "example_worker": mem[0]["processes"],
            }
            print(
                f"[{h.elapsed(started)}] N={n}: ready, {result['warm_up_rounds']} warm-up "
                f"round(s), {result['memory_mib']['pss_per_worker']:.0f} MiB PSS per worker",
                flush=True,
            )
            for duration in [float(x) for x in args.durations.split(",")]:
                result["batches"].append(measure_batch(conn, fleet, n, duration, args, started))
    finally:
        stop_fleet(fleet)
    return result


def measure_batch(
    conn: Any,
    fleet: list[WorkerProcess],
    n: int,
    duration: float,
    args: argparse.Namespace,
    started: float,
) -> dict[str, Any]:
    per_worker = max(1, round(args.ideal_seconds / duration))
    trials = n * per_worker
    ideal = trials * duration / n
    offsets = [w.log_path.stat().st_size for w in fleet]
    cpu = h.CpuMeter()
    cpu.start()
    runs = h.enqueue_synthetic(conn, trials, {"duration": duration}, f"fleet N={n} T={duration}")
    wait_done(conn, runs, fleet, 60 + 5 * ideal)
    busy = cpu.stop()
    time.sleep(0.5)  # the completion's log line follows its statement
    timing = bq.batch_timing(conn, runs)
    counts = [int(r["trials"]) for r in bq.trials_per_worker(conn, runs)]
    trial_ids = set(bq.trial_ids(conn, runs))
    overhead, statements, parts = parse_logs([w.log_path for w in fleet], offsets, trial_ids)
    wall = float(timing["wall_s"])
    batch = {
        "duration_s": duration,
        "trials": trials,
        "done": int(timing["done"]),
        "not_done": int(timing["not_done"]),
        "ideal_s": ideal,
        "wall_s": wall,
        "efficiency": ideal / wall if wall > 0 else None,
        "first_claim_s": timing["first_claim_s"],
        "trials_per_worker": {"min": min(counts, default=0), "max": max(counts, default=0)},
        "workers_used": len(counts),
        "overhead_ms": h.summary(overhead),
        "overhead_parts_ms": {k: h.summary(v) for k, v in parts.items()},
        "statements_ms": {k: h.summary(v) for k, v in sorted(statements.items())},
        "cpu_busy": busy,
        "load_average": h.os.getloadavg(),
    }
    print(
        f"[{h.elapsed(started)}] N={n} T={duration:g}: {trials} trials, wall {wall:.2f} s "
        f"(ideal {ideal:.2f}), efficiency {batch['efficiency']:.3f}, overhead median "
        f"{batch['overhead_ms'].get('median', float('nan')):.2f} ms "
        f"p99 {batch['overhead_ms'].get('p99', float('nan')):.2f} ms, "
        f"CPU busy {100 * (busy or 0):.0f}%",
        flush=True,
    )
    return batch


def available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(x) for x in args.workers.split(",")]
    log_root = Path(args.keep_logs or tempfile.mkdtemp(prefix="tunefleet-fleet-logs-"))
    log_root.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {
        "benchmark": NAME,
        "command": " ".join(["python", "benchmarks/fleet_scaling.py", *(argv or sys.argv[1:])]),
        "machine": h.machine(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "keep_logs")},
        "fleets": [],
        "skipped": [],
    }
    per_worker_mib: float | None = None
    try:
        with h.database(args.db) as url:
            out["postgresql"] = h.server_version(url)
            for n in sizes:
                if per_worker_mib is not None:
                    need = n * per_worker_mib
                    have = available_mib()
                    if need > args.memory_share * have:
                        reason = (
                            f"N={n} needs about {need:.0f} MiB ({per_worker_mib:.0f} MiB PSS per "
                            f"worker), more than {args.memory_share:.0%} of the {have:.0f} MiB "
                            "available"
                        )
                        print("skipped:", reason, flush=True)
                        out["skipped"].append({"workers": n, "reason": reason})
                        continue
                fleet = measure_fleet(url, n, args, log_root)
                per_worker_mib = max(per_worker_mib or 0.0, fleet["memory_mib"]["pss_per_worker"])
                out["fleets"].append(fleet)
    finally:
        if not args.keep_logs:
            shutil.rmtree(log_root, ignore_errors=True)
    rows = []
    for fleet in out["fleets"]:
        for b in fleet["batches"]:
            o, parts = b["overhead_ms"], b["overhead_parts_ms"]
            rows.append(
                [
                    fleet["workers"],
                    f"{b['duration_s']:g}",
                    b["trials"],
                    h.fmt(b["ideal_s"], 2),
                    h.fmt(b["wall_s"], 2),
                    h.fmt(b["efficiency"]),
                    h.fmt(o.get("median"), 2),
                    h.fmt(o.get("p99"), 2),
                    h.fmt(parts.get("claim", {}).get("median"), 2),
                    h.fmt(parts.get("complete", {}).get("median"), 2),
                    f"{b['trials_per_worker']['min']}-{b['trials_per_worker']['max']}",
                    f"{100 * (b['cpu_busy'] or 0):.0f}%",
                    h.fmt(fleet["memory_mib"]["pss_per_worker"], 0),
                ]
            )
    print()
    print(
        h.table(
            [
                "N",
                "T s",
                "trials",
                "ideal s",
                "wall s",
                "efficiency",
                "ovh med ms",
                "ovh p99 ms",
                "claim ms",
                "complete ms",
                "trials/worker",
                "CPU busy",
                "PSS/worker MiB",
            ],
            rows,
        )
    )
    for s in out["skipped"]:
        print("skipped:", s["reason"])
    h.write_json(NAME, out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
