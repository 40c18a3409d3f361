"""The coordinator's SQL statements, one by one, against a real PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.helpers.coordinator import register_worker
from tests.helpers.queue_data import wait_until
from tunefleet.coordinator.enqueue import NewTrial, enqueue
from tunefleet.db.engine import connect
from tunefleet.problems.base import Protocol, cache_key
from tunefleet.queries import search as q
from tunefleet.space import config_hash
from tunefleet.vocabulary import NOTIFY_CHANNEL, TrialSource

PROTOCOL = Protocol().to_json()


def new_run(db: Any, device_class: str = "any", args: dict[str, Any] | None = None) -> int:
    args = args if args is not None else {"n": 64}
    return q.insert_run(
        db,
        problem="analytic",
        problem_args=args,
        space={"version": 1, "params": [{"kind": "int", "name": "x", "low": 0, "high": 99}]},
        device_class=device_class,
        protocol=PROTOCOL,
        cache_key=cache_key("analytic", args, device_class, PROTOCOL),
        search={},
        max_trials=10,
    )


def items(*xs: int, source: str = "search") -> list[dict[str, Any]]:
    return [
        {"config": {"x": x}, "config_hash": config_hash({"x": x}), "source": source} for x in xs
    ]


def finish(db: Any, trial_id: int, state: str, median_s: float | None = None) -> None:
    """Complete a trial the way a worker does (without the claim, which is not ours)."""
    row = db.execute(
        "UPDATE tunefleet.trial SET state = %s, finished_at = now() WHERE id = %s "
        "RETURNING run_id, config, config_hash",
        (state, trial_id),
    ).fetchone()
    if median_s is not None:
        run = db.execute("SELECT * FROM tunefleet.run WHERE id = %s", (row["run_id"],)).fetchone()
        db.execute(
            """
            INSERT INTO tunefleet.measurement (trial_id, run_id, cache_key, config_hash,
                problem, problem_args, config, median_s, min_s, samples_s, gflops, protocol)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            (
                trial_id,
                row["run_id"],
                run["cache_key"],
                row["config_hash"],
                run["problem"],
                Jsonb(run["problem_args"]),
                Jsonb(row["config"]),
                median_s,
                median_s,
                [median_s],
                1.0 / median_s,
                Jsonb(run["protocol"]),
            ),
        )


def test_a_batch_insert_sends_one_notification_and_skips_what_the_run_has(db_url, db):
    run_id = new_run(db, "nvidia-h200")
    listener = connect(db_url)
    listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
    rows = q.insert_trials(db, run_id, "nvidia-h200", items(1, 2, 3, 4, 5), timeout_s=12.0)
    assert len(rows) == 5
    again = q.insert_trials(db, run_id, "nvidia-h200", items(4, 5, 6))
    assert [r.config_hash for r in again] == [config_hash({"x": 6})]
    nothing = q.insert_trials(db, run_id, "nvidia-h200", items(1, 2))
    assert nothing == []
    # A marker sent last: notifications arrive in commit order, so everything the inserts
    # sent has arrived once the marker has (however slowly), and nothing is cut off early.
    db.execute("SELECT pg_notify(%s, 'marker')", (NOTIFY_CHANNEL,))
    notes = []
    for note in listener.notifies(timeout=30.0):
        if note.payload == "marker":
            break
        notes.append(note)
    else:
        raise AssertionError(f"no marker notification within 30 s; got {notes}")
    listener.close()
    assert [(n.channel, n.payload) for n in notes] == [(NOTIFY_CHANNEL, "nvidia-h200")] * 2
    trials = db.execute(
        "SELECT device_class, state, timeout_s, source FROM tunefleet.trial WHERE run_id = %s "
        "ORDER BY id",
        (run_id,),
    ).fetchall()
    assert len(trials) == 6
    assert trials[0] == {
        "device_class": "nvidia-h200",
        "state": "pending",
        "timeout_s": 12.0,
        "source": "search",
    }
    assert q.queue_depth(db, run_id) == 6


def test_cancelled_trials_come_back_when_asked_again(db):
    run_id = new_run(db)
    [first, _] = q.insert_trials(db, run_id, "any", items(1, 2))
    assert q.cancel_pending(db, run_id) == 2
    assert q.queue_depth(db, run_id) == 0
    revived = q.insert_trials(db, run_id, "any", items(1))
    assert revived == [q.Queued(first.id, first.config_hash)]
    assert q.queue_depth(db, run_id) == 1


