"""Remote access as a cluster uses it: TCP, SCRAM passwords from pgpass files, and TLS options
passed through the DSN (``sslmode``, ``sslrootcert``), on a private server with a self-signed
certificate authority made by the ``openssl`` command for this module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import psycopg
import pytest

from tests.helpers.ports import free_port
from tests.helpers.tls import enable_tls, make_ca, make_server_cert, ssl_capable_bin_dir
from tunefleet.db.embedded import EmbeddedServer
from tunefleet.db.engine import connect
from tunefleet.db.migrate import upgrade
from tunefleet.db.roles import ROLE_NAMES, RolesSettings, setup_roles
from tunefleet.errors import DatabaseUnavailable
from tunefleet.queries import roles as q

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


@dataclass
class TlsServer:
    server: EmbeddedServer
    port: int
    ca: Path
    wrong_ca: Path
    admin_url: str

    @property
    def pgpass(self) -> Path:
        return self.server.pgpass_path

    def url(self, user: str = "tunefleet", **params: str) -> str:
        query = urlencode(params)
        return f"postgresql://{user}@127.0.0.1:{self.port}/tunefleet" + (
            f"?{query}" if query else ""
        )


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    base = tmp_path_factory.mktemp("tls")
    certs = base / "certs"
    certs.mkdir()
    ca = make_ca(certs, "ca")
    wrong_ca = make_ca(certs, "other-ca")
    crt, key = make_server_cert(certs, "ca")

    port = free_port()
    bin_dir = ssl_capable_bin_dir()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server build with SSL support on this machine")
    server = EmbeddedServer(base / "pg" / "data", bin_dir=bin_dir)
    server.start(listen="127.0.0.1", port=port)
    try:
        enable_tls(server, crt, key)
        admin = server.admin_url("tunefleet")
        upgrade(server.local_url())
        yield TlsServer(server, port, ca, wrong_ca, admin)
    finally:
        server.stop()


def ssl_in_use(url: str) -> bool:
    with connect(url) as conn:
        row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    assert row is not None
    return bool(row["ssl"])


# --- TLS through the DSN ------------------------------------------------------------------


def test_sslmode_require_connects_with_ssl(tls_server):
    url = tls_server.url(sslmode="require", passfile=str(tls_server.pgpass))
    assert ssl_in_use(url)


def test_sslmode_disable_connects_without_ssl(tls_server):
    """The control: the same server without TLS when the DSN says so."""
    url = tls_server.url(sslmode="disable", passfile=str(tls_server.pgpass))
    assert not ssl_in_use(url)


def test_key_value_dsn_passes_ssl_options_too(tls_server):
    dsn = (
        f"host=127.0.0.1 port={tls_server.port} dbname=tunefleet user=tunefleet "
        f"sslmode=verify-full sslrootcert={tls_server.ca} passfile={tls_server.pgpass}"
    )
    assert ssl_in_use(dsn)


def test_verify_full_with_the_right_ca_connects(tls_server):
    url = tls_server.url(
        sslmode="verify-full", sslrootcert=str(tls_server.ca), passfile=str(tls_server.pgpass)
    )
    assert ssl_in_use(url)


def test_verify_full_with_a_wrong_ca_fails_in_one_line(tls_server):
    url = tls_server.url(
        sslmode="verify-full", sslrootcert=str(tls_server.wrong_ca), passfile=str(tls_server.pgpass)
    )
    with pytest.raises(DatabaseUnavailable, match="certificate verify failed") as info:
        connect(url)
    assert "\n" not in str(info.value)


def test_verify_full_with_a_wrong_host_name_fails(tls_server):
    # The certificate names 127.0.0.1 and localhost; 127.0.0.2 reaches no listener here, so
    # present a name the certificate does not carry through hostaddr instead.
    dsn = (
        f"host=not-the-server.example hostaddr=127.0.0.1 port={tls_server.port} "
        f"dbname=tunefleet user=tunefleet sslmode=verify-full sslrootcert={tls_server.ca} "
        f"passfile={tls_server.pgpass}"
    )
    with pytest.raises(DatabaseUnavailable, match="does not match host name"):
        connect(dsn)


def test_sslmode_require_against_a_server_without_ssl_fails_clearly(tls_server):
    with psycopg.connect(tls_server.server.admin_url(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET ssl = off")
        conn.execute("SELECT pg_reload_conf()")
    try:
        url = tls_server.url(sslmode="require", passfile=str(tls_server.pgpass))
        with pytest.raises(DatabaseUnavailable, match="server does not support SSL") as info:
            connect(url)
        assert "\n" not in str(info.value)
        # ... and without sslmode the same DSN falls back to plain TCP, proving the server is up.
        assert not ssl_in_use(tls_server.url(passfile=str(tls_server.pgpass)))
    finally:
        with psycopg.connect(tls_server.server.admin_url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET ssl")
            conn.execute("SELECT pg_reload_conf()")


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunefleet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_upgrade_honours_sslmode_and_reports_a_bad_ca_in_one_line(tls_server, cli_env):
    env = dict(cli_env, PGPASSFILE=str(tls_server.pgpass))
    good = _cli(
        [
            "db",
            "upgrade",
            "--db",
            tls_server.url(sslmode="verify-full", sslrootcert=str(tls_server.ca)),
        ],
        env,
    )
    assert good.returncode == 0, good.stderr
    assert "database at revision" in good.stdout
    bad = _cli(
        [
            "db",
            "upgrade",
            "--db",
            tls_server.url(sslmode="verify-full", sslrootcert=str(tls_server.wrong_ca)),
        ],
        env,
    )
    assert bad.returncode == 1
    assert bad.stderr.startswith("tunefleet: error: cannot connect")
    assert "certificate verify failed" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


# --- passwords: environment and generated pgpass files ------------------------------------


@pytest.fixture
def remote_roles(tls_server: TlsServer, tmp_path: Path) -> Iterator[RolesSettings]:
    settings = RolesSettings(
        prefix=f"tfr{os.getpid()}_",
        pgpass=tmp_path / "roles.pgpass",
        passwords={"coordinator": "coordinator-secret"},
    )
    setup_roles(tls_server.admin_url, settings)
    try:
        yield settings
    finally:
        with psycopg.connect(tls_server.admin_url, autocommit=True) as conn:
            for name in ROLE_NAMES:
                q.drop_owned_and_role(conn, settings.role(name), reassign_to="postgres")


def test_worker_logs_in_over_tls_with_the_generated_pgpass(tls_server, remote_roles):
    worker = remote_roles.role("worker")
    url = tls_server.url(
        worker,
        sslmode="verify-full",
        sslrootcert=str(tls_server.ca),
        passfile=str(remote_roles.pgpass),
    )
    with connect(url) as conn:
        row = conn.execute(
            "SELECT current_user AS me, (SELECT ssl FROM pg_stat_ssl"
            " WHERE pid = pg_backend_pid()) AS ssl, current_setting('statement_timeout') AS st"
        ).fetchone()
    assert row == {"me": worker, "ssl": True, "st": "30s"}


def test_password_from_the_environment_works_and_a_wrong_one_is_refused(
    tls_server, remote_roles, tmp_path
):
    coordinator = remote_roles.role("coordinator")
    assert coordinator not in remote_roles.pgpass.read_text()  # never written to disk
    good = tmp_path / "good.pgpass"
    good.write_text(f"*:*:tunefleet:{coordinator}:coordinator-secret\n")
    good.chmod(0o600)
    with connect(tls_server.url(coordinator, sslmode="require", passfile=str(good))) as conn:
        assert conn.execute("SELECT current_user AS me").fetchone()["me"] == coordinator
    bad = tmp_path / "bad.pgpass"
    bad.write_text(f"*:*:tunefleet:{coordinator}:not-the-password\n")
    bad.chmod(0o600)
    with pytest.raises(DatabaseUnavailable, match="password authentication failed"):
        connect(tls_server.url(coordinator, sslmode="require", passfile=str(bad)))
