"""A hostile worker, connected as the worker role, tries every forgery it used to get away
with (and the obvious variants): each is refused and nothing in the database changes. A
legitimate worker still registers, claims, heartbeats, completes and releases; a forged
measurement never answers a later run's cache.

The scene (built with the queue's own functions, as the worker role): a victim worker that
finished one trial of an earlier run (``done``, with a measurement) and holds one running
trial of the current run; the hostile worker, registered and holding a claim of its own; one
trial still pending. Every forgery gets a fresh hostile session; afterwards every table is
compared with a snapshot taken before it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.helpers.coordinator import settings
from tests.helpers.queue_data import insert_run, insert_trials, synthetic_configs
from tests.helpers.roles import Roles
from tunefleet.coordinator.create import create_run
from tunefleet.db.migrate import downgrade, upgrade
from tunefleet.devices import DeviceInfo
from tunefleet.errors import DatabaseProblem
from tunefleet.problems.synthetic import FLOP_COUNT
from tunefleet.queries import queue, search
from tunefleet.queries.queue import ClaimedTrial, Lease, MeasurementRow
from tunefleet.space import config_hash
from tunefleet.worker.loop import Worker
from tunefleet.worker.settings import WorkerSettings

TABLES = ("run", "trial", "attempt", "measurement", "worker", "device", "stand_aside")
VICTIM_DEVICE = DeviceInfo(platform="P", vendor="V", name="Victim GPU", driver_version="1")
HOSTILE_DEVICE = DeviceInfo(platform="P", vendor="V", name="Hostile GPU", driver_version="1")


def measured(median: float = 0.01) -> MeasurementRow:
    return MeasurementRow(
        median_s=median,
        min_s=median,
        samples_s=[median],
        protocol={"warmup": 0},
        gflops=FLOP_COUNT / median / 1e9,
    )


@dataclass
class Scene:
    victim: uuid.UUID
    victim_secret: str
    victim_claim: ClaimedTrial  # running, held by the victim
    done_trial: int  # finished by the victim, in the earlier run
    earlier_run: int
    run: int
    pending_trial: int
    hostile: uuid.UUID
    hostile_secret: str
    hostile_claim: ClaimedTrial
    victim_device: int
    cache_key: str


def register(conn: Any, device: DeviceInfo) -> tuple[uuid.UUID, str]:
    worker_id = uuid.uuid4()
    device_id = queue.register_device(conn, device)
    secret = queue.register_worker(
        conn,
        worker_id=worker_id,
        host="node",
        pid=1,
        device_id=device_id,
        device_class="any",
        version="t",
    )
    return worker_id, secret


def claim_one(conn: Any, worker: uuid.UUID, secret: str) -> ClaimedTrial:
    [c] = queue.claim_trials(
        conn, worker_id=worker, secret=secret, device_classes=["any"], limit=1, lease_s=60
    )
    return c


@pytest.fixture
def scene(roles: Roles, db: Any) -> Scene:
    earlier = insert_run(db, name="earlier")
    [done_trial] = insert_trials(db, earlier, synthetic_configs(1))
    with roles.connect("worker") as w:
        victim, victim_secret = register(w, VICTIM_DEVICE)
        c = claim_one(w, victim, victim_secret)
        assert c.trial_id == done_trial
        state = queue.complete_trial(
            w,
            trial_id=c.trial_id,
            attempt=c.attempt,
            token=c.lease_token,
            worker_id=victim,
            state="done",
            measurement=measured(),
        )
        assert state == "done"
    db.execute("UPDATE tunefleet.run SET state = 'finished' WHERE id = %s", (earlier,))
    run = insert_run(db, name="current", problem_args={"seed": 7})
    running, hostile_held, pending = insert_trials(db, run, synthetic_configs(3, start=1))
    with roles.connect("worker") as w:
        victim_claim = claim_one(w, victim, victim_secret)
        assert victim_claim.trial_id == running
        hostile, hostile_secret = register(w, HOSTILE_DEVICE)
        hostile_claim = claim_one(w, hostile, hostile_secret)
        assert hostile_claim.trial_id == hostile_held
    key = db.execute("SELECT cache_key FROM tunefleet.run WHERE id = %s", (earlier,)).fetchone()
    device = db.execute(
        "SELECT id FROM tunefleet.device WHERE fingerprint = %s", (VICTIM_DEVICE.fingerprint,)
    ).fetchone()
    return Scene(
        victim=victim,
        victim_secret=victim_secret,
        victim_claim=victim_claim,
        done_trial=done_trial,
        earlier_run=earlier,
        run=run,
        pending_trial=pending,
        hostile=hostile,
        hostile_secret=hostile_secret,
        hostile_claim=hostile_claim,
        victim_device=device["id"],
        cache_key=key["cache_key"],
    )


def snapshot(db: Any) -> dict[str, list[dict[str, Any]]]:
    return {t: db.execute(f"SELECT * FROM tunefleet.{t} ORDER BY 1").fetchall() for t in TABLES}


Denied = psycopg.errors.InsufficientPrivilege
Refused = psycopg.errors.InvalidParameterValue

# --- the forgeries --------------------------------------------------------------------------
# Each takes the hostile worker's session and the scene; it either raises (the expected
# exception type is in the table) or returns what the call answered (checked against the
# expected "nothing happened" answer). Either way every table must be unchanged.

Forgery = Callable[[Any, Scene], Any]


def sql(statement: str, *params: Callable[[Scene], Any]) -> Forgery:
    """A statement the worker role used to be allowed, with parameters taken from the scene."""
    return lambda w, s: w.execute(statement, tuple(p(s) for p in params))


def complete(
    trial: Callable[[Scene], int],
    attempt: Callable[[Scene], int],
    token: Callable[[Scene], str],
    worker: Callable[[Scene], uuid.UUID],
    state: str = "done",
    measurement: MeasurementRow | None = None,
) -> Forgery:
    return lambda w, s: queue.complete_trial(
        w,
        trial_id=trial(s),
        attempt=attempt(s),
        token=token(s),
        worker_id=worker(s),
        state=state,
        error=None if state == "done" else "forged",
        measurement=measurement if state != "done" or measurement else measured(1e-12),
    )


def victims(s: Scene) -> int:
    return s.victim_claim.trial_id


def guessed(s: Scene) -> str:
    return "0" * 64


def own_token(s: Scene) -> str:
    return s.hostile_claim.lease_token


def hostile_id(s: Scene) -> uuid.UUID:
    return s.hostile


def victim_id(s: Scene) -> uuid.UUID:
    return s.victim


def first(s: Scene) -> int:
    return 1


def as_victim_lease(token: Callable[[Scene], str]) -> Callable[[Scene], list[Lease]]:
    return lambda s: [Lease(s.victim_claim.trial_id, s.victim_claim.attempt, token(s))]


def with_raised_timeout(setting: str, value: str, call: Forgery) -> Forgery:
    def forgery(w: Any, s: Scene) -> Any:
        w.execute(f"SET {setting} = '{value}'")
        return call(w, s)

    return forgery


FORGERY_CASES: list[tuple[str, Forgery, Any]] = [
    # Direct writes: the worker role writes no table at all.
    (
        "mark another worker's running trial done",
        sql(
            "UPDATE tunefleet.trial SET state = 'done', lease_expires_at = NULL WHERE id = %s",
            victims,
        ),
        Denied,
    ),
    (
        "insert a measurement for a trial it never claimed",
        sql(
            "INSERT INTO tunefleet.measurement (trial_id, run_id, attempt, cache_key,"
            " config_hash, problem, problem_args, config, median_s, min_s, samples_s, protocol)"
            " SELECT t.id, t.run_id, t.attempt, r.cache_key, t.config_hash, r.problem,"
            " r.problem_args, t.config, 1e-12, 1e-12, ARRAY[1e-12], '{}'"
            " FROM tunefleet.trial t JOIN tunefleet.run r ON r.id = t.run_id WHERE t.id = %s",
            lambda s: s.pending_trial,
        ),
        Denied,
    ),
    (
        "flip finished trials of other runs back to pending",
        sql("UPDATE tunefleet.trial SET state = 'pending' WHERE state = 'done'"),
        Denied,
    ),
    (
        "flip finished trials of other runs to failed",
        sql(
            "UPDATE tunefleet.trial SET state = 'failed', error = 'x' WHERE run_id = %s",
            lambda s: s.earlier_run,
        ),
        Denied,
    ),
    (
        "mark another worker stopped",
        sql("UPDATE tunefleet.worker SET state = 'stopped' WHERE id = %s", victim_id),
        Denied,
    ),
    (
        "overwrite every device's details",
        sql("UPDATE tunefleet.device SET details = '{\"forged\": true}'"),
        Denied,
    ),
    (
        "insert a trialless measurement under a run's cache key",
        sql(
            "INSERT INTO tunefleet.measurement (cache_key, config_hash, problem, problem_args,"
            " config, median_s, min_s, samples_s, gflops, protocol)"
            " SELECT cache_key, 'forged', problem, problem_args, '{}', 1e-12, 1e-12,"
            " ARRAY[1e-12], 1e9, protocol FROM tunefleet.run WHERE id = %s",
            lambda s: s.earlier_run,
        ),
        Denied,
    ),
    (
        "insert an imported-looking measurement",
        sql(
            "INSERT INTO tunefleet.measurement (cache_key, config_hash, problem, problem_args,"
            " config, median_s, min_s, samples_s, protocol, source)"
            " VALUES (%s, 'forged', 'synthetic', '{}', '{}', 1e-12, 1e-12, ARRAY[1e-12], '{}',"
            " 'imported')",
            lambda s: s.cache_key,
        ),
        Denied,
    ),
    (
        "rewrite a measurement's numbers",
        sql("UPDATE tunefleet.measurement SET median_s = 1e-12, gflops = 1e9"),
        Denied,
    ),
    (
        "take over a running trial by rewriting its lease",
        sql(
            "UPDATE tunefleet.trial SET lease_owner = %s, lease_token_hash = NULL WHERE id = %s",
            hostile_id,
            victims,
        ),
        Denied,
    ),
    (
        "forge an attempt row",
        sql(
            "INSERT INTO tunefleet.attempt (trial_id, attempt, worker_id, outcome)"
            " VALUES (%s, 9, %s, 'done')",
            victims,
            hostile_id,
        ),
        Denied,
    ),
    (
        "insert a worker row directly (no secret)",
        sql(
            "INSERT INTO tunefleet.worker (id, host, pid, device_class, version)"
            " VALUES (%s, 'h', 1, 'any', 't')",
            lambda s: uuid.uuid4(),
        ),
        Denied,
    ),
    (
        "insert a device directly",
        sql(
            "INSERT INTO tunefleet.device (fingerprint, device_class, platform, vendor, name,"
            " driver_version) VALUES ('fp', 'c', 'p', 'v', 'n', 'd')"
        ),
        Denied,
    ),
    ("delete history", sql("DELETE FROM tunefleet.attempt"), Denied),
    ("create a temporary table", sql("CREATE TEMP TABLE sneaky (i int)"), Denied),
    ("create a table in the public schema", sql("CREATE TABLE public.sneaky (i int)"), Denied),
    ("call an internal helper", sql("SELECT tunefleet._new_secret()"), Denied),
    (
        "define a function of its own in the schema",
        sql("CREATE FUNCTION tunefleet.sneaky() RETURNS int LANGUAGE sql AS 'SELECT 1'"),
        Denied,
    ),
    # Through the queue's functions, without the secrets.
    (
        "complete another worker's trial knowing its id and attempt",
        complete(victims, lambda s: s.victim_claim.attempt, guessed, hostile_id),
        None,
    ),
    (
        "complete another worker's trial in its owner's name",
        complete(victims, lambda s: s.victim_claim.attempt, guessed, victim_id),
        None,
    ),
    (
        "complete another worker's trial with its own valid lease token",
        complete(victims, lambda s: s.victim_claim.attempt, own_token, victim_id),
        None,
    ),
    (
        "complete another worker's trial as failed (to requeue it)",
        complete(victims, lambda s: s.victim_claim.attempt, own_token, hostile_id, "failed"),
        None,
    ),
    (
        "complete a trial nobody claimed",
        complete(lambda s: s.pending_trial, first, own_token, hostile_id),
        None,
    ),
    (
        "flip a finished trial of another run back through completion",
        complete(lambda s: s.done_trial, first, guessed, victim_id, "failed"),
        None,
    ),
    (
        "heartbeat another worker's lease (keep a dead claim alive)",
        lambda w, s: queue.heartbeat_trials(
            w, worker_id=s.victim, held=as_victim_lease(guessed)(s), lease_s=3600
        ),
        set(),
    ),
    (
        "release another worker's trial",
        lambda w, s: queue.release_trials(
            w, worker_id=s.victim, held=as_victim_lease(own_token)(s)
        ),
        set(),
    ),
    (
        "stop another worker without its secret",
        lambda w, s: queue.stop_worker(w, s.victim, "0" * 64),
        False,
    ),
    (
        "stop another worker with its own secret",
        lambda w, s: queue.stop_worker(w, s.victim, s.hostile_secret),
        False,
    ),
    (
        "heartbeat another worker with its own secret",
        lambda w, s: queue.heartbeat_worker(w, s.victim, s.hostile_secret),
        False,
    ),
    (
        "report another worker's sizing (inflate its queue share)",
        lambda w, s: queue.report_worker_sizing(
            w,
            s.victim,
            s.hostile_secret,
            capacity=1001,
            prepare_workers=0,
            prefetch=1000,
            sizing="flags",
            device_busy=None,
            peer_alive_s=60,
        ),
        1,
    ),
    (
        "report a capacity that would flood the queue",
        lambda w, s: queue.report_worker_sizing(
            w,
            s.hostile,
            s.hostile_secret,
            capacity=10**6,
            prepare_workers=0,
            prefetch=10**6,
            sizing="flags",
            device_busy=None,
            peer_alive_s=60,
        ),
        Refused,
    ),
    (
        "stand aside in another worker's name",
        lambda w, s: queue.stand_aside(
            w, worker_id=s.victim, secret=s.hostile_secret, run_id=s.run, reason="forged"
        ),
        Denied,
    ),
    (
        "insert a stand-aside row directly",
        sql(
            "INSERT INTO tunefleet.stand_aside (worker_id, run_id, reason) VALUES (%s, %s, 'x')",
            victim_id,
            lambda s: s.run,
        ),
        Denied,
    ),
    (
        "claim in another worker's name",
        lambda w, s: queue.claim_trials(
            w,
            worker_id=s.victim,
            secret=s.hostile_secret,
            device_classes=["any"],
            limit=1,
            lease_s=30,
        ),
        Denied,
    ),
    (
        "register again under another worker's id",
        lambda w, s: queue.register_worker(
            w,
            worker_id=s.victim,
            host="h",
            pid=1,
            device_id=None,
            device_class="any",
            version="t",
        ),
        psycopg.errors.UniqueViolation,
    ),
    (
        "overwrite a known device's details by registering it again",
        lambda w, s: (
            queue.register_device(
                w,
                DeviceInfo(
                    platform="P",
                    vendor="V",
                    name="Victim GPU",
                    driver_version="1",
                    compute_units=9999,
                    global_mem_bytes=1,
                ),
            )
            == s.victim_device
        ),
        True,
    ),
    # Its own claim, with numbers or settings the queue refuses.
    *[
        (
            f"complete its own claim with {what}",
            complete(
                lambda s: s.hostile_claim.trial_id,
                lambda s: s.hostile_claim.attempt,
                own_token,
                hostile_id,
                measurement=MeasurementRow(
                    median_s=median, min_s=min_s, samples_s=samples, protocol={}, gflops=gflops
                ),
            ),
            Refused,
        )
        for what, median, min_s, samples, gflops in [
            ("a NaN median", float("nan"), 1.0, [1.0], None),
            ("a negative median", -1.0, 1.0, [1.0], None),
            ("an infinite minimum", 1.0, float("inf"), [1.0], None),
            ("a zero sample", 1.0, 1.0, [1.0, 0.0], None),
            ("an infinite GFLOP/s", 1.0, 1.0, [1.0], float("inf")),
            ("a negative GFLOP/s", 1.0, 1.0, [1.0], -5.0),
        ]
    ],
    (
        "claim with a lease of years",
        lambda w, s: queue.claim_trials(
            w,
            worker_id=s.hostile,
            secret=s.hostile_secret,
            device_classes=["any"],
            limit=1,
            lease_s=1e9,
        ),
        Refused,
    ),
    (
        "claim the whole queue at once",
        lambda w, s: queue.claim_trials(
            w,
            worker_id=s.hostile,
            secret=s.hostile_secret,
            device_classes=["any"],
            limit=1_000_000,
            lease_s=30,
        ),
        Refused,
    ),
    (
        "heartbeat its own claim after turning statement_timeout off",
        with_raised_timeout(
            "statement_timeout",
            "0",
            lambda w, s: queue.heartbeat_trials(
                w, worker_id=s.hostile, held=[s.hostile_claim.key], lease_s=60
            ),
        ),
        Denied,
    ),
    (
        "claim after raising idle_in_transaction_session_timeout",
        with_raised_timeout(
            "idle_in_transaction_session_timeout",
            "1h",
            lambda w, s: queue.claim_trials(
                w,
                worker_id=s.hostile,
                secret=s.hostile_secret,
                device_classes=["any"],
                limit=1,
                lease_s=30,
            ),
        ),
        Denied,
    ),
]


@pytest.mark.parametrize(
    ("forgery", "expected"),
    [pytest.param(f, e, id=name) for name, f, e in FORGERY_CASES],
)
def test_hostile_worker_is_refused(roles: Roles, db: Any, scene: Scene, forgery, expected):
    before = snapshot(db)
    with roles.connect("worker") as w:
        if isinstance(expected, type) and issubclass(expected, Exception):
            with pytest.raises(expected):
                forgery(w, scene)
        else:
            assert forgery(w, scene) == expected
    assert snapshot(db) == before


def test_legitimate_worker_claims_heartbeats_completes_and_releases(
    roles: Roles, db: Any, scene: Scene
) -> None:
    """The same role, with its own secret and tokens, does everything the worker loop needs;
    the measurement's identity comes from the database, its device from the worker row."""
    [extra] = insert_trials(db, scene.run, synthetic_configs(1, start=50))
    with roles.connect("worker") as w:
        held = queue.claim_trials(
            w,
            worker_id=scene.hostile,
            secret=scene.hostile_secret,
            device_classes=["any"],
            limit=2,
            lease_s=30,
        )
        assert sorted(c.trial_id for c in held) == sorted([scene.pending_trial, extra])
        mine = [scene.hostile_claim, *held]
        assert queue.heartbeat_trials(
            w, worker_id=scene.hostile, held=[c.key for c in mine], lease_s=30
        ) == {c.trial_id for c in mine}
        assert queue.heartbeat_worker(w, scene.hostile, scene.hostile_secret)
        c = scene.hostile_claim
        assert (
            queue.complete_trial(
                w,
                trial_id=c.trial_id,
                attempt=c.attempt,
                token=c.lease_token,
                worker_id=scene.hostile,
                state="done",
                measurement=measured(0.02),
            )
            == "done"
        )
        assert queue.release_trials(w, worker_id=scene.hostile, held=[h.key for h in held]) == {
            h.trial_id for h in held
        }
        assert queue.stop_worker(w, scene.hostile, scene.hostile_secret)
    m = db.execute(
        "SELECT m.run_id, m.cache_key, m.config, m.config_hash, m.attempt, m.worker_id,"
        " m.source, d.name AS device FROM tunefleet.measurement m"
        " JOIN tunefleet.device d ON d.id = m.device_id WHERE m.trial_id = %s",
        (c.trial_id,),
    ).fetchone()
    run = db.execute("SELECT cache_key FROM tunefleet.run WHERE id = %s", (scene.run,)).fetchone()
    assert m == {
        "run_id": scene.run,
        "cache_key": run["cache_key"],
        "config": c.config,
        "config_hash": c.config_hash,
        "attempt": c.attempt,
        "worker_id": scene.hostile,
        "source": "measured",
        "device": "Hostile GPU",
    }
    states = db.execute(
        "SELECT id, state, lease_token_hash FROM tunefleet.trial WHERE run_id = %s ORDER BY id",
        (scene.run,),
    ).fetchall()
    assert [(r["state"], r["lease_token_hash"] is None) for r in states] == [
        ("running", False),  # the victim's, untouched
        ("done", True),
        ("pending", True),
        ("pending", True),
    ]


