"""Raw queue throughput: claim + complete cycles per second through tunefleet's own queue
functions (``tunefleet.queries.queue.claim_trials`` / ``complete_trial``, dict rows, dataclasses,
a measurement row per trial) against a minimal psycopg loop that runs the very same SQL, and
against the direct statements the worker ran before it wrote only through database functions.

Three loops, in the same session against the same database, alternating (ABBA: each pair of
rounds runs them in one order, then the reverse) so that table growth and machine noise hit
all alike:

``tunefleet``  the wrappers in ``tunefleet.queries.queue``, which call the SECURITY DEFINER
               functions ``tunefleet.claim_trials`` / ``tunefleet.complete_trial``.
``raw``        a minimal psycopg loop replaying those calls: each client runs one real claim
               and completion through tunefleet's functions on a recording connection, then
               replays the recorded statements with plain tuple rows and explicitly prepared
               statements, changing only the trial id, attempt and lease token.
``direct``     the same minimal loop running the claim and completion statements the worker
               sent itself before migration 0003 (kept below, verbatim, as the baseline): what
               the function path costs is ``raw / direct``.

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
from psycopg.types.json import Jsonb

from tunefleet.db.engine import connect, normalise_url
from tunefleet.queries import bench as bq
from tunefleet.queries import search
from tunefleet.vocabulary import ANY_DEVICE_CLASS

NAME = "raw_queue"
#: Trials of this class are served by no real worker: the benchmark's clients own them.
DEVICE_CLASS = "bench-raw-queue"
#: What a worker claims: its own class and runs of class ``any``.
CLASSES = [DEVICE_CLASS, ANY_DEVICE_CLASS]
LEASE_S = 30.0
MODES = ("tunefleet", "raw", "direct")

# The worker's claim and completion before it wrote only through database functions (the
# parent commit of migration 0003), verbatim: the baseline of the function path. They need
# the table privileges the worker role no longer has, so run this as an owner or superuser.
DIRECT_CLAIM_SQL = """
        WITH picked AS (
            SELECT p.id
              FROM (SELECT DISTINCT unnest(%(classes)s::text[])) AS c(device_class)
             CROSS JOIN LATERAL (
                   SELECT t.id, t.priority FROM tunefleet.trial t
                    WHERE t.state = 'pending' AND t.device_class = c.device_class
                    ORDER BY t.priority, t.id
                    LIMIT %(limit)s
                    FOR UPDATE SKIP LOCKED
                   ) p
             ORDER BY p.priority, p.id
             LIMIT %(limit)s
        ), claimed AS (
            UPDATE tunefleet.trial t
               SET state = 'running',
                   attempt = t.attempt + 1,
                   lease_owner = %(worker_id)s,
                   lease_expires_at = now() + make_interval(secs => %(lease_s)s),
                   started_at = now(),
                   finished_at = NULL
              FROM picked
             WHERE t.id = picked.id
         RETURNING t.id, t.run_id, t.attempt, t.max_attempts, t.config, t.config_hash,
                   t.timeout_s, t.device_class, t.priority
        ), recorded AS (
            INSERT INTO tunefleet.attempt (trial_id, attempt, worker_id)
            SELECT id, attempt, %(worker_id)s FROM claimed
        )
        SELECT c.id, c.run_id, c.attempt, c.max_attempts, c.config, c.config_hash,
               c.timeout_s, c.device_class, r.problem, r.problem_args, r.protocol, r.cache_key
          FROM claimed c
          JOIN tunefleet.run r ON r.id = c.run_id
         ORDER BY c.priority, c.id
