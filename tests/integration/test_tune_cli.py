"""`tunefleet tune` end to end: real processes, the embedded database, real workers.

A synthetic run (host pseudo-device) exercises the whole front door — tune, runs, best, show,
export, plot — on the embedded server; a tiny GEMM does the same on the PoCL CPU device;
Ctrl-C stops a run so that it resumes; each user error is one line.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.launch import process_alive
from tunefleet.db.engine import connect
from tunefleet.queries import report


def tf(env: dict[str, str], *argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["tunefleet", *argv], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def home(cli_env: dict[str, str]):
    """The CLI environment; the embedded server it starts is stopped afterwards."""
    yield cli_env
    tf(cli_env, "db", "stop", timeout=60)


def embedded_conn(env: dict[str, str]) -> Any:
    url = tf(env, "db", "url").stdout.strip()
    return connect(url)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tunefleet: error:")
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_tune_synthetic_then_every_read_command(home, tmp_path):
    proc = tf(
        home,
        "tune",
        "synthetic",
        "--arg",
        "duration=0.02",
        "--arg",
        "invalid_rate=0.15",
        "--workers",
        "2",
        "--max-trials",
        "24",
        "--progress-every",
        "0.5",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # periodic plain progress lines (stdout is not a terminal) with every number
    progress = [ln for ln in out.splitlines() if ln.startswith("run 1: ") and "eval/min" in ln]
    assert progress, out
    assert "workers" in progress[-1] and "GFLOP/s" in progress[-1]
    assert "best: trial" in out and "tunefleet measure synthetic" in out
    # the best was re-measured before it was reported, and the last line says so
    assert "\nconfirmed: median " in out, out
    # judged across its processes (the search's and the cold confirmation): quoted with the ±
    # the run's between-process spread gives
    assert re.match(
        r"run 1: best trial \d+: .* GFLOP/s ± \d+ % across \d processes, confirmed \(median "
        r".*; (fresh processes of one kernel differ by \d+\.\d %|too few processes)",
        out.splitlines()[-1],
    ), out
    # one best everywhere: the headline is the figure across processes, and says so
    assert re.search(
        r"\nbest: trial \d+, .* GFLOP/s ± \d+ % across \d processes, median .*: confirmed", out
    ), out
    assert "\nsearch: " in out and "cold build, same code" not in out  # synthetic: no code
    # what tuning gained: the best against the default configuration, measured first
    gained = re.search(
        r"\nover the default configuration: (?:(\d+\.\d\d)x faster \(the default, trial "
        r"(\d+): median .*\)|the best is the default itself)\n",
        out,
    )
    assert gained, out

    with embedded_conn(home) as conn:
        counts = conn.execute(
            "SELECT state, count(*) AS n FROM tunefleet.trial"
            " WHERE run_id = 1 AND purpose = 'search' GROUP BY state"
        ).fetchall()
        confirmed = conn.execute(
            "SELECT count(*) AS n FROM tunefleet.confirmations WHERE run_id = 1 AND state = 'done'"
        ).fetchone()["n"]
        states = {r["state"]: r["n"] for r in counts}
        run = conn.execute("SELECT * FROM tunefleet.run WHERE id = 1").fetchone()
        workers = conn.execute("SELECT state FROM tunefleet.worker").fetchall()
        # Both workers are started, but on a loaded machine the first can drain 24 short
        # trials before the second claims one: the plot names the workers that did work.
        worked = len({str(i["worker_id"]) for i in report.worker_intervals(conn, 1)})
    finished = sum(states.get(s, 0) for s in ("done", "invalid", "failed", "timed_out"))
    assert finished >= 24 and states.get("done", 0) > 0
    assert confirmed >= 3  # the three best, at least (more when one drops out of the top)
    assert states.get("running", 0) == 0 and states.get("pending", 0) == 0
    assert run["state"] == "finished"
    assert len(workers) == 2 and {w["state"] for w in workers} == {"stopped"}

    best = json.loads(tf(home, "best", "1", "--json").stdout)["best"][0]
    # the printed reproduce command really reproduces the configuration
    repro = tf(home, *shlex.split(best["reproduce"])[1:])
    assert repro.returncode == 0, repro.stderr
    assert "GFLOP/s" in repro.stdout

    export = tf(home, "export", "1", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(export.stdout)))
    assert len(rows) == finished
    assert {r["state"] for r in rows} <= {"done", "invalid", "failed", "timed_out"}
    data = json.loads(tf(home, "export", "1", "--format", "json").stdout)
    assert len(data) == finished

    png = tmp_path / "run1.png"
    plot = tf(home, "plot", "1", "-o", str(png))
    assert plot.returncode == 0, plot.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert 1 <= worked <= 2
    assert f"{finished} evaluations" in plot.stdout
    assert f"{worked} worker{'' if worked == 1 else 's'}" in plot.stdout, plot.stdout

    status = tf(home, "status", "1")
    assert "finished" in status.stdout and f"{states['done']} done" in status.stdout


def test_max_trials_counts_finished_search_trials_and_re_measurements_apart(home):
    # Every report says the budget the same way: search trials that finished (whatever their
    # verdict) out of --max-trials, the best's re-measurements apart and labelled extra.
    proc = tf(
        home, "tune", "synthetic", "--arg", "duration=0.01", "--arg", "invalid_rate=0.3",
        "--workers", "1", "--max-trials", "8", "--confirm", "2", "--progress-every", "0.5",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with embedded_conn(home) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE purpose = 'search' AND state IN "
            "('done', 'invalid', 'failed', 'timed_out')) AS finished, "
            "count(*) FILTER (WHERE purpose = 'search' AND state = 'done') AS done, "
            "count(*) FILTER (WHERE purpose = 'confirm' AND state = 'done') AS confirmed "
            "FROM tunefleet.trial WHERE run_id = 1"
        ).fetchone()
    assert row["finished"] == 8 and row["confirmed"] >= 1, row
    counts = f"8/8 finished ({row['done']} done, {8 - row['done']} invalid, 0 failed)"
    live = [ln for ln in proc.stdout.splitlines() if ln.startswith("run 1: ") and "eval/min" in ln]
    assert live and live[-1].startswith(f"run 1: {counts}, 0 running, 0 pending"), live
    assert f"; {row['confirmed']} re-measured (extra) | best" in live[-1], live[-1]
    heading = next(ln for ln in proc.stdout.splitlines() if ln.startswith("run 1: synthetic"))
    assert heading.endswith(f"{counts}; {row['confirmed']} re-measured (extra))"), heading
    status = tf(home, "status", "1").stdout
    assert f"  trials    {counts}, 0 running, 0 pending" in status, status
    assert f"  extra     {row['confirmed']} re-measured (the best's re-" in status, status
    runs = tf(home, "runs").stdout.splitlines()
    assert "FINISHED" in runs[0] and " 8/8 " in runs[1], runs


def test_tune_says_once_when_the_search_begins_its_end_game(home):
    """The default search sweeps the neighbourhoods of its fastest configurations near the
    end of its budget; ``tune`` says when, in one note on stderr, with the evaluations left
    (trials of 0.5 s: the note comes while the run still moves, not only on its last
    record, which test_search_session.py covers)."""
    proc = tf(
        home, "tune", "synthetic", "--arg", "duration=0.5", "--workers", "2",
        "--max-trials", "30", "--confirm", "0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    notes = re.findall(
        r"^tunefleet: note: run 1: about (\d+) of (\d+) evaluations left; the search sweeps "
        r"the neighbourhoods of its fastest configurations from now on$",
        proc.stderr,
        re.M,
    )
    assert len(notes) == 1, proc.stderr
    left, total = (int(n) for n in notes[0])
    # The budget, and past the model's first twelve measurements (ModelSearch's ``initial``).
    assert total == 30 and 0 < left <= 30 - 12, notes


def test_read_commands_leave_a_stopped_embedded_server_stopped(home):
    assert tf(home, "runs").returncode == 0  # a fresh home: the first command starts it
    assert tf(home, "db", "stop").returncode == 0
    for argv in (["status", "999"], ["status"], ["runs"], ["best", "1"], ["show", "1", "1"]):
        proc = tf(home, *argv)
        assert_one_line_error(proc, "embedded database is stopped", "`tunefleet db start`")
    assert re.search(r"^running\s+False$", tf(home, "db", "status").stdout, re.M)
    # whatever starts it on purpose clears that: a read command then finds it running
    assert tf(home, "db", "start").returncode == 0
    assert tf(home, "runs").returncode == 0


def _started_note(home: dict[str, str]) -> str:
    data = Path(home["TUNEFLEET_HOME"]) / "postgres" / "data"
    return (
        f"tunefleet: note: started the embedded database server (data: {data}); it keeps "
        "running after this command: stop it with `tunefleet db stop`"
    )


def test_a_command_that_starts_the_embedded_server_says_so(home):
    """The embedded server outlives the command that started it: a read command that starts
    it says so in one line on stderr, ``tune`` at its very end; one that finds it running
    says nothing."""
    first = tf(home, "runs")  # a fresh home: the first command starts it
    assert first.returncode == 0, first.stderr
    assert first.stderr.splitlines() == [_started_note(home)], first.stderr
    again = tf(home, "status")
    assert again.returncode == 0 and again.stderr == "", again.stderr

    assert tf(home, "db", "stop").returncode == 0
    tuned = subprocess.run(
        ["tunefleet", "tune", "synthetic", "--arg", "duration=0.01", "--workers", "1",
         "--max-trials", "2", "--confirm", "0"],
        env=home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240,
    )  # fmt: skip
    assert tuned.returncode == 0, tuned.stdout
    lines = tuned.stdout.splitlines()
    assert lines[-1] == _started_note(home), tuned.stdout
    assert lines.count(_started_note(home)) == 1, tuned.stdout
    assert re.search(r"^running\s+True$", tf(home, "db", "status").stdout, re.M)
    assert tf(home, "db", "stop").returncode == 0


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_ctrl_c_stops_cleanly_and_resume_continues(home):
    proc = subprocess.Popen(
        ["tunefleet", "tune", "synthetic", "--arg", "duration=0.2", "--max-trials", "500"],
        env=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def some_done() -> bool:
            try:
                with embedded_conn(home) as conn:
                    row = conn.execute(
                        "SELECT count(*) AS n FROM tunefleet.trial WHERE state = 'done'"
                    ).fetchone()
                    return bool(row["n"] >= 2)
            except Exception:
                return False

        _wait_for(some_done, 90, "two finished trials")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert "tunefleet tune --resume 1" in err
    with embedded_conn(home) as conn:
        run = conn.execute("SELECT state FROM tunefleet.run WHERE id = 1").fetchone()
        running = conn.execute(
            "SELECT count(*) AS n FROM tunefleet.trial WHERE state = 'running'"
        ).fetchone()
        alive = conn.execute(
            "SELECT count(*) AS n FROM tunefleet.worker WHERE state = 'active'"
        ).fetchone()
        done_before = conn.execute(
            "SELECT count(*) AS n FROM tunefleet.trial WHERE state = 'done'"
        ).fetchone()["n"]
    assert run["state"] == "stopped"
    assert running["n"] == 0  # held trials were handed back
    assert alive["n"] == 0  # the worker said goodbye

    resumed = tf(home, "tune", "--resume", "1", "--max-trials", str(done_before + 3))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    with embedded_conn(home) as conn:
        run = conn.execute("SELECT state FROM tunefleet.run WHERE id = 1").fetchone()
        done_after = conn.execute(
            "SELECT count(*) AS n FROM tunefleet.trial WHERE state = 'done'"
        ).fetchone()["n"]
        dupes = conn.execute(
            "SELECT count(*) AS n FROM (SELECT trial_id FROM tunefleet.measurement "
            "GROUP BY trial_id HAVING count(*) > 1) d"
        ).fetchone()["n"]
    assert run["state"] == "finished" and done_after > done_before and dupes == 0


def test_workers_stop_when_tune_is_killed_outright(home):
    proc = subprocess.Popen(
        ["tunefleet", "tune", "synthetic", "--arg", "duration=0.2", "--max-trials", "500"],
        env=home,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:

        def worker_busy() -> bool:
            try:
                with embedded_conn(home) as conn:
                    rows = conn.execute(
                        "SELECT w.pid FROM tunefleet.worker w JOIN tunefleet.trial t "
                        "ON t.lease_owner = w.id WHERE t.state = 'done'"
                    ).fetchall()
            except Exception:
                return False
            pids[:] = sorted({r["pid"] for r in rows})
            return bool(pids)

        _wait_for(worker_busy, 90, "a worker to finish a trial")
        proc.kill()  # no chance to clean up: the workers must not be orphaned
        proc.wait(30)

        def workers_gone() -> bool:
            with embedded_conn(home) as conn:
                row = conn.execute(
                    "SELECT count(*) AS n FROM tunefleet.worker WHERE state = 'active'"
                ).fetchone()
            return row["n"] == 0 and not any(process_alive(pid) for pid in pids)

        try:
            _wait_for(workers_gone, 60, "the orphaned worker to stop")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_fleet_report(home, pids)}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in pids:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


def _fleet_report(env: dict[str, str], pids: list[int]) -> str:
    """What a failed orphan test needs: worker rows, process states and the worker logs."""
    with embedded_conn(env) as conn:
        rows = conn.execute(
            "SELECT pid, state, heartbeat_at, stopped_at FROM tunefleet.worker"
        ).fetchall()
    lines = [f"worker rows: {rows}"]
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            stat = "gone"
        lines.append(f"pid {pid}: {stat}")
    for log in sorted((Path(env["TUNEFLEET_HOME"]) / "logs").glob("*/*.log")):
        lines.append(f"--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-15:]))
    return "\n".join(lines)


def test_workers_zero_drives_the_search_for_workers_started_elsewhere(home):
    tf(home, "db", "start")
    url = tf(home, "db", "url").stdout.strip()
    worker = subprocess.Popen(
        ["tunefleet", "worker", "--db", url, "--device", "host"],
        env=home,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        proc = tf(
            home, "tune", "synthetic", "--workers", "0", "--max-trials", "6",
            "--arg", "duration=0.01",
        )  # fmt: skip
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "workers: remote workers of class any" in proc.stdout
    with embedded_conn(home) as conn:
        hosts = conn.execute(
            "SELECT DISTINCT w.pid FROM tunefleet.measurement m "
            "JOIN tunefleet.worker w ON w.id = m.worker_id WHERE m.run_id = 1"
        ).fetchall()
    assert [h["pid"] for h in hosts] == [worker.pid]  # every result came from that worker


@pytest.mark.opencl
def test_tune_a_tiny_gemm_on_the_pocl_cpu_device(home, tmp_path):
    pytest.importorskip("pyopencl")
    proc = tf(home, "tune", "gemm", "--size", "m=64,n=64,k=64", "--max-trials", "2", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "best: trial" in proc.stdout
    with embedded_conn(home) as conn:
        m = conn.execute(
            "SELECT m.code, m.gflops, d.platform FROM tunefleet.measurement m "
            "JOIN tunefleet.device d ON d.id = m.device_id ORDER BY m.median_s LIMIT 1"
        ).fetchone()
        # The kernel's best was re-measured with fresh inputs (another seed, validated again).
        confirmed = conn.execute(
            "SELECT c.state, c.input_seed, m.protocol->>'seed' AS seed, m.validation"
            " FROM tunefleet.confirmations c"
            " JOIN tunefleet.measurement m ON m.trial_id = c.confirm_trial_id"
        ).fetchall()
    assert m["gflops"] > 0 and "Portable Computing Language" in m["platform"]
    assert confirmed and all(
        c["state"] == "done"
        and c["input_seed"] != 0
        and c["seed"] == str(c["input_seed"])
        and c["validation"]["passed"]
        for c in confirmed
    ), confirmed
    code = tf(home, "show", "1", str(_best_trial(home)), "--code")
    assert "__kernel" in code.stdout
    _assert_timelines_add_up(home)


def _assert_timelines_add_up(home: dict[str, str]) -> None:
    """Every attempt of the run reported its timeline, and its phases add up to the
    attempt's wall time on the database clock but for the claim's and the completion's own
    latency; the device process's phases are there, and ``status`` and the API quote the
    devices' timing share."""
    with embedded_conn(home) as conn:
        rows = conn.execute(
            "SELECT a.trial_id, t.wall_s, t.untracked_s, t.timeline, t.timing_s, t.codegen_s"
            "  FROM tunefleet.attempt a"
            "  LEFT JOIN tunefleet.timeline t ON t.trial_id = a.trial_id"
            "   AND t.attempt = a.attempt WHERE a.ended_at IS NOT NULL"
        ).fetchall()
        share = conn.execute("SELECT timing_share FROM tunefleet.run_timeline").fetchone()
    assert rows and all(r["timeline"] is not None for r in rows), rows
    for r in rows:
        told = sum(r["timeline"].values())
        assert told == pytest.approx(r["wall_s"] - r["untracked_s"])
        assert 0 <= r["untracked_s"] <= max(0.5, 0.1 * r["wall_s"]), r
        assert r["timing_s"] > 0 and r["codegen_s"] > 0, r
        assert {"validation", "timing"} <= set(r["timeline"]), r
    assert 0 < share["timing_share"] <= 1
    status = tf(home, "status", "1").stdout
    assert f"{100 * share['timing_share']:.0f}% timing of" in status, status
    assert "per eval  median" in status, status


