"""Every statement the worker side of the queue runs: registration, claim, lease heartbeat,
fenced completion, release, standing aside from a run, the lease reaper, the device lease and
wake-ups.

A worker is untrusted, so it writes nothing itself: every write below calls one of the
queue's database functions (``tunefleet.claim_trials``, ``tunefleet.complete_trial``, ...,
installed by migration ``0003_worker_functions``; SECURITY DEFINER, owned by the migrator).
The worker role may execute exactly those (``WORKER_FUNCTIONS`` in
:mod:`tunefleet.db.roles`) and has no INSERT, UPDATE or DELETE on any table. Reads (the drain
check, the outcome of an unacknowledged completion) are plain SELECTs.

All functions take an open psycopg connection in autocommit mode (``tunefleet.db.engine
.connect``), whose session carries ``statement_timeout`` and
``idle_in_transaction_session_timeout`` (the database functions refuse a session that raised
them above its role's defaults). Each docstring states what the statement locks and for how
long. Every statement here is one short statement: no row lock outlives it, so nothing is
held while a kernel compiles or runs.

Secrets: registration returns a **worker secret** and each claim a **lease token** per trial;
the database keeps only their SHA-256. Claims, the worker heartbeat and the worker's stop need
the secret; every later write about a claim (heartbeat, completion, release) is fenced on
``(trial id, attempt, lease_owner, lease token)`` plus ``state = 'running'``. A write that
matches no row means the claim is gone (the lease expired and somebody else may own the trial
now) and the caller must drop its work. Knowing a trial id or worker id, both readable by
every worker, is not enough to write anything about it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from tunefleet.devices import DeviceInfo
from tunefleet.settings import COORDINATOR_ALIVE_S, WORKER_ALIVE_S
from tunefleet.vocabulary import FINISHED_TRIAL_STATES, NOTIFY_CHANNEL, AttemptOutcome, TrialState

#: Key of the transaction-level advisory lock that serialises the reaper across the fleet
#: (taken inside ``tunefleet.reap_expired_leases``; the migration spells the same text).
REAPER_LOCK_NAME = "tunefleet:reaper"

#: Outcomes a worker may report for its own claim.
COMPLETION_STATES = FINISHED_TRIAL_STATES


@dataclass(frozen=True, order=True)
class Lease:
    """One claim as its holder proves it: trial id, attempt and the secret lease token the
    claim returned (kept out of ``repr`` so it never reaches a log)."""

    trial_id: int
    attempt: int
    token: str = field(repr=False)


@dataclass(frozen=True)
class ClaimedTrial:
    """What a worker needs to evaluate one claimed trial (trial fields plus its run's)."""

    trial_id: int
    run_id: int
    attempt: int
    max_attempts: int
    config: dict[str, Any]
    config_hash: str
    timeout_s: float | None
    device_class: str
    problem: str
    problem_args: dict[str, Any]
    protocol: dict[str, Any]
    cache_key: str
    lease_token: str = field(repr=False)

    @property
    def key(self) -> Lease:
        """The fencing token of this claim (with the worker id)."""
        return Lease(self.trial_id, self.attempt, self.lease_token)


@dataclass(frozen=True)
class MeasurementRow:
    """The measured numbers of a ``done`` trial. Everything else of the measurement row
    (trial, run, cache key, config, problem, arguments, attempt, worker, device) is copied from
    the database's own rows inside the completion."""

    median_s: float
    min_s: float
    samples_s: Sequence[float]
    protocol: dict[str, Any]
    gflops: float | None = None
    gbps: float | None = None
    flop_count: float | None = None
    byte_count: float | None = None
    compile_s: float | None = None
    validation: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    code: str | None = None

    def problems(self) -> list[str]:
        """Why the completion would refuse this row (empty when fine); the database function
        checks the same and more, this only names the problem before a round trip."""
        bad = []
        for name in ("median_s", "min_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                bad.append(f"{name}={value!r} is not a positive finite number of seconds")
        if not self.samples_s:
            bad.append("no timing samples")
        return bad


@dataclass(frozen=True)
class ReapedTrial:
    trial_id: int
    attempt: int
    previous_owner: UUID
    state: str  # 'pending' (requeued), 'failed' (attempts used up) or 'cancelled'


# --- registration ----------------------------------------------------------------------------


def register_device(conn: psycopg.Connection[Any], info: DeviceInfo) -> int:
    """Register the device by fingerprint (``tunefleet.register_device``); return its id. A
    fingerprint already known keeps the details it was first registered with.

    Locking: the unique index on ``fingerprint`` serialises two concurrent first
    registrations (one inserts, the other finds its row); no row lock outlives the statement.
    """
    row = conn.execute(
        """
        SELECT tunefleet.register_device(
                 %(fingerprint)s, %(device_class)s, %(platform)s, %(vendor)s, %(name)s,
                 %(driver_version)s, %(compute_units)s::integer, %(global_mem_bytes)s::bigint,
                 %(details)s) AS id
        """,
        {
            "fingerprint": info.fingerprint,
            "device_class": info.device_class,
            "platform": info.platform,
            "vendor": info.vendor,
            "name": info.name,
            "driver_version": info.driver_version,
            "compute_units": info.compute_units,
            "global_mem_bytes": info.global_mem_bytes,
            "details": Jsonb(info.to_json()),
        },
    ).fetchone()
    assert row is not None
    return int(row["id"])


def register_worker(
    conn: psycopg.Connection[Any],
    *,
    worker_id: UUID,
    host: str,
    pid: int,
    device_id: int | None,
    device_class: str,
    version: str,
    capacity: int = 2,
) -> str:
    """Insert this worker process's row (state ``active``, heartbeat now) with the number of
    trials it holds at once (``capacity``, 1 + prefetch); return the worker secret that its
    claims, heartbeats and stop must present (only its hash is stored; keep it in memory).

    Locking: a plain insert of a fresh UUID (an id already taken fails); no contention.
    """
    row = conn.execute(
        "SELECT tunefleet.register_worker(%s, %s, %s, %s::bigint, %s, %s, %s) AS secret",
        (worker_id, host, int(pid), device_id, device_class, version, int(capacity)),
    ).fetchone()
    assert row is not None
    return str(row["secret"])


def heartbeat_worker(conn: psycopg.Connection[Any], worker_id: UUID, secret: str) -> bool:
    """Record that the worker is alive (``heartbeat_at = now()``, database clock).

    Returns False when the row is gone or stopped (or the secret is not this worker's).
    Locking: the worker's own row, for the statement; only this worker writes it.
    """
    row = conn.execute(
        "SELECT tunefleet.heartbeat_worker(%s, %s) AS alive", (worker_id, secret)
    ).fetchone()
    return bool(row is not None and row["alive"])


def stop_worker(conn: psycopg.Connection[Any], worker_id: UUID, secret: str) -> bool:
    """Mark the worker ``stopped`` (graceful exit) and give its device lease back; False
    when the secret does not match. Locking: its own row, then its device lease row, for the
    statement."""
    row = conn.execute(
        "SELECT tunefleet.stop_worker(%s, %s) AS stopped", (worker_id, secret)
    ).fetchone()
    return bool(row is not None and row["stopped"])


def report_worker_sizing(
    conn: psycopg.Connection[Any],
    worker_id: UUID,
    secret: str,
    *,
    capacity: int,
    prepare_workers: int,
    prefetch: int,
    sizing: str,
    device_busy: float | None,
    peer_alive_s: float,
) -> int:
    """Record the worker's current sizing (``tunefleet.report_worker_sizing``, which needs
    the worker secret; its ``capacity``, 1 + prefetch, at most 1,001, is what the
    coordinator's queue depth follows) and how much of the time its device was busy; return
    how many live workers its host runs, itself included (they share the host's cores).

    Locking: the worker's own row, for the statement; the count reads the host's rows
    without locking them.
    """
    row = conn.execute(
        "SELECT tunefleet.report_worker_sizing(%s, %s, %s, %s, %s, %s, %s::double precision,"
        " %s) AS peers",
        (
            worker_id,
            secret,
            int(capacity),
            int(prepare_workers),
            int(prefetch),
            sizing,
            None if device_busy is None else float(device_busy),
            float(peer_alive_s),
        ),
    ).fetchone()
    return 1 if row is None or row["peers"] is None else max(int(row["peers"]), 1)


# --- the device lease --------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceTaken:
    """What :func:`take_device` found: ``taken`` (this worker holds the device now), else
    the worker that holds it, its process id and how many seconds its lease has left."""

    taken: bool
    holder: UUID | None = None
    holder_pid: int | None = None
    holder_expires_in_s: float | None = None


def take_device(
    conn: psycopg.Connection[Any], *, worker_id: UUID, secret: str, index: int, lease_s: float
) -> DeviceTaken:
    """Take the lease of one device of one host for this registered worker, without waiting
    (``tunefleet.take_device``): the device of the worker's own rows (its host, its device's
    fingerprint) and ``index`` (identical GPUs share a fingerprint). Taken when nobody holds
    it, when the holder's lease expired (it stopped heartbeating for a whole lease), when the
    holder's worker row is stopped, or when it is already this worker's; the lease then runs
    until ``now() + lease_s`` (database clock) and :func:`heartbeat` extends it. A row, not
    session state: it holds through a transaction pooler and across reconnects, and
    :func:`stop_worker` gives it back. Needs the worker secret.

    Locking: the device's lease row, for the statement (``INSERT ... ON CONFLICT DO
    UPDATE`` locks it even when it stays the holder's); the worker and device rows are only
    read.
    """
    row = conn.execute(
        "SELECT * FROM tunefleet.take_device(%s, %s, %s, %s::double precision)",
        (worker_id, secret, int(index), float(lease_s)),
    ).fetchone()
    assert row is not None
    return DeviceTaken(
        taken=bool(row["taken"]),
        holder=None if row["taken"] else row["holder"],
        holder_pid=None if row["holder_pid"] is None else int(row["holder_pid"]),
        holder_expires_in_s=(
            None if row["holder_expires_in_s"] is None else float(row["holder_expires_in_s"])
        ),
    )


# --- wake-ups ----------------------------------------------------------------------------------


def listen(conn: psycopg.Connection[Any]) -> None:
    """``LISTEN`` on the trial channel (autocommit: effective at once). Session state: only
    on a route that keeps one (:mod:`tunefleet.db.pooler`). No locks (the notification
    queue's own lock, for a moment, to register the session)."""
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))