def test_tokens_and_secrets_are_stored_only_as_hashes(db: Any, scene: Scene) -> None:
    rows = db.execute(
        "SELECT lease_token_hash FROM tunefleet.trial WHERE id = %s", (scene.victim_claim.trial_id,)
    ).fetchone()
    stored = bytes(rows["lease_token_hash"])
    token = scene.victim_claim.lease_token
    assert len(token) >= 32 and token.encode() not in stored and len(stored) == 32
    assert "lease_token" not in repr(scene.victim_claim) and token not in repr(
        scene.victim_claim.key
    )
    secrets = db.execute("SELECT secret_hash FROM tunefleet.worker").fetchall()
    assert all(scene.victim_secret.encode() not in bytes(r["secret_hash"]) for r in secrets)


@pytest.mark.parametrize(
    ("role", "statement_timeout_ms", "message"),
    [
        ("reader", 30_000, "permission denied for function register_device"),
        ("worker", 120_000, "statement_timeout of this session is 2min, above the 30000 ms"),
    ],
)
def test_a_worker_the_queue_refuses_exits_with_one_clear_error(
    roles: Roles, db: Any, role: str, statement_timeout_ms: int, message: str
) -> None:
    """A worker started with the wrong role (no EXECUTE on the queue's functions), or with a
    statement timeout above its role's, stops at registration with a DatabaseProblem naming
    the reason and the fix; it wrote nothing."""
    url = roles.url(role)
    config = WorkerSettings.build(db=url, device="host")
    config = replace(config, db=replace(config.db, statement_timeout_ms=statement_timeout_ms))
    with pytest.raises(DatabaseProblem) as err:
        Worker(config, url).run()
    text = str(err.value)
    assert message in text and "tunefleet db roles" in text and "\n" not in text
    assert db.execute("SELECT count(*) AS n FROM tunefleet.worker").fetchone()["n"] == 0
    assert db.execute("SELECT count(*) AS n FROM tunefleet.device").fetchone()["n"] == 0


