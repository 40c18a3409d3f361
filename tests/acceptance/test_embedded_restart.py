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


def _finished(url: str) -> int:
    """Search trials of run 1 that finished, or 0 while the run or the server is not there."""
    try:
        with connect(url, connect_timeout=2) as db:
            return sum(trial_counts(db, 1).get(s, 0) for s in FINISHED)
    except Exception:
        return 0


@pytest.mark.timeout(600)
def test_tune_restarts_the_embedded_server_it_runs_on_when_its_postmaster_dies(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    """`tune` on the embedded server: its postmaster is killed mid-run. Before, `tune` waited
    in silence, its live line frozen, until someone ran `tunefleet db start`; now it notices,
    starts the server again itself, says so in one line, and finishes the run with every
    configuration measured exactly once."""
    from tunefleet.db.embedded import EmbeddedServer

    server = EmbeddedServer(Path(cli_env["TUNEFLEET_HOME"]) / "postgres" / "data")
    env = {**cli_env, "TUNEFLEET_POLL_S": "0.05"}
    log = tmp_path / "tune.out"
    with log.open("w") as out:
        tune = subprocess.Popen(
            [sys.executable, "-m", "tunefleet", "tune", "synthetic", "--arg", "duration=0.3",
             "--workers", "1", "--max-trials", str(MAX_TRIALS), "--confirm", "1",
             "--progress-every", "1"],
            env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def alive() -> bool:
        if tune.poll() is None:
            return True
        raise AssertionError(f"tune exited {tune.returncode}: {log.read_text()}")

    try:

        def running_url() -> str | None:
            return server.local_url() if alive() and server.status().running else None

        url = wait_until(running_url, timeout=180, interval=0.1, what="the embedded server")
        wait_until(
            lambda: alive() and _finished(url) >= 4,
            timeout=180, interval=0.1, what="4 finished trials",
        )  # fmt: skip
        before = server.status()
        assert before.pid is not None
        os.kill(before.pid, signal.SIGKILL)
        wait_until(lambda: postmaster_gone(before.pid), timeout=30, what="the postmaster")

        # `tune` starts it again by itself, on the same address: nobody runs `db start`.
        wait_until(
            lambda: alive() and server.status().running and reachable(url),
            timeout=120, interval=0.1, what="tune to start the server again",
        )  # fmt: skip
        assert server.status().pid != before.pid
        assert server.local_url() == url, "the same port and socket directory"
        tune.wait(timeout=300)
    finally:
        if tune.poll() is None:
            tune.kill()
            tune.wait(timeout=30)
    said = log.read_text()
    assert tune.returncode == 0, said
    restarted = [ln for ln in said.splitlines() if "restarted it" in ln]
    assert restarted == [
        "tunefleet: note: the embedded database server stopped under run 1 (its postmaster "
        f"is gone); restarted it (data: {server.data_dir}), the run goes on"
    ], said
    assert "run 1 finished" in said, said

    with connect(url) as db:
        counts = trial_counts(db, 1)
        assert sum(counts.get(s, 0) for s in FINISHED) == MAX_TRIALS, counts
        assert counts.get("pending", 0) == counts.get("running", 0) == 0, counts
        # Every search trial claimed once and measured at most once: nothing lost, nothing
        # measured twice.
        claims = db.execute(
            "SELECT t.id, t.attempt, count(a.*) AS claims,"
            "       (SELECT count(*) FROM tunefleet.measurement m WHERE m.trial_id = t.id)"
            "         AS measurements"
            "  FROM tunefleet.trial t LEFT JOIN tunefleet.attempt a ON a.trial_id = t.id"
            " WHERE t.run_id = 1 AND t.purpose = 'search' AND t.source <> 'cache'"
            " GROUP BY t.id"
        ).fetchall()
        assert claims and all(
            (r["attempt"], r["claims"]) == (1, 1) and r["measurements"] <= 1 for r in claims
        ), claims
        twice = db.execute(
            "SELECT m.config_hash FROM tunefleet.measurement m"
            "  JOIN tunefleet.trial t ON t.id = m.trial_id"
            " WHERE m.run_id = 1 AND t.purpose = 'search'"
            " GROUP BY m.config_hash HAVING count(*) > 1"
        ).fetchall()
        assert twice == [], "a configuration was measured twice"