def session_timeout(conn: psycopg.Connection[Any]) -> int:
    """This session's ``statement_timeout`` in milliseconds (0: none). Behind a pooler that
    drops the startup options it is the role's own (``tunefleet db roles``) or the
    server's. Locks: none."""
    row = conn.execute(
        "SELECT extract(epoch FROM current_setting('statement_timeout')::interval) * 1000 AS ms"
    ).fetchone()
    return 0 if row is None or row["ms"] is None else int(row["ms"])


def unlisten(conn: psycopg.Connection[Any]) -> None:
    """``UNLISTEN`` the trial channel: this session is no longer woken by new batches (a
    worker with no room for a trial). No locks, as :func:`listen`."""
    conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))


def notify_new_trials(conn: psycopg.Connection[Any], device_class: str) -> None:
    """One ``NOTIFY`` per inserted batch; the payload is the batch's device class.

    Locking: none beyond the notification queue; in autocommit it is delivered at once.
    """
    conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, device_class))


# --- claim and lease ---------------------------------------------------------------------------


def claim_trials(
    conn: psycopg.Connection[Any],
    *,
    worker_id: UUID,
    secret: str,
    device_classes: Sequence[str],
    limit: int,
    lease_s: float,
    excluded_runs: Sequence[int] = (),
    skipped_trials: Sequence[int] = (),
    alive_s: float = WORKER_ALIVE_S,
    listen_first: bool = False,
) -> list[ClaimedTrial]:
    """Claim up to ``limit`` (1-1000) pending trials of the given device classes, in
    ``priority, id`` order, skipping the runs in ``excluded_runs`` (those this worker stands
    aside from) and the trials in ``skipped_trials`` (those whose claim the database
    refused): one autocommit statement (``tunefleet.claim_trials``), which returns a fresh
    lease token per trial.

    For each class, a LATERAL subquery walks the partial index on pending trials
    ``(device_class, priority, id)`` in order and takes the first ``limit`` rows with ``FOR
    UPDATE SKIP LOCKED`` (concurrent claimers skip each other's rows instead of waiting); the
    best ``limit`` of those, over all classes, are set ``running`` with the next attempt, our
    lease (``now() + lease``, database clock, at most a day), the token's hash and
    ``started_at``, and one ``attempt`` row is recorded per claim. One index walk per class
    rather than ``device_class = ANY(...)``, which made PostgreSQL sort every pending row of
    the classes on each claim. The excluded runs are a filter of that walk (``run_id <>
    ALL(array)``), not a join: it steps over their pending rows, of which a coordinator keeps
    only a queue's depth. The next attempt number is one past both the trial's own counter and
    the last counted attempt in its history (one index probe per claimed row): a row put back
    to ``pending`` by hand with its counter reset would otherwise collide with its own
    history. Raises ``InsufficientPrivilege`` when ``secret`` is not this worker's.

    A confirmation (a re-measurement of a search trial) names the worker that measured the
    original in ``avoid_worker``: that worker skips it while another worker able to serve
    its class (and not standing aside from its run) has heartbeated within ``alive_s``,
    until ``avoid_until`` (then it takes it anyway). Its ``input_seed`` replaces the run
    protocol's ``seed`` in the claimed protocol, so the worker builds fresh inputs and
    records the seed with the measurement.

    ``listen_first``: send :func:`listen` before the claim, in the same round trip (a
    pipeline) but its own transaction, committed first: a batch committed after the LISTEN
    is notified, one committed before it is visible to the claim, so a worker that starts
    waiting misses nothing (``tunefleet.worker.wake``).

    Locking: the picked rows (at most ``limit`` per class; those not claimed are only locked
    for the statement), until the statement commits; nothing is held afterwards.
    """
    if limit <= 0:
        return []
    query = (
        "SELECT * FROM tunefleet.claim_trials("
        "%s, %s, %s::text[], %s, %s, %s::bigint[], %s::bigint[], %s::double precision)"
    )
    params = (
        worker_id,
        secret,
        list(device_classes),
        int(limit),
        float(lease_s),
        [int(r) for r in excluded_runs],
        [int(t) for t in skipped_trials],
        float(alive_s),
    )
    if listen_first:
        with conn.pipeline() as pipeline:
            listen(conn)
            pipeline.sync()  # the LISTEN commits before the claim takes its snapshot
            rows = conn.execute(query, params).fetchall()
    else:
        rows = conn.execute(query, params).fetchall()
    return [
        ClaimedTrial(
            trial_id=int(r["trial_id"]),
            run_id=int(r["run_id"]),
            attempt=int(r["attempt"]),
            max_attempts=int(r["max_attempts"]),
            config=dict(r["config"]),
            config_hash=str(r["config_hash"]),
            timeout_s=None if r["timeout_s"] is None else float(r["timeout_s"]),
            device_class=str(r["device_class"]),
            problem=str(r["problem"]),
            problem_args=dict(r["problem_args"] or {}),
            protocol=dict(r["protocol"] or {}),
            cache_key=str(r["cache_key"]),
            lease_token=str(r["lease_token"]),
        )
        for r in rows
    ]


