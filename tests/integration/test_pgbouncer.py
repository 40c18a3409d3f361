"""A real PgBouncer between tunefleet and PostgreSQL (skipped where the ``pgbouncer`` binary is
not installed).

Session pooling keeps each client on one server connection: a worker's LISTEN wake-ups and its
session-level device lock work through it (a real worker process serves trials it was woken
for). Transaction pooling lends server connections around: the device lock stops being
exclusive, and a worker behind it exits at once with one line naming the fix; so does a
coordinator (its run lock is session state too), before it writes anything. PgBouncer
refuses the ``options`` startup parameter tunefleet sends unless told to ignore it: that is a
one-line, permanent error too, not an endless reconnect.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import CLI
from tests.helpers.launch import WorkerProcess, start_worker
from tests.helpers.ports import free_port
from tests.helpers.queue_data import (
    insert_run,
    insert_trials,
    synthetic_configs,
    trial_states,
    wait_until,
)
from tunefleet.db.engine import connect
from tunefleet.db.pooler import PooledPerTransaction, require_session_pooling
from tunefleet.errors import DatabaseUnavailable
from tunefleet.queries import queue

PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
)
pytestmark = pytest.mark.skipif(PGBOUNCER is None, reason="pgbouncer is not installed")

Pooler = Callable[[str], str]  # the test database's URL -> the same database through the pooler


@contextlib.contextmanager
def pgbouncer(
    admin_url: str, pool_mode: str, *, ignore_options: bool = True, pool_size: int = 20
) -> Iterator[Pooler]:
    """A PgBouncer in ``pool_mode`` in front of the test server, for every database of it."""
    assert PGBOUNCER is not None
    info = psycopg.conninfo.conninfo_to_dict(admin_url)
    socket_dir, port, user = str(info["host"]), str(info["port"]), str(info["user"])
    directory = Path(tempfile.mkdtemp(prefix="tunefleet-pgbouncer-"))
    directory.chmod(0o755)
    listen = free_port()
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    (directory / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={socket_dir} port={port} user={user}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {directory / 'users.txt'}\n"
        f"pool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\n"
        + ("ignore_startup_parameters = options\n" if ignore_options else "")
    )
    for f in directory.iterdir():
        f.chmod(0o644)
    argv = [PGBOUNCER]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root: run it as the owner of the server's socket
        # directory (the embedded server's own user), who can reach the socket.
        argv += ["-u", pwd.getpwuid(os.stat(socket_dir).st_uid).pw_name]
    log = open(directory / "pgbouncer.log", "wb")
    proc = subprocess.Popen(
        [*argv, str(directory / "pgbouncer.ini")], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_until(
            lambda: (
                proc.poll() is not None
                or b"process up" in (directory / "pgbouncer.log").read_bytes()
            ),
            timeout=30,
            what="pgbouncer to start",
        )
        assert proc.poll() is None, (directory / "pgbouncer.log").read_text()

        def through(url: str) -> str:
            dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
            return f"postgresql://{user}@127.0.0.1:{listen}/{dbname}"

        yield through
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def session_pooler(pg_admin_url: str) -> Iterator[Pooler]:
    with pgbouncer(pg_admin_url, "session") as through:
        yield through


@pytest.fixture
def transaction_pooler(pg_admin_url: str) -> Iterator[Pooler]:
    # One server connection: every client shares it, so what transaction pooling does to
    # session state is certain rather than likely.
    with pgbouncer(pg_admin_url, "transaction", pool_size=1) as through:
        yield through


DEVICE = {"host": "node-1", "fingerprint": "f" * 32, "index": 0}


def test_session_pooling_keeps_the_device_lock_and_wake_ups(
    db_url: str, session_pooler: Pooler
) -> None:
    url = session_pooler(db_url)
    first, second = connect(url), connect(url)
    try:
        require_session_pooling(first, lambda: connect(url))  # passes: nothing raised
        assert queue.try_lock_device(first, **DEVICE)
        assert not queue.try_lock_device(second, **DEVICE)  # exclusive through the pooler
        queue.listen(second)
        with connect(db_url) as direct:
            queue.notify_new_trials(direct, "any")
        (note,) = list(second.notifies(timeout=30, stop_after=1))
        assert note.payload == "any"
        # A worker that goes away loses its lock: PgBouncer resets the server connection.
        first.close()
        wait_until(lambda: queue.try_lock_device(second, **DEVICE), timeout=30, what="the lock")
    finally:
        first.close()
        second.close()


def test_worker_behind_session_pooling_is_woken_and_serves(
    db_url: str, session_pooler: Pooler, tmp_path: Path
) -> None:
    # An hour's polling: only a notification can wake it for the trials inserted below.
    with worker_through(session_pooler(db_url), tmp_path, poll_s=3600, extra=["-v"]) as w:
        wait_until(lambda: "waiting for work" in w.log() or not w.alive, 120, what="idle worker")
        assert w.alive, w.log()
        with connect(db_url) as conn:
            run = insert_run(conn, problem_args={"duration": 0.01})
            ids = insert_trials(conn, run, synthetic_configs(3))
            queue.notify_new_trials(conn, "any")
            wait_until(
                lambda: set(trial_states(conn, ids).values()) == {"done"}, 120, what="trials done"
            )
        w.stop()
        assert w.wait(60) == 0, w.log()


def test_transaction_pooling_breaks_the_device_lock_and_is_detected(
    db_url: str, transaction_pooler: Pooler
) -> None:
    url = transaction_pooler(db_url)
    with connect(db_url) as direct:
        require_session_pooling(direct, lambda: connect(db_url))  # a direct session passes
    first, second = connect(url), connect(url)
    try:
        # The failure mode the check exists for: two "workers" both hold one device's lock.
        assert queue.try_lock_device(first, **DEVICE)
        assert queue.try_lock_device(second, **DEVICE)
        with pytest.raises(PooledPerTransaction, match="pool_mode = session"):
            require_session_pooling(first, lambda: connect(url))
    finally:
        first.close()
        second.close()


def test_worker_behind_transaction_pooling_exits_with_one_line(
    db_url: str, transaction_pooler: Pooler, tmp_path: Path
) -> None:
    with connect(db_url) as conn:
        run = insert_run(conn, problem_args={"duration": 0.01})
        ids = insert_trials(conn, run, synthetic_configs(2))
    with worker_through(transaction_pooler(db_url), tmp_path) as w:
        code = w.wait(120)
    assert code != 0
    lines = [ln for ln in w.log().splitlines() if ln.strip()]
    assert lines and "pool_mode = session" in lines[-1], w.log()
    assert sum("pool_mode" in ln for ln in lines) == 1  # one line, no traceback
    with connect(db_url) as conn:
        assert set(trial_states(conn, ids).values()) == {"pending"}  # nothing claimed or lost
        assert worker_rows(conn) == 0  # refused before it registered


def test_coordinator_behind_transaction_pooling_exits_with_one_line_and_writes_nothing(
    db_url: str, transaction_pooler: Pooler, cli: CLI
) -> None:
    url = transaction_pooler(db_url)
    line = cli.fails("coordinator", "synthetic", "--max-trials", "4", "--db", url)
    assert "pool_mode = session" in line and "coordinators" in line
    with connect(db_url) as conn:
        assert run_rows(conn) == 0  # refused before it created a run

        # Resuming a run is refused the same way, and the run is left as it was.
        run = insert_run(conn, problem_args={"duration": 0.01})
        ids = insert_trials(conn, run, synthetic_configs(2))
        line = cli.fails("coordinator", "--resume", str(run), "--db", url)
        assert "pool_mode = session" in line
        row = conn.execute(
            "SELECT state, coordinator_id FROM tunefleet.run WHERE id = %s", (run,)
        ).fetchone()
        assert row is not None and row["coordinator_id"] is None
        assert set(trial_states(conn, ids).values()) == {"pending"}


def test_coordinator_behind_session_pooling_drives_its_run(
    db_url: str, session_pooler: Pooler, cli: CLI, tmp_path: Path
) -> None:
    url = session_pooler(db_url)
    with worker_through(url, tmp_path):
        out = cli.ok("coordinator", "synthetic", "--max-trials", "4", "--db", url)
    assert out.startswith("run ") and " finished: " in out.splitlines()[0], out
    with connect(db_url) as conn:
        states = conn.execute("SELECT state FROM tunefleet.trial").fetchall()
        assert len(states) >= 4 and {r["state"] for r in states} <= {"done", "invalid"}


def test_pooler_refusing_the_session_options_is_a_permanent_one_line_error(
    db_url: str, pg_admin_url: str
) -> None:
    with pgbouncer(pg_admin_url, "session", ignore_options=False) as through:
        with pytest.raises(DatabaseUnavailable) as caught:
            connect(through(db_url))
    assert "ignore_startup_parameters = options" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not caught.value.transient  # waiting never fixes it: no endless reconnect


@contextlib.contextmanager
def worker_through(
    url: str, tmp_path: Path, *, drain: bool = False, **kwargs: Any
) -> Iterator[WorkerProcess]:
    """A worker process on ``url`` (no code-generation pool), killed if still alive after."""
    w = start_worker(url, log_path=tmp_path / "w.log", drain=drain, prepare_workers=0, **kwargs)
    try:
        yield w
    finally:
        w.kill()


def run_rows(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) AS n FROM tunefleet.run").fetchone()
    return int(row["n"]) if row else 0


def worker_rows(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) AS n FROM tunefleet.worker").fetchone()
    return int(row["n"]) if row else 0
