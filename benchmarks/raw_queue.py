"""Raw queue throughput: claim + complete cycles per second through tunefleet's own queue
functions (``tunefleet.queries.queue.claim_trials`` / ``complete_trial``, dict rows, dataclasses,
a measurement row per trial) against a minimal psycopg loop that runs the very same SQL.

The minimal loop does not copy the SQL: each client runs one real claim and completion through
tunefleet's functions on a recording connection, then replays the recorded statements with
plain tuple rows and explicitly prepared statements, changing only the trial id and attempt.
Both loops run in the same session against the same database, alternating (ABBA) so that table
growth and machine noise hit both alike.

A cycle = one trial claimed and completed as ``done`` (with its measurement row). Clients are
separate processes, each with its own connection and worker row; ``--batch k`` claims up to k
trials per claim statement (then completes them one by one, as the worker does). A feeder
thread plays the coordinator: it keeps between ``--backlog`` and twice that many trials
pending, inserting in batches. For scale, the clients also time ``SELECT 1`` round trips (the
floor under any statement here), and one client times claims against growing backlogs.

    python benchmarks/raw_queue.py                     # 1-32 clients, batch 1 and 8
    python benchmarks/raw_queue.py --clients 1,4 --batch 1 --seconds 1 --repeat 1

Writes ``benchmarks/results/raw_queue.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tunefleet.db.engine import connect, normalise_url
from tunefleet.db.schema import ANY_DEVICE_CLASS
from tunefleet.queries import bench as bq
from tunefleet.queries import search

NAME = "raw_queue"
#: Trials of this class are served by no real worker: the benchmark's clients own them.
DEVICE_CLASS = "bench-raw-queue"
#: What a worker claims: its own class and runs of class ``any``.
CLASSES = [DEVICE_CLASS, ANY_DEVICE_CLASS]
LEASE_S = 30.0
MODES = ("tunefleet", "raw")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="1,2,4,8,16,32", help="concurrent clients (comma list)")
    p.add_argument("--batch", default="1,8", help="claim limits k (comma list)")
    p.add_argument("--seconds", type=float, default=3.0, help="length of each measurement")
    p.add_argument(
        "--backlog", type=int, default=500, help="pending trials kept (default 500: 500-1000)"
    )
    p.add_argument(
        "--backlogs",
        default="100,1000,10000",
        help="backlogs of the one-client claim sweep (comma list; empty: skip it)",
    )
    p.add_argument(
        "--repeat", type=int, default=2, help="ABBA pairs per cell (tunefleet, raw, raw, ...)"
    )
    p.add_argument(
        "--db",
        default=None,
        help="a scratch database URL (default: a private embedded server in a temporary directory)",
    )
    p.add_argument("--out", default=None, help="JSON file or folder (default benchmarks/results)")
    return p.parse_args(argv)


# --- the client process -----------------------------------------------------------------------
class _Recorder:
    """Passes statements through to a real connection and keeps the last one's text and
    parameters: how the raw loop gets tunefleet's exact SQL without a copy of it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.query: Any = None
        self.params: Any = None

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        self.query, self.params = query, params
        return self.conn.execute(query, params, **kwargs)


def _measurement() -> Any:
    from tunefleet.problems.base import Protocol
    from tunefleet.queries.queue import MeasurementRow

    return MeasurementRow(
        device_id=None,
        median_s=1e-3,
        min_s=0.9e-3,
        samples_s=[1e-3, 0.9e-3, 1.1e-3],
        protocol=Protocol(warmup=0, min_launches=3, min_seconds=0.0, max_launches=3).to_json(),
        gflops=2.0,
        flop_count=2e6,
        compile_s=0.0,
        validation={"passed": True},
        versions={"tunefleet": "bench"},
    )