def next_pending(
    conn: psycopg.Connection[Any],
    *,
    device_classes: Sequence[str],
    excluded_runs: Sequence[int] = (),
    skipped_trials: Sequence[int] = (),
) -> int | None:
    """The id of the trial a one-row :func:`claim_trials` with the same filters would take
    now (rows locked by a claim in flight are skipped the same way): after the database
    refused such a claim, the trial it is about.

    Locking: none (a read of the pending index; ``SKIP LOCKED`` needs no lock of its own here,
    so it is approximated by reading committed rows only).
    """
    row = conn.execute(
        """
        SELECT t.id FROM tunefleet.trial t
         WHERE t.state = 'pending' AND t.device_class = ANY(%(classes)s::text[])
           AND t.run_id <> ALL(%(excluded)s::bigint[])
           AND t.id <> ALL(%(skipped)s::bigint[])
         ORDER BY t.priority, t.id
         LIMIT 1
        """,
        {
            "classes": list(device_classes),
            "excluded": [int(r) for r in excluded_runs],
            "skipped": [int(t) for t in skipped_trials],
        },
    ).fetchone()
    return None if row is None else int(row["id"])


def _lease_arrays(held: Sequence[Lease]) -> tuple[list[int], list[int], list[str]]:
    # In trial id order, for readable logs and stable plans; the lock order does not depend
    # on it: the functions lock the rows ORDER BY id themselves (0010_lease_lock_order).
    held = sorted(held)
    return (
        [int(h.trial_id) for h in held],
        [int(h.attempt) for h in held],
        [str(h.token) for h in held],
    )