"""
DIRECT_COMPLETE_SQL = """
        WITH ended AS (
            UPDATE tunefleet.trial t
               SET state = CASE WHEN %(state)s::text <> 'failed' OR t.attempt >= t.max_attempts
                                THEN %(state)s::text
                                WHEN r.state = 'running' THEN 'pending'
                                ELSE 'cancelled' END,
                   lease_owner = CASE WHEN %(state)s = 'failed' AND t.attempt < t.max_attempts
                                      THEN NULL ELSE t.lease_owner END,
                   finished_at = CASE WHEN %(state)s = 'failed' AND t.attempt < t.max_attempts
                                       AND r.state = 'running'
                                      THEN NULL ELSE now() END,
                   lease_expires_at = NULL,
                   error = %(error)s
              FROM tunefleet.run r
             WHERE t.id = %(trial_id)s AND t.attempt = %(attempt)s AND r.id = t.run_id
               AND t.lease_owner = %(worker_id)s AND t.state = 'running'
         RETURNING t.id, t.run_id, t.attempt, t.state, t.config, t.config_hash
        ), recorded AS (
            UPDATE tunefleet.attempt a
               SET ended_at = now(), outcome = %(state)s, error = %(error)s
              FROM ended
             WHERE a.trial_id = ended.id AND a.attempt = ended.attempt
               AND a.worker_id = %(worker_id)s AND a.ended_at IS NULL
        ), measured AS (
            INSERT INTO tunefleet.measurement
                   (trial_id, run_id, attempt, cache_key, config_hash, problem, problem_args,
                    config, device_id, worker_id, median_s, min_s, samples_s, gflops, gbps,
                    flop_count, byte_count, protocol, compile_s, validation, versions, code)
            SELECT ended.id, ended.run_id, ended.attempt, r.cache_key, ended.config_hash,
                   r.problem, r.problem_args, ended.config, %(device_id)s::bigint,
                   %(worker_id)s::uuid, %(median_s)s::double precision,
                   %(min_s)s::double precision, %(samples_s)s::double precision[],
                   %(gflops)s::double precision, %(gbps)s::double precision,
                   %(flop_count)s::double precision, %(byte_count)s::double precision,
                   %(protocol)s::jsonb, %(compile_s)s::double precision,
                   coalesce(%(validation)s::jsonb, '{}'::jsonb),
                   coalesce(%(versions)s::jsonb, '{}'::jsonb), %(code)s::text
              FROM ended
              JOIN tunefleet.run r ON r.id = ended.run_id
             WHERE %(with_measurement)s
        )
        SELECT state FROM ended
