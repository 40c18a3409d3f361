"""The queue's statements that wait on trial rows take them in one order (trial id), whatever
plan PostgreSQL picks, so two of them never deadlock.

The conflict a simulated fleet hit at release: one worker's heartbeat (its own session) and
its release at shutdown (the main session) both lock the worker's held trial rows. The arrays
they pass are sorted by trial id, but the rows were locked in the order the plan produced
them: a plan cached after a few heartbeats (generic) hashed the rows and joined them in
array order, a fresh plan walked an index of running trials (by lease expiry, or by run) and
joined each row with the arrays. A worker whose lower trial id expires later (claimed
later: its prefetched trial) then had the heartbeat take trial 1 and wait for trial 2 while
the release held trial 2 and waited for trial 1.

Each case here holds the first row with a third session, lets the heartbeat and then the
release queue up behind it (states read from ``pg_stat_activity``), lets go, and requires
both statements to finish without ``DeadlockDetected``, under every combination of custom and
generic plans for the two sessions.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest

from tests.helpers.queue_data import (
    attempts_of,
    insert_run,
    insert_trials,
    synthetic_configs,
    trial_states,
    wait_until,
    waiting_on_a_lock,
)
from tests.integration.test_queue import SECRETS, claim, make_worker
from tunefleet.db.engine import connect
from tunefleet.queries import queue

DEADLINE_S = 60.0


class Statement(threading.Thread):
    """One queue statement on its own session, run once ``go`` is set."""

    def __init__(self, conn: psycopg.Connection[Any], fn: Any, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.conn, self.fn, self.kwargs = conn, fn, kwargs
        self.pid = int(conn.info.backend_pid)
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn(self.conn, **self.kwargs)
        except BaseException as exc:
            self.error = exc


def _whole_beat(conn: psycopg.Connection[Any], **kwargs: Any) -> set[int]:
    """The worker's beat since 0011_fleet_shape (leases, worker row, device lease)."""
    worker = kwargs["worker_id"]
    return set(queue.heartbeat(conn, secret=SECRETS[worker], **kwargs).kept)


@pytest.mark.parametrize("beat_fn", [queue.heartbeat_trials, _whole_beat], ids=["trials", "whole"])
@pytest.mark.parametrize("heartbeat_plan", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("release_plan", ["force_custom_plan", "force_generic_plan"])
def test_heartbeat_and_release_of_one_worker_never_deadlock(
    db_url, db, heartbeat_plan, release_plan, beat_fn
):
    # The higher id was claimed first, with the shorter lease: the index on running leases
    # (lease_expires_at) lists it first, the sorted arrays list it last.
    run = insert_run(db)
    (low,) = insert_trials(db, run, synthetic_configs(1), priority=1)
    (high,) = insert_trials(db, run, synthetic_configs(1, start=1), priority=0)
    worker = make_worker(db)
    held = [c.key for c in claim(db, worker, limit=1, lease_s=10.0)]
    held += [c.key for c in claim(db, worker, limit=1, lease_s=30.0)]
    assert [h.trial_id for h in held] == [high, low]

    blocker = psycopg.connect(db_url)  # a transaction holding the lowest row
    beat_conn, release_conn = connect(db_url), connect(db_url)
    try:
        for conn, mode in ((beat_conn, heartbeat_plan), (release_conn, release_plan)):
            conn.execute("SELECT set_config('plan_cache_mode', %s, false)", (mode,))
        blocker.execute("SELECT 1 FROM tunefleet.trial WHERE id = %s FOR NO KEY UPDATE", (low,))

        beat = Statement(beat_conn, beat_fn, worker_id=worker, held=held, lease_s=30.0)
        release = Statement(release_conn, queue.release_trials, worker_id=worker, held=held)
        beat.start()
        wait_until(
            lambda: waiting_on_a_lock(db, beat.pid), DEADLINE_S, what="the heartbeat to wait"
        )
        release.start()
        wait_until(
            lambda: waiting_on_a_lock(db, release.pid), DEADLINE_S, what="the release to wait"
        )
        blocker.rollback()
        for statement in (beat, release):
            statement.join(DEADLINE_S)
            assert not statement.is_alive(), f"{statement.fn.__name__} still running"
    finally:
        blocker.close()
        beat_conn.close()
        release_conn.close()

    assert beat.error is None, f"heartbeat: {beat.error!r}"
    assert release.error is None, f"release: {release.error!r}"
    # The heartbeat queued first, so it extended both leases; the release then gave both back.
    assert beat.result == {low, high}
    assert release.result == {low, high}
    assert trial_states(db, [low, high]) == {low: "pending", high: "pending"}
    for trial in (low, high):
        assert [a["outcome"] for a in attempts_of(db, trial)] == ["released"]


def test_unused_worker_id_keeps_the_statements_harmless(db):
    """The fence still holds with the locking step in front: a worker id that holds nothing
    extends and releases nothing."""
    run = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(2))
    worker = make_worker(db)
    held = [c.key for c in claim(db, worker, limit=2)]
    stranger = uuid.uuid4()
    assert queue.heartbeat_trials(db, worker_id=stranger, held=held, lease_s=30.0) == set()
    beat = queue.heartbeat(db, worker_id=stranger, secret="x", held=held, lease_s=30.0)
    assert beat == queue.Beat(alive=False, devices=0, kept=frozenset())
    assert queue.release_trials(db, worker_id=stranger, held=held) == set()
    assert trial_states(db, ids) == {i: "running" for i in ids}