def _best_trial(env: dict[str, str]) -> int:
    return int(json.loads(tf(env, "best", "1", "--json").stdout)["best"][0]["trial_id"])


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["no-such-problem"], ["unknown problem 'no-such-problem'"]),
        (["gemm", "--size", "n=-4"], ["--size n='-4' is not a positive integer"]),
        (["gemm", "--dtype", "int7"], ["dtype", "int7"]),
        (["synthetic", "--max-trials", "0"], ["--max-trials 0: use at least 1"]),
        # Values the storage cannot hold, or that never end, are refused before anything runs.
        (
            ["synthetic", "--max-trials", "99999999999"],
            ["--max-trials 99999999999 is above the limit 2147483647; use a smaller number"],
        ),
        (["synthetic", "--max-time", "inf"], ["--max-time inf: use a finite number, at most"]),
        (["synthetic", "--max-time", "1e400"], ["--max-time 1e400: use a finite number"]),
        (
            ["gemm", "--size", "n=99999999999999999999"],
            ["--size n=99999999999999999999 is above the limit 2147483647"],
        ),
        (
            ["synthetic", "--arg", "duration=1e308"],
            ["synthetic: duration=1e+308 must be between 0 and 3600"],
        ),
        (["synthetic", "--arg", "duration=Infinity"], ["--arg duration='Infinity'", "finite"]),
        (["synthetic", "--prefetch", "-1"], ["--prefetch -1: use zero or a positive number"]),
        (["synthetic", "--prepare-workers", "257"], ["--prepare-workers 257 is above the limit"]),
        (["synthetic", "--cores", "nan"], ["--cores nan: use a finite number"]),
        (
            ["synthetic", "--workers", "0", "--prefetch", "8"],
            ["--prefetch sets up the workers this command starts", "tunefleet worker"],
        ),
        (["--resume", "3", "--seed-config", "{}"], ["--resume continues run 3", "--seed-config"]),
        (["synthetic", "--confirm", "-1"], ["--confirm -1: use zero or a positive number"]),
        (["--resume", "42"], ["run 42 does not exist"]),
        (["synthetic", "--db", "postgresql://nobody@127.0.0.1:1/none"], ["cannot connect"]),
    ],
)
def test_tune_errors_are_one_line(home, argv, needles):
    assert_one_line_error(tf(home, "tune", *argv, timeout=120), *needles)


