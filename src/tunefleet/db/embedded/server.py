"""The embedded server of one data directory: start (or reuse), stop, status and its URLs.

The running server's address is read back from ``postmaster.pid`` (the server's own record),
never from a cache of ours that could go stale; every state change holds the data directory's
lock, so a second process starting the server finds it running and reuses it.

Local connections use the private Unix socket (:mod:`~tunefleet.db.embedded.datadir`).
``start(listen=HOST, port=P)`` also serves TCP with SCRAM passwords: the role ``tunefleet``
gets a generated password kept in a ``pgpass`` file (mode 0600) beside the data, which is what
``tunefleet db url`` points remote workers at.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tunefleet.db.embedded import upgrade
from tunefleet.db.embedded.datadir import SUPERUSER, DataDirectory, free_port
from tunefleet.errors import EmbeddedServerError

DATABASE = "tunefleet"
REMOTE_ROLE = "tunefleet"
DEFAULT_PORT = 5432


@dataclass(frozen=True)
class ServerStatus:
    """What ``postmaster.pid`` says of a data directory's server, checked against the process
    table."""

    running: bool
    data_dir: Path
    pid: int | None = None
    port: int | None = None
    socket_dir: str | None = None
    listen: str | None = None
    #: A ``postmaster.pid`` is left but its process is gone (a crash, SIGKILL, a reboot).
    #: ``start`` recovers from this: PostgreSQL replaces a stale pid file itself.
    stale: bool = False
    #: What :meth:`EmbeddedServer.start` returned started the server (it was down), rather
    #: than finding it running: the server now outlives the process that started it.
    started: bool = False


class EmbeddedServer(DataDirectory):
    """One private PostgreSQL server living in ``data_dir``."""

    # --- state --------------------------------------------------------------------------
    def status(self) -> ServerStatus:
        """What ``postmaster.pid`` says, checked against the live process table."""
        not_running = ServerStatus(running=False, data_dir=self.data_dir)
        pidfile = self.data_dir / "postmaster.pid"
        try:
            lines = pidfile.read_text().splitlines()
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return not_running
        try:
            pid = int(lines[0])
            port = int(lines[3])
            sock = lines[4] or None
            listen = (lines[5] or None) if len(lines) > 5 else None
        except (IndexError, ValueError):
            # A server writes the file in steps while it starts; treat a partial one as down.
            return not_running
        if not _is_postgres(pid):
            return ServerStatus(running=False, data_dir=self.data_dir, stale=True)
        return ServerStatus(True, self.data_dir, pid, port, sock, listen)

    def start(self, listen: str | None = None, port: int | None = None) -> ServerStatus:
        """Initialise if needed and start, or reuse the running server.

        ``listen=None`` and ``port=None`` mean "as the last start": a server restarted after a
        crash or a stop comes back on the same port, TCP addresses and socket directory, so
        the coordinators and workers that were connected reconnect by themselves.
        ``listen=""`` serves the local socket only. A data directory made by an older
        PostgreSQL major is carried forward first (:func:`.upgrade.carry_forward`).

        A running server is reused as it is; asking for a different ``listen``/``port`` than it
        has is an error (stop it first) rather than a silent restart under other clients.
        """
        with self._locked():
            current = self.status()
            if current.running:
                wanted_listen = listen is not None and (current.listen or "") != listen
                wanted_port = port is not None and current.port != port
                if wanted_listen or wanted_port:
                    raise EmbeddedServerError(
                        f"the embedded server is already running (port {current.port}, "
                        f"listening on {current.listen or 'local socket only'}); "
                        "stop it with `tunefleet db stop` before changing --listen/--port"
                    )
                return current
            if current.stale:
                self._clear_stale()
            upgrade.finish_interrupted_upgrade(self)
            self._check_data_dir()
            self._prepare_root()
            if not self.is_initialised():
                self._initdb(self.data_dir)
            upgrade.check_version(self)
            served = self._start_server(listen, port)
            self.stopped_path.unlink(missing_ok=True)
            status = self.status()
            self._ensure_database(status)
            if served:
                self._ensure_remote_role(status)
            return dataclasses.replace(status, started=True)

    def _clear_stale(self) -> None:
        """Remove what a server that died without cleaning up left behind.

        Only called under the lock after :meth:`status` found that the recorded pid is not a
        live PostgreSQL process. PostgreSQL would normally detect a stale ``postmaster.pid``
        itself, but ``kill(pid, 0)`` succeeds on a zombie (an unreaped, killed server, common
        in containers whose init does not reap) and on a recycled pid, and it then refuses to
        start. The socket directory is private to this data directory, so its lock files are
        that dead server's too.
        """
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / "postmaster.pid").unlink()
        sock = self.socket_dir()
        if sock.is_dir():
            for leftover in sock.glob(".s.PGSQL.*"):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()

    def _check_data_dir(self) -> None:
        if self.data_dir.exists() and not self.data_dir.is_dir():
            raise EmbeddedServerError(
                f"{self.data_dir} is a file, not a PostgreSQL data directory; "
                "move it away or set TUNEFLEET_HOME to another directory"
            )
        if self.data_dir.exists() and not self.is_initialised() and any(self.data_dir.iterdir()):
            raise EmbeddedServerError(
                f"{self.data_dir} exists but is not a PostgreSQL data directory; "
                "move it away or set TUNEFLEET_HOME to another directory"
            )

    def _start_server(self, listen: str | None, port: int | None) -> str:
        """Start on the asked address, else the recorded one; return the TCP addresses served
        (empty: local socket only)."""
        sock = self._prepare_socket_dir()
        recorded = self.recorded_address()
        last_listen = recorded.get("listen")
        last_port = recorded.get("port")
        recorded_listen = last_listen if isinstance(last_listen, str) else ""
        recorded_port = last_port if isinstance(last_port, int) else None
        served: str = recorded_listen if listen is None else listen
        same_kind = listen is None or bool(recorded_listen) == bool(served)
        if port is not None:
            chosen_port = port
        elif recorded_port is not None and same_kind:
            chosen_port = recorded_port
        else:
            # Local only, the number only names the socket file in our private directory.
            chosen_port = DEFAULT_PORT if served else free_port()
        opts = (
            f"-c listen_addresses='{served}' -c port={int(chosen_port)} "
            f"-c unix_socket_directories='{sock}'" + self._server_options()
        )
        try:
            self._run(
                "pg_ctl",
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_path),
                "-o",
                opts,
            )
        except EmbeddedServerError as exc:
            if served and ("bind" in str(exc) or "TCP/IP" in str(exc)):
                raise EmbeddedServerError(
                    f"{exc} (is port {chosen_port} on {served} taken? choose another with --port)"
                ) from None
            raise
        deadline = time.monotonic() + 30
        while not self.status().running:
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"the server did not come up; see {self.log_path}")
            time.sleep(0.1)
        self._record_address(int(chosen_port), served, sock)
        return served

    def _admin_conn(self, status: ServerStatus, dbname: str = "postgres") -> Any:
        import psycopg

        return psycopg.connect(self._admin_dsn(status, dbname), autocommit=True)

    def _admin_dsn(self, status: ServerStatus, dbname: str) -> str:
        from psycopg.conninfo import make_conninfo

        return make_conninfo(
            "",
            host=status.socket_dir or str(self.socket_dir()),
            port=str(status.port),
            user=SUPERUSER,
            dbname=dbname,
        )

    def _ensure_database(self, status: ServerStatus) -> None:
        from psycopg import sql

        with self._admin_conn(status) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))

    def _ensure_remote_role(self, status: ServerStatus) -> None:
        """Create/refresh the SCRAM role remote workers use; keep its password in pgpass."""
        from tunefleet.queries.roles import set_login_superuser

        password = self._read_password() or secrets.token_urlsafe(24)
        with self._admin_conn(status) as conn:
            set_login_superuser(conn, REMOTE_ROLE, password)
        self._write_pgpass(password)

    def _read_password(self) -> str | None:
        try:
            line = self.pgpass_path.read_text().strip().splitlines()[0]
        except (FileNotFoundError, IndexError):
            return None
        return line.rsplit(":", 1)[-1] or None

    def _write_pgpass(self, password: str) -> None:
        fd = os.open(self.pgpass_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"*:*:{DATABASE}:{REMOTE_ROLE}:{password}\n")
        self.pgpass_path.chmod(0o600)

    def stop(self) -> bool:
        """Stop the server if it runs; return whether it was running. Either way it stays
        stopped for read-only commands until something starts it (:meth:`stopped_on_purpose`)."""
        with self._locked():
            if self.is_initialised():
                self.stopped_path.touch()
            if not self.status().running:
                self._remove_socket_dir()
                return False
            self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", "fast", "-D", str(self.data_dir))
            self._remove_socket_dir()
            return True

    def stopped_on_purpose(self) -> bool:
        """The server is down because it was stopped (not crashed, not yet initialised):
        read-only commands report that rather than start it behind the user's back."""
        return self.stopped_path.exists() and not self.status().running

    def _remove_socket_dir(self) -> None:
        # Empty once the server is down; a non-empty one belongs to a server we do not know.
        with contextlib.suppress(OSError):
            self.socket_dir().rmdir()

    # --- addresses ----------------------------------------------------------------------
    def admin_url(self, dbname: str = "postgres") -> str:
        status = self.status()
        if not status.running:
            raise EmbeddedServerError("the embedded server is not running; `tunefleet db start`")
        return self._admin_dsn(status, dbname)

    def local_url(self) -> str:
        """URL of the tunefleet database over the private socket (this machine only)."""
        status = self.status()
        if not status.running:
            raise EmbeddedServerError(
                "the embedded server is not running; start it with `tunefleet db start`"
            )
        host = quote(status.socket_dir or str(self.socket_dir()), safe="")
        return f"postgresql://{SUPERUSER}@/{DATABASE}?host={host}&port={status.port}"

    def remote_url(self, host: str | None = None) -> str:
        """URL for workers on other machines (password via the pgpass file, not the URL)."""
        status = self.status()
        if not status.running or not status.listen:
            raise EmbeddedServerError(
                "the embedded server does not listen on TCP; "
                "restart it with `tunefleet db stop && tunefleet db start --listen 0.0.0.0`"
            )
        addr = host or status.listen.split(",")[0].strip()
        if addr in {"*", "0.0.0.0", "::"}:
            addr = socket.getfqdn()
        if ":" in addr and not addr.startswith("["):
            addr = f"[{addr}]"  # an IPv6 literal
        return f"postgresql://{REMOTE_ROLE}@{addr}:{status.port}/{DATABASE}"


def _is_postgres(pid: int) -> bool:
    """Whether ``pid`` is a live PostgreSQL server process.

    ``kill(pid, 0)`` alone is not enough: a server killed with SIGKILL stays a zombie until its
    parent reaps it, and after a reboot the pid may belong to an unrelated process.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc = Path("/proc") / str(pid)
    if not Path("/proc/self").exists():
        return True  # no procfs (macOS): the signal check is all we have
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        comm = (proc / "comm").read_text().strip()
    except (OSError, IndexError):
        return False
    return state not in {"Z", "X"} and comm.startswith("postgres")


def default_server() -> EmbeddedServer:
    from tunefleet.settings import home_dir

    return EmbeddedServer(home_dir() / "postgres" / "data")
