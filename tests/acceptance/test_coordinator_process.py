"""``tunefleet coordinator`` as a process: killed and resumed, refused twice, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.coordinator import fleet, logs, measured_twice, trial_counts
from tests.helpers.queue_data import first_invalid, wait_until
from tunefleet.db.engine import connect
from tunefleet.queries import search as q
from tunefleet.vocabulary import FINISHED_TRIAL_STATES

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.acceptance


#: Quick synthetic evaluations timed with one launch.
FAST = [
    "synthetic",
    "--arg",
    "duration=0.02",
    "--arg",
    "invalid_rate=0.1",
]


def env_for(cli_env: dict[str, str]) -> dict[str, str]:
    return {**cli_env, "PYTHONPATH": str(ROOT), "TUNEFLEET_POLL_S": "0.02"}


def coordinator_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tunefleet", "coordinator", *args]


def cli(args: list[str], env: dict[str, str], cwd: Path | None = None) -> Any:
    return subprocess.run(
        coordinator_argv(*args), env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


counts = trial_counts
SLOWER = [a.replace("duration=0.02", "duration=0.2") for a in FAST]


def test_sigkilled_coordinator_resumes_and_finishes_without_measuring_anything_twice(
    db_url, db, cli_env, tmp_path
):
    (tmp_path / "cwd").mkdir()
    env = env_for(cli_env)
    with fleet(db_url, 3, tmp_path / "logs") as procs:
        proc = subprocess.Popen(
            coordinator_argv(
                # 0.2 s trials (not FAST's 0.02): after the 15th result some three seconds
                # of work are left, so the kill lands mid-run however late it is sent.
                *SLOWER,
                "--max-trials",
                "60",
                "--db",
                db_url,
                # The assertion on a learned invalid outcome must not depend on the search.
                "--seed-config",
                json.dumps(first_invalid({"invalid_rate": 0.1})),
            ),
            env=env,
            cwd=tmp_path / "cwd",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            run_id = wait_until(
                lambda: (db.execute("SELECT max(id) AS id FROM tunefleet.run").fetchone())["id"],
                what="the run to be created",
            )
            wait_until(
                lambda: counts(db, run_id).get("done", 0) >= 15,
                timeout=60,
                what="15 done trials",
            )
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        run = db.execute("SELECT * FROM tunefleet.run WHERE id = %s", (run_id,)).fetchone()
        assert run["state"] == "running" and run["coordinator_id"] is not None
        assert sum(counts(db, run_id).values()) < 60  # it really died mid-run

        # The lock died with the process: a new coordinator takes over and finishes.
        done = cli(["--resume", str(run_id), "--db", db_url], env, cwd=tmp_path / "cwd")
        final = counts(db, run_id)
    assert done.returncode == 0, done.stderr + logs(procs)
    assert done.returncode == 0, done.stderr
    assert f"run {run_id} finished: the trial budget is spent (max_trials)" in done.stdout
    best = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(best) == {"tile", "unroll", "vector", "order"}
    assert sum(final.get(s, 0) for s in ("done", "invalid", "failed", "timed_out")) == 60
    assert final.get("pending", 0) == final.get("running", 0) == 0
    assert measured_twice(db) == [], "a configuration was measured twice"
    assert final.get("invalid", 0) > 0  # learned as infinitely slow, not retried
    # OpenTuner left nothing in the working directory of either coordinator.
    assert list((tmp_path / "cwd").iterdir()) == []


def test_a_second_coordinator_process_is_refused_with_one_line(db_url, db, cli_env):
    env = env_for(cli_env)
    proc = subprocess.Popen(
        coordinator_argv(*FAST, "--max-time", "60", "--db", db_url),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_id = wait_until(
            lambda: db.execute(
                "SELECT id FROM tunefleet.run WHERE coordinator_id IS NOT NULL"
            ).fetchone(),
            what="the first coordinator to drive its run",
        )["id"]
        second = cli(["--resume", str(run_id), "--db", db_url], env)
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert lines[0].startswith(f"tunefleet: error: run {run_id} is already driven by")
    finally:
        proc.send_signal(signal.SIGTERM)  # a clean stop: pending cancelled, run resumable
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"run {run_id} stopped: stopped by the user (user)" in out
    assert counts(db, run_id).get("pending", 0) == 0


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["nope"], 1, "unknown problem 'nope'; built-ins are"),
        (["synthetic", "--arg", "noise=-4"], 1, "synthetic: noise=-4 must be >= 0"),
        (["synthetic", "--size", "noise"], 2, "--size 'noise' is not NAME=VALUE"),
        (["synthetic", "--size", "noise=0.5"], 2, "--size noise='0.5' is not a positive integer"),
        (
            ["synthetic", "--max-trials", "99999999999"],
            2,
            "--max-trials 99999999999 is above the limit 2147483647",
        ),
        (["synthetic", "--max-time", "inf"], 2, "--max-time inf: use a finite number, at most"),
        (["synthetic", "--patience", "0"], 2, "--patience 0: use at least 1"),
        (
            ["synthetic", "--arg", "duration=1e308"],
            1,
            "synthetic: duration=1e+308 must be between 0 and 3600",
        ),
        (["synthetic", "--arg", "duration=NaN"], 2, "--arg duration='NaN' is not a finite"),
        (
            ["gemm", "--size", "n=99999999999999999999"],
            2,
            "--size n=99999999999999999999 is above the limit 2147483647",
        ),
        (["synthetic", "--seed-config", "{x: 1}"], 2, "--seed-config is not valid JSON"),
        (["synthetic", "--seed-config", '{"x": 1}'], 2, "seed configuration 1: configuration"),
        (["synthetic", "--resume", "3"], 2, "--resume continues run 3 as it was created; drop"),
        (["synthetic", "--technique", "Magic"], 2, "unknown search technique 'Magic'"),
        (["--resume", "77"], 1, "run 77 does not exist"),
        ([], 2, "name a PROBLEM to tune, or --resume RUN"),
    ],
)
def test_bad_input_is_one_line_and_stores_nothing(db_url, db, cli_env, args, code, message):
    done = cli([*args, "--db", db_url], env_for(cli_env))
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunefleet: error: "), done.stderr
    assert message in lines[0]
    assert db.execute("SELECT count(*) AS n FROM tunefleet.run").fetchone()["n"] == 0


def test_the_coordinator_imports_without_opencl(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['pyopencl'] = None\n"  # any import of it now fails
        "sys.modules['loopy'] = None\n"
        "import tunefleet.coordinator.engine, tunefleet.coordinator.cli\n"
        "import tunefleet.coordinator.tuner\n"
        "import tunefleet.queries.search\n"
        "from tunefleet.cli import build_parser\n"
        "build_parser().parse_args(['coordinator', '--help'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "--warm-start-from CLASS" in done.stdout


def test_a_finished_coordinator_releases_its_run(db_url, db, cli_env, tmp_path):
    with fleet(db_url, 1, tmp_path):
        done = cli([*FAST, "--max-trials", "5", "--db", db_url], env_for(cli_env))
    assert done.returncode == 0, done.stderr
    run_id = int(done.stderr.split("created run ")[1].split()[0])
    other = connect(db_url)
    assert q.try_lock_run(other, run_id)
    other.close()
    run = db.execute("SELECT * FROM tunefleet.run WHERE id = %s", (run_id,)).fetchone()
    assert (run["state"], run["stop_reason"], run["coordinator_id"]) == (
        "finished",
        "max_trials",
        None,
    )


def test_a_resumed_run_gets_its_time_budget_again(db_url, db, cli_env, tmp_path):
    """`--max-time` counts from the command's start, as for `tune`: a run created long ago
    (an earlier batch job) and resumed with a budget searches on rather than finding it
    spent by its age and stopping at once."""
    env = env_for(cli_env)
    with fleet(db_url, 1, tmp_path / "logs") as procs:
        first = cli([*FAST, "--max-trials", "3", "--confirm", "0", "--db", db_url], env)
        assert first.returncode == 0, first.stderr + logs(procs)
        run_id = db.execute("SELECT max(id) AS id FROM tunefleet.run").fetchone()["id"]
        # An hour old, as if its first coordinator ran in an earlier allocation.
        db.execute(
            "UPDATE tunefleet.run SET created_at = created_at - interval '1 hour' WHERE id = %s",
            (run_id,),
        )
        done = cli(
            ["--resume", str(run_id), "--max-trials", "8", "--max-time", "600", "--confirm",
             "0", "--db", db_url],
            env,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr + logs(procs)
    assert f"run {run_id} finished: the trial budget is spent (max_trials)" in done.stdout
    finished = sum(counts(db, run_id).get(s, 0) for s in FINISHED_TRIAL_STATES)
    assert finished == 8


def test_a_second_signal_during_the_stop_exits_at_once_with_130(db_url, db, cli_env):
    """The one stop rule (tunefleet.stopping): the first SIGTERM asks for a clean stop and
    says so; while that stop cannot finish (the test holds the run's row, which marking it
    stopped needs), a second SIGTERM ends the command at once with 130."""
    import queue
    import threading

    import psycopg

    env = env_for(cli_env)
    proc = subprocess.Popen(
        coordinator_argv(*FAST, "--max-time", "300", "--db", db_url),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    stderr: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            stderr.append(line)
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    locker = psycopg.connect(db_url)
    try:
        run_id = wait_until(
            lambda: db.execute(
                "SELECT r.id FROM tunefleet.run r WHERE r.coordinator_id IS NOT NULL AND "
                "EXISTS (SELECT 1 FROM tunefleet.trial t WHERE t.run_id = r.id "
                "AND t.state = 'pending')"
            ).fetchone(),
            what="the coordinator to drive its run and queue trials",
        )["id"]
        locker.execute("SELECT id FROM tunefleet.run WHERE id = %s FOR UPDATE", (run_id,))
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "no stopping notice after the first SIGTERM:\n" + "".join(stderr)
            try:
                if lines.get(timeout=left).startswith("tunefleet: stopping the run cleanly"):
                    break
            except queue.Empty:
                continue
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)  # promptly: the held row lock no longer holds it up
    finally:
        if proc.poll() is None:
            proc.kill()
        locker.rollback()
        locker.close()
    reader.join(timeout=30)
    assert proc.returncode == 130, "".join(stderr)
    assert "tunefleet: interrupted\n" in stderr, "".join(stderr)
    # The stop never finished: the run is not marked stopped by this coordinator.
    row = db.execute("SELECT state FROM tunefleet.run WHERE id = %s", (run_id,)).fetchone()
    assert row["state"] == "running"
