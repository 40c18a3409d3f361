"""Worker settings: flag, then TUNEFLEET_* variable, then default; bad values named."""

from __future__ import annotations

import pytest

from tunefleet.db.engine import dead_link_options
from tunefleet.errors import UsageError
from tunefleet.settings import WORKER_ALIVE_S
from tunefleet.worker.settings import (
    DEFAULT_LEASE_S,
    DEFAULT_TIMEOUT_S,
    Cadence,
    WorkerSettings,
    cadence,
)


def test_defaults(monkeypatch):
    names = ("LEASE", "TIMEOUT", "DRAIN", "DEVICE", "MAX_TRIALS", "PREFETCH", "PREBUILD")
    for name in (*names, "PREPARE_WORKERS", "CORES", "PEERS", "LISTEN", "POLL"):
        monkeypatch.delenv(f"TUNEFLEET_WORKER_{name}", raising=False)
    s = WorkerSettings.build(db="postgresql://u@h/db")
    assert s.lease_s == DEFAULT_LEASE_S == 30 and s.timeout_s == DEFAULT_TIMEOUT_S
    assert s.heartbeat_s == pytest.approx(10) and not s.drain and s.device is None
    assert s.db.url == "postgresql://u@h/db"
    # No sizing given: the worker sizes its pool and prefetch itself (worker.sizing).
    assert (s.prepare_workers, s.prefetch, s.cores, s.peers) == (None, None, None, 1)
    assert s.prebuild is True
    # Polls, never LISTENs (worker.wake); works behind any pooler.
    assert s.poll_s == 5.0 and s.listen is False and s.db.behind_pooler is True


def test_a_dead_link_is_given_up_after_one_lease(monkeypatch):
    """The worker's connections give up a peer that acknowledges nothing for a lease (its
    claims are gone by then anyway), through libpq's TCP settings; a URL's own win."""
    monkeypatch.delenv("TUNEFLEET_WORKER_LEASE", raising=False)
    s = WorkerSettings.build(db="postgresql://u@h/db", lease_s=30)
    assert s.db.dead_link_s == 30
    assert dead_link_options("postgresql://u@h/db", s.db.dead_link_s) == {
        "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 10,
        "keepalives_count": 3, "tcp_user_timeout": 30_000,
    }  # fmt: skip
    chosen = dead_link_options("postgresql://u@h/db?tcp_user_timeout=5000&keepalives=0", 3.0)
    assert chosen == {"keepalives_idle": 1, "keepalives_interval": 1, "keepalives_count": 3}
    # Every other process keeps the system's TCP behaviour.
    assert dead_link_options("postgresql://u@h/db", None) == {}


@pytest.mark.parametrize(
    ("lease_s", "expected"),
    [
        # The default lease: a beat every 10 s, a reaper turn every 15 s, a report every 10 s.
        (30.0, Cadence(heartbeat_s=10.0, reap_s=15.0, report_s=10.0)),
        # Short leases (the tests'): beats and reaper turns follow, reports stay at 10 s.
        (3.0, Cadence(heartbeat_s=1.0, reap_s=1.5, report_s=10.0)),
        (0.45, Cadence(heartbeat_s=0.15, reap_s=0.25, report_s=10.0)),
        # A large fleet's lease: every background statement a third as often or less.
        (90.0, Cadence(heartbeat_s=20.0, reap_s=45.0, report_s=30.0)),
        # A very long lease still beats often enough to stay counted alive.
        (300.0, Cadence(heartbeat_s=20.0, reap_s=150.0, report_s=100.0)),
    ],
)
def test_background_cadence_follows_the_lease(lease_s, expected):
    got = cadence(lease_s)
    assert got == expected
    s = WorkerSettings.build(db="postgresql://u@h/db", lease_s=lease_s)
    assert (s.heartbeat_s, s.reap_s, s.report_s) == (got.heartbeat_s, got.reap_s, got.report_s)
    # Two beats may be lost before a claim's lease expires, and a live worker's row is never
    # older than the window in which coordinators and the dashboard count it alive.
    assert 3 * got.heartbeat_s <= lease_s
    assert 3 * got.heartbeat_s <= WORKER_ALIVE_S


def test_flag_beats_environment_beats_default(monkeypatch):
    monkeypatch.setenv("TUNEFLEET_WORKER_LEASE", "6")
    monkeypatch.setenv("TUNEFLEET_WORKER_DRAIN", "yes")
    monkeypatch.setenv("TUNEFLEET_WORKER_DEVICE", "pocl")
    s = WorkerSettings.build(db="postgresql://u@h/db", lease_s=3.0)
    assert s.lease_s == 3.0 and s.heartbeat_s == pytest.approx(1.0)
    assert s.drain is True and s.device == "pocl"
    assert WorkerSettings.build(db="postgresql://u@h/db").lease_s == 6.0
    monkeypatch.setenv("TUNEFLEET_WORKER_PREBUILD", "no")
    assert WorkerSettings.build(db="postgresql://u@h/db").prebuild is False
    assert WorkerSettings.build(db="postgresql://u@h/db", prebuild=True).prebuild is True
    monkeypatch.setenv("TUNEFLEET_WORKER_LISTEN", "on")
    assert WorkerSettings.build(db="postgresql://u@h/db").listen is True
    assert WorkerSettings.build(db="postgresql://u@h/db", listen=False).listen is False


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("WORKER_LEASE", "-1"),
        ("WORKER_MAX_TRIALS", "0"),
        ("WORKER_DRAIN", "maybe"),
        ("WORKER_PREFETCH", "1001"),
        ("WORKER_PREPARE_WORKERS", "-1"),
        ("WORKER_CORES", "inf"),
        ("WORKER_PEERS", "0"),
        ("WORKER_LISTEN", "sometimes"),
    ],
)
def test_bad_environment_value_names_the_variable(monkeypatch, env, value):
    monkeypatch.setenv(f"TUNEFLEET_{env}", value)
    with pytest.raises(UsageError, match=f"TUNEFLEET_{env}"):
        WorkerSettings.build(db="postgresql://u@h/db")


def test_too_short_lease_is_refused():
    with pytest.raises(UsageError, match="too short"):
        WorkerSettings.build(db="postgresql://u@h/db", lease_s=0.01)


def test_explicit_sizing_from_flags_or_environment(monkeypatch):
    monkeypatch.setenv("TUNEFLEET_WORKER_PREPARE_WORKERS", "12")
    monkeypatch.setenv("TUNEFLEET_WORKER_CORES", "6")
    monkeypatch.setenv("TUNEFLEET_WORKER_PEERS", "4")
    s = WorkerSettings.build(db="postgresql://u@h/db", prefetch=8)
    assert (s.prepare_workers, s.prefetch, s.cores, s.peers) == (12, 8, 6.0, 4)
    assert WorkerSettings.build(db="postgresql://u@h/db", prepare_workers=0).prepare_workers == 0