def heartbeat_trials(
    conn: psycopg.Connection[Any],
    *,
    worker_id: UUID,
    held: Sequence[Lease],
    lease_s: float,
) -> set[int]:
    """Extend the lease of every held claim to ``now() + lease`` (database clock;
    ``tunefleet.heartbeat_trials``); return the ids whose lease was extended. A held id
    missing from the result has lost its lease: abandon it.

    Fenced on id, attempt, lease_owner, lease token and ``state = 'running'``. Locking: the
    held rows, taken in trial id order (``ORDER BY id FOR NO KEY UPDATE``, whatever the plan),
    for the statement: the worker's release on its other session takes them in the same
    order, so the two never deadlock.
    """
    if not held:
        return set()
    ids, attempts, tokens = _lease_arrays(held)
    rows = conn.execute(
        "SELECT t AS id FROM tunefleet.heartbeat_trials(%s, %s::bigint[], %s::integer[],"
        " %s::text[], %s) AS t",
        (worker_id, ids, attempts, tokens, float(lease_s)),
    ).fetchall()
    return {int(r["id"]) for r in rows}


@dataclass(frozen=True)
class Beat:
    """What one :func:`heartbeat` did: the worker row is ``alive`` (active, the secret its
    own), ``devices`` leases were extended (1 for a worker that holds its device, 0 for one
    that lost it or never took one), and the ids of the held trials whose lease was
    extended (``kept``; a held id missing from it has lost its lease)."""

    alive: bool
    devices: int
    kept: frozenset[int]