def client_main(url: str, pipe: multiprocessing.connection.Connection) -> None:
    import psycopg

    from tunefleet import __version__
    from tunefleet.queries import queue

    worker_id = uuid.uuid4()
    tf = connect(url)
    raw = psycopg.connect(normalise_url(url), autocommit=True)
    queue.register_worker(
        tf,
        worker_id=worker_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        device_id=None,
        device_class=DEVICE_CLASS,
        version=__version__,
    )
    measurement = _measurement()
    recorded: dict[int, tuple[Any, Any, Any, Any]] = {}

    def record(k: int) -> tuple[Any, Any, Any, Any]:
        """One real cycle through tunefleet's functions, recording both statements."""
        rec: Any = _Recorder(tf)  # stands in for the connection
        claims = queue.claim_trials(
            rec, worker_id=worker_id, device_classes=CLASSES, limit=k, lease_s=LEASE_S
        )
        claim = (rec.query, rec.params)
        if not claims:
            raise RuntimeError("no pending trial to record the statements with")
        for c in claims:
            queue.complete_trial(
                rec,
                trial_id=c.trial_id,
                attempt=c.attempt,
                worker_id=worker_id,
                state="done",
                measurement=measurement,
            )
        return (*claim, rec.query, rec.params)

    while True:
        try:
            command = pipe.recv()
        except EOFError:
            break
        if command is None:
            break
        mode, k, start_at, seconds = command
        if k not in recorded:
            recorded[k] = record(k)
        claim_sql, claim_params, complete_sql, complete_params = recorded[k]
        claim_ms: list[float] = []
        complete_ms: list[float] = []
        cycles = empty = 0
        while time.time() < start_at:
            time.sleep(min(0.01, max(start_at - time.time(), 0)))
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            if mode == "tunefleet":
                claims = queue.claim_trials(
                    tf,
                    worker_id=worker_id,
                    device_classes=CLASSES,
                    limit=k,
                    lease_s=LEASE_S,
                )
                t1 = time.perf_counter()
                claim_ms.append((t1 - t0) * 1e3)
                for c in claims:
                    queue.complete_trial(
                        tf,
                        trial_id=c.trial_id,
                        attempt=c.attempt,
                        worker_id=worker_id,
                        state="done",
                        measurement=measurement,
                    )
                    t2 = time.perf_counter()
                    complete_ms.append((t2 - t1) * 1e3)
                    t1 = t2
                got = len(claims)
            elif mode == "ping":
                bq.ping(raw)
                claim_ms.append((time.perf_counter() - t0) * 1e3)
                cycles += 1
                continue
            else:
                rows = raw.execute(claim_sql, claim_params, prepare=True).fetchall()
                t1 = time.perf_counter()
                claim_ms.append((t1 - t0) * 1e3)
                for row in rows:
                    complete_params["trial_id"] = row[0]
                    complete_params["attempt"] = row[2]
                    raw.execute(complete_sql, complete_params, prepare=True).fetchone()
                    t2 = time.perf_counter()
                    complete_ms.append((t2 - t1) * 1e3)
                    t1 = t2
                got = len(rows)
            cycles += got
            if not got:
                empty += 1
                time.sleep(0.001)
        pipe.send(
            {"cycles": cycles, "empty": empty, "claim_ms": claim_ms, "complete_ms": complete_ms}
        )
    tf.close()
    raw.close()


# --- the driver -------------------------------------------------------------------------------
class Clients:
    def __init__(self, url: str, n: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes = []
        self.procs = []
        for _ in range(n):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=client_main, args=(url, theirs), daemon=True)
            proc.start()
            theirs.close()
            self.pipes.append(ours)
            self.procs.append(proc)

    def run(self, n: int, mode: str, k: int, seconds: float) -> list[dict[str, Any]]:
        start_at = time.time() + 0.5 + 0.02 * n
        for pipe in self.pipes[:n]:
            pipe.send((mode, k, start_at, seconds))
        out = []
        for pipe in self.pipes[:n]:
            if not pipe.poll(seconds + 120):
                raise SystemExit("a client did not answer")
            out.append(pipe.recv())
        return out

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


