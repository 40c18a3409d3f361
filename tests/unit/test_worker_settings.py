"""Worker settings: flag, then TUNEFLEET_* variable, then default; bad values named."""

from __future__ import annotations

import pytest

from tunefleet.errors import UsageError
from tunefleet.worker.settings import DEFAULT_LEASE_S, DEFAULT_TIMEOUT_S, WorkerSettings


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
