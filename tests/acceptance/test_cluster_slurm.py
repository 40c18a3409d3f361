"""The shipped batch script under a real Slurm: ``examples/slurm/tunefleet-workers.sbatch``
submitted with ``sbatch`` as a user would, to a controller and two ``slurmd`` nodes of this
session (:mod:`tests.helpers.slurm`), whose tasks run on nodes with their own network and reach
the database host over TCP, with TLS verified, as the worker role.

CPU nodes: the script's ``--gres=gpu:4`` is overridden with ``--gres=none`` and every task
serves the synthetic problem's ``host`` device (``TUNEFLEET_WORKER_DEVICE``); the coordinator
runs on the login node as the coordinator role.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.chaos import accounting, violations
from tests.helpers.cluster import ROOT, SiteDatabase, coordinator_on
from tests.helpers.launch import WorkerProcess
from tests.helpers.queue_data import wait_until
from tests.helpers.slurm import SlurmCluster
from tunefleet.db.engine import connect

pytestmark = [pytest.mark.acceptance, pytest.mark.cluster]

SCRIPT = ROOT / "examples" / "slurm" / "tunefleet-workers.sbatch"
#: The coordinator's polling, fast enough for short runs.
COORDINATOR_ENV = {"TUNEFLEET_POLL_S": "0.05"}


def job_env(db: SiteDatabase, tmp_path: Path, worker_args: str = "--drain -v") -> dict[str, str]:
    """What a user exports before ``sbatch``: the worker role's URL (TLS, no password), its
    pgpass file, a file that puts tunefleet on PATH, the device and the worker's flags."""
    env_file = tmp_path / "tunefleet-env.sh"
    env_file.write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')
    env = db.env("worker")
    env.update(
        TUNEFLEET_DATABASE_URL=db.url("worker"),
        TUNEFLEET_ENV_FILE=str(env_file),
        TUNEFLEET_WORKER_DEVICE="host",
        TUNEFLEET_WORKER_ARGS=worker_args,
        TUNEFLEET_WAIT_FOR_DB_S="60",
    )
    return env


def submit(
    slurm: SlurmCluster, db: SiteDatabase, tmp_path: Path, *options: str
) -> tuple[int, Path]:
    """The shipped script on CPU nodes; the job's id and its output file."""
    job = slurm.sbatch(
        SCRIPT,
        "--gres=none",
        "--cpus-per-task=1",
        f"--output={tmp_path}/job-%j.out",
        *options,
        env=job_env(db, tmp_path),
        cwd=tmp_path,
    )
    return job, tmp_path / f"job-{job}.out"


def query(db: SiteDatabase, sql: str, params: Any = None) -> list[dict[str, Any]]:
    with connect(db.admin_url) as conn:
        return conn.execute(sql, params).fetchall()


def start_run(site: Any, db: SiteDatabase, tmp_path: Path, *args: str) -> tuple[WorkerProcess, int]:
    coordinator = coordinator_on(
        site.node("login1"), db, tmp_path / "coordinator.log", "synthetic", *args,
        env={**db.env("coordinator"), **COORDINATOR_ENV},
    )  # fmt: skip

    def created() -> int | None:
        if coordinator.poll() is not None:
            raise AssertionError(f"the coordinator exited:\n{coordinator.log()}")
        return query(db, "SELECT max(id) AS id FROM tunefleet.run")[0]["id"]

    run_id = wait_until(created, timeout=90, interval=0.1, what="the coordinator's run")
    return coordinator, int(run_id)


def worker_sessions_in_server_log(site: Any, db: SiteDatabase) -> list[str]:
    """The server's record of the worker role's connections to this database (TLS or not)."""
    text = site.server.log_path.read_text(errors="replace")
    return re.findall(rf"connection authorized: user=tunefleet_worker database={db.name}\b.*", text)


def running_by_host(db: SiteDatabase) -> dict[str, int]:
    rows = query(
        db,
        """
        SELECT w.host, count(*) AS n FROM tunefleet.trial t
          JOIN tunefleet.worker w ON w.id = t.lease_owner
         WHERE t.state = 'running' GROUP BY w.host
        """,
    )
    return {r["host"]: int(r["n"]) for r in rows}


def held_or_open(db: SiteDatabase, host: str) -> list[dict[str, Any]]:
    """Claims of ``host``'s workers still leased or never closed."""
    return query(
        db,
        """
        SELECT a.trial_id, a.attempt, a.outcome, t.state FROM tunefleet.attempt a
          JOIN tunefleet.worker w ON w.id = a.worker_id
          JOIN tunefleet.trial t ON t.id = a.trial_id
         WHERE w.host = %s
           AND (a.outcome IS NULL OR (t.state = 'running' AND t.lease_owner = w.id))
        """,
        (host,),
    )