def test_tune_without_an_opencl_device_is_a_one_line_error(home, tmp_path):
    # A sitecustomize that hides every OpenCL platform, as on a machine without a driver.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import tunefleet.worker.device as d\nd.list_devices = lambda: []\n"
    )
    env = dict(home)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    assert_one_line_error(
        tf(env, "tune", "gemm", "--size", "m=64,n=64,k=64"), "no OpenCL device found"
    )


def test_tune_help_names_every_flag(home):
    text = tf(home, "tune", "--help").stdout
    for flag in (
        "--size",
        "--dtype",
        "--workers",
        "--device",
        "--max-trials",
        "--max-time",
        "--target",
        "--db",
        "--resume",
        # What a one-node user needs of the coordinator and the worker.
        "--technique",
        "--patience",
        "--seed-config",
        "--warm-start-from",
        "--timeout",
        "--prefetch",
        "--prepare-workers",
        "--cores",
        "--prebuild",
        "--confirm",
    ):
        assert flag in text


def test_confirm_zero_reports_an_unconfirmed_best(home):
    proc = tf(
        home, "tune", "synthetic", "--arg", "duration=0.01", "--workers", "1",
        "--max-trials", "3", "--confirm", "0", timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "\nconfirmed: no (measured once" in proc.stdout
    last = proc.stdout.splitlines()[-1]
    assert re.fullmatch(
        r"run 1: best trial \d+ is NOT confirmed: confirmation is off \(--confirm 0\)", last
    ), proc.stdout
    with embedded_conn(home) as conn:
        n = conn.execute("SELECT count(*) AS n FROM tunefleet.trial WHERE purpose = 'confirm'")
        assert n.fetchone()["n"] == 0


def test_the_search_waits_until_its_local_workers_have_registered(db_url, tmp_path):
    from tunefleet.api.fleet import LocalWorkers

    workers = LocalWorkers(db_url, tmp_path / "logs")
    try:
        workers.start(("host", "host"), ["--poll", "0.2"])
        with connect(db_url) as conn:
            assert workers.wait_registered(conn, timeout_s=60)
            registered = {
                r["pid"] for r in conn.execute("SELECT pid FROM tunefleet.worker").fetchall()
            }
        assert registered == {proc.pid for proc, _ in workers.procs}
    finally:
        workers.stop()


def test_the_wait_for_local_workers_ends_when_one_exits_or_on_ctrl_c(db_url, tmp_path):
    from tunefleet.api.fleet import LocalWorkers

    dead = LocalWorkers(db_url, tmp_path / "dead")
    alive = LocalWorkers(db_url, tmp_path / "alive")
    try:
        # A device pattern that matches nothing: the worker exits before it registers.
        dead.start(("no-such-device-anywhere",), [])
        with connect(db_url) as conn:
            assert not dead.wait_registered(conn, timeout_s=120)
            assert dead.exited()
            alive.start(("host",), ["--poll", "0.2"])
            assert not alive.wait_registered(conn, timeout_s=120, give_up=lambda: True)
            assert not alive.exited()  # it gave up waiting; the worker itself is fine
    finally:
        dead.stop()
        alive.stop()


ENV_PROBLEM = str(Path(__file__).resolve().parents[1] / "acceptance" / "environment_problem.py")


def test_tune_on_a_node_that_cannot_run_the_problem_stops_with_the_reason_and_resumes(
    db_url, cli_env
):
    """A laptop whose Python lacks a module the problem's prepare needs: the local workers
    stand aside instead of failing every trial, tune stops with their one-line reason, and
    the run, untouched, resumes and finishes once the environment is fixed."""
    broken = {**cli_env, "TUNEFLEET_TEST_BROKEN": "needs_module"}
    proc = tf(broken, "tune", ENV_PROBLEM, "--db", db_url, "--workers", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert_one_line_error(proc, "every local worker exited (status 1)", "No module named 'libfoo'")
    assert "cannot serve any run with work" in proc.stderr
    with connect(db_url) as conn:
        states = conn.execute("SELECT state, attempt FROM tunefleet.trial").fetchall()
        assert {r["state"] for r in states} <= {"pending", "cancelled"}, states
        assert {r["attempt"] for r in states} == {0}
        aside = conn.execute("SELECT reason FROM tunefleet.standing_aside").fetchall()
        assert len(aside) == 2 and all("libfoo" in a["reason"] for a in aside)
    fixed = tf(cli_env, "tune", "--resume", "1", "--db", db_url, "--workers", "1")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    with connect(db_url) as conn:
        done = conn.execute(
            "SELECT count(*) AS n FROM tunefleet.trial WHERE state = 'done' AND purpose = 'search'"
        ).fetchone()
        assert done["n"] == 8  # the whole space, each configuration once
        assert not conn.execute("SELECT 1 FROM tunefleet.trial WHERE state = 'failed'").fetchall()


def test_the_class_of_a_search_only_run_is_device_class_and_device_its_old_spelling(
    db_url: str, db: Any, cli_env: dict[str, str]
) -> None:
    """``--device`` means a device of this machine everywhere; the class a ``--workers 0``
    run targets is ``--device-class`` (as for ``coordinator``). The old ``--device CLASS``
    still works there, after one notice line."""
    base = ["tune", "synthetic", "--workers", "0", "--max-time", "2", "--confirm", "0"]
    gemm = ["tune", "gemm", "--size", "m=64,n=64,k=64", "--workers", "0", "--max-time", "2"]
    for spelling, flag in (("new", "--device-class"), ("old", "--device")):
        proc = tf(cli_env, *gemm, "--confirm", "0", flag, "nvidia-h200", "--db", db_url)
        # No worker serves the class: the budget ends the run without a best.
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "workers: remote workers of class nvidia-h200" in proc.stdout, spelling
        notes = [line for line in proc.stderr.splitlines() if line.startswith("tunefleet: note:")]
        if spelling == "new":
            assert notes == []
        else:
            assert notes == [
                "tunefleet: note: `tune --workers 0 --device CLASS` is deprecated and goes in "
                "the next release; use `tune --workers 0 --device-class CLASS`"
            ]
    classes = db.execute(
        "SELECT device_class FROM tunefleet.run WHERE problem = 'gemm' ORDER BY id"
    ).fetchall()
    assert [r["device_class"] for r in classes] == ["nvidia-h200", "nvidia-h200"]
    # --device-class with local workers: their class is their device's.
    wrong = tf(cli_env, *base[:2], "--device-class", "cpu", "--db", db_url)
    assert_one_line_error(wrong, "--device-class cpu", "--workers 0")
    runs = db.execute("SELECT count(*) AS n FROM tunefleet.run").fetchone()
    assert runs["n"] == 2  # the refused command stored nothing
