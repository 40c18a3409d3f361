"""TLS for a test's PostgreSQL: a throw-away certificate authority and server certificate made
with the ``openssl`` command, a server build that links OpenSSL, and turning TLS on in an
embedded server's data directory."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import psycopg

from tunefleet.db.embedded import EmbeddedServer


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> Path:
    """A self-signed CA certificate and key; returns the certificate path."""
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    return directory / f"{name}.crt"


def make_server_cert(
    directory: Path, ca: str, addresses: Sequence[str] = ("127.0.0.1",)
) -> tuple[Path, Path]:
    """A server certificate for ``addresses`` (IP addresses) and localhost, signed by ``ca``."""
    names = ",".join([*(f"IP:{a}" for a in addresses), "DNS:localhost"])
    (directory / "san.ext").write_text(f"subjectAltName={names}\n")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.ext",
        cwd=directory,
    )  # fmt: skip
    return directory / "server.crt", directory / "server.key"


def ssl_capable_bin_dir() -> Path | None:
    """A PostgreSQL binary directory whose server links OpenSSL (the pgserver wheel's build
    does not; distribution packages do)."""
    from tunefleet.db.embedded import find_bin_dir

    candidates = [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    try:
        candidates.append(find_bin_dir())
    except Exception:
        pass
    for directory in candidates:
        postgres = directory / "postgres"
        if not postgres.exists() or shutil.which("ldd") is None:
            continue
        libs = subprocess.run(["ldd", str(postgres)], capture_output=True, text=True).stdout
        if "libssl" in libs:
            return directory
    return None


def enable_tls(server: EmbeddedServer, crt: Path, key: Path) -> None:
    """Give the running ``server`` this certificate and key and turn TLS on (a reload)."""
    for src, dest in ((crt, "server.crt"), (key, "server.key")):
        target = server.data_dir / dest
        shutil.copy(src, target)
        # The server's key must belong to the server's user and be private to it.
        target.chmod(0o600)
        if server.run_as is not None:
            import pwd

            entry = pwd.getpwnam(server.run_as)
            os.chown(target, entry.pw_uid, entry.pw_gid)
    with open(server.data_dir / "postgresql.conf", "a") as conf:
        conf.write("ssl = on\n")
    with psycopg.connect(server.admin_url(), autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")
