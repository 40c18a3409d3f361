"""Every statement the worker side of the queue runs: registration, claim, lease heartbeat,
fenced completion, release, standing aside from a run, the lease reaper, the device lock and
wake-ups.

All functions take an open psycopg connection in autocommit mode (``tunefleet.db.engine
.connect``), whose session carries ``statement_timeout`` and
``idle_in_transaction_session_timeout``. Each docstring states what the statement locks and for
how long. Every statement here is short: no row lock outlives the statement (or, for the
reaper, its one small transaction), so nothing is held while a kernel compiles or runs.

Fencing: a claim hands out ``(trial id, attempt, lease_owner)``. Every later write about that
claim (heartbeat, completion, release) is guarded by all three plus ``state = 'running'``; a
write that matches no row means the claim is gone (the lease expired and somebody else may own
the trial now) and the caller must drop its work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from tunefleet.db.schema import NOTIFY_CHANNEL
from tunefleet.devices import DeviceInfo

#: Key of the transaction-level advisory lock that serialises the reaper across the fleet.
REAPER_LOCK_NAME = "tunefleet:reaper"
#: Prefix of the session-level advisory lock a worker holds on its device for its lifetime.
DEVICE_LOCK_PREFIX = "tunefleet:device"

#: A confirmation leaves its original worker alone while another worker of its class has
#: heartbeated within this many seconds (the coordinator's default liveness window).
WORKER_ALIVE_S = 60.0

#: Outcomes a worker may report for its own claim.
COMPLETION_STATES = ("done", "invalid", "failed", "timed_out")


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

    @property
    def key(self) -> tuple[int, int]:
        """The fencing token of this claim (with the worker id)."""
        return (self.trial_id, self.attempt)


@dataclass(frozen=True)
class MeasurementRow:
    """The measured numbers of a ``done`` trial; the identity columns (cache key, config,
    problem, arguments) are copied from the trial and its run inside the completion."""

    device_id: int | None
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
        """Why this row would violate the table's checks (empty when fine)."""
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
    state: str  # 'pending' (requeued) or 'failed' (attempts used up)


# --- registration ----------------------------------------------------------------------------