def test_the_batch_script_runs_workers_that_finish_a_run_with_every_trial_once(
    site, site_db, slurm_cluster, tmp_path
):
    trials = 24
    coordinator, run_id = start_run(
        site, site_db, tmp_path, "--arg", "duration=0.2", "--max-trials", str(trials)
    )
    try:
        job, output = submit(
            slurm_cluster, site_db, tmp_path, "--nodes=2", "--ntasks-per-node=2", "--time=10"
        )
        state = slurm_cluster.wait_finished(job, 240)
        text = output.read_text(errors="replace")
        assert state == "COMPLETED", f"{text}\n{slurm_cluster.logs()}"
        assert f"tunefleet-workers: job {job} on 2 node(s), 2 worker(s) per node" in text
        assert coordinator.wait(120) == 0, coordinator.log()
    finally:
        coordinator.kill()
    with connect(site_db.admin_url) as db:
        broken = violations(db, run_id, trials)
        books = accounting(db, run_id)
        workers = db.execute("SELECT host, state FROM tunefleet.worker ORDER BY host").fetchall()
    assert not broken, "\n".join(broken) + "\n" + text
    assert (books["finished"], books["lost"], books["duplicated"], books["stuck"]) == (
        trials, 0, 0, 0
    ), books  # fmt: skip
    # Four tasks on the two Slurm nodes, each one worker that left on its own (--drain).
    assert [w["host"] for w in workers] == ["node1", "node1", "node2", "node2"], workers
    assert {w["state"] for w in workers} == {"stopped"}
    # They logged in as the worker role, over TLS (the server refuses TCP without it).
    sessions = worker_sessions_in_server_log(site, site_db)
    assert len(sessions) >= 4 and all("SSL enabled" in s for s in sessions), sessions


def test_scancel_and_the_time_limit_signal_hand_trials_back_and_lose_nothing(
    site, site_db, slurm_cluster, tmp_path
):
    """Two one-worker jobs mid-run: one is cancelled (``scancel``), the other's time limit is
    cut to two minutes, under the script's ``--signal=TERM@120``: Slurm signals its workers
    early. Both hand back what they hold; a third job finishes the run, every trial once."""
    trials = 40
    coordinator, run_id = start_run(
        site, site_db, tmp_path, "--arg", "duration=2.5", "--max-trials", str(trials)
    )
    try:
        one_task = ("--nodes=1", "--ntasks-per-node=1", "--time=10")
        signalled, signalled_out = submit(slurm_cluster, site_db, tmp_path, *one_task, "-wnode1")
        cancelled, cancelled_out = submit(slurm_cluster, site_db, tmp_path, *one_task, "-wnode2")
        wait_until(
            lambda: running_by_host(site_db).keys() >= {"node1", "node2"},
            timeout=120,
            interval=0.1,
            what=f"both jobs' workers to hold running trials\n{slurm_cluster.logs()}",
        )
        slurm_cluster.scancel(cancelled)
        # Two minutes is less than the script's --signal=TERM@120 leaves: Slurm sends the
        # early signal on its next check of the time limits (every 30 s).
        slurm_cluster.scontrol("update", f"JobId={signalled}", "TimeLimit=2")

        assert slurm_cluster.wait_finished(cancelled, 120) == "CANCELLED"
        text = cancelled_out.read_text(errors="replace")
        assert "SIGTERM: finishing the trial being timed" in text, text
        assert "tunefleet worker: aborted" not in text, text
        assert held_or_open(site_db, "node2") == []

        # The time limit's early signal: the workers stop, the script ends, the job completes
        # before its limit (not TIMEOUT).
        assert slurm_cluster.wait_finished(signalled, 120) == "COMPLETED"
        text = signalled_out.read_text(errors="replace")
        assert "SIGTERM: finishing the trial being timed" in text, text
        assert "tunefleet worker: aborted" not in text, text
        assert held_or_open(site_db, "node1") == []
        [left] = query(
            site_db,
            "SELECT count(*) FILTER (WHERE state IN ('done', 'invalid', 'failed', 'timed_out'))"
            " AS finished FROM tunefleet.trial WHERE run_id = %s AND purpose = 'search'",
            (run_id,),
        )
        assert left["finished"] < trials, "the run ended before the signal: nothing was tested"

        finishing, finishing_out = submit(
            slurm_cluster, site_db, tmp_path, "--nodes=2", "--ntasks-per-node=2", "--time=10"
        )
        assert slurm_cluster.wait_finished(finishing, 300) == "COMPLETED", finishing_out.read_text(
            errors="replace"
        )
        assert coordinator.wait(120) == 0, coordinator.log()
    finally:
        coordinator.kill()
    with connect(site_db.admin_url) as db:
        broken = violations(db, run_id, trials)
        books = accounting(db, run_id)
        stopped = db.execute(
            "SELECT host, state FROM tunefleet.worker WHERE host IN ('node1', 'node2')"
            " ORDER BY host"
        ).fetchall()
    assert not broken, "\n".join(broken)
    assert (books["lost"], books["duplicated"], books["stuck"]) == (0, 0, 0), books
    assert {w["state"] for w in stopped} == {"stopped"}, stopped
