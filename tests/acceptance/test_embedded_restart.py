"""A restart of the embedded server strands nobody: the postmaster is killed mid-run, a new user's
`tunefleet db start` brings it back, and the same coordinator and the same two workers finish
the run by themselves, measuring every configuration once.

Regression: the server came back on a new random port, so the live coordinator retried its old
URL for ten minutes and the workers never reconnected.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.coordinator import logs, trial_counts
from tests.helpers.launch import start_workers, wait_all
from tests.helpers.queue_data import wait_until
from tunefleet.db.engine import connect

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.acceptance

MAX_TRIALS = 30
FINISHED = ("done", "invalid", "failed", "timed_out")


def status(env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "tunefleet", "db", "status", "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    ).stdout  # fmt: skip
    info: dict[str, Any] = json.loads(out)
    return info


def reachable(url: str) -> bool:
    try:
        with connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False


def postmaster_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in {"Z", "X"}  # a killed server nobody reaped yet is gone too


@pytest.mark.timeout(600)
def _alive(proc: subprocess.Popen[str]) -> bool:
    """True while ``proc`` runs; a coordinator that exited fails the test at once with its
    output instead of leaving the next wait to run out."""
    if proc.poll() is None:
        return True
    out, err = proc.communicate()
    raise AssertionError(f"the coordinator exited {proc.returncode}: {err or out}")


def test_killed_postmaster_restarted_with_db_start_strands_no_coordinator_or_worker(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**cli_env, "PYTHONPATH": str(ROOT), "TUNEFLEET_POLL_S": "0.05"}
    started = subprocess.run(
        [sys.executable, "-m", "tunefleet", "db", "start"],
        env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    before = status(env)
    url = before["url"]

    # A lease well beyond the outage: the workers keep what they hold while the server is down.
    workers = start_workers(
        url, 2, log_dir=tmp_path / "logs", env=env,
        drain=False, poll_s=0.05, lease_s=30, prepare_workers=0,
    )  # fmt: skip
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "tunefleet", "coordinator", "synthetic",
         "--arg", "duration=0.3", "--max-trials", str(MAX_TRIALS)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with connect(url) as db:
            pids = [w.pid for w in workers]
            wait_until(
                lambda: (
                    db.execute(
                        "SELECT count(*) AS n FROM tunefleet.worker"
                        " WHERE state = 'active' AND pid = ANY(%s)",
                        (pids,),
                    ).fetchone()["n"]
                    == 2
                ),
                timeout=120,
                interval=0.1,
                what="both workers to register",
            )
            run_id = wait_until(
                lambda: (
                    _alive(coordinator)
                    and db.execute("SELECT max(id) AS id FROM tunefleet.run").fetchone()["id"]
                ),
                timeout=120,
                what="the coordinator's run",
            )
            wait_until(
                lambda: sum(trial_counts(db, run_id).get(s, 0) for s in FINISHED) >= 4,
                timeout=180,
                interval=0.1,
                what="4 finished trials",
            )
            worker_ids = [
                r["id"]
                for r in db.execute(
                    "SELECT id FROM tunefleet.worker WHERE pid = ANY(%s)", (pids,)
                ).fetchall()
            ]

        os.kill(before["pid"], signal.SIGKILL)
        wait_until(lambda: postmaster_gone(before["pid"]), timeout=30, what="the postmaster")
        assert not reachable(url)
        assert coordinator.poll() is None and all(w.alive for w in workers)

        again = subprocess.run(
            [sys.executable, "-m", "tunefleet", "db", "start"],
            env=env, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        after = status(env)
        assert after["pid"] != before["pid"]
        assert after["url"] == url, "the same port and socket directory"

        with connect(url) as db:
            # The workers may reconnect before `db start` has finished checking the schema.
            restarted_at = db.execute("SELECT pg_postmaster_start_time() AS t").fetchone()["t"]
            # Both workers reconnect by themselves: their heartbeats resume.
            wait_until(
                lambda: (
                    db.execute(
                        "SELECT count(*) AS n FROM tunefleet.worker"
                        " WHERE id = ANY(%s) AND state = 'active' AND heartbeat_at > %s",
                        (worker_ids, restarted_at),
                    ).fetchone()["n"]
                    == 2
                ),
                timeout=120,
                interval=0.2,
                what="both workers to heartbeat again",
            )
        out, err = coordinator.communicate(timeout=300)
        assert coordinator.returncode == 0, err + logs(workers)
        assert f"run {run_id} finished" in out, out + err

        with connect(url) as db:
            counts = trial_counts(db, run_id)
            assert sum(counts.get(s, 0) for s in FINISHED) == MAX_TRIALS, counts
            assert counts.get("pending", 0) == counts.get("running", 0) == 0, counts
            twice = db.execute(
                # Confirmations re-measure the best configurations by design.
                "SELECT m.config_hash, count(*) AS n FROM tunefleet.measurement m"
                "  JOIN tunefleet.trial t ON t.id = m.trial_id"
                " WHERE m.run_id = %s AND t.purpose = 'search'"
                " GROUP BY m.config_hash HAVING count(*) > 1",
                (run_id,),
            ).fetchall()
            assert twice == [], "a configuration was measured twice"
            others = db.execute(
                "SELECT count(*) AS n FROM tunefleet.attempt a"
                "  JOIN tunefleet.trial t ON t.id = a.trial_id"
                " WHERE t.run_id = %s AND a.worker_id <> ALL(%s)",
                (run_id, worker_ids),
            ).fetchone()
            assert others["n"] == 0, "only the two original workers took trials"
            measured_after = db.execute(
                "SELECT count(*) AS n FROM tunefleet.attempt a"
                "  JOIN tunefleet.trial t ON t.id = a.trial_id"
                " WHERE t.run_id = %s AND a.claimed_at > %s",
                (run_id, restarted_at),
            ).fetchone()
            assert measured_after["n"] > 0, "trials were claimed after the restart"
        assert all(w.alive for w in workers), "the same worker processes, still serving"
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
            coordinator.communicate(timeout=30)
        for w in workers:
            w.stop()
        try:
            wait_all(workers, 60)
        finally:
            for w in workers:
                w.kill()