def heartbeat(
    conn: psycopg.Connection[Any],
    *,
    worker_id: UUID,
    secret: str,
    held: Sequence[Lease],
    lease_s: float,
) -> Beat:
    """The worker's whole beat in one statement (``tunefleet.heartbeat``): extend the lease
    of every held claim to ``now() + lease`` (database clock; fenced on id, attempt,
    lease_owner, lease token and ``state = 'running'``, as :func:`heartbeat_trials`), the
    worker row's ``heartbeat_at`` (needs the secret) and the worker's device lease.

    Locking: the held trial rows in trial id order (``ORDER BY id FOR NO KEY UPDATE``), then
    the worker's own row, then its device lease row, each for the statement: the order
    every other statement that locks more than one of them keeps.
    """
    ids, attempts, tokens = _lease_arrays(held)
    row = conn.execute(
        "SELECT * FROM tunefleet.heartbeat(%s, %s, %s::bigint[], %s::integer[], %s::text[],"
        " %s::double precision)",
        (worker_id, secret, ids, attempts, tokens, float(lease_s)),
    ).fetchone()
    assert row is not None
    return Beat(
        alive=bool(row["alive"]),
        devices=int(row["devices"] or 0),
        kept=frozenset(int(i) for i in row["kept"] or ()),
    )


