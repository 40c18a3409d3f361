"""Test helper: fill a database with the rows a real fleet leaves behind.

Two runs of one problem on two device classes (a CPU class served by two workers, a GPU class
served by one), trials in every state with measurements, generated code, attempts and
timestamps spread over ten minutes, so the read side (status, best, show, export, plot and
the SQL of docs/sql.md) has something real to read. Rows are written the way the worker and the
coordinator write them: the trial keeps its lease owner after it finishes, a measurement
carries the run, device and worker, every claim leaves an attempt row.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from tunefleet.problems.base import Protocol

CPU = {
    "fingerprint": "cpu-fp-1",
    "device_class": "pthread-intel-r-xeon-r-processor",
    "platform": "Portable Computing Language",
    "vendor": "GenuineIntel",
    "name": "pthread-Intel(R) Xeon(R) Processor",
    "driver_version": "3.0-rc2",
}
GPU = {
    "fingerprint": "gpu-fp-1",
    "device_class": "nvidia-h200",
    "platform": "NVIDIA CUDA",
    "vendor": "NVIDIA Corporation",
    "name": "NVIDIA H200",
    "driver_version": "570.86",
}
ARGS = {"n": 256, "dtype": "float32"}
CODE = "__kernel void gemm(__global float *c, __global const float *a) { /* tile %d */ }\n"


@dataclass
class Filled:
    cpu_run: int
    gpu_run: int
    workers: list[uuid.UUID]
    trials: dict[str, list[int]] = field(default_factory=dict)  # state -> ids (cpu run)
    best_trial: int = 0
    best_gflops: float = 0.0
    finished: int = 0  # finished (done/invalid/failed/timed_out) trials of the cpu run


def _device(conn: Any, d: dict[str, str]) -> int:
    row = conn.execute(
        """INSERT INTO tunefleet.device (fingerprint, device_class, platform, vendor, name,
                                         driver_version, compute_units)
           VALUES (%(fingerprint)s, %(device_class)s, %(platform)s, %(vendor)s, %(name)s,
                   %(driver_version)s, 2) RETURNING id""",
        d,
    ).fetchone()
    return int(row["id"])


def _worker(conn: Any, device_id: int, device_class: str, host: str, pid: int) -> uuid.UUID:
    wid = uuid.uuid4()
    conn.execute(
        """INSERT INTO tunefleet.worker (id, host, pid, device_id, device_class, version,
                                         started_at, heartbeat_at)
           VALUES (%s, %s, %s, %s, %s, '0.1.0', now() - interval '11 minutes', now())""",
        (wid, host, pid, device_id, device_class),
    )
    return wid


def _run(conn: Any, device_class: str, state: str, **budget: Any) -> int:
    row = conn.execute(
        """INSERT INTO tunefleet.run (problem, problem_args, space, device_class, protocol,
                                      cache_key, max_trials, state, stop_reason, created_at,
                                      finished_at)
           VALUES ('gemm', %s, %s, %s, %s, %s, %s, %s, %s, now() - interval '10 minutes',
                   CASE WHEN %s = 'running' THEN NULL ELSE now() END)
           RETURNING id""",
        (
            Jsonb(ARGS),
            Jsonb(
                {"version": 1, "params": [{"kind": "pow2", "name": "tile", "low": 1, "high": 64}]}
            ),
            device_class,
            Jsonb(Protocol().to_json()),  # the default protocol, as a plain run has
            f"key-{device_class}",
            budget.get("max_trials"),
            state,
            None if state == "running" else "max_trials",
            state,
        ),
    ).fetchone()
    return int(row["id"])


def _trial(
    conn: Any,
    run_id: int,
    device_class: str,
    n: int,
    state: str,
    worker: uuid.UUID | None,
    start_s: float | None,
    end_s: float | None,
    error: str | None = None,
) -> int:
    config = {"tile": 2 ** (n % 7), "unroll": n % 3 == 0}
    attempt = 0 if worker is None else 1
    row = conn.execute(
        """INSERT INTO tunefleet.trial (run_id, device_class, config, config_hash, state,
                                        attempt, lease_owner, lease_expires_at, started_at,
                                        finished_at, error, reported)
           SELECT %(run)s, %(cls)s, %(config)s, %(hash)s, %(state)s, %(attempt)s, %(worker)s,
                  CASE WHEN %(state)s = 'running' THEN now() + interval '1 minute' END,
                  r.created_at + make_interval(secs => %(start)s),
                  r.created_at + make_interval(secs => %(end)s),
                  %(error)s, %(reported)s
             FROM tunefleet.run r WHERE r.id = %(run)s
           RETURNING id""",
        {
            "run": run_id,
            "cls": device_class,
            "config": Jsonb(config),
            "hash": f"h{run_id}-{n}",
            "state": state,
            "attempt": attempt,
            "worker": worker,
            "start": start_s,
            "end": end_s,
            "error": error,
            "reported": state not in ("pending", "running"),
        },
    ).fetchone()
    tid = int(row["id"])
    if worker is not None:
        conn.execute(
            """INSERT INTO tunefleet.attempt (trial_id, attempt, worker_id, claimed_at, ended_at,
                                              outcome, error)
               SELECT t.id, 1, %s, t.started_at, t.finished_at,
                      CASE WHEN t.state = 'running' THEN NULL ELSE t.state END, t.error
                 FROM tunefleet.trial t WHERE t.id = %s""",
            (worker, tid),
        )
    return tid


def _measure(
    conn: Any, trial_id: int, device_id: int, worker: uuid.UUID, gflops: float, n: int
) -> None:
    flops = 2.0 * 256**3
    median = flops / (gflops * 1e9)
    conn.execute(
        """INSERT INTO tunefleet.measurement (trial_id, run_id, attempt, cache_key, config_hash,
                   problem, problem_args, config, device_id, worker_id, median_s, min_s,
                   samples_s, gflops, gbps, flop_count, protocol, compile_s, validation, code)
           SELECT t.id, t.run_id, t.attempt, r.cache_key, t.config_hash, r.problem,
                  r.problem_args, t.config, %(device)s, %(worker)s, %(median)s, %(min)s,
                  %(samples)s, %(gflops)s, %(gbps)s, %(flops)s, r.protocol, 0.8,
                  %(validation)s, %(code)s
             FROM tunefleet.trial t JOIN tunefleet.run r ON r.id = t.run_id
            WHERE t.id = %(trial)s""",
        {
            "trial": trial_id,
            "device": device_id,
            "worker": worker,
            "median": median,
            "min": median * 0.97,
            "samples": [median * 0.97, median, median * 1.02, median * 1.05, median],
            "gflops": gflops,
            "gbps": gflops / 4,
            "flops": flops,
            "validation": Jsonb({"passed": True, "max_rel_err": 1e-6}),
            "code": CODE % n,
        },
    )


def fill(conn: Any) -> Filled:
    """Write the two runs; return their ids and what a reader should find."""
    cpu_dev, gpu_dev = _device(conn, CPU), _device(conn, GPU)
    w1 = _worker(conn, cpu_dev, CPU["device_class"], "node-a", 101)
    w2 = _worker(conn, cpu_dev, CPU["device_class"], "node-b", 102)
    w3 = _worker(conn, gpu_dev, GPU["device_class"], "gpu-node", 103)
    cpu_run = _run(conn, CPU["device_class"], "running", max_trials=40)
    gpu_run = _run(conn, GPU["device_class"], "finished", max_trials=3)
    filled = Filled(cpu_run=cpu_run, gpu_run=gpu_run, workers=[w1, w2, w3])

    def add(state: str, tid: int) -> None:
        filled.trials.setdefault(state, []).append(tid)

    gflops_of = [3.5, 7.25, 5.0, 12.5, 9.0, 11.0]
    t = 10.0
    for n, g in enumerate(gflops_of):
        w = (w1, w2)[n % 2]
        tid = _trial(conn, cpu_run, CPU["device_class"], n, "done", w, t, t + 20)
        _measure(conn, tid, cpu_dev, w, g, n)
        add("done", tid)
        if g > filled.best_gflops:
            filled.best_gflops, filled.best_trial = g, tid
        t += 25
    for n, (state, err) in enumerate(
        [
            ("invalid", "work-group size 512 exceeds the device limit 256"),
            ("invalid", "work-group size 512 exceeds the device limit 256"),
            ("failed", "worker lost: evaluation process killed by signal 9"),
            ("timed_out", "evaluation exceeded 60 s"),
        ],
        start=10,
    ):
        add(state, _trial(conn, cpu_run, CPU["device_class"], n, state, w1, t, t + 5, err))
        t += 8
    add("running", _trial(conn, cpu_run, CPU["device_class"], 20, "running", w2, t, None))
    for n in (21, 22):
        add("pending", _trial(conn, cpu_run, CPU["device_class"], n, "pending", None, None, None))
    add(
        "cancelled",
        _trial(conn, cpu_run, CPU["device_class"], 23, "cancelled", None, None, None),
    )
    filled.finished = len(gflops_of) + 4

    for n, g in enumerate([250.0, 410.0, 390.0]):
        tid = _trial(conn, gpu_run, GPU["device_class"], n, "done", w3, 5.0 + 10 * n, 14 + 10 * n)
        _measure(conn, tid, gpu_dev, w3, g, n)
    return filled


def add_done_trial(conn: Any, filled: Filled, gflops: float, n: int) -> int:
    """One more ``done`` trial of the CPU run, measured by its second worker and finished
    just now (what a live run does between two looks at it); returns its id."""
    device = conn.execute(
        "SELECT id FROM tunefleet.device WHERE fingerprint = %s", (CPU["fingerprint"],)
    ).fetchone()
    age = conn.execute(
        "SELECT extract(epoch FROM now() - created_at)::float8 AS s FROM tunefleet.run "
        "WHERE id = %s",
        (filled.cpu_run,),
    ).fetchone()
    w = filled.workers[1]
    start = float(age["s"]) - 2.0
    tid = _trial(conn, filled.cpu_run, CPU["device_class"], n, "done", w, start, start + 1.0)
    _measure(conn, tid, int(device["id"]), w, gflops, n)
    filled.trials["done"].append(tid)
    filled.finished += 1
    if gflops > filled.best_gflops:
        filled.best_gflops, filled.best_trial = gflops, tid
    return tid


@contextmanager
def module_database(admin_url: str, template: str, label: str) -> Iterator[str]:
    """A database at head for a whole test module (cloned from the session's template),
    dropped afterwards: for modules whose tests only read what one setup wrote."""
    name = f"tf_{label}_{os.getpid()}"
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(drop)
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    try:
        yield make_conninfo(admin_url, dbname=name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(drop)