"""


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
    backends = {"tunefleet": tf.info.backend_pid, "raw": raw.info.backend_pid}
    backends["direct"] = backends["ping"] = backends["raw"]
    secret = queue.register_worker(
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
            rec,
            worker_id=worker_id,
            secret=secret,
            device_classes=CLASSES,
            limit=k,
            lease_s=LEASE_S,
        )
        claim = (rec.query, rec.params)
        if not claims:
            raise RuntimeError("no pending trial to record the statements with")
        for c in claims:
            queue.complete_trial(
                rec,
                trial_id=c.trial_id,
                attempt=c.attempt,
                token=c.lease_token,
                worker_id=worker_id,
                state="done",
                measurement=measurement,
            )
        return (*claim, rec.query, list(rec.params))

    direct_claim = {
        "classes": CLASSES,
        "limit": 0,
        "worker_id": worker_id,
        "lease_s": LEASE_S,
    }
    m = measurement
    direct_complete: dict[str, Any] = {
        "trial_id": 0,
        "attempt": 0,
        "worker_id": worker_id,
        "state": "done",
        "error": None,
        "with_measurement": True,
        "device_id": None,
        "median_s": m.median_s,
        "min_s": m.min_s,
        "samples_s": list(m.samples_s),
        "gflops": m.gflops,
        "gbps": m.gbps,
        "flop_count": m.flop_count,
        "byte_count": m.byte_count,
        "protocol": Jsonb(m.protocol),
        "compile_s": m.compile_s,
        "validation": Jsonb(m.validation),
        "versions": Jsonb(m.versions),
        "code": m.code,
    }

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
        server_cpu = _process_cpu_s(backends[mode])
        client_cpu = time.process_time()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            if mode == "tunefleet":
                claims = queue.claim_trials(
                    tf,
                    worker_id=worker_id,
                    secret=secret,
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
                        token=c.lease_token,
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
            elif mode == "direct":
                direct_claim["limit"] = k
                rows = raw.execute(DIRECT_CLAIM_SQL, direct_claim, prepare=True).fetchall()
                t1 = time.perf_counter()
                claim_ms.append((t1 - t0) * 1e3)
                for row in rows:
                    direct_complete["trial_id"] = row[0]
                    direct_complete["attempt"] = row[2]
                    raw.execute(DIRECT_COMPLETE_SQL, direct_complete, prepare=True).fetchone()
                    t2 = time.perf_counter()
                    complete_ms.append((t2 - t1) * 1e3)
                    t1 = t2
                got = len(rows)
            else:
                rows = raw.execute(claim_sql, claim_params, prepare=True).fetchall()
                t1 = time.perf_counter()
                claim_ms.append((t1 - t0) * 1e3)
                for row in rows:
                    # worker, trial, attempt, lease token, then what was measured
                    complete_params[1:4] = [row[0], row[2], row[12]]
                    raw.execute(complete_sql, complete_params, prepare=True).fetchone()
                    t2 = time.perf_counter()
                    complete_ms.append((t2 - t1) * 1e3)
                    t1 = t2
                got = len(rows)
            cycles += got
            if not got:
                empty += 1
                time.sleep(0.001)
        server_end = _process_cpu_s(backends[mode])
        pipe.send(
            {
                "cycles": cycles,
                "empty": empty,
                "claim_ms": claim_ms,
                "complete_ms": complete_ms,
                "client_cpu_s": time.process_time() - client_cpu,
                "server_cpu_s": None
                if server_cpu is None or server_end is None
                else server_end - server_cpu,
            }
        )
    tf.close()
    raw.close()


def _process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a local process (a database backend), or None when it
    is not readable here (a remote server)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
                    order = [  # ABBA...: tunefleet, raw, direct, direct, raw, tunefleet, ...
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
                        server = [r["server_cpu_s"] for r in replies]
                        samples[mode].append(
                            {
                                "rate": rate,
                                "cycles": cycles,
                                "empty_claims": sum(r["empty"] for r in replies),
                                "cpu_busy": busy,
                                "client_cpu_s": sum(r["client_cpu_s"] for r in replies),
                                "server_cpu_s": None if None in server else sum(server),
                            }
                        )
                        print(
                            f"[{h.elapsed(started)}] clients {n:2d} batch {k}: {mode:9s} "
                            f"{rate:8.0f} cycles/s (CPU busy {100 * (busy or 0):.0f}%)",
                            flush=True,
                        )
                    for mode in MODES:
                        rates = [s["rate"] for s in samples[mode]]
                        done = sum(s["cycles"] for s in samples[mode])
                        server_s = [s["server_cpu_s"] for s in samples[mode]]
                        cell[mode] = {
                            "rate": sum(rates) / len(rates),
                            # CPU of the database backends per cycle: what the statements cost
                            # the server, much less disturbed by other load than the rates.
                            "server_cpu_ms_per_cycle": None
                            if None in server_s or not done
                            else 1e3 * sum(server_s) / done,
                            "client_cpu_ms_per_cycle": 1e3
                            * sum(s["client_cpu_s"] for s in samples[mode])
                            / max(done, 1),
                            "rates": rates,
                            "runs": samples[mode],
                            "claim_ms": h.summary(latency[mode]["claim_ms"]),
                            "complete_ms": h.summary(latency[mode]["complete_ms"]),
                        }
                    cell["ratio"] = cell["tunefleet"]["rate"] / max(cell["raw"]["rate"], 1e-9)
                    # The cost of writing through the database functions: same minimal loop,
                    # function calls against the direct statements they replaced.
                    direct = max(cell["direct"]["rate"], 1e-9)
                    cell["functions_vs_direct"] = cell["raw"]["rate"] / direct
                    cell["tunefleet_vs_direct"] = cell["tunefleet"]["rate"] / direct
                    fn_cpu = cell["raw"]["server_cpu_ms_per_cycle"]
                    direct_cpu = cell["direct"]["server_cpu_ms_per_cycle"]
                    cell["server_cpu_functions_vs_direct"] = (
                        fn_cpu / direct_cpu if fn_cpu and direct_cpu else None
                    )
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
            h.fmt(c["direct"]["rate"], 0),
            h.fmt(c["functions_vs_direct"], 2),
            h.fmt(c["tunefleet_vs_direct"], 2),
            h.fmt(c["raw"]["server_cpu_ms_per_cycle"], 3),
            h.fmt(c["direct"]["server_cpu_ms_per_cycle"], 3),
            h.fmt(c["server_cpu_functions_vs_direct"], 2),
            h.fmt(c["raw"]["claim_ms"].get("median"), 2),
            h.fmt(c["raw"]["complete_ms"].get("median"), 2),
            h.fmt(c["direct"]["claim_ms"].get("median"), 2),
            h.fmt(c["direct"]["complete_ms"].get("median"), 2),
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
                "functions (raw) cycles/s",
                "direct cycles/s",
                "functions / direct",
                "tunefleet / direct",
                "fn server CPU ms/cycle",
                "direct server CPU ms/cycle",
                "server CPU fn / direct",
                "fn claim ms",
                "fn complete ms",
                "direct claim ms",
                "direct complete ms",
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