def register_device(conn: psycopg.Connection[Any], info: DeviceInfo) -> int:
    """Upsert the device by fingerprint; return its id.

    Locking: the unique index on ``fingerprint`` serialises two concurrent first
    registrations (one inserts, the other updates the same row); the row lock lasts the
    statement only.
    """
    row = conn.execute(
        """
        INSERT INTO tunefleet.device AS d
               (fingerprint, device_class, platform, vendor, name, driver_version,
                compute_units, global_mem_bytes, details)
        VALUES (%(fingerprint)s, %(device_class)s, %(platform)s, %(vendor)s, %(name)s,
                %(driver_version)s, %(compute_units)s, %(global_mem_bytes)s, %(details)s)
        ON CONFLICT (fingerprint) DO UPDATE
           SET details = EXCLUDED.details
        RETURNING d.id
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
) -> None:
    """Insert this worker process's row (state ``active``, heartbeat now) with the number of
    trials it holds at once (``capacity``, 1 + prefetch).

    Locking: a plain insert of a fresh UUID; no contention.
    """
    conn.execute(
        """
        INSERT INTO tunefleet.worker (id, host, pid, device_id, device_class, version, capacity)
        VALUES (%s, %s, %s, %s, %s, %s, %s)
        """,
        (worker_id, host, pid, device_id, device_class, version, int(capacity)),
    )


def heartbeat_worker(conn: psycopg.Connection[Any], worker_id: UUID) -> bool:
    """Record that the worker is alive (``heartbeat_at = now()``, database clock).

    Returns False when the row is gone or stopped. Locking: the worker's own row, for the
    statement; only this worker writes it.
    """
    row = conn.execute(
        """
        UPDATE tunefleet.worker SET heartbeat_at = now()
         WHERE id = %s AND state = 'active'
        RETURNING id
        """,
        (worker_id,),
    ).fetchone()
    return row is not None


def report_worker_sizing(
    conn: psycopg.Connection[Any],
    worker_id: UUID,
    *,
    capacity: int,
    prepare_workers: int,
    prefetch: int,
    sizing: str,
    device_busy: float | None,
    peer_alive_s: float,
) -> int:
    """Record the worker's current sizing (its ``capacity``, 1 + prefetch, is what the
    coordinator's queue depth follows) and how much of the time its device was busy; return
    how many live workers its host runs, itself included (they share the host's cores).

    Locking: the worker's own row, for the statement; the count reads the host's rows
    without locking them.
    """
    row = conn.execute(
        """
        UPDATE tunefleet.worker w
           SET capacity = %(capacity)s, prepare_workers = %(prepare_workers)s,
               prefetch = %(prefetch)s, sizing = %(sizing)s, device_busy = %(device_busy)s
         WHERE w.id = %(worker_id)s AND w.state = 'active'
        RETURNING (SELECT count(*) FROM tunefleet.worker o
                    WHERE o.host = w.host AND o.state = 'active'
                      AND (o.id = w.id
                           OR o.heartbeat_at > now() - make_interval(secs => %(alive_s)s)))
                  AS peers
        """,
        {
            "worker_id": worker_id,
            "capacity": int(capacity),
            "prepare_workers": int(prepare_workers),
            "prefetch": int(prefetch),
            "sizing": sizing,
            "device_busy": None if device_busy is None else float(device_busy),
            "alive_s": float(peer_alive_s),
        },
    ).fetchone()
    return 1 if row is None else max(int(row["peers"]), 1)


def stop_worker(conn: psycopg.Connection[Any], worker_id: UUID) -> None:
    """Mark the worker ``stopped`` (graceful exit). Locking: its own row, for the statement."""
    conn.execute(
        """
        UPDATE tunefleet.worker SET state = 'stopped', stopped_at = now(), heartbeat_at = now()
         WHERE id = %s
        """,
        (worker_id,),
    )


# --- the device lock ---------------------------------------------------------------------------


def device_lock_name(host: str, fingerprint: str, index: int) -> str:
    """Identical GPUs share a fingerprint, so the device index is part of the key."""
    return f"{DEVICE_LOCK_PREFIX}\x1f{host}\x1f{fingerprint}\x1f{int(index)}"


def try_lock_device(
    conn: psycopg.Connection[Any], *, host: str, fingerprint: str, index: int
) -> bool:
    """Take the session-level advisory lock of one device of one host, without waiting.

    Locking: ``pg_try_advisory_lock`` on a 64-bit hash of host + fingerprint + index, held by
    this *session* until :func:`unlock_device` or the connection closes (a dead worker's lock
    goes away with its connection). Advisory locks are per database: workers pointed at two
    different databases do not see each other's locks.
    """
    row = conn.execute(
        "SELECT pg_try_advisory_lock(hashtextextended(%s, 0)) AS got",
        (device_lock_name(host, fingerprint, index),),
    ).fetchone()
    assert row is not None
    return bool(row["got"])


def unlock_device(
    conn: psycopg.Connection[Any], *, host: str, fingerprint: str, index: int
) -> bool:
    """Release the device lock taken by :func:`try_lock_device` on this session."""
    row = conn.execute(
        "SELECT pg_advisory_unlock(hashtextextended(%s, 0)) AS released",
        (device_lock_name(host, fingerprint, index),),
    ).fetchone()
    assert row is not None
    return bool(row["released"])


# --- wake-ups ----------------------------------------------------------------------------------


def listen(conn: psycopg.Connection[Any]) -> None:
    """``LISTEN`` on the trial channel (autocommit: effective at once). No locks."""
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))


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
    device_classes: Sequence[str],
    limit: int,
    lease_s: float,
    excluded_runs: Sequence[int] = (),
    skipped_trials: Sequence[int] = (),
    alive_s: float = WORKER_ALIVE_S,
) -> list[ClaimedTrial]:
    """Claim up to ``limit`` pending trials of the given device classes, in
    ``priority, id`` order, skipping the runs in ``excluded_runs`` (those this worker stands
    aside from) and the trials in ``skipped_trials`` (those whose claim the database refused):
    one autocommit statement.

    For each class, a LATERAL subquery walks the partial index on pending trials
    ``(device_class, priority, id)`` in order and takes the first ``limit`` rows with ``FOR
    UPDATE SKIP LOCKED`` (concurrent claimers skip each other's rows instead of waiting); the
    best ``limit`` of those, over all classes, are set ``running`` with the next attempt
    number, our lease (``now() + lease``, database clock) and ``started_at``, and one
    ``attempt`` row is recorded per claim. One index walk per class rather than
    ``device_class = ANY(...)``, which made PostgreSQL sort every pending row of the classes
    on each claim. The excluded runs are a filter of that walk (``run_id <> ALL(array)``),
    not a join: it steps over their pending rows, of which a coordinator keeps only a queue's
    depth.

    The next attempt number is one past both the trial's own counter and the last counted
    attempt in its history (one index probe per claimed row, ``attempt_counted_unique``): a
    row put back to ``pending`` by hand with its counter reset would otherwise collide with
    its own history, and every worker claiming it would die of the unique key.

    A confirmation (a re-measurement of a search trial) names the worker that measured the
    original in ``avoid_worker``: that worker skips it while another worker able to serve
    its class (and not standing aside from its run) has heartbeated within ``alive_s``,
    until ``avoid_until`` (then it takes it anyway). Its ``input_seed`` replaces the run
    protocol's ``seed`` in the claimed protocol, so the worker builds fresh inputs and
    records the seed with the measurement.

    Locking: the picked rows (at most ``limit`` per class; those not claimed are only locked
    for the statement), until the statement commits; nothing is held afterwards.
    """
    if limit <= 0:
        return []
    rows = conn.execute(
        """
        WITH picked AS (
            SELECT p.id
              FROM (SELECT DISTINCT unnest(%(classes)s::text[])) AS c(device_class)
             CROSS JOIN LATERAL (
                   SELECT t.id, t.priority FROM tunefleet.trial t
                    WHERE t.state = 'pending' AND t.device_class = c.device_class
                      AND t.run_id <> ALL(%(excluded)s::bigint[])
                      AND t.id <> ALL(%(skipped)s::bigint[])
                      AND (t.avoid_worker IS DISTINCT FROM %(worker_id)s
                           OR t.avoid_until <= now()
                           OR NOT EXISTS (
                                SELECT 1 FROM tunefleet.worker w
                                 WHERE w.state = 'active' AND w.id <> %(worker_id)s
                                   AND w.heartbeat_at
                                       > now() - make_interval(secs => %(alive_s)s)
                                   AND (w.device_class = t.device_class
                                        OR t.device_class = 'any')
                                   AND NOT EXISTS (
                                        SELECT 1 FROM tunefleet.stand_aside s
                                         WHERE s.worker_id = w.id AND s.run_id = t.run_id)))
                    ORDER BY t.priority, t.id
                    LIMIT %(limit)s
                    FOR UPDATE SKIP LOCKED
                   ) p
             ORDER BY p.priority, p.id
             LIMIT %(limit)s
        ), claimed AS (
            UPDATE tunefleet.trial t
               SET state = 'running',
                   attempt = 1 + greatest(
                       t.attempt,
                       (SELECT max(a.attempt) FROM tunefleet.attempt a
                         WHERE a.trial_id = t.id AND a.outcome IS DISTINCT FROM 'released')),
                   lease_owner = %(worker_id)s,
                   lease_expires_at = now() + make_interval(secs => %(lease_s)s),
                   started_at = now(),
                   finished_at = NULL
              FROM picked
             WHERE t.id = picked.id
         RETURNING t.id, t.run_id, t.attempt, t.max_attempts, t.config, t.config_hash,
                   t.timeout_s, t.device_class, t.priority, t.input_seed
        ), recorded AS (
            INSERT INTO tunefleet.attempt (trial_id, attempt, worker_id)
            SELECT id, attempt, %(worker_id)s FROM claimed
        )
        SELECT c.id, c.run_id, c.attempt, c.max_attempts, c.config, c.config_hash,
               c.timeout_s, c.device_class, r.problem, r.problem_args, r.cache_key,
               CASE WHEN c.input_seed IS NULL THEN r.protocol
                    ELSE jsonb_set(r.protocol, '{seed}', to_jsonb(c.input_seed)) END
                 AS protocol
          FROM claimed c
          JOIN tunefleet.run r ON r.id = c.run_id
         ORDER BY c.priority, c.id
        """,
        {
            "classes": list(device_classes),
            "limit": int(limit),
            "worker_id": worker_id,
            "lease_s": float(lease_s),
            "excluded": [int(r) for r in excluded_runs],
            "skipped": [int(t) for t in skipped_trials],
            "alive_s": float(alive_s),
        },
    ).fetchall()
    return [
        ClaimedTrial(
            trial_id=int(r["id"]),
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


def _unnest_params(held: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    return [int(t) for t, _ in held], [int(a) for _, a in held]


def heartbeat_trials(
    conn: psycopg.Connection[Any],
    *,
    worker_id: UUID,
    held: Sequence[tuple[int, int]],
    lease_s: float,
) -> set[int]:
    """Extend the lease of every held ``(trial id, attempt)`` to ``now() + lease`` (database
    clock); return the ids whose lease was extended. A held id missing from the result has
    lost its lease: abandon it.

    Fenced on id, attempt, lease_owner and ``state = 'running'``. Locking: the held rows, for
    the statement.
    """
    if not held:
        return set()
    ids, attempts = _unnest_params(held)
    rows = conn.execute(
        """
        UPDATE tunefleet.trial t
           SET lease_expires_at = now() + make_interval(secs => %(lease_s)s)
          FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS h(id, attempt)
         WHERE t.id = h.id AND t.attempt = h.attempt
           AND t.lease_owner = %(worker_id)s AND t.state = 'running'
        RETURNING t.id
        """,
        {"ids": ids, "attempts": attempts, "worker_id": worker_id, "lease_s": float(lease_s)},
    ).fetchall()
    return {int(r["id"]) for r in rows}


# --- completion and release --------------------------------------------------------------------


def complete_trial(
    conn: psycopg.Connection[Any],
    *,
    trial_id: int,
    attempt: int,
    worker_id: UUID,
    state: str,
    error: str | None = None,
    measurement: MeasurementRow | None = None,
) -> str | None:
    """Fenced completion of our claim: the trial's state change, the attempt row's outcome and
    (for ``done``) the measurement row, all in ONE statement, hence one transaction.

    ``state`` is how the attempt ended: ``done`` (needs ``measurement``), ``invalid`` or
    ``timed_out`` (terminal), or ``failed`` (the evaluator died or raised): a failed attempt
    sends the trial back to ``pending`` while ``attempt < max_attempts`` (``cancelled`` if its
    run is no longer ``running``) and makes it ``failed`` (quarantined) after that. Returns
    the trial's new state, or ``None`` when the guard ``id, attempt, lease_owner,
    state = 'running'`` matched nothing: a zombie's result, which the caller drops (nothing
    was written).

    Locking: the trial row and its attempt row, for the statement; the run row is only read.
    """
    if state not in COMPLETION_STATES:
        raise ValueError(f"completion state must be one of {COMPLETION_STATES}, got {state!r}")
    if (state == "done") != (measurement is not None):
        raise ValueError("a measurement goes with state 'done' and only with it")
    m = measurement
    params: dict[str, Any] = {
        "trial_id": int(trial_id),
        "attempt": int(attempt),
        "worker_id": worker_id,
        "state": state,
        "error": error,
        "with_measurement": m is not None,
        "device_id": m.device_id if m else None,
        "median_s": m.median_s if m else None,
        "min_s": m.min_s if m else None,
        "samples_s": [float(s) for s in m.samples_s] if m else None,
        "gflops": m.gflops if m else None,
        "gbps": m.gbps if m else None,
        "flop_count": m.flop_count if m else None,
        "byte_count": m.byte_count if m else None,
        "protocol": Jsonb(m.protocol) if m else None,
        "compile_s": m.compile_s if m else None,
        "validation": Jsonb(m.validation) if m else None,
        "versions": Jsonb(m.versions) if m else None,
        "code": m.code if m else None,
    }
    row = conn.execute(
        """
        WITH ended AS (
            UPDATE tunefleet.trial t
               SET state = CASE WHEN %(state)s::text <> 'failed' OR t.attempt >= t.max_attempts
                                THEN %(state)s::text
                                WHEN r.state = 'running' THEN 'pending'
                                ELSE 'cancelled' END,
                   lease_owner = CASE WHEN %(state)s = 'failed' AND t.attempt < t.max_attempts
                                      THEN NULL ELSE t.lease_owner END,
                   finished_at = CASE WHEN %(state)s = 'failed' AND t.attempt < t.max_attempts
                                       AND r.state = 'running'
                                      THEN NULL ELSE now() END,
                   lease_expires_at = NULL,
                   error = %(error)s
              FROM tunefleet.run r
             WHERE t.id = %(trial_id)s AND t.attempt = %(attempt)s AND r.id = t.run_id
               AND t.lease_owner = %(worker_id)s AND t.state = 'running'
         RETURNING t.id, t.run_id, t.attempt, t.state, t.config, t.config_hash
        ), recorded AS (
            UPDATE tunefleet.attempt a
               SET ended_at = now(), outcome = %(state)s, error = %(error)s
              FROM ended
             WHERE a.trial_id = ended.id AND a.attempt = ended.attempt
               AND a.worker_id = %(worker_id)s AND a.ended_at IS NULL
        ), measured AS (
            INSERT INTO tunefleet.measurement
                   (trial_id, run_id, attempt, cache_key, config_hash, problem, problem_args,
                    config, device_id, worker_id, median_s, min_s, samples_s, gflops, gbps,
                    flop_count, byte_count, protocol, compile_s, validation, versions, code)
            SELECT ended.id, ended.run_id, ended.attempt, r.cache_key, ended.config_hash,
                   r.problem, r.problem_args, ended.config, %(device_id)s::bigint,
                   %(worker_id)s::uuid, %(median_s)s::double precision,
                   %(min_s)s::double precision, %(samples_s)s::double precision[],
                   %(gflops)s::double precision, %(gbps)s::double precision,
                   %(flop_count)s::double precision, %(byte_count)s::double precision,
                   %(protocol)s::jsonb, %(compile_s)s::double precision,
                   coalesce(%(validation)s::jsonb, '{}'::jsonb),
                   coalesce(%(versions)s::jsonb, '{}'::jsonb), %(code)s::text
              FROM ended
              JOIN tunefleet.run r ON r.id = ended.run_id
             WHERE %(with_measurement)s
        )
        SELECT state FROM ended
        """,
        params,
    ).fetchone()
    return None if row is None else str(row["state"])


def attempt_outcome(
    conn: psycopg.Connection[Any], *, trial_id: int, attempt: int, worker_id: UUID
) -> str | None:
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
    return None if row is None or row["outcome"] is None else str(row["outcome"])


def release_trials(
    conn: psycopg.Connection[Any],
    *,
    worker_id: UUID,
    held: Sequence[tuple[int, int]],
    reason: str = "released by the worker at shutdown",
) -> set[int]:
    """Give held claims back (graceful shutdown, or an environment fault of this worker):
    ``pending`` again with the attempt not counted (``attempt - 1``), lease cleared, the
    attempt row marked ``released`` with ``reason``. A trial of a run that is no longer
    ``running`` (stopped or finished meanwhile) becomes ``cancelled`` instead, so nobody
    measures it for nothing; resuming the run enqueues it again. Returns the ids released;
    claims no longer ours are left alone.

    Fenced like a completion. Locking: the held rows and their attempt rows, for the
    statement; the run rows are only read.
    """
    if not held:
        return set()
    ids, attempts = _unnest_params(held)
    rows = conn.execute(
        """
        WITH given AS (
            UPDATE tunefleet.trial t
               SET state = CASE WHEN r.state = 'running' THEN 'pending' ELSE 'cancelled' END,
                   finished_at = CASE WHEN r.state = 'running' THEN NULL ELSE now() END,
                   attempt = t.attempt - 1, lease_owner = NULL,
                   lease_expires_at = NULL, started_at = NULL
              FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS h(id, attempt),
                   tunefleet.run r
             WHERE t.id = h.id AND t.attempt = h.attempt AND r.id = t.run_id
               AND t.lease_owner = %(worker_id)s AND t.state = 'running'
         RETURNING t.id, h.attempt
        ), recorded AS (
            UPDATE tunefleet.attempt a
               SET ended_at = now(), outcome = 'released', error = %(reason)s
              FROM given
             WHERE a.trial_id = given.id AND a.attempt = given.attempt
               AND a.worker_id = %(worker_id)s AND a.ended_at IS NULL
        )
        SELECT id FROM given
        """,
        {
            "ids": ids,
            "attempts": attempts,
            "worker_id": worker_id,
            "reason": reason,
        },
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
    conn: psycopg.Connection[Any], *, worker_id: UUID, run_id: int, reason: str
) -> None:
    """Record that this worker cannot run run ``run_id``'s problem, and why (one row per
    worker and run: a second call keeps the first reason). The coordinator then no longer
    counts this worker as able to serve the run; ``status`` and the ``standing_aside`` view
    show the reason.

    Locking: the new row, for the statement (its key is this worker's own id, so no other
    session ever contends for it).
    """
    conn.execute(
        """
        INSERT INTO tunefleet.stand_aside (worker_id, run_id, reason)
        VALUES (%s, %s, %s)
        ON CONFLICT (worker_id, run_id) DO NOTHING
        """,
        (worker_id, int(run_id), reason),
    )


# --- the reaper --------------------------------------------------------------------------------


def reap_expired_leases(
    conn: psycopg.Connection[Any], *, limit: int = 1000
) -> list[ReapedTrial] | None:
    """Requeue running trials whose lease expired (database clock): back to ``pending`` while
    attempts remain, else ``failed`` with ``lease expired N times``; the attempt row of the
    expired claim ends ``lease_expired``. A trial whose run is no longer ``running`` becomes
    ``cancelled`` rather than ``pending`` (resuming the run enqueues it again). Returns what was
    reaped, or ``None`` when another session is reaping right now (nothing to do here then).

    Serialised across the fleet by ``pg_try_advisory_xact_lock`` (a second reaper does not
    wait, it skips). Locking: one short transaction holding that advisory lock and the expired
    rows (``FOR UPDATE SKIP LOCKED``, so a claim or heartbeat in flight is never waited on);
    released at commit.
    """
    with conn.transaction():
        got = conn.execute(
            "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0)) AS got",
            (REAPER_LOCK_NAME,),
        ).fetchone()
        if got is None or not got["got"]:
            return None
        rows = conn.execute(
            """
            WITH expired AS (
                SELECT id, run_id, attempt, max_attempts, lease_owner FROM tunefleet.trial
                 WHERE state = 'running' AND lease_expires_at < now()
                 ORDER BY lease_expires_at
                 LIMIT %(limit)s
                 FOR UPDATE SKIP LOCKED
            ), counted AS (
                SELECT e.id, e.attempt, e.lease_owner,
                       1 + (SELECT count(*) FROM tunefleet.attempt a
                             WHERE a.trial_id = e.id AND a.outcome = 'lease_expired')
                         AS expiries,
                       CASE WHEN e.attempt >= e.max_attempts THEN 'failed'
                            WHEN r.state = 'running' THEN 'pending'
                            ELSE 'cancelled' END AS next_state
                  FROM expired e
                  JOIN tunefleet.run r ON r.id = e.run_id
            ), requeued AS (
                UPDATE tunefleet.trial t
                   SET state = c.next_state,
                       lease_owner = CASE WHEN c.next_state = 'failed'
                                          THEN t.lease_owner END,
                       finished_at = CASE WHEN c.next_state <> 'pending' THEN now() END,
                       lease_expires_at = NULL,
                       error = CASE WHEN c.next_state = 'failed'
                                    THEN format('lease expired %%s times', c.expiries)
                                    ELSE format('lease expired on attempt %%s', t.attempt) END
                  FROM counted c
                 WHERE t.id = c.id
             RETURNING t.id, t.state, c.attempt, c.lease_owner
            ), recorded AS (
                UPDATE tunefleet.attempt a
                   SET ended_at = now(), outcome = 'lease_expired',
                       error = 'lease expired (worker stopped heartbeating)'
                  FROM requeued q
                 WHERE a.trial_id = q.id AND a.attempt = q.attempt
                   AND a.worker_id = q.lease_owner AND a.ended_at IS NULL
            )
            SELECT id, attempt, lease_owner, state FROM requeued ORDER BY id
            """,
            {"limit": int(limit)},
        ).fetchall()
    return [
        ReapedTrial(
            trial_id=int(r["id"]),
            attempt=int(r["attempt"]),
            previous_owner=r["lease_owner"],
            state=str(r["state"]),
        )
        for r in rows
    ]


# --- drain -------------------------------------------------------------------------------------


#: A draining worker stays while a coordinator whose heartbeat is at most this old (seconds)
#: drives a run of its classes: the queue of a live run is empty only between refills.
COORDINATOR_ALIVE_S = 30.0


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
