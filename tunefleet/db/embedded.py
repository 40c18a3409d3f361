"""The embedded database: a private PostgreSQL server in a data directory, no root, no Docker.

Binaries come from the ``pgserver`` wheel when it is installed, else from ``pg_ctl``/``initdb``
on ``PATH`` or under Debian's ``/usr/lib/postgresql/*/bin``. The data lives in
``<home>/postgres/data`` where ``<home>`` is ``$TUNEFLEET_HOME`` or the user data directory.

Every state change (initdb, start, stop, role setup) happens under an exclusive ``flock`` on
``<home>/postgres/lock``, so two processes starting the server at once end with one server:
the second finds it running and reuses it. The running server's address is read back from
``postmaster.pid`` (the server's own record), never from a cache of ours that could go stale.

PostgreSQL refuses to run as root; when we are root the server runs as the system user
``tunefleet-pg`` (created if missing), like a distribution package would do.

Local connections go through a Unix socket in a private short directory (trust auth, the
directory is only reachable by the owner). ``start(listen=HOST, port=P)`` also serves TCP with
SCRAM passwords: the role ``tunefleet`` gets a generated password kept in a ``pgpass`` file
(mode 0600) beside the data, which is what ``tunefleet db url`` points remote workers at.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import importlib.util
import os
import re
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tunefleet.errors import EmbeddedServerError

DATABASE = "tunefleet"
SUPERUSER = "postgres"
REMOTE_ROLE = "tunefleet"
ROOT_RUN_AS = "tunefleet-pg"
DEFAULT_PORT = 5432


def find_bin_dir() -> Path:
    """Directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    ``$TUNEFLEET_PG_BIN`` wins when set; then the ``pgserver`` wheel (located without importing
    it: its import creates runtime directories as a side effect); then Debian's layout; then
    ``PATH``.
    """
    explicit = os.environ.get("TUNEFLEET_PG_BIN")
    if explicit:
        chosen = Path(explicit).expanduser()
        if not ((chosen / "pg_ctl").exists() and (chosen / "initdb").exists()):
            raise EmbeddedServerError(
                f"TUNEFLEET_PG_BIN={explicit!r} has no pg_ctl and initdb; "
                "point it at a PostgreSQL bin directory or unset it"
            )
        return chosen
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "pginstall" / "bin"
        if (bundled / "pg_ctl").exists():
            return bundled
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    for directory in candidates:
        if (Path(directory) / "pg_ctl").exists() and (Path(directory) / "initdb").exists():
            return Path(directory)
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).resolve().parent
    raise EmbeddedServerError(
        "no PostgreSQL server binaries found; install the embedded extra "
        "(pip install 'tunefleet[embedded]') or a PostgreSQL server package, "
        "or pass --db URL to use an existing server"
    )


def _version_key(path: str) -> float:
    try:
        return float(Path(path).parent.name)
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    data_dir: Path
    pid: int | None = None
    port: int | None = None
    socket_dir: str | None = None
    listen: str | None = None
    #: A ``postmaster.pid`` is left but its process is gone (a crash, SIGKILL, a reboot).
    #: ``start`` recovers from this: PostgreSQL replaces a stale pid file itself.
    stale: bool = False


class EmbeddedServer:
    """One private PostgreSQL server living in ``data_dir``."""

    def __init__(self, data_dir: Path, bin_dir: Path | None = None) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.base = self.data_dir.parent
        self._bin_dir = bin_dir
        self.run_as = ROOT_RUN_AS if os.geteuid() == 0 else None

    # --- paths --------------------------------------------------------------------------
    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = find_bin_dir()
        return self._bin_dir

    @property
    def lock_path(self) -> Path:
        return self.base / "lock"

    @property
    def pgpass_path(self) -> Path:
        return self.base / "pgpass"

    @property
    def log_path(self) -> Path:
        return self.base / "server.log"

    def socket_dir(self) -> Path:
        # Unix socket paths are limited to ~107 bytes: use a short private directory.
        digest = hashlib.sha1(str(self.data_dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"tunefleet-{digest}"

    # --- locking and commands -----------------------------------------------------------
    def _unusable(self, path: Path, exc: OSError) -> EmbeddedServerError:
        return EmbeddedServerError(
            f"cannot use {path} for the embedded database ({exc.strerror or exc}); "
            "set TUNEFLEET_HOME to a writable directory"
        )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.base.mkdir(parents=True, exist_ok=True)
            fh = open(self.lock_path, "a+")
        except OSError as exc:
            raise self._unusable(self.base, exc) from None
        with fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _run(self, exe: str, *args: str, timeout: float = 120) -> str:
        cmd = [str(self.bin_dir / exe), *args]
        log_offset = _size(self.log_path)
        try:
            proc = subprocess.run(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                timeout=timeout,
                # Drop root's groups too: a root-group directory with mode 0701 would
                # otherwise deny us through its group bits.
                user=self.run_as,
                group=self.run_as,
                extra_groups=[] if self.run_as else None,
                cwd="/",
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise EmbeddedServerError(
                f"{exe} did not finish in {timeout:.0f} s; see {self.log_path}"
            ) from None
        if proc.returncode != 0:
            # The server's own complaint (in its log) says more than pg_ctl's "could not start".
            reason = _log_reason(self.log_path, log_offset) or _last_lines(proc.stdout)
            raise EmbeddedServerError(
                f"{exe} failed (exit {proc.returncode}): {reason}; see {self.log_path}"
            )
        return proc.stdout

    def _prepare_root(self) -> None:
        """As root: make sure the service user exists and can reach data and binaries.

        Adds the ``x`` bit for others on the parents of the data and binary directories (no
        read bit: nothing becomes listable) so the service user can traverse them.
        """
        if self.run_as is None:
            return
        import pwd

        if _user_missing(self.run_as):
            created = subprocess.run(
                [
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    self.run_as,
                ],
                check=False,
                capture_output=True,
                text=True,
            )
            # Exit 9: another process created it a moment ago.
            if created.returncode not in (0, 9):
                raise EmbeddedServerError(
                    f"PostgreSQL does not run as root and creating the system user "
                    f"{self.run_as!r} failed: {_last_lines(created.stderr)}; "
                    "run tunefleet as an ordinary user"
                )
        entry = pwd.getpwnam(self.run_as)
        for path in (self.base, self.bin_dir):
            for parent in [path, *path.parents]:
                mode = parent.stat().st_mode
                if not mode & stat.S_IXOTH:
                    parent.chmod(mode | stat.S_IXOTH)
        os.chown(self.base, entry.pw_uid, entry.pw_gid)
        if self.log_path.exists():
            os.chown(self.log_path, entry.pw_uid, entry.pw_gid)
        if self.data_dir.exists():
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)

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

    def is_initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def start(self, listen: str | None = None, port: int | None = None) -> ServerStatus:
        """Initialise if needed and start, or reuse the running server.

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
            self._check_data_dir()
            self._prepare_root()
            if not self.is_initialised():
                self._initdb()
            self._check_version()
            self._start_server(listen, port)
            status = self.status()
            self._ensure_database(status)
            if listen:
                self._ensure_remote_role(status)
            return status

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

    def _check_version(self) -> None:
        """A data directory only opens with the PostgreSQL major version that created it."""
        data_version = (self.data_dir / "PG_VERSION").read_text().strip()
        out = self._run("postgres", "--version")
        match = re.search(r"(\d+)(?:\.\d+)?", out)
        server_version = match.group(1) if match else ""
        if server_version and data_version != server_version:
            raise EmbeddedServerError(
                f"{self.data_dir} was created by PostgreSQL {data_version} but the server "
                f"binaries in {self.bin_dir} are PostgreSQL {server_version}; set "
                f"TUNEFLEET_PG_BIN to a PostgreSQL {data_version} bin directory, or dump the "
                "data and move the directory away"
            )

    def _initdb(self) -> None:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.data_dir.chmod(0o700)
        except OSError as exc:
            raise self._unusable(self.data_dir, exc) from None
        self._prepare_root()
        try:
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--no-instructions",
            )
        except EmbeddedServerError:
            # Leave no half-initialised directory behind: the next start would refuse it.
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# tunefleet embedded server\n"
                "password_encryption = 'scram-sha-256'\n"
                "max_connections = 300\n"
                "shared_buffers = 128MB\n"
                "unix_socket_permissions = 0700\n"
            )
        with open(self.data_dir / "pg_hba.conf", "a") as hba:
            # Remote workers: SCRAM passwords only, any address (TLS via the DSN's sslmode).
            hba.write("host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n")

    def _start_server(self, listen: str | None, port: int | None) -> None:
        sock = self.socket_dir()
        sock.mkdir(mode=0o700, exist_ok=True)
        if self.run_as is not None:
            import pwd

            entry = pwd.getpwnam(self.run_as)
            os.chown(sock, entry.pw_uid, entry.pw_gid)
            self.log_path.touch(exist_ok=True)
            os.chown(self.log_path, entry.pw_uid, entry.pw_gid)
        elif sock.stat().st_uid != os.geteuid():
            # The directory is in the shared temporary directory: never use somebody else's.
            raise EmbeddedServerError(
                f"the socket directory {sock} belongs to another user; remove it and start again"
            )
        sock.chmod(0o700)
        chosen_port = port or (DEFAULT_PORT if listen else _free_port())
        opts = (
            f"-c listen_addresses='{listen or ''}' -c port={int(chosen_port)} "
            f"-c unix_socket_directories='{sock}'"
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
            if listen and ("bind" in str(exc) or "TCP/IP" in str(exc)):
                raise EmbeddedServerError(
                    f"{exc} (is port {chosen_port} on {listen} taken? choose another with --port)"
                ) from None
            raise
        deadline = time.monotonic() + 30
        while not self.status().running:
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"the server did not come up; see {self.log_path}")
            time.sleep(0.1)

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
        from psycopg import sql

        password = self._read_password() or secrets.token_urlsafe(24)
        with self._admin_conn(status) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", (REMOTE_ROLE,)
            ).fetchone()
            verb = "ALTER" if exists else "CREATE"
            conn.execute(
                sql.SQL(verb + " ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                    sql.Identifier(REMOTE_ROLE), sql.Literal(password)
                )
            )
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
        """Stop the server if it runs; return whether it was running."""
        with self._locked():
            if not self.status().running:
                self._remove_socket_dir()
                return False
            self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", "fast", "-D", str(self.data_dir))
            self._remove_socket_dir()
            return True

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