# --- the cache --------------------------------------------------------------------------------


def test_a_forged_measurement_never_answers_a_later_run(roles: Roles, db: Any, db_url: str) -> None:
    """The exploit: a trialless row under a run's cache key, which the next run served as
    its best ("1,000,000,000 GFLOP/s"). A worker can no longer write one; rows that a worker
    wrote before this was closed are marked ``unverified`` by the migration and never served
    (nor shown as anyone's best, nor used to warm-start a search)."""
    real, forged = synthetic_configs(2, start=10)
    first = create_run(settings(seed_configs=[real], max_trials=1), db_url)
    with roles.connect("worker") as w:
        worker, secret = register(w, VICTIM_DEVICE)
        c = claim_one(w, worker, secret)
        queue.complete_trial(
            w,
            trial_id=c.trial_id,
            attempt=c.attempt,
            token=c.lease_token,
            worker_id=worker,
            state="done",
            measurement=measured(0.005),
        )
        with pytest.raises(Denied):
            w.execute(
                "INSERT INTO tunefleet.measurement (cache_key, config_hash, problem,"
                " problem_args, config, median_s, min_s, samples_s, gflops, protocol)"
                " SELECT cache_key, %s, problem, problem_args, %s, 1e-12, 1e-12, ARRAY[1e-12],"
                " 1e9, protocol FROM tunefleet.run WHERE id = %s",
                (config_hash(forged), Jsonb(forged), first),
            )
    # A database from before: the same rows written while workers could insert them.
    downgrade(roles.url("migrator"), "0008_confirmations")
    for forged_hash in (config_hash(forged), "another"):
        db.execute(
            "INSERT INTO tunefleet.measurement (cache_key, config_hash, problem,"
            " problem_args, config, device_id, median_s, min_s, samples_s, gflops, protocol)"
            " SELECT cache_key, %s, problem, problem_args, %s,"
            " (SELECT id FROM tunefleet.device LIMIT 1), 1e-12, 1e-12, ARRAY[1e-12],"
            " 1e9, protocol FROM tunefleet.run WHERE id = %s",
            (forged_hash, Jsonb(forged), first),
        )
    # ... and a forged row claiming the real trial, with another configuration's numbers.
    db.execute(
        "UPDATE tunefleet.measurement SET median_s = 1e-12, gflops = 1e9, worker_id = NULL"
        " WHERE trial_id = %s",
        (c.trial_id,),
    )
    upgrade(roles.url("migrator"))
    sources = db.execute("SELECT source FROM tunefleet.measurement ORDER BY id").fetchall()
    assert [r["source"] for r in sources] == ["unverified"] * 3

    # A later run under the same cache key asks for both configurations: nothing is served.
    second = create_run(settings(seed_configs=[real, forged], max_trials=2), db_url)
    trials = db.execute(
        "SELECT state, source FROM tunefleet.trial WHERE run_id = %s ORDER BY id", (second,)
    ).fetchall()
    assert trials == [{"state": "pending", "source": "seed"}] * 2
    key = db.execute("SELECT cache_key FROM tunefleet.run WHERE id = %s", (second,)).fetchone()
    assert (
        search.insert_cached_trials(db, second, "any", key["cache_key"], [config_hash(forged)])
        == []
    )
    assert db.execute("SELECT * FROM tunefleet.best_per_problem_device").fetchall() == []
    assert search.warm_start_configs(db, "synthetic", {"duration": 0.005}, "any", 5) == []


