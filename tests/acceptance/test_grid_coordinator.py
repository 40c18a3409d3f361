"""A ``tunefleet coordinator --technique grid`` process SIGKILLed in the middle of its grid:
the next coordinator rebuilds the plan from the run's stored space, walks on from what the
database holds and ends ``space_exhausted`` with every valid configuration measured once."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.test_coordinator_process import cli, coordinator_argv, env_for
from tests.helpers.coordinator import fleet, logs, measured_twice, trial_counts
from tests.helpers.coordinator_problems import RULED
from tests.helpers.queue_data import wait_until
from tests.integration.test_grid_runs import RULED_OUT, VALID, measured_order, plan_order

pytestmark = pytest.mark.acceptance


def test_a_sigkilled_grid_resumes_and_measures_each_valid_point_once(
    db_url, db, cli_env, tmp_path: Path
):
    env = env_for(cli_env)
    argv = [RULED, "--arg", "duration=0.01", "--technique", "grid", "--confirm", "0"]
    with fleet(db_url, 3, tmp_path / "logs") as procs:
        proc = subprocess.Popen(
            coordinator_argv(*argv, "--db", db_url),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            run_id = wait_until(
                lambda: db.execute("SELECT max(id) AS id FROM tunefleet.run").fetchone()["id"],
                what="the run to be created",
            )
            wait_until(
                lambda: trial_counts(db, run_id).get("done", 0) >= 100,
                timeout=60,
                what="100 done trials",
            )
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        assert trial_counts(db, run_id).get("done", 0) < VALID  # killed mid-grid

        done = cli(["--resume", str(run_id), "--db", db_url], env)
        final = trial_counts(db, run_id)
    assert done.returncode == 0, done.stderr + logs(procs)
    assert "space_exhausted" in done.stdout, done.stdout
    assert final == {"done": VALID, "invalid": RULED_OUT}
    assert measured_twice(db) == []
    assert measured_order(db, run_id) == plan_order(db, run_id)


def test_a_box_too_big_for_the_grid_is_one_line_and_stores_nothing(db_url, db, cli_env):
    argv = ["gemm", "--device-class", "nvidia-h200", "--technique", "grid", "--db", db_url]
    done = cli(argv, env_for(cli_env))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunefleet: error: "), done.stderr
    assert "the space has 27,216,000 configurations, more than the grid technique" in lines[0]
    assert "fix some parameters to narrow it, or pick another --technique" in lines[0]
    assert db.execute("SELECT count(*) AS n FROM tunefleet.run").fetchone()["n"] == 0