def test_cancel_leaves_running_and_finished_trials_alone(db):
    run_id = new_run(db)
    ids = [r.id for r in q.insert_trials(db, run_id, "any", items(1, 2, 3))]
    owner = register_worker(db)  # a registered worker to own the lease
    db.execute(
        "UPDATE tunefleet.trial SET state = 'running', lease_owner = %s, attempt = 1, "
        "lease_expires_at = now() + interval '1 minute' WHERE id = %s",
        (owner, ids[0]),
    )
    finish(db, ids[1], "done", 0.5)
    assert q.cancel_pending(db, run_id) == 1
    rows = db.execute("SELECT id, state FROM tunefleet.trial WHERE run_id = %s", (run_id,))
    states = {r["id"]: r["state"] for r in rows.fetchall()}
    assert states == {ids[0]: "running", ids[1]: "done", ids[2]: "cancelled"}


def test_unreported_outcomes_are_read_once_with_their_numbers(db):
    run_id = new_run(db)
    ids = [r.id for r in q.insert_trials(db, run_id, "any", items(1, 2, 3))]
    finish(db, ids[0], "done", 0.25)
    finish(db, ids[1], "invalid")
    got = q.fetch_unreported(db, run_id)
    assert [(r.id, r.state, r.median_s) for r in got] == [
        (ids[0], "done", 0.25),
        (ids[1], "invalid", None),
    ]
    assert q.fetch_unreported(db, run_id) == []
    finish(db, ids[2], "timed_out")
    assert [r.id for r in q.fetch_unreported(db, run_id)] == [ids[2]]
    # The resume read sees every reported outcome, in finishing order.
    assert [r.id for r in q.reported_outcomes(db, run_id)] == ids
    assert q.in_flight_trials(db, run_id) == []
    best = q.best_of_run(db, run_id)
    assert best is not None
    assert (best.trial_id, best.config, best.median_s) == (ids[0], {"x": 1}, 0.25)


def test_the_cache_answers_from_any_run_with_the_same_key_only(db):
    old = new_run(db)
    ids = [r.id for r in q.insert_trials(db, old, "any", items(1, 2))]
    finish(db, ids[0], "done", 0.125)
    finish(db, ids[1], "invalid")  # no measurement: not cached
    key = db.execute("SELECT cache_key FROM tunefleet.run WHERE id = %s", (old,)).fetchone()
    run_id = new_run(db)
    hashes = [config_hash({"x": x}) for x in (1, 2, 3)]
    hits = q.insert_cached_trials(db, run_id, "any", key["cache_key"], hashes)
    assert [(h.config_hash, h.median_s, h.state, h.source) for h in hits] == [
        (hashes[0], 0.125, "done", "cache")
    ]
    row = db.execute(
        "SELECT * FROM tunefleet.results WHERE trial_id = %s", (hits[0].id,)
    ).fetchone()
    assert (row["run_id"], row["state"], row["source"], row["median_s"]) == (
        run_id,
        "done",
        "cache",
        0.125,
    )
    assert q.fetch_unreported(db, run_id) == []  # answered already, never re-reported
    # Asking again changes nothing; another key (other arguments) finds nothing.
    assert q.insert_cached_trials(db, run_id, "any", key["cache_key"], hashes) == []
    other = new_run(db, args={"n": 128})
    other_key = db.execute("SELECT cache_key FROM tunefleet.run WHERE id = %s", (other,))
    assert q.insert_cached_trials(db, other, "any", other_key.fetchone()["cache_key"], hashes) == []


def test_the_run_lock_is_exclusive_and_dies_with_its_connection(db_url, db):
    run_id = new_run(db)
    other = connect(db_url)
    assert q.try_lock_run(db, run_id)
    assert not q.try_lock_run(other, run_id)
    assert q.try_lock_run(other, run_id + 1)  # other runs are independent
    db.close()  # the server releases the lock as the session ends
    wait_until(lambda: q.try_lock_run(other, run_id), what="the lock to be released")
    other.close()


def test_taking_a_run_sets_the_owner_and_replaces_only_given_budget_values(db):
    run_id = new_run(db)
    me = uuid.uuid4()
    row = q.take_run(db, run_id, me, patience=5)
    assert row is not None
    assert (row.coordinator_id, row.max_trials, row.patience) == (me, 10, 5)
    assert q.heartbeat_run(db, run_id, uuid.uuid4()) is None
    assert q.heartbeat_run(db, run_id, me).state == "running"
    assert q.finish_run(db, run_id, me, "patience")
    run = q.get_run(db, run_id)
    assert (run["state"], run["stop_reason"], run["coordinator_id"]) == (
        "finished",
        "patience",
        None,
    )
    assert q.take_run(db, 999, me) is None