class Feeder(threading.Thread):
    """Plays the coordinator: keeps between ``level`` and ``2 * level`` trials of one run
    pending, checking every 20 ms on its own connection."""

    def __init__(self, url: str, level: int) -> None:
        super().__init__(name="feeder", daemon=True)
        self.conn = connect(url)
        self.run_id = h.create_synthetic_run(self.conn, {}, "raw queue", DEVICE_CLASS)
        self.level = level
        self.next = 0
        self.inserted_batches = 0
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self.fill()

    def fill(self) -> None:
        with self._lock:
            missing = 2 * self.level - bq.open_trials(self.conn, [self.run_id])
            if missing <= self.level:
                return
            while missing > 0:
                chunk = min(missing, 20000)
                batch = [
                    {"config": {"i": i}, "config_hash": f"raw-{i}"}
                    for i in range(self.next, self.next + chunk)
                ]
                search.insert_trials(self.conn, self.run_id, DEVICE_CLASS, batch)
                self.next += chunk
                self.inserted_batches += 1
                missing -= chunk

    def set_level(self, level: int) -> None:
        self.level = level
        self.fill()

    def run(self) -> None:
        while not self._stop_event.wait(0.02):
            self.fill()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)
        self.conn.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(x) for x in args.clients.split(",")]
    batches = [int(x) for x in args.batch.split(",")]
    out: dict[str, Any] = {
        "benchmark": NAME,
        "command": " ".join(["python", "benchmarks/raw_queue.py", *(argv or sys.argv[1:])]),
        "machine": h.machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "cells": [],
        "ping": [],
        "backlog_sweep": [],
    }
    started = time.monotonic()
    with h.database(args.db) as url:
        out["postgresql"] = h.server_version(url)
        feeder = Feeder(url, args.backlog)
        feeder.start()
        clients = Clients(url, max(counts))
        try:
            for k in batches:
                for n in counts:
                    cell: dict[str, Any] = {"clients": n, "batch": k}
                    samples: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
                    latency: dict[str, dict[str, list[float]]] = {
                        m: {"claim_ms": [], "complete_ms": []} for m in MODES
                    }
                    order = [  # ABBA...: tunefleet, raw, raw, tunefleet, ...
                        mode
                        for pair in range(args.repeat)
                        for mode in (MODES if pair % 2 == 0 else MODES[::-1])
                    ]
                    for mode in order:
                        cpu = h.CpuMeter()
                        cpu.start()
                        replies = clients.run(n, mode, k, args.seconds)
                        busy = cpu.stop()
                        cycles = sum(r["cycles"] for r in replies)
                        rate = cycles / args.seconds
                        for key in ("claim_ms", "complete_ms"):
                            latency[mode][key] += [x for r in replies for x in r[key]]
                        samples[mode].append(
                            {
                                "rate": rate,
                                "cycles": cycles,
                                "empty_claims": sum(r["empty"] for r in replies),
                                "cpu_busy": busy,
                            }
                        )
                        print(
                            f"[{h.elapsed(started)}] clients {n:2d} batch {k}: {mode:9s} "
                            f"{rate:8.0f} cycles/s (CPU busy {100 * (busy or 0):.0f}%)",
                            flush=True,
                        )
                    for mode in MODES:
                        rates = [s["rate"] for s in samples[mode]]
                        cell[mode] = {
                            "rate": sum(rates) / len(rates),
                            "rates": rates,
                            "runs": samples[mode],
                            "claim_ms": h.summary(latency[mode]["claim_ms"]),
                            "complete_ms": h.summary(latency[mode]["complete_ms"]),
                        }
                    cell["ratio"] = cell["tunefleet"]["rate"] / max(cell["raw"]["rate"], 1e-9)
                    out["cells"].append(cell)
            for n in counts:
                replies = clients.run(n, "ping", 1, args.seconds)
                trips = sum(r["cycles"] for r in replies)
                out["ping"].append(
                    {
                        "clients": n,
                        "rate": trips / args.seconds,
                        "latency_ms": h.summary([x for r in replies for x in r["claim_ms"]]),
                    }
                )
                print(
                    f"[{h.elapsed(started)}] clients {n:2d}: SELECT 1 {trips / args.seconds:8.0f}"
                    "/s",
                    flush=True,
                )
            for level in [int(x) for x in args.backlogs.split(",") if x.strip()]:
                feeder.set_level(level)
                (reply,) = clients.run(1, "tunefleet", 1, args.seconds)
                claim = h.summary(reply["claim_ms"])
                out["backlog_sweep"].append(
                    {"backlog": level, "rate": reply["cycles"] / args.seconds, "claim_ms": claim}
                )
                print(
                    f"[{h.elapsed(started)}] backlog {level:6d}: claim median "
                    f"{claim.get('median', float('nan')):.2f} ms",
                    flush=True,
                )
        finally:
            clients.close()
            feeder.stop()
    floor = {p["clients"]: p["latency_ms"].get("median") for p in out["ping"]}
    rows = [
        [
            c["batch"],
            c["clients"],
            h.fmt(c["tunefleet"]["rate"], 0),
            h.fmt(c["raw"]["rate"], 0),
            h.fmt(c["ratio"], 2),
            h.fmt(c["tunefleet"]["claim_ms"].get("median"), 2),
            h.fmt(c["tunefleet"]["complete_ms"].get("median"), 2),
            h.fmt(c["raw"]["claim_ms"].get("median"), 2),
            h.fmt(c["raw"]["complete_ms"].get("median"), 2),
            h.fmt(floor.get(c["clients"]), 2),
        ]
        for c in out["cells"]
    ]
    print()
    print(
        h.table(
            [
                "batch k",
                "clients",
                "tunefleet cycles/s",
                "raw psycopg cycles/s",
                "ratio",
                "tf claim ms",
                "tf complete ms",
                "raw claim ms",
                "raw complete ms",
                "SELECT 1 ms",
            ],
            rows,
        )
    )
    if out["backlog_sweep"]:
        print()
        print(
            h.table(
                ["pending backlog", "claim median ms", "claim p99 ms", "cycles/s (1 client)"],
                [
                    [
                        f"{b['backlog']}-{2 * b['backlog']}",
                        h.fmt(b["claim_ms"].get("median"), 2),
                        h.fmt(b["claim_ms"].get("p99"), 2),
                        h.fmt(b["rate"], 0),
                    ]
                    for b in out["backlog_sweep"]
                ],
            )
        )
    h.write_json(NAME, out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
