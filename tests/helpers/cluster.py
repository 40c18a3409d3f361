"""A cluster site on one machine, for the cluster tests and the network benchmark: nodes on
their own network (:mod:`tests.helpers.netns`), and the database host's PostgreSQL (the embedded
server, on a build that links OpenSSL) listening on the test subnet with TLS only, its roles set
up as ``tunefleet db roles`` does.

    with cluster_site(tmp_path) as site, site.database() as db:
        w = worker_on(site.node("node1"), db, tmp_path / "w.log", drain=True)

A process on a node reaches the database as a remote node does: over TCP to the database
host's address, ``sslmode=verify-full`` against the site's own certificate authority, as its
role (``worker`` or ``coordinator``), with only that role's line in its pgpass file. Plain TCP
is refused (``hostnossl ... reject``), so a process that connects at all used TLS.

The test itself observes through the server's private socket as the superuser
(``db.admin_url``), which no network fault touches.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.helpers import netns
from tests.helpers.launch import WorkerProcess, worker_argv
from tests.helpers.ports import free_port
from tests.helpers.tls import enable_tls, make_ca, make_server_cert, ssl_capable_bin_dir
from tunefleet.db.embedded import EmbeddedServer
from tunefleet.db.engine import connect
from tunefleet.db.migrate import upgrade
from tunefleet.db.roles import ROLE_NAMES, RolesSettings, setup_roles, write_pgpass

ROOT = Path(__file__).resolve().parents[2]
#: A login node (coordinators) and four compute nodes.
SITE_NODES = ("login1", "node1", "node2", "node3", "node4")
TEMPLATE = "tf_cluster_template"
_counter = itertools.count()
T = TypeVar("T")


def unavailable() -> str | None:
    """Why a site cannot be built here (``None`` when it can)."""
    reason = netns.unavailable()
    if reason:
        return reason
    if ssl_capable_bin_dir() is None:
        return "no PostgreSQL server build with TLS support on this machine"
    return None


@dataclass
class Site:
    net: netns.NodeNetwork
    server: EmbeddedServer
    port: int
    ca: Path
    directory: Path
    #: Every role's password, by its unprefixed name (the same on every database).
    passwords: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        """The database host's address on the test subnet."""
        return self.net.gateway

    def node(self, name: str) -> netns.Node:
        return self.net.nodes[name]

    @contextlib.contextmanager
    def database(self) -> Iterator[SiteDatabase]:
        """A fresh database at the schema head with the four roles, dropped afterwards."""
        name = f"tf_cluster_{os.getpid()}_{next(_counter)}"
        admin = self.server.admin_url()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(TEMPLATE)
                )
            )
        db = SiteDatabase(self, name, self.directory / name)
        db.directory.mkdir(parents=True, exist_ok=True)
        try:
            setup_roles(db.admin_url, RolesSettings(pgpass=None, passwords=self.passwords))
            for role in ("worker", "coordinator", "reader"):
                write_pgpass(db.pgpass(role), name, {f"tunefleet_{role}": self.passwords[role]})
            yield db
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


@dataclass
class SiteDatabase:
    site: Site
    name: str
    directory: Path

    @property
    def admin_url(self) -> str:
        """The superuser on the server's private socket: the test's own view."""
        return make_conninfo(self.site.server.admin_url(), dbname=self.name)

    def url(self, role: str) -> str:
        """What a node is given: the role's URL over TCP with TLS verified, no password."""
        query = urlencode({"sslmode": "verify-full", "sslrootcert": str(self.site.ca)})
        return (
            f"postgresql://tunefleet_{role}@{self.site.address}:{self.site.port}/{self.name}"
            f"?{query}"
        )

    def pgpass(self, role: str) -> Path:
        return self.directory / f"{role}.pgpass"

    def env(self, role: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A process environment for ``role``: its pgpass file, this checkout's code."""
        env = dict(os.environ if base is None else base)
        env.pop("TUNEFLEET_DATABASE_URL", None)
        env["PGPASSFILE"] = str(self.pgpass(role))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        return env


@contextlib.contextmanager
def cluster_site(directory: Path, nodes: Sequence[str] = SITE_NODES) -> Iterator[Site]:
    """The network, the database host's TLS-only server and the roles (module docstring)."""
    bin_dir = ssl_capable_bin_dir()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server build with TLS support on this machine")
    directory.mkdir(parents=True, exist_ok=True)
    with netns.node_network(nodes) as net:
        certs = directory / "certs"
        certs.mkdir(exist_ok=True)
        ca = make_ca(certs, "ca")
        crt, key = make_server_cert(certs, "ca", [net.gateway])
        server = EmbeddedServer(directory / "pg" / "data", bin_dir=bin_dir, no_sync=True)
        port = free_port()
        server.start(listen=net.gateway, port=port)
        try:
            _tls_only(server)
            with open(server.data_dir / "postgresql.conf", "a") as conf:
                # Who connected, as which role, with or without TLS: what a site audits.
                conf.write("log_connections = on\n")
                # Sessions of clients cut off for good go within seconds, not the embedded
                # server's two minutes: a test waits for them.
                conf.write(
                    "tcp_keepalives_idle = 2\ntcp_keepalives_interval = 1\n"
                    "tcp_keepalives_count = 3\n"
                )
            enable_tls(server, crt, key)
            admin = server.admin_url()
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
            upgrade(make_conninfo(admin, dbname=TEMPLATE))
            passwords = {name: f"{name}-{os.urandom(12).hex()}" for name in ROLE_NAMES}
            yield Site(net, server, port, ca, directory, passwords)
        finally:
            server.stop()


def _tls_only(server: EmbeddedServer) -> None:
    """Refuse every TCP connection without TLS (the first matching line wins)."""
    hba = server.data_dir / "pg_hba.conf"
    hba.write_text("hostnossl all all all reject\n" + hba.read_text())


# --- processes on nodes ---------------------------------------------------------------------


def start_on(
    node: netns.Node, argv: Sequence[str], log_path: Path, env: Mapping[str, str]
) -> WorkerProcess:
    """``argv`` on ``node``, its output in ``log_path``."""
    with open(log_path, "ab") as out:
        popen = node.popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
        )
    return WorkerProcess(popen, log_path, list(argv))


