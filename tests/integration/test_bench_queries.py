"""The read-only statements of ``tunefleet.queries.bench`` (what the benchmark scripts time a
fleet with) against real trials moved through the real queue, and the worker's statement
latency line at debug level that ``benchmarks/fleet_scaling.py`` reads back."""

from __future__ import annotations

import logging
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.queue_data import insert_run, insert_trials, synthetic_configs
from tunefleet.queries import bench, queue
from tunefleet.queries.queue import MeasurementRow
from tunefleet.settings import DatabaseSettings
from tunefleet.worker.link import Link

ROOT = Path(__file__).resolve().parents[2]


def register(db: Any) -> tuple[uuid.UUID, str]:
    worker_id = uuid.uuid4()
    secret = queue.register_worker(
        db,
        worker_id=worker_id,
        host="h",
        pid=1,
        device_id=None,
        device_class="any",
        version="0",
    )
    return worker_id, secret


def finish(db: Any, worker: tuple[uuid.UUID, str], limit: int, state: str = "done") -> list[int]:
    worker_id, secret = worker
    claims = queue.claim_trials(
        db, worker_id=worker_id, secret=secret, device_classes=["any"], limit=limit, lease_s=30
    )
    for c in claims:
        queue.complete_trial(
            db,
            trial_id=c.trial_id,
            attempt=c.attempt,
            token=c.lease_token,
            worker_id=worker_id,
            state=state,
            measurement=MeasurementRow(
                median_s=1e-3 * c.trial_id,
                min_s=1e-3,
                samples_s=[1e-3],
                protocol={},
                gflops=1.0 / c.trial_id,
                compile_s=0.5,
                byte_count=8.0,
            )
            if state == "done"
            else None,
            error=None if state == "done" else "bad",
        )
    return [c.trial_id for c in claims]


def test_batch_reads_follow_trials_through_the_queue(db: Any) -> None:
    run = insert_run(db)
    other = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(6))
    insert_trials(db, other, synthetic_configs(2))
    assert bench.open_trials(db, [run]) == 6
    assert bench.trial_ids(db, [run]) == ids

    a, b = register(db), register(db)
    done_a = finish(db, a, 3)
    done_b = finish(db, b, 1)
    finish(db, b, 1, state="invalid")

    assert bench.open_trials(db, [run]) == 1
    assert bench.open_trials(db, [run, other]) == 3
    assert bench.state_counts(db, [run]) == {"done": 4, "invalid": 1, "pending": 1}
    timing = bench.batch_timing(db, [run])
    assert (timing["trials"], timing["done"], timing["not_done"]) == (6, 4, 2)
    assert timing["wall_s"] >= 0 and timing["first_claim_s"] >= 0
    per_worker = {r["worker_id"]: r["trials"] for r in bench.trials_per_worker(db, [run])}
    assert per_worker == {a[0]: 3, b[0]: 1}
    rows = bench.measurements(db, [run])
    assert [r["trial_id"] for r in rows] == sorted(done_a + done_b)  # fastest first
    assert rows[0]["compile_s"] == 0.5 and rows[0]["byte_count"] == 8.0
    times = {r["id"]: r for r in bench.trial_times(db, [run])}
    assert set(times) == set(ids)
    for t in done_a + done_b:
        assert times[t]["created_at"] <= times[t]["started_at"] <= times[t]["finished_at"]
    assert times[ids[-1]]["finished_at"] is None
    bench.ping(db)


def test_link_logs_statement_latency_in_the_format_the_benchmark_reads(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import fleet_scaling
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    link = Link(db_url, DatabaseSettings(url=db_url), "main")
    try:
        with caplog.at_level(logging.INFO, logger="tunefleet.worker"):
            link.run(bench.ping)
        assert "took" not in caplog.text  # off unless debug logging is on
        with caplog.at_level(logging.DEBUG, logger="tunefleet.worker"):
            link.run(bench.ping)
    finally:
        link.close()
    line = f" DEBUG tunefleet.worker: {caplog.records[-1].getMessage()}"
    m = fleet_scaling._STATEMENT.search(line)
    assert m is not None, line
    assert (m.group(1), m.group(2)) == ("main", "ping")
    assert float(m.group(3)) >= 0
    assert re.fullmatch(r"[0-9]+\.[0-9]{3}", m.group(3))
