"""Bad input, table by table: every mistake gives a clear one-line error (command line) or the
right trial state with its reason (problem code run by a real worker), and nothing already
stored changes.

All rows share one database holding an earlier finished run, tuned by a real coordinator and
a real worker; its rows (and every worker and device row) are snapshotted first and compared
after each row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.acceptance.bad_input_problems import KERNEL_MODES, MODES
from tests.helpers.launch import start_worker
from tests.helpers.queue_data import (
    FAST_PROTOCOL,
    attempts_of,
    first_invalid,
    insert_run,
    insert_trials,
    wait_until,
)
from tunefleet.db.engine import connect

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = str(Path(__file__).with_name("bad_input_problems.py"))
#: Tables whose existing rows must never change, and how to order them.
TABLES = ("run", "trial", "attempt", "measurement", "worker", "device")


@dataclass
class Stored:
    """A database with an earlier finished run, and a snapshot of everything in it."""

    url: str
    run_id: int
    snapshot: dict[str, dict[Any, Any]]

    def changes(
        self, *, allow_new_rows: bool, since: dict[str, dict[Any, Any]] | None = None
    ) -> list[str]:
        """What changed since the earlier run's snapshot, or since ``since`` (a snapshot a
        test took itself: tests of this module share the database, in any order, and the
        kernel rows add runs of their own)."""
        now = snapshot(self.url)
        out = []
        for table, before in (since or self.snapshot).items():
            for key, row in before.items():
                if now[table].get(key) != row:
                    out.append(f"{table} row {key} changed: {row} -> {now[table].get(key)}")
            added = sorted(set(now[table]) - set(before), key=str)
            if added and not allow_new_rows:
                out.append(f"{table}: rows {added} were added")
        return out


def snapshot(url: str) -> dict[str, dict[Any, Any]]:
    with connect(url) as db:
        return {
            table: {
                r["id"]: r["row"]
                for r in db.execute(
                    sql.SQL("SELECT id, to_jsonb(t) AS row FROM tunefleet.{} t").format(
                        sql.Identifier(table)
                    )
                ).fetchall()
            }
            for table in TABLES
        }


def env_for(cli_env: dict[str, str]) -> dict[str, str]:
    return {**cli_env, "PYTHONPATH": str(ROOT), "TUNEFLEET_POLL_S": "0.05"}


@pytest.fixture(scope="module")
def stored(
    pg_admin_url: str, pg_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stored]:
    name = f"tf_bad_input_{os.getpid()}"
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(drop)
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(pg_template)
            )
        )
    url = make_conninfo(pg_admin_url, dbname=name)
    logs = tmp_path_factory.mktemp("earlier-run")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNEFLEET_POLL_S": "0.05"}
    # The search is random: seed one configuration that is invalid by construction, so the
    # stored run always holds both terminal states the snapshot must protect.
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "tunefleet", "coordinator", "synthetic", "--arg",
         "duration=0.01", "--arg", "invalid_rate=0.3", "--max-trials", "8",
         "--seed-config", json.dumps(first_invalid({"invalid_rate": 0.3})), "--db", url],
        env=env, cwd=logs, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    worker = None
    try:
        with connect(url) as db:
            wait_until(
                lambda: db.execute("SELECT 1 FROM tunefleet.trial").fetchone(),
                timeout=60,
                what="the earlier run's first trial",
            )
        worker = start_worker(url, log_path=logs / "worker.log", env=env, lease_s=2, poll_s=0.2)
        _out, err = coordinator.communicate(timeout=120)
        assert coordinator.returncode == 0, err
        assert worker.wait(60) == 0, worker.log()
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
        if worker is not None:
            worker.kill()
    with connect(url) as db:
        run = db.execute("SELECT id, state FROM tunefleet.run").fetchone()
        states = {
            r["state"] for r in db.execute("SELECT DISTINCT state FROM tunefleet.trial").fetchall()
        }
    assert run["state"] == "finished" and states == {"done", "invalid"}, states
    yield Stored(url, int(run["id"]), snapshot(url))
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(drop)


# --- the command line ---------------------------------------------------------------------


@dataclass(frozen=True)
class CliRow:
    """``tunefleet ARGS`` must exit with ``code`` and say ``message`` in one line. ``{db}``
    in an argument is the stored database, ``{missing_db}`` a database that does not exist
    on the same server, ``{problems}`` the user problem file."""

    args: tuple[str, ...]
    code: int
    message: str


NO_SERVER = "postgresql://postgres@/tunefleet?host=/nonexistent-socket-dir"
CLI_ROWS = {
    "bad DSN, not a URL": CliRow(
        ("coordinator", "synthetic", "--db", "not-a-url"), 2, "is not a PostgreSQL URL"
    ),
    "bad DSN, port out of range": CliRow(
        ("worker", "--device", "host", "--db", "postgresql://me@db:99999/tf"),
        2,
        "has port '99999', which is not a TCP port",
    ),
    "bad DSN, no server there": CliRow(
        ("coordinator", "synthetic", "--db", NO_SERVER),
        1,
        "cannot connect to the database at /nonexistent-socket-dir:5432/tunefleet",
    ),
    "bad DSN, no such database (worker)": CliRow(
        ("worker", "--device", "host", "--drain", "--db", "{missing_db}"),
        1,
        'database "tf_no_such_database" does not exist; create that database',
    ),
    "unknown problem": CliRow(
        ("coordinator", "gemmm", "--db", "{db}"), 1, "unknown problem 'gemmm'; built-ins are"
    ),
    "problem file missing": CliRow(
        ("coordinator", "no/such/problem.py", "--db", "{db}"),
        1,
        "problem file 'no/such/problem.py' does not exist",
    ),
    "problem class missing": CliRow(
        ("coordinator", "{problems}:Nope", "--db", "{db}"), 1, "has no attribute 'Nope'"
    ),
    "problem class whose constructor raises": CliRow(
        ("coordinator", "{problems}:NeedsSetup", "--db", "{db}"),
        1,
        "NeedsSetup() raised RuntimeError: set DOUBLER_HOME first",
    ),
    "problem module whose import raises": CliRow(
        ("coordinator", "tests.acceptance.raises_on_import:P", "--db", "{db}"),
        1,
        "importing it raised RuntimeError: this module needs a GPU at import time",
    ),
    "malformed space: not a Space": CliRow(
        ("coordinator", "{problems}:NotASpace", "--db", "{db}"),
        1,
        "space() returned a dict, not a Space; build it with Space.of([...])",
    ),
    "malformed space: space() raises": CliRow(
        ("coordinator", "{problems}:SpaceRaises", "--db", "{db}"),
        1,
        "space() raised KeyError: 'n' (at bad_input_problems.py:",
    ),
    "malformed space: not a list of parameters": CliRow(
        ("coordinator", "{problems}:NotAParamList", "--db", "{db}"),
        1,
        "space() raised TypeError: 'IntRange' object is not iterable",
    ),
    "malformed space: empty range": CliRow(
        ("coordinator", "{problems}:EmptyRange", "--db", "{db}"),
        1,
        "parameter 'tile': empty integer range 8..1",
    ),
    "malformed space: duplicate names": CliRow(
        ("coordinator", "{problems}:DuplicateNames", "--db", "{db}"),
        1,
        "duplicate parameter names: ['tile']",
    ),
    "problem arguments raise": CliRow(
        ("coordinator", "{problems}:ArgumentsRaise", "--db", "{db}"),
        1,
        "normalise_args raised ValueError: invalid literal for int()",
    ),
    "problem arguments refused": CliRow(
        ("coordinator", "{problems}:ArgumentsRefused", "--size", "n=100", "--db", "{db}"),
        1,
        "doubler: n must be a multiple of 64",
    ),
    "bad built-in argument": CliRow(
        ("coordinator", "synthetic", "--arg", "fail_rate=2", "--db", "{db}"),
        1,
        "synthetic: fail_rate=2 must be between 0 and 1",
    ),
    "resume a run that does not exist": CliRow(
        ("coordinator", "--resume", "424242", "--db", "{db}"), 1, "run 424242 does not exist"
    ),
    "resume with a new problem": CliRow(
        ("coordinator", "gemm", "--resume", "1", "--db", "{db}"),
        2,
        "--resume continues run 1 as it was created; drop PROBLEM",
    ),
}


@pytest.mark.parametrize("row", CLI_ROWS.values(), ids=CLI_ROWS.keys())
def test_command_line_mistakes_are_one_line_and_change_nothing(
    row: CliRow, stored: Stored, cli_env: dict[str, str], tmp_path: Path
):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    missing = make_conninfo(stored.url, dbname="tf_no_such_database")
    args = [a.format(db=stored.url, missing_db=missing, problems=PROBLEMS) for a in row.args]
    before = snapshot(stored.url)
    done = subprocess.run(
        [sys.executable, "-m", "tunefleet", *args],
        env=env_for(cli_env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("tunefleet: error: "), lines[0]
    assert row.message in lines[0]
    assert done.returncode == row.code, done.stderr
    assert done.stdout == ""
    assert stored.changes(allow_new_rows=False, since=before) == []
    assert stored.changes(allow_new_rows=True) == []
    assert list(cwd.iterdir()) == []  # nothing written where it ran either


# --- problem code, run by a real worker on an OpenCL device --------------------------------

#: (problem class, mode) -> (final trial state, counted attempts, what the reason says)
KERNEL_ROWS: dict[tuple[str, str], tuple[str, int, str | None]] = {
    ("OpenCLDoubler", "good"): ("done", 1, None),
    ("OpenCLDoubler", "builder_raises"): (
        "failed",
        2,
        "code generation raised ValueError: tile 3 does not divide n=4096",
    ),
    ("OpenCLDoubler", "does_not_compile"): ("invalid", 1, "OpenCL build failed: "),
    ("OpenCLDoubler", "driver_error_escapes"): ("failed", 2, "BUILD_PROGRAM_FAILURE"),
    ("OpenCLDoubler", "writes_nan"): ("invalid", 1, "y: 4096 of 4096 values are NaN or inf"),
    ("OpenCLDoubler", "reference_mismatch"): (
        "invalid",
        1,
        "y differs from the reference: scaled max error 0.5 > tolerance 1e-06",
    ),
    ("LoopyDoubler", "good"): ("done", 1, None),
    ("LoopyDoubler", "builder_raises"): (
        "failed",
        2,
        "code generation raised ValueError: tile 3 does not divide n=4096",
    ),
    ("LoopyDoubler", "does_not_compile"): ("invalid", 1, "this kernel does not compile"),
    ("LoopyDoubler", "writes_nan"): ("invalid", 1, "y: 4096 of 4096 outputs are NaN or infinite"),
    ("LoopyDoubler", "reference_mismatch"): (
        "invalid",
        1,
        "y: wrong numbers (max error 0.5 relative to the largest reference value; "
        "float32 tolerance 0.0001)",
    ),
}
assert {m for p, m in KERNEL_ROWS if p == "OpenCLDoubler"} == set(MODES)
assert {m for p, m in KERNEL_ROWS if p == "LoopyDoubler"} == set(KERNEL_MODES)


@dataclass
class KernelRun:
    ids: dict[tuple[str, str], int]
    worker_log: str
    url: str


@pytest.fixture(scope="module")
def kernel_run(stored: Stored, tmp_path_factory: pytest.TempPathFactory) -> KernelRun:
    """A run per user problem, a trial per mode, all measured by one real worker on the
    first OpenCL device (PoCL is enough)."""
    pytest.importorskip("pyopencl")
    from tunefleet.worker.device import list_devices

    devices = list_devices()
    if not devices:
        pytest.skip("no OpenCL device")
    device = devices[0]
    ids: dict[tuple[str, str], int] = {}
    with connect(stored.url) as db:
        for cls in ("OpenCLDoubler", "LoopyDoubler"):
            modes = [m for p, m in KERNEL_ROWS if p == cls]
            run = insert_run(
                db,
                problem=f"{PROBLEMS}:{cls}",
                problem_args={"n": 4096},
                device_class=device.device_class,
            )
            trials = insert_trials(db, run, [{"mode": m} for m in modes], max_attempts=2)
            ids.update({(cls, m): t for m, t in zip(modes, trials, strict=True)})
    log = tmp_path_factory.mktemp("kernel-worker") / "worker.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    w = start_worker(
        stored.url, log_path=log, env=env, device=str(device.index), lease_s=10, poll_s=0.2
    )
    try:
        code = w.wait(300)
    finally:
        w.kill()
    assert code == 0, w.log()
    return KernelRun(ids, w.log(), stored.url)


@pytest.mark.opencl
@pytest.mark.parametrize("row", KERNEL_ROWS.keys(), ids=[f"{p}-{m}" for p, m in KERNEL_ROWS])
def test_problem_code_mistakes_end_in_the_right_state_with_the_reason(
    row: tuple[str, str], kernel_run: KernelRun, stored: Stored
):
    state, attempts, reason = KERNEL_ROWS[row]
    tid = kernel_run.ids[row]
    with connect(kernel_run.url) as db:
        trial = db.execute(
            "SELECT state, attempt, error FROM tunefleet.trial WHERE id = %s", (tid,)
        ).fetchone()
        history = attempts_of(db, tid)
        measured = db.execute(
            "SELECT median_s, samples_s, validation, code FROM tunefleet.measurement "
            "WHERE trial_id = %s",
            (tid,),
        ).fetchall()
    assert trial["state"] == state, (trial, kernel_run.worker_log)
    assert trial["attempt"] == attempts == len(history)
    assert [a["outcome"] for a in history] == [state] * attempts
    if reason is None:
        assert trial["error"] is None
        [m] = measured
        assert m["median_s"] > 0 and len(m["samples_s"]) == FAST_PROTOCOL.min_launches
        verdict = m["validation"]  # the kernel base says "ok", the plain problem "passed"
        assert verdict.get("passed") is True, verdict
        assert "2" in m["code"] and "x[" in m["code"]
    else:
        assert reason in trial["error"], trial["error"]
        assert all(reason in (a["error"] or "") for a in history)
        assert measured == []
    assert stored.changes(allow_new_rows=True) == []
