"""A real PgBouncer in front of a test's (or a benchmark's) PostgreSQL: Debian's
``/usr/sbin/pgbouncer`` as CI installs it, or the binary named by ``TUNEFLEET_PGBOUNCER``
(``benchmarks/fleet_sim.py --pgbouncer``: the carried copy under ``.pgb/``).

``pgbouncer(admin_url, pool_mode, ...)`` starts one for every database of the server behind
``admin_url`` (a superuser URL on the server's socket directory, as the embedded server's
``admin_url()`` is), trust authentication, on a free local port, and stops it after; the
object it yields turns a database URL of that server into the same database through the
pooler and reads PgBouncer's own log.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.helpers.ports import free_port


def find_pgbouncer() -> str | None:
    """The PgBouncer to run: ``$TUNEFLEET_PGBOUNCER``, else one on PATH, else Debian's."""
    explicit = os.environ.get("TUNEFLEET_PGBOUNCER")
    if explicit:
        return explicit
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
    )


@dataclass
class PgBouncer:
    port: int
    user: str
    directory: Path
    proc: subprocess.Popen[bytes]

    def url(self, database_url: str) -> str:
        """The database of ``database_url`` (on the same server), through this pooler."""
        dbname = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def __call__(self, database_url: str) -> str:
        return self.url(database_url)

    def log(self) -> str:
        return (self.directory / "pgbouncer.log").read_text(errors="replace")


@contextlib.contextmanager
def pgbouncer(
    admin_url: str,
    pool_mode: str,
    *,
    ignore_options: bool = True,
    pool_size: int = 20,
    max_client_conn: int = 100,
    binary: str | None = None,
    settings: Mapping[str, str | int] | None = None,
    start_timeout_s: float = 30.0,
) -> Iterator[PgBouncer]:
    """A PgBouncer in ``pool_mode`` in front of the server of ``admin_url``, for every
    database of it, with at most ``pool_size`` server connections per database and user and
    ``max_client_conn`` clients; ``settings`` adds or overrides ``[pgbouncer]`` settings."""
    program = binary or find_pgbouncer()
    if program is None:
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
    info = psycopg.conninfo.conninfo_to_dict(admin_url)
    socket_dir, port, user = str(info["host"]), str(info["port"]), str(info["user"])
    directory = Path(tempfile.mkdtemp(prefix="tunefleet-pgbouncer-"))
    directory.chmod(0o755)
    listen = free_port()
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    options: dict[str, str | int] = {
        "listen_addr": "127.0.0.1",
        "listen_port": listen,
        "unix_socket_dir": "",
        "auth_type": "trust",
        "auth_file": str(directory / "users.txt"),
        "pool_mode": pool_mode,
        "default_pool_size": pool_size,
        "max_client_conn": max_client_conn,
        # Come back soon after the server restarts (the default waits 15 s).
        "server_login_retry": 1,
    }
    if ignore_options:
        options["ignore_startup_parameters"] = "options"
    options.update(settings or {})
    (directory / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={socket_dir} port={port} user={user}\n"
        "[pgbouncer]\n" + "".join(f"{k} = {v}\n" for k, v in options.items())
    )
    for f in directory.iterdir():
        f.chmod(0o644)
    argv = [program]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root: run it as the owner of the server's socket
        # directory (the embedded server's own user), who can reach the socket.
        argv += ["-u", pwd.getpwuid(os.stat(socket_dir).st_uid).pw_name]
    log_path = directory / "pgbouncer.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*argv, str(directory / "pgbouncer.ini")],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    bouncer = PgBouncer(listen, user, directory, proc)
    try:
        deadline = time.monotonic() + start_timeout_s
        while proc.poll() is None and b"process up" not in log_path.read_bytes():
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start:\n{bouncer.log()}")
            time.sleep(0.05)
        if proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited:\n{bouncer.log()}")
        yield bouncer
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(directory, ignore_errors=True)
