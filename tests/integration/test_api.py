"""The Python API against a real PostgreSQL and real worker processes: ``tunefleet.tune()``
in this process (the synthetic problem on the host pseudo-device keeps it fast), the read
functions against the CLI's output for the same run, a stop from the progress callback and
its resume, bad arguments, ``workers=0`` with a worker started by the test, and the
examples/python scripts (a Problem subclass in a file next to the script).
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

import tunefleet
from tunefleet.db.engine import connect
from tunefleet.errors import TunefleetError, TuneInterrupted

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "python"
QUICK = {"duration": 0.005}


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker logs under the test's own home; no database from the environment."""
    monkeypatch.setenv("TUNEFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNEFLEET_DATABASE_URL", raising=False)


def _cli(db_url: str, *argv: str) -> Any:
    proc = subprocess.run(
        [sys.executable, "-m", "tunefleet", *argv, "--db", db_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _counts(db_url: str, run_id: int) -> dict[str, int]:
    with connect(db_url) as conn:
        rows = conn.execute(
            "SELECT state, count(*) AS n FROM tunefleet.trial WHERE run_id = %s GROUP BY state",
            (run_id,),
        ).fetchall()
    return {r["state"]: r["n"] for r in rows}


def test_tune_then_the_read_functions_equal_the_cli(db_url: str) -> None:
    result = tunefleet.tune(
        "synthetic", args=QUICK, max_trials=10, workers=1, db=db_url, progress=False
    )
    assert result.state == "finished" and result.best is not None
    assert result.config == result.best.config and result.reproduce
    assert result.report.splitlines()[-1].startswith(f"run {result.run_id}: best trial ")

    best = tunefleet.best(result.run_id, top=3, db=db_url)
    cli_best = _cli(db_url, "best", str(result.run_id), "--top", "3", "--json")["best"]
    assert best[0] == result.best
    assert [(b.trial_id, b.config, b.median_s, b.reproduce) for b in best] == [
        (b["trial_id"], b["config"], b["median_s"], b["reproduce"]) for b in cli_best
    ]

    rows = tunefleet.results(result.run_id, db=db_url)
    cli_rows = _cli(db_url, "export", str(result.run_id), "--format", "json")
    assert [(r.trial_id, r.state, r.config, r.median_s) for r in rows] == [
        (r["trial_id"], r["state"], r["config"], r["median_s"]) for r in cli_rows
    ]
    assert len(rows) >= 10

    runs = tunefleet.runs(db=db_url)
    cli_runs = _cli(db_url, "runs", "--json")
    assert [(r.run_id, r.state, r.done, r.problem) for r in runs] == [
        (r["run_id"], r["run_state"], r["done"], r["problem"]) for r in cli_runs
    ]


def test_to_dataframe_where_pandas_is_installed(db_url: str) -> None:
    pandas = pytest.importorskip("pandas")
    result = tunefleet.tune(
        "synthetic", args=QUICK, max_trials=4, workers=1, confirm=0, db=db_url, progress=False
    )
    frame = tunefleet.results(result.run_id, db=db_url).to_dataframe()
    assert isinstance(frame, pandas.DataFrame)
    assert len(frame) == sum(_counts(db_url, result.run_id).values())
    assert {"trial_id", "config", "median_s", "gflops"} <= set(frame.columns)


def test_keyboard_interrupt_in_the_progress_callback_stops_a_resumable_run(db_url: str) -> None:
    seen: list[tunefleet.TuneProgress] = []

    def impatient(p: tunefleet.TuneProgress) -> None:
        seen.append(p)
        if p.phase == "running" and p.finished >= 2:
            raise KeyboardInterrupt

    args = {"duration": 0.05}
    with pytest.raises(TuneInterrupted) as stopped:
        tunefleet.tune("synthetic", args=args, max_trials=400, db=db_url, progress=impatient)
    run_id = stopped.value.run_id
    assert seen[0].phase == "start" and f"run {run_id}" in seen[0].line
    with connect(db_url) as conn:
        run = conn.execute("SELECT state FROM tunefleet.run WHERE id = %s", (run_id,)).fetchone()
        active = conn.execute(
            "SELECT count(*) AS n FROM tunefleet.worker WHERE state = 'active'"
        ).fetchone()
    counts = _counts(db_url, run_id)
    assert run["state"] == "stopped"
    assert counts.get("running", 0) == 0 and counts.get("pending", 0) == 0
    assert active["n"] == 0  # the local worker said goodbye
    done_before = counts.get("done", 0)

    resumed = tunefleet.tune(resume=run_id, max_trials=done_before + 3, db=db_url, progress=False)
    assert resumed.run_id == run_id and resumed.state == "finished"
    assert _counts(db_url, run_id).get("done", 0) > done_before


def test_an_error_in_the_progress_callback_stops_the_run_and_is_raised(db_url: str) -> None:
    class Broken(Exception):
        pass

    def broken(p: tunefleet.TuneProgress) -> None:
        if p.phase == "running" and p.finished >= 1:
            raise Broken("the caller's own bug")

    with pytest.raises(Broken):
        tunefleet.tune("synthetic", args={"duration": 0.05}, max_trials=400, db=db_url,
                       progress=broken)  # fmt: skip
    with connect(db_url) as conn:
        run = conn.execute("SELECT id, state FROM tunefleet.run").fetchone()
    assert run["state"] == "stopped"
    assert _counts(db_url, run["id"]).get("running", 0) == 0


def test_tune_runs_in_a_thread_other_than_the_main_one(db_url: str) -> None:
    # Signal handlers belong to the main thread: elsewhere tune() installs none.
    import threading

    results: list[Any] = []

    def tune() -> None:
        results.append(
            tunefleet.tune(
                "synthetic", args=QUICK, max_trials=3, workers=1, confirm=0, db=db_url,
                progress=False,
            )
        )  # fmt: skip

    thread = threading.Thread(target=tune)
    thread.start()
    thread.join(240)
    assert not thread.is_alive() and results and results[0].state == "finished"


def test_keyboard_interrupt_at_the_start_line_stops_before_any_worker(db_url: str) -> None:
    def at_once(p: tunefleet.TuneProgress) -> None:
        raise KeyboardInterrupt

    with pytest.raises(TuneInterrupted) as stopped:
        tunefleet.tune("synthetic", args=QUICK, max_trials=50, db=db_url, progress=at_once)
    with connect(db_url) as conn:
        run = conn.execute(
            "SELECT state FROM tunefleet.run WHERE id = %s", (stopped.value.run_id,)
        ).fetchone()
        workers = conn.execute("SELECT count(*) AS n FROM tunefleet.worker").fetchone()
    assert run["state"] == "stopped" and workers["n"] == 0


def test_numpy_integers_are_counts(db_url: str) -> None:
    np = pytest.importorskip("numpy")
    result = tunefleet.tune(
        "synthetic", args=QUICK, max_trials=np.int64(3), workers=np.int32(1), confirm=0,
        db=db_url, progress=False,
    )  # fmt: skip
    assert result.state == "finished" and result.trials >= 3


def _local_class() -> type:
    class Local(tunefleet.Problem):  # type: ignore[misc]
        pass

    return Local


def _main_class() -> type:
    cls = type("Scripted", (tunefleet.Problem,), {})
    cls.__module__ = "__main__"
    return cls


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"problem": "no-such-problem"}, "unknown problem 'no-such-problem'"),
        ({"problem": 42}, "problem=42"),
        ({}, "name a problem to tune"),
        ({"problem": "gemm", "sizes": {"n": -4}}, "sizes['n']=-4 is not a positive integer"),
        ({"problem": "gemm", "sizes": [256]}, "sizes=[256]: give a dict"),
        ({"problem": "gemm", "dtype": "int7"}, "int7"),
        ({"problem": "synthetic", "max_trials": 0}, "max_trials=0"),
        ({"problem": "synthetic", "max_trials": 2.5}, "max_trials=2.5 is not a whole number"),
        ({"problem": "synthetic", "max_time": float("inf")}, "max_time=inf"),
        ({"problem": "synthetic", "workers": -1}, "workers=-1"),
        ({"problem": "synthetic", "args": {"duration": 1e308}}, "duration=1e+308"),
        ({"problem": "synthetic", "args": {"noise": float("nan")}}, "not a finite number"),
        ({"problem": "synthetic", "prefetch": -1}, "prefetch=-1"),
        ({"problem": "synthetic", "technique": 3}, "technique=3"),
        ({"problem": "synthetic", "seed_configs": [3]}, "seed_configs: 3 is not"),
        ({"problem": "synthetic", "progress": "yes"}, "progress='yes'"),
        ({"problem": "synthetic", "workers": 0, "prefetch": 8}, "--prefetch sets up"),
        ({"problem": _local_class()}, "defined inside a function"),
        ({"problem": _main_class()}, "defined in __main__"),
        ({"resume": 42}, "run 42 does not exist"),
    ],
)
def test_bad_arguments_raise_one_error_type_with_one_line(
    db_url: str, kwargs: dict[str, Any], needle: str
) -> None:
    with pytest.raises(TunefleetError) as caught:
        tunefleet.tune(**{"db": db_url, "progress": False, **kwargs})
    message = str(caught.value)
    assert needle in message and len(message.splitlines()) == 1, message
    exc = caught.value
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)
    with connect(db_url) as conn:
        assert conn.execute("SELECT count(*) AS n FROM tunefleet.run").fetchone()["n"] == 0


