"""The queue statements against a real PostgreSQL: claim, lease, fencing, reaper, release,
device lease, registration and wake-ups."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from tests.helpers.queue_data import (
    attempts_of,
    insert_run,
    insert_trials,
    synthetic_configs,
    trial_states,
)
from tunefleet.db.engine import connect
from tunefleet.devices import HOST_DEVICE, DeviceInfo
from tunefleet.queries import queue
from tunefleet.queries.queue import MeasurementRow

ANY = ["any"]
#: The secret each test worker got back from registration, by worker id.
SECRETS: dict[uuid.UUID, str] = {}


def make_worker(db: Any, device_class: str = "host-cpu") -> uuid.UUID:
    worker_id = uuid.uuid4()
    device_id = queue.register_device(db, HOST_DEVICE)
    SECRETS[worker_id] = queue.register_worker(
        db,
        worker_id=worker_id,
        host="testhost",
        pid=1,
        device_id=device_id,
        device_class=device_class,
        version="test",
    )
    return worker_id


def row(median: float = 0.002) -> MeasurementRow:
    return MeasurementRow(
        median_s=median,
        min_s=median / 2,
        samples_s=[median / 2, median, median * 2],
        protocol={"warmup": 0},
        gflops=1.0,
        validation={"passed": True},
        versions={"x": 1},
    )


def claim(db: Any, worker: uuid.UUID, limit: int = 1, lease_s: float = 30.0, classes=ANY):
    return queue.claim_trials(
        db,
        worker_id=worker,
        secret=SECRETS[worker],
        device_classes=classes,
        limit=limit,
        lease_s=lease_s,
    )


def test_claim_marks_running_with_lease_attempt_row_and_run_fields(db):
    run = insert_run(db, problem_args={"duration": 0.0})
    [tid] = insert_trials(db, run, synthetic_configs(1), timeout_s=7.5)
    w = make_worker(db)
    [c] = claim(db, w, lease_s=10)
    assert (c.trial_id, c.run_id, c.attempt, c.timeout_s) == (tid, run, 1, 7.5)
    assert c.problem == "synthetic" and c.problem_args["duration"] == 0.0
    assert c.config == synthetic_configs(1)[0] and c.protocol["min_launches"] == 3
    t = db.execute(
        "SELECT state, attempt, lease_owner, lease_expires_at - started_at AS left, started_at "
        "FROM tunefleet.trial WHERE id = %s",
        (tid,),
    ).fetchone()
    assert t["state"] == "running" and t["attempt"] == 1 and t["lease_owner"] == w
    # The lease runs lease_s from the claim (both stamped by the claim's one now()).
    assert t["left"].total_seconds() == 10 and t["started_at"] is not None
    [a] = attempts_of(db, tid)
    assert (a["attempt"], a["worker_id"], a["outcome"]) == (1, w, None)
    assert claim(db, w) == []  # nothing else pending


def test_claim_follows_priority_then_id_and_skips_non_pending(db):
    run = insert_run(db)
    low = insert_trials(db, run, synthetic_configs(2), priority=5)
    high = insert_trials(db, run, synthetic_configs(2, start=2), priority=-1)
    done = insert_trials(db, run, synthetic_configs(1, start=4))
    db.execute("UPDATE tunefleet.trial SET state = 'done' WHERE id = %s", (done[0],))
    w = make_worker(db)
    got = [c.trial_id for c in claim(db, w, limit=10)]
    assert got == high + low


def test_worker_claims_only_its_classes_and_any(db):
    any_run = insert_run(db)
    gpu_run = insert_run(db, device_class="nvidia-h200")
    cpu_run = insert_run(db, device_class="pthread-intel-r-xeon-r-processor")
    any_ids = insert_trials(db, any_run, synthetic_configs(2))
    gpu_ids = insert_trials(db, gpu_run, synthetic_configs(2))
    cpu_ids = insert_trials(db, cpu_run, synthetic_configs(2))
    w = make_worker(db)
    got = claim(db, w, limit=10, classes=["host-cpu", "any"])
    assert sorted(c.trial_id for c in got) == any_ids
    got = claim(db, w, limit=10, classes=["pthread-intel-r-xeon-r-processor", "any"])
    assert sorted(c.trial_id for c in got) == cpu_ids
    assert set(trial_states(db, gpu_ids).values()) == {"pending"}


def test_concurrent_claimers_never_claim_a_row_twice(db_url, db):
    """Exactly-once ledger: 8 sessions claim 1-3 rows at a time until the queue is empty."""
    run = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(240))
    ledger: list[tuple[uuid.UUID, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    workers = [make_worker(db) for _ in range(8)]
    start = threading.Barrier(len(workers))

    def claimer(w: uuid.UUID, limit: int) -> None:
        try:
            conn = connect(db_url)
            start.wait()
            while True:
                got = claim(conn, w, limit=limit)
                if not got:
                    break
                with lock:
                    ledger.extend((w, c.trial_id) for c in got)
            conn.close()
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(w, 1 + i % 3)) for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    counts = Counter(tid for _, tid in ledger)
    assert sorted(counts) == ids and set(counts.values()) == {1}
    assert len({w for w, _ in ledger}) > 1  # they really competed
    per_trial = db.execute(
        "SELECT trial_id, count(*) AS n, min(worker_id::text) AS w FROM tunefleet.attempt "
        "GROUP BY trial_id"
    ).fetchall()
    assert len(per_trial) == len(ids) and {r["n"] for r in per_trial} == {1}
    owners = {tid: w for w, tid in ledger}
    assert all(uuid.UUID(r["w"]) == owners[r["trial_id"]] for r in per_trial)


def test_heartbeat_extends_only_our_running_claim(db):
    run = insert_run(db)
    [tid] = insert_trials(db, run, synthetic_configs(1))
    me, other = make_worker(db), make_worker(db)
    [c] = claim(db, me, lease_s=1)
    kept = queue.heartbeat_trials(db, worker_id=me, held=[c.key], lease_s=60)
    assert kept == {tid}
    left = db.execute(
        "SELECT lease_expires_at - now() AS left FROM tunefleet.trial WHERE id = %s", (tid,)
    ).fetchone()["left"]
    assert left.total_seconds() > 50
    assert queue.heartbeat_trials(db, worker_id=other, held=[c.key], lease_s=60) == set()
    assert (
        queue.heartbeat_trials(db, worker_id=me, held=[replace(c.key, attempt=2)], lease_s=60)
        == set()
    )
    # Knowing the trial id and attempt is not enough: the lease token must match.
    assert (
        queue.heartbeat_trials(db, worker_id=me, held=[replace(c.key, token="guess")], lease_s=60)
        == set()
    )
    assert queue.heartbeat_worker(db, me, SECRETS[me])
    assert not queue.heartbeat_worker(db, me, SECRETS[other])


def test_fenced_completion_writes_state_attempt_and_measurement_once(db):
    run = insert_run(db)
    [tid] = insert_trials(db, run, synthetic_configs(1))
    w = make_worker(db)
    [c] = claim(db, w)
    state = queue.complete_trial(
        db,
        trial_id=tid,
        attempt=1,
        token=c.lease_token,
        worker_id=w,
        state="done",
        measurement=row(),
    )
    assert state == "done"
    m = db.execute("SELECT * FROM tunefleet.measurement WHERE trial_id = %s", (tid,)).fetchall()
    assert len(m) == 1
    run_row = db.execute("SELECT cache_key FROM tunefleet.run WHERE id = %s", (run,)).fetchone()
    assert m[0]["cache_key"] == run_row["cache_key"] and m[0]["config_hash"] == c.config_hash
    assert m[0]["worker_id"] == w and m[0]["samples_s"] == [0.001, 0.002, 0.004]
    assert m[0]["problem"] == "synthetic" and m[0]["config"] == c.config
    [a] = attempts_of(db, tid)
    assert a["outcome"] == "done" and a["ended_at"] is not None
    # The same completion again (a retry after an unacknowledged commit) changes nothing.
    again = queue.complete_trial(
        db,
        trial_id=tid,
        attempt=1,
        token=c.lease_token,
        worker_id=w,
        state="done",
        measurement=row(),
    )
    assert again is None
    assert queue.attempt_outcome(db, trial_id=tid, attempt=1, worker_id=w) == "done"
    count = db.execute("SELECT count(*) AS n FROM tunefleet.measurement").fetchone()["n"]
    assert count == 1


def test_zombie_heartbeat_and_completion_are_rejected_after_reap_and_reclaim(db):
    run = insert_run(db)
    [tid] = insert_trials(db, run, synthetic_configs(1))
    zombie, rescuer = make_worker(db), make_worker(db)
    [cz] = claim(db, zombie, lease_s=0.3)
    time.sleep(0.4)
    reaped = queue.reap_expired_leases(db)
    assert reaped is not None and [(r.trial_id, r.state) for r in reaped] == [(tid, "pending")]
    [cr] = claim(db, rescuer)
    assert cr.attempt == 2
    assert queue.heartbeat_trials(db, worker_id=zombie, held=[cz.key], lease_s=30) == set()
    assert (
        queue.complete_trial(
            db,
            trial_id=tid,
            attempt=1,
            token=cz.lease_token,
            worker_id=zombie,
            state="done",
            measurement=row(9.0),
        )
        is None
    )
    assert (
        queue.complete_trial(
            db,
            trial_id=tid,
            attempt=2,
            token=cr.lease_token,
            worker_id=rescuer,
            state="done",
            measurement=row(),
        )
        == "done"
    )
    ms = db.execute("SELECT worker_id, median_s FROM tunefleet.measurement").fetchall()
    assert [(m["worker_id"], m["median_s"]) for m in ms] == [(rescuer, 0.002)]
    history = [(a["attempt"], a["worker_id"], a["outcome"]) for a in attempts_of(db, tid)]
    assert history == [(1, zombie, "lease_expired"), (2, rescuer, "done")]


def test_failed_attempt_requeues_until_max_attempts_then_quarantines(db):
    run = insert_run(db)
    [tid] = insert_trials(db, run, synthetic_configs(1), max_attempts=2)
    w = make_worker(db)
    [c1] = claim(db, w)
    s1 = queue.complete_trial(
        db,
        trial_id=tid,
        attempt=c1.attempt,
        token=c1.lease_token,
        worker_id=w,
        state="failed",
        error="died: SIGSEGV",
    )
    assert s1 == "pending"
    t = db.execute("SELECT * FROM tunefleet.trial WHERE id = %s", (tid,)).fetchone()
    assert t["lease_owner"] is None and t["lease_expires_at"] is None and t["attempt"] == 1
    [c2] = claim(db, w)
    s2 = queue.complete_trial(
        db,
        trial_id=tid,
        attempt=c2.attempt,
        token=c2.lease_token,
        worker_id=w,
        state="failed",
        error="died again",
    )
    assert s2 == "failed"
    t = db.execute("SELECT state, error, finished_at FROM tunefleet.trial WHERE id = %s", (tid,))
    t = t.fetchone()
    assert t["state"] == "failed" and t["error"] == "died again" and t["finished_at"]
    assert [(a["attempt"], a["outcome"]) for a in attempts_of(db, tid)] == [
        (1, "failed"),
        (2, "failed"),
    ]
    assert claim(db, w) == []


@pytest.mark.parametrize("state", ["invalid", "timed_out"])
def test_invalid_and_timed_out_are_terminal_at_once(db, state):
    run = insert_run(db)
    [tid] = insert_trials(db, run, synthetic_configs(1), max_attempts=3)
    w = make_worker(db)
    [c] = claim(db, w)
    assert (
        queue.complete_trial(
            db, trial_id=tid, attempt=1, token=c.lease_token, worker_id=w, state=state, error="why"
        )
        == state
    )
    assert trial_states(db, [tid]) == {tid: state}
    assert db.execute("SELECT count(*) AS n FROM tunefleet.measurement").fetchone()["n"] == 0


def test_completion_rejects_inconsistent_arguments(db):
    w = uuid.uuid4()
    with pytest.raises(ValueError, match="measurement"):
        queue.complete_trial(db, trial_id=1, attempt=1, token="t", worker_id=w, state="done")
    with pytest.raises(ValueError, match="state"):
        queue.complete_trial(db, trial_id=1, attempt=1, token="t", worker_id=w, state="pending")
    assert row(float("nan")).problems() and not row().problems()


def test_reaper_fails_trial_after_max_attempts_with_count(db):
    run = insert_run(db)
    [tid] = insert_trials(db, run, synthetic_configs(1), max_attempts=2)
    w = make_worker(db)
    for expected in ("pending", "failed"):
        claim(db, w, lease_s=0.2)
        time.sleep(0.3)
        reaped = queue.reap_expired_leases(db)
        assert reaped is not None and [r.state for r in reaped] == [expected]
    t = db.execute("SELECT state, error FROM tunefleet.trial WHERE id = %s", (tid,)).fetchone()
    assert t["state"] == "failed" and t["error"] == "lease expired 2 times"
    assert [a["outcome"] for a in attempts_of(db, tid)] == ["lease_expired", "lease_expired"]


def test_reaper_leaves_live_leases_alone_and_is_serialised(db_url, db):
    run = insert_run(db)
    [live, dead] = insert_trials(db, run, synthetic_configs(2))
    w = make_worker(db)
    claim(db, w, lease_s=30)
    claim(db, w, lease_s=0.2)
    time.sleep(0.3)
    other = connect(db_url)
    try:
        with other.transaction():  # another session is reaping right now
            other.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (queue.REAPER_LOCK_NAME,),
            )
            assert queue.reap_expired_leases(db) is None
            assert trial_states(db, [dead]) == {dead: "running"}
    finally:
        other.close()
    reaped = queue.reap_expired_leases(db)
    assert reaped is not None and [r.trial_id for r in reaped] == [dead]
    assert trial_states(db, [live, dead]) == {live: "running", dead: "pending"}


def test_release_returns_trials_without_counting_an_attempt(db):
    run = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(3))
    me, other = make_worker(db), make_worker(db)
    mine = claim(db, me, limit=2)
    theirs = claim(db, other, limit=1)
    released = queue.release_trials(db, worker_id=me, held=[c.key for c in mine] + [theirs[0].key])
    assert released == {c.trial_id for c in mine}
    rows = db.execute(
        "SELECT id, state, attempt, lease_owner FROM tunefleet.trial ORDER BY id"
    ).fetchall()
    assert [(r["state"], r["attempt"]) for r in rows] == [
        ("pending", 0),
        ("pending", 0),
        ("running", 1),
    ]
    assert [a["outcome"] for a in attempts_of(db, ids[0])] == ["released"]
    # The next claim reuses attempt number 1; the released row stays in the history.
    again = claim(db, other, limit=1)
    assert again[0].trial_id == ids[0] and again[0].attempt == 1
    assert [(a["attempt"], a["outcome"]) for a in attempts_of(db, ids[0])] == [
        (1, "released"),
        (1, None),
    ]


@pytest.mark.parametrize("run_state", ["stopped", "finished"])
def test_trials_of_a_run_no_longer_running_are_cancelled_not_requeued(db, run_state):
    """A run stopped or finished while its trials were held: releasing or reaping them must not
    put them back in the queue for someone to measure for nothing. They end ``cancelled`` (which
    a resumed run enqueues again); a trial out of attempts still fails."""
    run = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(4))
    released_id, reaped_id, spent_id, crashed_id = ids
    db.execute("UPDATE tunefleet.trial SET max_attempts = 1 WHERE id = %s", (spent_id,))
    w = make_worker(db)
    [released] = claim(db, w, limit=1, lease_s=30)
    claim(db, w, limit=2, lease_s=0.2)
    [crashed] = claim(db, w, limit=1, lease_s=30)
    db.execute("UPDATE tunefleet.run SET state = %s WHERE id = %s", (run_state, run))
    time.sleep(0.3)
    assert queue.release_trials(db, worker_id=w, held=[released.key]) == {released_id}
    ended = queue.complete_trial(
        db,
        trial_id=crashed_id,
        attempt=1,
        token=crashed.lease_token,
        worker_id=w,
        state="failed",
        error="segfault",
    )
    assert ended == "cancelled"
    reaped = queue.reap_expired_leases(db)
    assert reaped is not None
    assert {r.trial_id: r.state for r in reaped} == {reaped_id: "cancelled", spent_id: "failed"}
    rows = db.execute(
        "SELECT id, state, lease_owner, lease_expires_at, finished_at FROM tunefleet.trial"
        " ORDER BY id"
    ).fetchall()
    assert [r["state"] for r in rows] == ["cancelled", "cancelled", "failed", "cancelled"]
    assert all(r["finished_at"] is not None and r["lease_expires_at"] is None for r in rows)
    assert [r["lease_owner"] is None for r in rows] == [True, True, False, True]
    assert [a["outcome"] for a in attempts_of(db, released_id)] == ["released"]
    assert [a["outcome"] for a in attempts_of(db, reaped_id)] == ["lease_expired"]
    assert [a["outcome"] for a in attempts_of(db, crashed_id)] == ["failed"]
    assert claim(db, make_worker(db), limit=4) == []


GPU = DeviceInfo(platform="P", vendor="V", name="GPU", driver_version="1")


def gpu_worker(db: Any, host: str = "node1", device: DeviceInfo = GPU) -> uuid.UUID:
    """A registered worker of ``host`` serving ``device`` (its secret in SECRETS)."""
    worker_id = uuid.uuid4()
    SECRETS[worker_id] = queue.register_worker(
        db,
        worker_id=worker_id,
        host=host,
        pid=4242,
        device_id=queue.register_device(db, device),
        device_class=device.device_class,
        version="test",
    )
    return worker_id


def take(db: Any, worker: uuid.UUID, index: int = 0, lease_s: float = 30.0) -> queue.DeviceTaken:
    return queue.take_device(
        db, worker_id=worker, secret=SECRETS[worker], index=index, lease_s=lease_s
    )


def lease_rows(db: Any) -> list[dict[str, Any]]:
    return db.execute(
        "SELECT host, fingerprint, device_index, worker_id FROM tunefleet.device_lease"
        " ORDER BY host, device_index"
    ).fetchall()


def test_device_lease_is_exclusive_per_host_fingerprint_and_index(db):
    first, second = gpu_worker(db), gpu_worker(db)
    assert take(db, first).taken
    assert take(db, first).taken  # already its own: taken again (a restart of the call)
    refused = take(db, second)
    assert not refused.taken and refused.holder == first and refused.holder_pid == 4242
    assert refused.holder_expires_in_s is not None and 25 < refused.holder_expires_in_s <= 30
    assert take(db, second, index=1).taken  # the identical second GPU of the node
    elsewhere = gpu_worker(db, host="node2")
    assert take(db, elsewhere).taken  # the same model on another node
    # Host and fingerprint come from the worker's own rows, not from the caller.
    rows = [
        (r["host"], r["fingerprint"], r["device_index"], r["worker_id"]) for r in lease_rows(db)
    ]
    assert rows == [
        ("node1", GPU.fingerprint, 0, first),
        ("node1", GPU.fingerprint, 1, second),
        ("node2", GPU.fingerprint, 0, elsewhere),
    ]  # fmt: skip
    # A stopped worker gives its device back at once.
    assert queue.stop_worker(db, first, SECRETS[first])
    assert [r["worker_id"] for r in lease_rows(db)] == [second, elsewhere]
    third = gpu_worker(db)
    assert take(db, third).taken
    # A worker that stopped heartbeating for a whole lease loses it to the next taker.
    db.execute(
        "UPDATE tunefleet.device_lease SET expires_at = now() - interval '1 second'"
        " WHERE worker_id = %s",
        (third,),
    )
    fourth = gpu_worker(db)
    assert take(db, fourth).taken
    assert next(r["worker_id"] for r in lease_rows(db) if r["device_index"] == 0) == fourth


def test_device_lease_needs_the_secret_an_active_worker_and_a_device(db):
    import psycopg

    worker = gpu_worker(db)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        queue.take_device(db, worker_id=worker, secret="wrong", index=0, lease_s=30)
    deviceless = uuid.uuid4()
    SECRETS[deviceless] = queue.register_worker(
        db, worker_id=deviceless, host="node1", pid=1, device_id=None, device_class="x",
        version="t",
    )  # fmt: skip
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="registered no device"):
        take(db, deviceless)
    assert queue.stop_worker(db, worker, SECRETS[worker])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="is stopped"):
        take(db, worker)
    assert lease_rows(db) == []


def test_heartbeat_extends_leases_worker_row_and_device_lease_in_one_statement(db):
    run = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(2))
    worker = gpu_worker(db)
    assert take(db, worker, lease_s=5.0).taken
    held = [c.key for c in claim(db, worker, limit=2, lease_s=5.0)]
    db.execute("UPDATE tunefleet.worker SET heartbeat_at = now() - interval '1 hour'")
    beat = queue.heartbeat(db, worker_id=worker, secret=SECRETS[worker], held=held, lease_s=60)
    assert beat == queue.Beat(alive=True, devices=1, kept=frozenset(ids))
    row = db.execute(
        "SELECT (SELECT min(lease_expires_at) FROM tunefleet.trial) - now() AS trials,"
        " (SELECT expires_at FROM tunefleet.device_lease) - now() AS device,"
        " now() - (SELECT heartbeat_at FROM tunefleet.worker) AS worker"
    ).fetchone()
    assert row["trials"].total_seconds() > 55 and row["device"].total_seconds() > 55
    assert row["worker"].total_seconds() < 5
    # A wrong secret keeps the worker row and device alone; the tokens still fence the trials.
    beat = queue.heartbeat(db, worker_id=worker, secret="wrong", held=held, lease_s=60)
    assert beat == queue.Beat(alive=False, devices=0, kept=frozenset(ids))
    # The device taken over (after the lease ran out): the next beat says so.
    db.execute("UPDATE tunefleet.device_lease SET expires_at = now() - interval '1 second'")
    other = gpu_worker(db)
    assert take(db, other).taken
    beat = queue.heartbeat(db, worker_id=worker, secret=SECRETS[worker], held=held[:1], lease_s=60)
    assert beat == queue.Beat(alive=True, devices=0, kept=frozenset(ids[:1]))
    # No device, nothing held: a host worker's beat is its worker row alone.
    host = make_worker(db)
    beat = queue.heartbeat(db, worker_id=host, secret=SECRETS[host], held=[], lease_s=60)
    assert beat == queue.Beat(alive=True, devices=0, kept=frozenset())


def test_listen_first_claims_after_the_listen_committed(db_url, db):
    """LISTEN goes first in its own transaction: the claim sees every batch committed
    before it, and a batch committed after it is notified."""
    run = insert_run(db)
    worker = make_worker(db)
    conn = connect(db_url)
    try:
        got = queue.claim_trials(
            conn, worker_id=worker, secret=SECRETS[worker], device_classes=ANY, limit=2,
            lease_s=30, listen_first=True,
        )  # fmt: skip
        assert got == []
        listening = conn.execute("SELECT pg_listening_channels() AS c").fetchall()
        assert [r["c"] for r in listening] == ["tunefleet_trials"]
        insert_trials(db, run, synthetic_configs(1))
        queue.notify_new_trials(db, "any")
        assert [n.payload for n in conn.notifies(timeout=30, stop_after=1)] == ["any"]
        queue.unlisten(conn)
        assert conn.execute("SELECT pg_listening_channels() AS c").fetchall() == []
    finally:
        conn.close()


def test_register_device_keeps_known_details_and_worker_lifecycle(db):
    dev = DeviceInfo(platform="P", vendor="V", name="GPU X", driver_version="1", index=3)
    first = queue.register_device(db, dev)
    assert queue.register_device(db, dev) == first
    assert queue.register_device(db, DeviceInfo("P", "V", "GPU X", "2")) != first
    w = uuid.uuid4()
    secret = queue.register_worker(
        db, worker_id=w, host="h", pid=42, device_id=first, device_class="gpu-x", version="t"
    )
    assert len(secret) >= 32
    stored = db.execute("SELECT secret_hash FROM tunefleet.worker WHERE id = %s", (w,))
    assert secret.encode() not in bytes(stored.fetchone()["secret_hash"])  # only a hash
    assert queue.heartbeat_worker(db, w, secret)
    assert not queue.stop_worker(db, w, "not-the-secret")
    assert queue.stop_worker(db, w, secret)
    r = db.execute("SELECT state, stopped_at FROM tunefleet.worker WHERE id = %s", (w,))
    r = r.fetchone()
    assert r["state"] == "stopped" and r["stopped_at"] is not None
    assert not queue.heartbeat_worker(db, w, secret)


def test_has_open_trials_counts_pending_and_running_only(db):
    run = insert_run(db)
    [tid] = insert_trials(db, run, synthetic_configs(1))
    w = make_worker(db)
    assert queue.has_open_trials(db, ANY)
    assert not queue.has_open_trials(db, ["nvidia-h200"])
    [c] = claim(db, w)
    assert queue.has_open_trials(db, ANY)
    queue.complete_trial(
        db, trial_id=tid, attempt=1, token=c.lease_token, worker_id=w, state="invalid", error="x"
    )
    assert not queue.has_open_trials(db, ANY)


def test_listen_receives_one_notify_per_batch(db_url, db):
    listener = connect(db_url)
    try:
        queue.listen(listener)
        queue.notify_new_trials(db, "any")
        got = [n.payload for n in listener.notifies(timeout=30.0, stop_after=1)]
        assert got == ["any"]
    finally:
        listener.close()


def test_claim_skips_the_runs_and_trials_a_worker_stands_aside_from(db):
    w = make_worker(db)
    aside = insert_run(db)
    aside_ids = insert_trials(db, aside, synthetic_configs(3))
    served = insert_run(db)
    served_ids = insert_trials(db, served, synthetic_configs(3))
    got = queue.claim_trials(
        db,
        worker_id=w,
        secret=SECRETS[w],
        device_classes=ANY,
        limit=5,
        lease_s=30,
        excluded_runs=[aside],
        skipped_trials=[served_ids[0]],
    )
    assert [c.trial_id for c in got] == served_ids[1:]
    assert set(trial_states(db, aside_ids).values()) == {"pending"}
    assert queue.next_pending(db, device_classes=ANY, excluded_runs=[aside]) == served_ids[0]
    work = queue.open_work(db, ANY, [aside])
    assert (work.servable, work.excluded) == (True, True)
    for c in got:
        queue.complete_trial(
            db, trial_id=c.trial_id, attempt=1, token=c.lease_token, worker_id=w, state="invalid"
        )
    db.execute("UPDATE tunefleet.trial SET state = 'cancelled' WHERE id = %s", (served_ids[0],))
    work = queue.open_work(db, ANY, [aside])
    assert (work.servable, work.excluded) == (False, True)


def test_stand_aside_is_one_row_per_worker_and_run_keeping_the_first_reason(db):
    w = make_worker(db)
    run = insert_run(db)
    queue.stand_aside(db, worker_id=w, secret=SECRETS[w], run_id=run, reason="needs feinsum")
    queue.stand_aside(db, worker_id=w, secret=SECRETS[w], run_id=run, reason="something else")
    rows = db.execute("SELECT worker_id, run_id, reason, host FROM tunefleet.standing_aside")
    assert [tuple(r.values()) for r in rows] == [(w, run, "needs feinsum", "testhost")]


def test_claim_numbers_the_attempt_past_its_history_after_a_reset_by_hand(db):
    w = make_worker(db)
    run = insert_run(db)
    [tid] = insert_trials(db, run, synthetic_configs(1))
    [c] = claim(db, w)
    queue.complete_trial(
        db, trial_id=tid, attempt=c.attempt, token=c.lease_token, worker_id=w, state="failed"
    )
    db.execute("UPDATE tunefleet.trial SET state = 'pending', attempt = 0 WHERE id = %s", (tid,))
    [again] = claim(db, w)
    assert again.attempt == 2
    assert [(a["attempt"], a["outcome"]) for a in attempts_of(db, tid)] == [
        (1, "failed"),
        (2, None),
    ]
