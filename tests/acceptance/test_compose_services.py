"""What `docker compose up` runs, without Docker: every service's command line, exactly as
written in docker-compose.yml, against a real PostgreSQL reached over TCP with passwords.

The `db` service is stood in for by a private server listening on 127.0.0.1 with SCRAM
authentication and the compose file's administrator password. Each service's environment is
taken from the file with its `${VAR:-default}` defaults, as compose resolves them with nothing
set; the only translation is the database address (`db:5432` becomes the private server's
address) and the image's `tunefleet-device-workers` becoming docker/device-workers.sh. Roles are
created with the file's default names on this private server, so nothing leaks into other
tests' clusters.

Order and conditions follow the file: migrate (one-shot) -> roles (one-shot) -> worker
(long-running, started in the background) and coordinator (one-shot, finite budget) -> reader
(psql as the reader role) -> `docker compose down` (SIGTERM to the worker). A second `up`
re-runs the one-shots on the kept volume.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import sql
from psycopg.rows import dict_row

from tests.helpers.ports import free_port
from tunefleet.db.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
pytestmark = pytest.mark.acceptance

_DEFAULT = re.compile(r"\$\{(\w+):-([^}]*)\}")


def resolve(value: Any) -> str:
    """A compose value with `${VAR:-default}` resolved as compose does with VAR unset."""
    text = str(value)
    assert "$" not in _DEFAULT.sub("", text), f"unsupported interpolation in {text!r}"
    return _DEFAULT.sub(lambda m: m.group(2), text)


class Stack:
    """The compose file's services, runnable against the stand-in database."""

    def __init__(self, server: EmbeddedServer, port: int, home: Path) -> None:
        self.services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
        self.server = server
        self.port = port
        self.home = home

    def command(self, name: str) -> list[str]:
        command = [resolve(c) for c in self.services[name]["command"]]
        if command[0] == "tunefleet-device-workers":  # COPY'd to /usr/local/bin in the image
            command = ["sh", str(ROOT / "docker" / "device-workers.sh"), *command[1:]]
        return command

    def env(self, name: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TUNEFLEET_", "PG", "POSTGRES_"))
        }
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env["PYTHONPATH"] = str(ROOT)
        env["PYTHONUNBUFFERED"] = "1"
        env["TUNEFLEET_HOME"] = str(self.home / name)  # the image's TUNEFLEET_HOME
        for key, value in (self.services[name].get("environment") or {}).items():
            env[key] = resolve(value)
        if "TUNEFLEET_DATABASE_URL" in env:
            url = env["TUNEFLEET_DATABASE_URL"]
            assert "@db:5432/" in url, url
            env["TUNEFLEET_DATABASE_URL"] = url.replace("@db:5432/", f"@127.0.0.1:{self.port}/")
        if env.get("PGHOST") == "db":
            env["PGHOST"], env["PGPORT"] = "127.0.0.1", str(self.port)
        return env

    def run(self, name: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(name),
            env=self.env(name),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def start(self, name: str, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(
                self.command(name),
                env=self.env(name),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("compose")
    server = EmbeddedServer(base / "pg" / "data")
    port = free_port()
    server.start(listen="127.0.0.1", port=port)
    try:
        services = yaml.safe_load(COMPOSE.read_text())["services"]
        db_env = services["db"]["environment"]
        admin = resolve(db_env["POSTGRES_USER"])
        # What the postgres image does on first start: the administrator's password.
        with psycopg.connect(server.admin_url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(admin), sql.Literal(resolve(db_env["POSTGRES_PASSWORD"]))
                )
            )
        assert resolve(db_env["POSTGRES_DB"]) == "tunefleet"  # the database the server made
        yield Stack(server, port, base / "home")
    finally:
        server.stop()


def _admin(stack: Stack) -> psycopg.Connection[Any]:
    return psycopg.connect(
        stack.server.admin_url("tunefleet"),
        autocommit=True,
        row_factory=dict_row,  # type: ignore[arg-type]
    )


def test_docker_compose_up_runs_the_demo_end_to_end(stack, tmp_path):
    # depends_on: db healthy -> migrate.
    migrate = stack.run("migrate")
    assert migrate.returncode == 0, migrate.stderr
    assert "database at revision" in migrate.stdout

    # migrate completed -> roles.
    roles = stack.run("roles")
    assert roles.returncode == 0, roles.stderr
    assert roles.stdout.count("created") == 4
    assert "generated" not in roles.stdout  # every password came from the environment

    # roles completed -> worker(s) and the coordinator.
    worker_log = tmp_path / "worker.log"
    worker = stack.start("worker", worker_log)
    try:
        try:
            # Well inside the test's own timeout (about 20 s when well), so that a hang
            # fails here, saying where the trials stood, not in pytest-timeout's stack dump.
            coordinator = stack.run("coordinator", timeout=200)
        except subprocess.TimeoutExpired:
            with _admin(stack) as db:
                states = db.execute(
                    "SELECT purpose, state, count(*) FROM tunefleet.trial GROUP BY 1, 2"
                ).fetchall()
            pytest.fail(f"the demo run did not end in 200 s; its trials: {states}")
        assert coordinator.returncode == 0, coordinator.stderr + worker_log.read_text()

        # coordinator completed -> reader.
        reader = stack.run("reader")
        assert reader.returncode == 0, reader.stderr
        assert "compose-demo" in reader.stdout and "finished" in reader.stdout
        assert "(1 row)" in reader.stdout
        assert worker.poll() is None, "the worker must keep serving until compose stops it"
    finally:
        # docker compose down: SIGTERM, then the grace period.
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
            code = None  # reported below, unless the run's own failure is on its way
    assert code == 0, f"the worker's stop (exit {code}): " + worker_log.read_text()
    # `docker compose logs worker` tells what it did (the service runs with -v).
    assert "claimed trial" in worker_log.read_text()

    with _admin(stack) as db:
        run = db.execute("SELECT * FROM tunefleet.run_progress").fetchone()
        assert run["name"] == "compose-demo" and run["run_state"] == "finished"
        assert run["done"] >= 1 and run["pending"] == 0 and run["running"] == 0
        measured = db.execute(
            "SELECT count(*) AS n, count(DISTINCT m.worker_id) AS workers"
            " FROM tunefleet.measurement m JOIN tunefleet.trial t ON t.id = m.trial_id"
            " WHERE m.run_id = %s AND t.purpose = 'search'",
            (run["run_id"],),
        ).fetchone()
        assert measured["n"] == run["done"] - run["cached"] and measured["workers"] == 1
        # The best was re-measured (by the one worker, later) before the run finished.
        assert run["confirmed"] >= 1 and run["confirming"] == 0
        states = db.execute("SELECT state FROM tunefleet.worker").fetchall()
        assert states == [{"state": "stopped"}]
        # The services ran as their own roles.
        who = db.execute(
            "SELECT w.id, m.worker_id FROM tunefleet.worker w"
            " JOIN tunefleet.measurement m ON m.worker_id = w.id LIMIT 1"
        ).fetchone()
        assert who is not None

    # A second `docker compose up` on the kept volume: the one-shots succeed again, and the
    # results are still there for the reader.
    assert stack.run("migrate").returncode == 0
    again = stack.run("roles")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("updated") == 4
    reader = stack.run("reader")
    assert reader.returncode == 0 and "compose-demo" in reader.stdout


def test_reader_role_of_the_stack_cannot_write(stack):
    """The reader's credentials from the compose file give no write access."""
    if stack.run("roles").returncode != 0:
        pytest.skip("roles need the schema: runs after the end-to-end test")
    env = stack.env("reader")
    out = subprocess.run(
        ["psql", "--no-psqlrc", "--set=ON_ERROR_STOP=1", "--command=DELETE FROM tunefleet.run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "permission denied" in out.stderr


def test_gpu_service_without_a_gpu_fails_with_a_clear_message(stack):
    pytest.importorskip("pyopencl")
    out = stack.run("worker-gpu", timeout=120)
    assert out.returncode == 1
    assert "no OpenCL device of type 'gpu'" in out.stderr


@pytest.fixture(autouse=True)
def _needs_psql() -> None:
    if shutil.which("psql") is None:
        pytest.skip("the reader service runs psql (PostgreSQL client) and it is not installed")