def test_an_unreachable_database_is_one_line() -> None:
    with pytest.raises(TunefleetError, match="cannot connect"):
        tunefleet.tune("synthetic", db="postgresql://nobody@127.0.0.1:1/none", progress=False)


def test_workers_zero_drives_a_worker_started_elsewhere(db_url: str) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "tunefleet", "worker", "--db", db_url, "--device", "host"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        result = tunefleet.tune(
            "synthetic", args=QUICK, workers=0, max_trials=6, db=db_url, progress=False
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    assert result.state == "finished" and result.best is not None
    with connect(db_url) as conn:
        pids = conn.execute(
            "SELECT DISTINCT w.pid FROM tunefleet.measurement m "
            "JOIN tunefleet.worker w ON w.id = m.worker_id WHERE m.run_id = %s",
            (result.run_id,),
        ).fetchall()
    assert [p["pid"] for p in pids] == [worker.pid]  # every result came from that worker


def test_the_example_with_its_own_problem_class_in_a_file_next_to_it(
    db_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "TUNEFLEET_DATABASE_URL": db_url, "TUNEFLEET_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "tune_own_problem.py")],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,  # not the examples folder: the script finds its module by its own path
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "best configuration {" in proc.stdout, proc.stdout
    with connect(db_url) as conn:
        run = conn.execute("SELECT problem, state FROM tunefleet.run").fetchone()
        done = conn.execute(
            "SELECT count(*) AS n FROM tunefleet.trial WHERE state = 'done'"
        ).fetchone()
    assert run["problem"] == f"{EXAMPLES / 'stencil_problem.py'}:Stencil"
    assert run["state"] == "finished" and done["n"] >= 12


@pytest.mark.opencl
@pytest.mark.examples
@pytest.mark.timeout(1800)  # 20 GEMM evaluations on a CPU: minutes of code generation
def test_the_gemm_example_on_the_pocl_cpu_device(db_url: str, tmp_path: Path) -> None:
    pytest.importorskip("pyopencl")
    env = {**os.environ, "TUNEFLEET_DATABASE_URL": db_url, "TUNEFLEET_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "tune_gemm.py")],
        capture_output=True,
        text=True,
        timeout=1700,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "best configuration {" in proc.stdout and "tunefleet measure gemm" in proc.stdout