def test_live_workers_are_counted_per_class_and_by_heartbeat(db):
    for device_class, capacity in (("nvidia-h200", 9), ("nvidia-h200", 2), ("host-cpu", 2)):
        register_worker(db, device_class, capacity=capacity)
    register_worker(db, "nvidia-h200", age_s=300)  # quiet for five minutes
    register_worker(db, "nvidia-h200", state="stopped")
    assert q.count_live_workers(db, "nvidia-h200", 60.0) == (2, 11)
    assert q.count_live_workers(db, "host-cpu", 60.0) == (1, 2)
    assert q.count_live_workers(db, "any", 60.0) == (3, 13)
    assert q.count_live_workers(db, "amd-mi300", 60.0) == (0, 0)
    assert q.count_live_workers(db, "nvidia-h200", 600.0).workers == 3
    assert q.live_worker_classes(db, 60.0) == ["host-cpu", "nvidia-h200"]


@pytest.mark.parametrize("limit", [1, 3])
def test_warm_start_reads_the_fastest_distinct_configurations_of_a_class(db, limit):
    source = new_run(db, "nvidia-a100")
    ids = [r.id for r in q.insert_trials(db, source, "nvidia-a100", items(1, 2, 3, 4))]
    for trial_id, t in zip(ids, (0.4, 0.1, 0.3, 0.2), strict=True):
        finish(db, trial_id, "done", t)
    rows = q.warm_start_configs(db, "analytic", {"n": 64}, "nvidia-a100", limit)
    assert [r.config for r in rows] == [{"x": 2}, {"x": 4}, {"x": 3}][:limit]
    assert q.warm_start_configs(db, "analytic", {"n": 32}, "nvidia-a100", limit) == []
    assert q.measured_device_classes(db, "analytic", {"n": 64}) == ["nvidia-a100"]


def test_the_enqueue_pipeline_answers_what_it_can_and_queues_the_rest(db):
    """Every way a configuration enters a run (``create_run``'s seeds and the search's
    batches go through the same function): illegal, invalid elsewhere, cached, already in
    the run (left alone), cancelled earlier (revived), new (queued)."""
    old = new_run(db)
    [measured, broken] = [r.id for r in q.insert_trials(db, old, "any", items(1, 2))]
    finish(db, measured, "done", 0.125)
    finish(db, broken, "invalid")
    db.execute("UPDATE tunefleet.trial SET error = 'bad tile' WHERE id = %s", (broken,))
    run_id = new_run(db)
    [running, cancelled, running_illegal] = q.insert_trials(db, run_id, "any", items(5, 6, 7))
    owner = register_worker(db)
    db.execute(
        "UPDATE tunefleet.trial SET state = 'running', lease_owner = %s, attempt = 1, "
        "lease_expires_at = now() + interval '1 minute' WHERE id = ANY(%s)",
        (owner, [running.id, running_illegal.id]),
    )
    q.cancel_pending(db, run_id)
    key = db.execute("SELECT cache_key FROM tunefleet.run WHERE id = %s", (run_id,)).fetchone()

    def h(x: int) -> str:
        return config_hash({"x": x})

    trials = {h(x): NewTrial({"x": x}, TrialSource.SEARCH) for x in (1, 2, 4, 5, 6)}
    trials[h(3)] = NewTrial({"x": 3}, TrialSource.SEED, illegal="x must be even")
    trials[h(7)] = NewTrial({"x": 7}, TrialSource.SEARCH, illegal="x must be even")
    done = enqueue(db, run_id, "any", key["cache_key"], trials, timeout_s=9.0, max_attempts=2)

    answered = {o.config["x"]: (o.state, o.source, o.median_s, o.error) for o in done.answered}
    assert answered == {
        3: ("invalid", "seed", None, "x must be even"),
        2: ("invalid", "cache", None, f"invalid in run {old}: bad tile"),
        1: ("done", "cache", 0.125, None),
    }
    assert sorted(r.config_hash for r in done.queued) == sorted([h(4), h(6)])
    assert cancelled.id in {r.id for r in done.queued}  # revived, its history kept
    assert sorted(done.skipped) == sorted([h(5), h(7)])
    rows = db.execute(
        "SELECT config->>'x' AS x, state, source, reported, timeout_s, max_attempts "
        "FROM tunefleet.trial WHERE run_id = %s ORDER BY (config->>'x')::int",
        (run_id,),
    ).fetchall()
    assert [(int(r["x"]), r["state"], r["source"], r["reported"]) for r in rows] == [
        (1, "done", "cache", True),
        (2, "invalid", "cache", True),
        (3, "invalid", "seed", True),
        (4, "pending", "search", False),
        (5, "running", "search", False),
        (6, "pending", "search", False),
        (7, "running", "search", False),
    ]
    assert {r["timeout_s"] for r in rows if r["state"] == "pending"} == {9.0}
    assert q.fetch_unreported(db, run_id) == []  # what was answered is never told twice
