"""One data directory of the embedded database, and running PostgreSQL's programs on it.

The data lives in ``<home>/postgres/data`` (``<home>`` is ``$TUNEFLEET_HOME`` or the user data
directory); beside it, in ``<home>/postgres``, the ``lock`` every state change (initdb, start,
stop, role setup, a carry-forward) holds an exclusive ``flock`` on, so two processes starting
the server at once end with one server, the server's log and the address it last started on.

Local connections go through a Unix socket in a private short directory (trust auth, the
directory is only reachable by its owner), under ``TMPDIR`` where a socket path fits, else in
``/tmp``. As root, every program runs as the system user of
:mod:`~tunefleet.db.embedded.system_user`, which is given the directories it needs.

``TUNEFLEET_PG_NO_SYNC=1`` makes a throw-away server (CI, a test suite, a demo in ``/tmp``):
initdb, pg_upgrade and the server stop waiting for the disk (``fsync`` off). A killed server
still loses no commit; an operating-system crash or a power cut can corrupt the data directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunefleet.db.embedded.binaries import Binaries, find_binaries, major_version
from tunefleet.db.embedded.logs import file_size, last_lines, log_reason
from tunefleet.db.embedded.system_user import ROOT_RUN_AS, ensure_system_user
from tunefleet.errors import EmbeddedServerError
from tunefleet.settings import parse_bool, resolve

SUPERUSER = "postgres"

#: The longest Unix socket path Linux takes (``sun_path`` is 108 bytes with its NUL).
SOCKET_PATH_MAX = 107
#: Where the socket goes when ``TMPDIR`` is too deep for it.
SHORT_TEMP_DIRS = ("/tmp",)


def _fits_a_socket_path(socket_dir: Path) -> bool:
    # The socket and PostgreSQL's lock file beside it, on the longest port number.
    return len(os.fsencode(socket_dir / ".s.PGSQL.65535.lock")) <= SOCKET_PATH_MAX


class DataDirectory:
    """One PostgreSQL data directory, ``data_dir``, and the files tunefleet keeps beside it
    (in its parent, :attr:`base`): the lock, the server log, the last address, the pgpass
    file of the remote role and the scratch space of a carry-forward.

    The methods named with an underscore are this package's own, called by
    :class:`~tunefleet.db.embedded.server.EmbeddedServer` (a data directory with a server
    running on it) and by :mod:`~tunefleet.db.embedded.upgrade`.
    """

    def __init__(
        self, data_dir: Path, bin_dir: Path | None = None, *, no_sync: bool | None = None
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.base = self.data_dir.parent
        self._binaries = Binaries(Path(bin_dir), "given") if bin_dir is not None else None
        self.run_as = ROOT_RUN_AS if os.geteuid() == 0 else None
        #: A throw-away server that never waits for the disk (``TUNEFLEET_PG_NO_SYNC``).
        self.no_sync = resolve(no_sync, "PG_NO_SYNC", False, parse_bool)

    def _server_options(self) -> str:
        """``postgres -c`` settings of every start: none, or no waiting for the disk. They
        are given at each start, not written to the directory, so a server made throw-away
        once is durable again when started without ``TUNEFLEET_PG_NO_SYNC``."""
        if not self.no_sync:
            return ""
        # Not synchronous_commit = off: a commit would then return before its WAL reaches
        # the operating system, and a killed server would lose it.
        return " -c fsync=off -c full_page_writes=off"

    # --- paths --------------------------------------------------------------------------
    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            self._binaries = find_binaries()
        return self._binaries

    @property
    def bin_dir(self) -> Path:
        return self.binaries.bin_dir

    @property
    def lock_path(self) -> Path:
        return self.base / "lock"

    @property
    def pgpass_path(self) -> Path:
        return self.base / "pgpass"

    @property
    def log_path(self) -> Path:
        return self.base / "server.log"

    @property
    def address_path(self) -> Path:
        return self.base / "address.json"

    @property
    def stopped_path(self) -> Path:
        """Present from a ``stop`` to the next ``start``: the server is down because someone
        stopped it, not because it crashed or never started."""
        return self.base / "stop-requested"

    @property
    def upgrade_dir(self) -> Path:
        """Scratch space of a carry-forward: the new data directory until it is verified."""
        return self.base / "upgrade"

    def recorded_address(self) -> dict[str, Any]:
        """Port, TCP addresses and socket directory the server last started with (``{}``
        before its first start): a restart reuses them, so live clients' URLs stay valid."""
        try:
            data = json.loads(self.address_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _record_address(self, port: int, listen: str, sock: Path) -> None:
        tmp = self.address_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"port": port, "listen": listen, "socket_dir": str(sock)}))
        tmp.replace(self.address_path)

    def socket_dir(self) -> Path:
        """The private directory of the server's Unix socket: the recorded one while it is
        usable (a restart from a shell with another ``TMPDIR`` must not move it), else a short
        one derived from the data directory, in the temporary directory or, where that is too
        deep for a socket path (a batch job's per-job ``TMPDIR``), in ``/tmp``."""
        recorded = self.recorded_address().get("socket_dir")
        if isinstance(recorded, str) and recorded and Path(recorded).parent.is_dir():
            return Path(recorded)
        digest = hashlib.sha1(str(self.data_dir).encode()).hexdigest()[:12]
        temp = tempfile.gettempdir()
        for base in (temp, *SHORT_TEMP_DIRS):
            candidate = Path(base) / f"tunefleet-{digest}"
            if _fits_a_socket_path(candidate) and Path(base).is_dir():
                return candidate
        raise EmbeddedServerError(
            f"the temporary directory {temp} is too long for the embedded server's socket "
            f"(a socket path takes at most {SOCKET_PATH_MAX} bytes); set TMPDIR to a shorter "
            "directory"
        )

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

    def _run(
        self,
        exe: str,
        *args: str,
        timeout: float = 120,
        bin_dir: Path | None = None,
        cwd: Path | None = None,
    ) -> str:
        cmd = [str((bin_dir or self.bin_dir) / exe), *args]
        log_offset = file_size(self.log_path)
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
                cwd=str(cwd or "/"),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise EmbeddedServerError(
                f"{exe} did not finish in {timeout:.0f} s; see {self.log_path}"
            ) from None
        if proc.returncode != 0:
            # The server's own complaint (in its log) says more than pg_ctl's "could not start".
            reason = log_reason(self.log_path, log_offset) or last_lines(proc.stdout)
            raise EmbeddedServerError(
                f"{exe} failed (exit {proc.returncode}): {reason}; see {self.log_path}"
            )
        return proc.stdout

    def _prepare_root(self, *more_bin_dirs: Path) -> None:
        """As root: make sure the service user exists and can reach data and binaries.

        Adds the ``x`` bit for others on the parents of the data and binary directories (no
        read bit: nothing becomes listable) so the service user can traverse them.
        """
        if self.run_as is None:
            return
        entry = ensure_system_user(self.run_as)
        for path in (self.base, self.bin_dir, *more_bin_dirs):
            for parent in [path, *path.parents]:
                mode = parent.stat().st_mode
                if not mode & stat.S_IXOTH:
                    parent.chmod(mode | stat.S_IXOTH)
        os.chown(self.base, entry.pw_uid, entry.pw_gid)
        if self.log_path.exists():
            os.chown(self.log_path, entry.pw_uid, entry.pw_gid)
        if self.data_dir.exists():
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)

    def is_initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def data_major(self) -> int | None:
        """The PostgreSQL major version that made the data directory (its ``PG_VERSION``)."""
        try:
            return major_version((self.data_dir / "PG_VERSION").read_text())
        except OSError:
            return None

    def _give_to_server_user(self, path: Path) -> None:
        if self.run_as is not None:
            import pwd

            entry = pwd.getpwnam(self.run_as)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _initdb(self, data_dir: Path, *options: str) -> None:
        """initdb ``data_dir`` with our settings; ``options`` replace the default encoding
        (a carry-forward repeats the old directory's encoding, locale and checksums)."""
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            data_dir.chmod(0o700)
        except OSError as exc:
            raise self._unusable(data_dir, exc) from None
        self._prepare_root()
        self._give_to_server_user(data_dir)
        try:
            self._run(
                "initdb",
                "-D",
                str(data_dir),
                "-U",
                SUPERUSER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                *(options or ("--encoding=UTF8",)),
                "--no-instructions",
                *(["--no-sync"] if self.no_sync else []),
            )
        except EmbeddedServerError:
            # Leave no half-initialised directory behind: the next start would refuse it.
            shutil.rmtree(data_dir, ignore_errors=True)
            raise
        with open(data_dir / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# tunefleet embedded server\n"
                "password_encryption = 'scram-sha-256'\n"
                "max_connections = 300\n"
                "shared_buffers = 128MB\n"
                "unix_socket_permissions = 0700\n"
                # A remote client that vanished mid-conversation (its node cut off, its host
                # gone) keeps a session and a connection slot until the server probes it:
                # about two minutes with these, not the system's two hours.
                "tcp_keepalives_idle = 60\n"
                "tcp_keepalives_interval = 10\n"
                "tcp_keepalives_count = 6\n"
            )
        with open(data_dir / "pg_hba.conf", "a") as hba:
            # Remote workers: SCRAM passwords only, any address (TLS via the DSN's sslmode).
            hba.write("host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n")

    def _prepare_socket_dir(self) -> Path:
        sock = self.socket_dir()
        sock.mkdir(mode=0o700, exist_ok=True)
        if self.run_as is not None:
            self._give_to_server_user(sock)
            self.log_path.touch(exist_ok=True)
            self._give_to_server_user(self.log_path)
        elif sock.stat().st_uid != os.geteuid():
            # The directory is in the shared temporary directory: never use somebody else's.
            raise EmbeddedServerError(
                f"the socket directory {sock} belongs to another user; remove it and start again"
            )
        sock.chmod(0o700)
        return sock


def free_port() -> int:
    # Only names the socket file when not listening on TCP, but keep it unique anyway.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
