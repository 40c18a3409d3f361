"""What a site's compute node meets at the door: the database host takes TCP with TLS only,
and a node that comes without it is told how to fix its URL, in one line, at once."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.acceptance, pytest.mark.cluster]


def test_a_node_without_tls_is_refused_in_one_line_naming_sslmode(site, site_db):
    # (Without any sslmode libpq prefers TLS and gets it here, unverified: hence verify-full
    # in every URL a node is given.)
    plain = site_db.url("worker").split("?", 1)[0] + "?sslmode=disable"
    argv = [sys.executable, "-m", "tunefleet", "worker", "--device", "host", "--db", plain]
    proc = subprocess.run(
        site.node("node3").argv(argv),
        env=site_db.env("worker"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tunefleet: error: cannot connect"), lines[0]
    assert "no encryption" in lines[0] and "sslmode=verify-full" in lines[0], lines[0]