def _user_missing(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return True
    return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _last_lines(text: str | None, count: int = 2) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return " | ".join(lines[-count:]) or "no output"


def _log_reason(log: Path, offset: int) -> str | None:
    """The first FATAL/PANIC/ERROR line the server wrote to its log since ``offset``."""
    try:
        with open(log, errors="replace") as fh:
            fh.seek(offset)
            new = fh.read()
    except OSError:
        return None
    lines = new.splitlines()
    # "could not bind" is logged (LOG level) just before the FATAL that only says no socket.
    for marker in ("could not bind", "FATAL:", "PANIC:", "ERROR:"):
        for line in lines:
            if marker in line:
                start = line.index(marker)
                if marker == "could not bind":
                    start = line.rfind(":", 0, start) + 1
                return " ".join(line[start:].split())
    return None


def _free_port() -> int:
    # Only names the socket file when not listening on TCP, but keep it unique anyway.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_server() -> EmbeddedServer:
    from tunefleet.settings import home_dir

    return EmbeddedServer(home_dir() / "postgres" / "data")


def ensure_embedded_url() -> str:
    """Start (or reuse) the embedded server, upgrade it to head, return its local URL."""
    from tunefleet.db.migrate import upgrade

    server = default_server()
    server.start()
    url = server.local_url()
    upgrade(url)
    return url
