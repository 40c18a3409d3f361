"""Coordinator test helpers: settings for fast runs, idle worker rows, a real worker fleet,
and the checks that nothing was measured twice."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.helpers.launch import WorkerProcess, start_workers, wait_all
from tests.helpers.queue_data import wait_until
from tunefleet.coordinator.budget import KEYWORDS, Budget
from tunefleet.coordinator.settings import CoordinatorSettings
from tunefleet.db.engine import connect
from tunefleet.problems.synthetic import FLOP_COUNT, OPTIMUM_SECONDS

#: GFLOP/s of the synthetic optimum: a target only the optimum reaches.
OPTIMUM_GFLOPS = FLOP_COUNT / OPTIMUM_SECONDS / 1e9


def settings(**kw: Any) -> CoordinatorSettings:
    """Fast-polling settings for the synthetic problem with quick evaluations."""
    base: dict[str, Any] = {
        "problem": "synthetic",
        "problem_args": {"duration": 0.005},
        "protocol": {"warmup": 0, "min_launches": 1, "min_seconds": 0.0, "max_launches": 1},
        "poll_s": 0.02,
    }
    # The budget's fields by name, as a test writes them, become the one Budget value.
    budget = {f: kw.pop(f) for f in KEYWORDS if f in kw}
    return CoordinatorSettings.build(**{**base, **kw}, budget=Budget.build(**budget))


def register_worker(
    db: Any,
    device_class: str = "host-cpu",
    age_s: float = 0.0,
    state: str = "active",
    capacity: int = 2,
) -> uuid.UUID:
    """A worker row without a process: counts as live (heartbeat ``age_s`` ago) but never
    claims, so the trials queued for it stay pending."""
    worker_id = uuid.uuid4()
    db.execute(
        """
        INSERT INTO tunefleet.worker
               (id, host, pid, device_class, version, heartbeat_at, state, capacity)
        VALUES (%s, 'test', %s, %s, 'test', now() - make_interval(secs => %s), %s, %s)
        """,
        (worker_id, os.getpid(), device_class, age_s, state, capacity),
    )
    return worker_id


@contextlib.contextmanager
def fleet(db_url: str, n: int, log_dir: Path, **options: Any) -> Iterator[list[WorkerProcess]]:
    """``n`` real ``tunefleet worker --device host`` processes that wait for work until the
    block ends, then stop gracefully (SIGKILL if they do not). The block starts once all ``n``
    have registered, so a coordinator started in it sees the whole fleet as live."""
    opts: dict[str, Any] = {"drain": False, "poll_s": 0.05, "lease_s": 5, "prepare_workers": 0}
    workers = start_workers(db_url, n, log_dir=log_dir, **{**opts, **options})
    try:
        pids = [w.pid for w in workers]

        def registered() -> bool:
            with connect(db_url) as conn:
                row = conn.execute(
                    "SELECT count(*) AS n FROM tunefleet.worker"
                    " WHERE state = 'active' AND pid = ANY(%s)",
                    (pids,),
                ).fetchone()
            return bool(row and row["n"] == n)

        wait_until(registered, timeout=60, interval=0.1, what=f"{n} workers to register")
        yield workers
    finally:
        for w in workers:
            w.stop()
        try:
            wait_all(workers, 30)
        finally:
            for w in workers:
                w.kill()


def logs(workers: list[WorkerProcess]) -> str:
    return "\n".join(f"--- worker {w.pid}\n{w.log()[-3000:]}" for w in workers)


def measured_twice(db: Any) -> list[dict[str, Any]]:
    """Configurations measured more than once under one cache key by the search (cache
    answers and confirmations, re-measurements by design, excluded), and trials claimed
    more than once: both must be empty."""
    twice = db.execute(
        """
        SELECT m.cache_key, m.config_hash, count(*) AS n
          FROM tunefleet.measurement m JOIN tunefleet.trial t ON t.id = m.trial_id
         WHERE t.source <> 'cache' AND t.purpose = 'search'
         GROUP BY m.cache_key, m.config_hash HAVING count(*) > 1
        """
    ).fetchall()
    reclaimed = db.execute(
        """
        SELECT trial_id, count(*) AS n FROM tunefleet.attempt
         WHERE outcome IS DISTINCT FROM 'released'
         GROUP BY trial_id HAVING count(*) > 1
        """
    ).fetchall()
    return twice + reclaimed


def trial_counts(db: Any, run_id: int) -> dict[str, int]:
    rows = db.execute(
        "SELECT state, count(*) AS n FROM tunefleet.trial"
        " WHERE run_id = %s AND purpose = 'search' GROUP BY state",
        (run_id,),
    ).fetchall()
    return {r["state"]: r["n"] for r in rows}