def test_rows_the_queue_produced_survive_the_migration_and_answer_the_cache(
    roles: Roles, db: Any, db_url: str
) -> None:
    """Upgrading an old database keeps a lease holder's measurement, a cache copy of it and an
    import; a later run is answered from them."""
    real = synthetic_configs(1, start=20)[0]
    first = create_run(settings(seed_configs=[real], max_trials=1), db_url)
    downgrade(roles.url("migrator"), "0008_confirmations")
    # The pre-0003 statements, as an old worker ran them.
    worker = uuid.uuid4()
    db.execute(
        "INSERT INTO tunefleet.worker (id, host, pid, device_class, version)"
        " VALUES (%s, 'h', 1, 'any', 'old')",
        (worker,),
    )
    tid = db.execute(
        "UPDATE tunefleet.trial SET state = 'done', attempt = 1, lease_owner = %s,"
        " finished_at = now() WHERE run_id = %s RETURNING id",
        (worker, first),
    ).fetchone()["id"]
    db.execute(
        "INSERT INTO tunefleet.attempt (trial_id, attempt, worker_id, ended_at, outcome)"
        " VALUES (%s, 1, %s, now(), 'done')",
        (tid, worker),
    )
    db.execute(
        "INSERT INTO tunefleet.measurement (trial_id, run_id, attempt, cache_key, config_hash,"
        " problem, problem_args, config, worker_id, median_s, min_s, samples_s, protocol)"
        " SELECT t.id, t.run_id, 1, r.cache_key, t.config_hash, r.problem, r.problem_args,"
        " t.config, %s, 0.004, 0.004, ARRAY[0.004], r.protocol"
        " FROM tunefleet.trial t JOIN tunefleet.run r ON r.id = t.run_id WHERE t.id = %s",
        (worker, tid),
    )
    db.execute(
        "INSERT INTO tunefleet.measurement (cache_key, config_hash, problem, problem_args,"
        " config, median_s, min_s, samples_s, protocol, source)"
        " VALUES ('imported-key', 'h', 'p', '{}', '{}', 1, 1, ARRAY[1.0], '{}', 'imported')"
    )
    upgrade(roles.url("migrator"))
    copy_run = create_run(settings(seed_configs=[real], max_trials=1), db_url)  # a cache copy
    downgrade(roles.url("migrator"), "0008_confirmations")
    upgrade(roles.url("migrator"))  # the copy survives a second pass too
    rows = db.execute("SELECT source FROM tunefleet.measurement ORDER BY id").fetchall()
    assert [r["source"] for r in rows] == ["measured", "imported", "measured"]
    later = create_run(settings(seed_configs=[real], max_trials=1), db_url)
    for run_id in (copy_run, later):
        t = db.execute(
            "SELECT state, source FROM tunefleet.trial WHERE run_id = %s", (run_id,)
        ).fetchone()
        assert t == {"state": "done", "source": "cache"}