# --- completion and release --------------------------------------------------------------------


def complete_trial(
    conn: psycopg.Connection[Any],
    *,
    trial_id: int,
    attempt: int,
    token: str,
    worker_id: UUID,
    state: str,
    error: str | None = None,
    measurement: MeasurementRow | None = None,
    timeline: Mapping[str, float] | None = None,
) -> str | None:
    """Fenced completion of our claim (``tunefleet.complete_trial``): the trial's state
    change, the attempt row's outcome and timeline (seconds per phase,
    :mod:`tunefleet.timeline`) and (for ``done``) the measurement row, all in ONE
    statement, hence one transaction. The function copies the measurement's identity columns
    from the trial, its run and our worker row; we send only what we measured, and it refuses
    numbers that are not positive finite seconds (``InvalidParameterValue``).

    ``state`` is how the attempt ended: ``done`` (needs ``measurement``), ``invalid`` or
    ``timed_out`` (terminal), or ``failed`` (the evaluator died or raised): a failed attempt
    sends the trial back to ``pending`` while ``attempt < max_attempts`` (``cancelled`` if its
    run is no longer ``running``) and makes it ``failed`` (quarantined) after that. Returns
    the trial's new state, or ``None`` when the guard ``id, attempt, lease_owner, lease
    token, state = 'running'`` matched nothing: a zombie's result, which the caller drops
    (nothing was written).

    Locking: the trial row and its attempt row, for the statement; the run row is only read.
    """
    if state not in COMPLETION_STATES:
        allowed = ", ".join(COMPLETION_STATES)
        raise ValueError(f"completion state must be one of {allowed}, got {state!r}")
    if (state == TrialState.DONE) != (measurement is not None):
        raise ValueError("a measurement goes with state 'done' and only with it")
    m = measurement
    row = conn.execute(
        """
        SELECT tunefleet.complete_trial(
                 %s, %s, %s, %s, %s, %s, %s::double precision, %s::double precision,
                 %s::double precision[], %s::double precision, %s::double precision,
                 %s::double precision, %s::double precision, %s::jsonb, %s::double precision,
                 %s::jsonb, %s::jsonb, %s::text, %s::jsonb) AS state
        """,
        (
            worker_id,
            int(trial_id),
            int(attempt),
            token,
            state,
            error,
            m.median_s if m else None,
            m.min_s if m else None,
            [float(s) for s in m.samples_s] if m else None,
            m.gflops if m else None,
            m.gbps if m else None,
            m.flop_count if m else None,
            m.byte_count if m else None,
            Jsonb(m.protocol) if m else None,
            m.compile_s if m else None,
            Jsonb(m.validation) if m else None,
            Jsonb(m.versions) if m else None,
            m.code if m else None,
            None if timeline is None else Jsonb(dict(timeline)),
        ),
    ).fetchone()
    return None if row is None or row["state"] is None else str(row["state"])


def attempt_outcome(
    conn: psycopg.Connection[Any], *, trial_id: int, attempt: int, worker_id: UUID
) -> AttemptOutcome | None:
    """How our claim ``(trial, attempt)`` ended, if it did: lets a worker whose completion
    was sent but unacknowledged (connection lost) tell "recorded" from "fenced out".

    Locking: none (a read).
    """
    row = conn.execute(
        """
        SELECT outcome FROM tunefleet.attempt
         WHERE trial_id = %s AND attempt = %s AND worker_id = %s
         ORDER BY id DESC LIMIT 1
        """,
        (trial_id, attempt, worker_id),
    ).fetchone()
    return None if row is None or row["outcome"] is None else AttemptOutcome(row["outcome"])