def worker_on(
    node: netns.Node,
    db: SiteDatabase,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    **options: object,
) -> WorkerProcess:
    """``tunefleet worker --device host`` on ``node`` as the worker role; ``options`` are
    :func:`tests.helpers.launch.worker_argv`'s keywords."""
    argv = worker_argv(db.url("worker"), **options)  # type: ignore[arg-type]
    return start_on(node, argv, log_path, db.env("worker", env))


def coordinator_on(
    node: netns.Node,
    db: SiteDatabase,
    log_path: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
) -> WorkerProcess:
    """``tunefleet coordinator ARGS`` on ``node`` as the coordinator role."""
    argv = [sys.executable, "-m", "tunefleet", "-v", "coordinator", *args, "--db"]
    argv.append(db.url("coordinator"))
    return start_on(node, argv, log_path, db.env("coordinator", env))


# --- a run on the site ----------------------------------------------------------------------


@dataclass
class SiteRun:
    """One tuning run on a site: the coordinator and workers it starts on nodes (all killed on
    :meth:`close`), the database seen from the database host, and the logs for a report."""

    site: Site
    db: SiteDatabase
    workdir: Path
    #: Extra environment of every process (polling, timeouts).
    env: dict[str, str] = field(default_factory=dict)
    coordinator: WorkerProcess | None = None
    workers: list[tuple[str, WorkerProcess]] = field(default_factory=list)
    run_id: int | None = None

    def start_coordinator(self, node: str, *args: str) -> WorkerProcess:
        self.coordinator = coordinator_on(
            self.site.node(node),
            self.db,
            self.workdir / "coordinator.log",
            *args,
            env={**self.db.env("coordinator"), **self.env},
        )
        coordinator = self.coordinator

        def created() -> int | None:
            if coordinator.poll() is not None:
                raise AssertionError(f"the coordinator exited:\n{coordinator.log()}")
            found: int | None = self.query("SELECT max(id) AS id FROM tunefleet.run")[0]["id"]
            return found

        self.run_id = self.wait_for(created, 90, "the coordinator's run")
        return coordinator

    def start_worker(self, node: str, **options: object) -> WorkerProcess:
        n = len(self.workers)
        opts: dict[str, object] = {"device": "host", "drain": False, **options}
        w = worker_on(
            self.site.node(node),
            self.db,
            self.workdir / f"worker-{n}-{node}.log",
            env={**self.db.env("worker"), **self.env},
            **opts,
        )
        self.workers.append((node, w))
        return w

    def wait_registered(self, timeout: float = 90) -> None:
        pids = [w.pid for _, w in self.workers]
        self.wait_for(
            lambda: (
                self.query(
                    "SELECT count(*) AS n FROM tunefleet.worker WHERE pid = ANY(%s)", (pids,)
                )[0]["n"]
                == len(pids)
            ),
            timeout,
            f"{len(pids)} workers to register",
        )

    def worker_on(self, node: str) -> WorkerProcess:
        return next(w for name, w in self.workers if name == node)

    def query(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        with connect(self.db.admin_url) as conn:
            return conn.execute(sql, params).fetchall()

    def finished_trials(self) -> int:
        [row] = self.query(
            "SELECT count(*) AS n FROM tunefleet.trial WHERE run_id = %s AND purpose = 'search'"
            " AND state IN ('done', 'invalid', 'failed', 'timed_out')",
            (self.run_id,),
        )
        return int(row["n"])

    def wait_for(self, predicate: Callable[[], T | None], timeout: float, what: str) -> T:
        """Poll ``predicate`` until it returns something truthy; fail with the logs."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:g} s waiting for {what}\n{self.report()}"
                )
            time.sleep(0.05)

    def report(self, tail: int = 40) -> str:
        out = []
        for path in sorted(self.workdir.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()
            out.append(f"--- {path.name} (last {tail} lines)\n" + "\n".join(lines[-tail:]))
        return "\n".join(out)

    def stop_workers(self, timeout: float = 60) -> list[int]:
        """SIGTERM every live worker; their exit codes."""
        live = [w for _, w in self.workers if w.alive]
        for w in live:
            w.stop()
        deadline = time.monotonic() + timeout
        return [w.wait(max(deadline - time.monotonic(), 0.1)) for w in live]

    def close(self) -> None:
        for _, w in self.workers:
            w.kill()
        if self.coordinator is not None:
            self.coordinator.kill()


def exit_summary(log: str) -> dict[str, int]:
    """The counts of a worker's last words (``worker ... exiting: done 12, dropped 1``)."""
    lines = [line for line in log.splitlines() if " exiting: " in line]
    if not lines:
        return {}
    counts: dict[str, int] = {}
    for part in lines[-1].split(" exiting: ", 1)[1].split(", "):
        name, _, value = part.rpartition(" ")
        if value.isdigit():
            counts[name] = int(value)
    return counts