def release_trials(
    conn: psycopg.Connection[Any],
    *,
    worker_id: UUID,
    held: Sequence[Lease],
    reason: str = "released by the worker at shutdown",
) -> set[int]:
    """Give held claims back (graceful shutdown; ``tunefleet.release_trials``): ``pending``
    again with the attempt not counted (``attempt - 1``), lease and token cleared, the attempt
    row marked ``released``. A trial of a run that is no longer ``running`` (stopped or
    finished meanwhile) becomes ``cancelled`` instead, so nobody measures it for nothing;
    resuming the run enqueues it again. Returns the ids released; claims no longer ours are
    left alone.

    Fenced like a completion. Locking: the held rows, taken in trial id order as the
    heartbeat takes them, then their attempt rows, for the statement; the run rows are only
    read.
    """
    if not held:
        return set()
    ids, attempts, tokens = _lease_arrays(held)
    rows = conn.execute(
        "SELECT t AS id FROM tunefleet.release_trials(%s, %s::bigint[], %s::integer[],"
        " %s::text[], %s) AS t",
        (worker_id, ids, attempts, tokens, reason),
    ).fetchall()
    return {int(r["id"]) for r in rows}


# --- standing aside ----------------------------------------------------------------------------

#: How the ``error`` of an attempt handed back after an environment fault begins.
ENVIRONMENT_PREFIX = "environment: "


def handed_back_elsewhere(
    conn: psycopg.Connection[Any], *, worker_id: UUID, trial_ids: Sequence[int]
) -> dict[int, set[str]]:
    """For each trial, the reasons other workers gave when they handed it back after an
    environment fault (``released`` attempts whose error starts with
    :data:`ENVIRONMENT_PREFIX`, the prefix stripped). An error that followed a configuration
    from another worker to this one is the configuration's, not this worker's environment.

    Locking: none (a read through the partial index on released attempts).
    """
    if not trial_ids:
        return {}
    rows = conn.execute(
        """
        SELECT trial_id, substr(error, %(skip)s) AS reason FROM tunefleet.attempt
         WHERE trial_id = ANY(%(ids)s::bigint[]) AND outcome = 'released'
           AND worker_id <> %(worker_id)s AND starts_with(error, %(prefix)s)
        """,
        {
            "ids": [int(t) for t in trial_ids],
            "worker_id": worker_id,
            "prefix": ENVIRONMENT_PREFIX,
            "skip": len(ENVIRONMENT_PREFIX) + 1,
        },
    ).fetchall()
    out: dict[int, set[str]] = {}
    for r in rows:
        out.setdefault(int(r["trial_id"]), set()).add(str(r["reason"]))
    return out


def stand_aside(
    conn: psycopg.Connection[Any], *, worker_id: UUID, secret: str, run_id: int, reason: str
) -> None:
    """Record that this worker cannot run run ``run_id``'s problem, and why (one row per
    worker and run: a second call keeps the first reason). The coordinator then no longer
    counts this worker as able to serve the run; ``status`` and the ``standing_aside`` view
    show the reason.

    Through ``tunefleet.stand_aside``, which needs the worker secret. Locking: the new row,
    for the statement (its key is this worker's own id, so no other session ever contends
    for it).
    """
    conn.execute(
        "SELECT tunefleet.stand_aside(%s, %s, %s, %s)", (worker_id, secret, int(run_id), reason)
    )


# --- the reaper --------------------------------------------------------------------------------


def reap_expired_leases(
    conn: psycopg.Connection[Any], *, limit: int = 1000
) -> list[ReapedTrial] | None:
    """Requeue running trials whose lease expired (database clock;
    ``tunefleet.reap_expired_leases``): back to ``pending`` while attempts remain, else
    ``failed`` with ``lease expired N times``; the attempt row of the expired claim ends
    ``lease_expired``. A trial whose run is no longer ``running`` becomes ``cancelled`` rather
    than ``pending`` (resuming the run enqueues it again). Returns what was reaped, or
    ``None`` when another session is reaping right now (nothing to do here then).

    Serialised across the fleet by ``pg_try_advisory_xact_lock`` inside the function (a
    second reaper does not wait, it skips). Locking: one statement holding that advisory lock
    and the expired rows (``FOR UPDATE SKIP LOCKED``, so a claim or heartbeat in flight is
    never waited on); released when it commits.
    """
    rows = conn.execute("SELECT * FROM tunefleet.reap_expired_leases(%s)", (int(limit),)).fetchall()
    if any(r["busy"] for r in rows):
        return None
    return [
        ReapedTrial(
            trial_id=int(r["trial_id"]),
            attempt=int(r["attempt"]),
            previous_owner=r["previous_owner"],
            state=str(r["state"]),
        )
        for r in rows
    ]


# --- drain -------------------------------------------------------------------------------------


# A draining worker stays while a coordinator whose heartbeat is at most COORDINATOR_ALIVE_S
# old drives a run of its classes: the queue of a live run is empty only between refills.


@dataclass(frozen=True)
class OpenWork:
    """Is there work for a worker's classes, now or soon (see :func:`open_work`)?"""

    #: In runs the worker may serve.
    servable: bool
    #: In runs it stands aside from.
    excluded: bool


def open_work(
    conn: psycopg.Connection[Any],
    device_classes: Sequence[str],
    excluded_runs: Sequence[int],
    coordinator_alive_s: float = COORDINATOR_ALIVE_S,
) -> OpenWork:
    """:func:`has_open_trials`, split by the runs a worker stands aside from: is there a
    trial pending or running, or a run driven by a live coordinator, among the runs it may
    serve, and among those it stands aside from? A worker with only the second kind cannot
    serve anything.

    Locking: none (reads through the pending and running partial indexes and the run table).
    """
    row = conn.execute(
        """
        WITH open_runs AS (
            SELECT DISTINCT run_id FROM tunefleet.trial
             WHERE state = 'pending' AND device_class = ANY(%(classes)s)
            UNION
            SELECT DISTINCT run_id FROM tunefleet.trial
             WHERE state = 'running' AND device_class = ANY(%(classes)s)
            UNION
            SELECT id FROM tunefleet.run
             WHERE state = 'running' AND device_class = ANY(%(classes)s)
               AND coordinator_id IS NOT NULL
               AND coordinator_heartbeat_at > now() - make_interval(secs => %(alive)s)
        )
        SELECT coalesce(bool_or(run_id <> ALL(%(excluded)s::bigint[])), false) AS servable,
               coalesce(bool_or(run_id = ANY(%(excluded)s::bigint[])), false) AS excluded
          FROM open_runs
        """,
        {
            "classes": list(device_classes),
            "excluded": [int(r) for r in excluded_runs],
            "alive": float(coordinator_alive_s),
        },
    ).fetchone()
    assert row is not None
    return OpenWork(servable=bool(row["servable"]), excluded=bool(row["excluded"]))


def has_open_trials(
    conn: psycopg.Connection[Any],
    device_classes: Sequence[str],
    coordinator_alive_s: float = COORDINATOR_ALIVE_S,
) -> bool:
    """Is there work for these classes, now or soon: a trial pending or running (a running
    one may come back when its lease expires), or a run of these classes still driven by a
    live coordinator (``state = 'running'``, heartbeat younger than ``coordinator_alive_s``),
    which refills the queue? A draining worker exits only when this is False.

    Locking: none (reads through the pending and running partial indexes and the run table).
    """
    row = conn.execute(
        """
        SELECT EXISTS (SELECT 1 FROM tunefleet.trial
                        WHERE state = 'pending' AND device_class = ANY(%(classes)s))
            OR EXISTS (SELECT 1 FROM tunefleet.trial
                        WHERE state = 'running' AND device_class = ANY(%(classes)s))
            OR EXISTS (SELECT 1 FROM tunefleet.run
                        WHERE state = 'running' AND device_class = ANY(%(classes)s)
                          AND coordinator_id IS NOT NULL
                          AND coordinator_heartbeat_at
                              > now() - make_interval(secs => %(alive)s)) AS open
        """,
        {"classes": list(device_classes), "alive": float(coordinator_alive_s)},
    ).fetchone()
    assert row is not None
    return bool(row["open"])
