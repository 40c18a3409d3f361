"""Every SQL statement of the coordinator: runs, ownership, trial insertion, outcomes, the
cross-run cache, stop and resume reads, warm-start seeds.

One function per statement; each takes an open autocommit psycopg connection
(``tunefleet.db.engine.connect``), so each statement is its own short transaction. What the
coordinator's loop reads comes back as the frozen row types below (``class_row``), built here
at the query boundary, so the engine never fills in or fakes a column; the readers outside the
loop (budget edits, tests) get dict rows. Locking is
stated per function. Only the coordinator that holds a run's advisory lock
(:func:`try_lock_run`) writes that run's trials, which is why no statement here needs a row
lock held across statements.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from tunefleet.devices import DeviceLimits
from tunefleet.vocabulary import NOTIFY_CHANNEL, RunState, TrialPurpose, TrialSource, TrialState

Row = dict[str, Any]
Conn = psycopg.Connection[Any]

#: First key of the two-key advisory lock that marks a run as driven (second key: run id).
#: The two-key form never collides with single-key advisory locks used elsewhere.
RUN_LOCK_NAMESPACE = 0x7466  # "tf"


# --- the rows the coordinator's loop reads ---------------------------------------------------
@dataclass(frozen=True)
class DrivenRun:
    """The run as :func:`take_run` leaves it: what a coordinator needs to drive it."""

    coordinator_id: uuid.UUID
    problem: str
    problem_args: dict[str, Any]
    space: dict[str, Any]
    device_class: str
    protocol: dict[str, Any]
    cache_key: str
    search: dict[str, Any]
    max_trials: int | None
    max_seconds: float | None
    target_gflops: float | None
    patience: int | None
    #: The run's age in seconds on the database clock.
    elapsed_s: float


@dataclass(frozen=True)
class RunOwner:
    """Who drives the run, and how it stands (:func:`run_owner`)."""

    state: str
    stop_reason: str | None
    coordinator_id: uuid.UUID | None
    coordinator_heartbeat_at: datetime | None


@dataclass(frozen=True)
class RunBeat:
    """The run's state and age after its coordinator's heartbeat (:func:`heartbeat_run`)."""

    state: str
    stop_reason: str | None
    elapsed_s: float


@dataclass(frozen=True)
class StandingAside:
    """A live worker that stands aside from the run (:func:`standing_aside`)."""

    worker_id: uuid.UUID
    host: str
    reason: str


@dataclass(frozen=True)
class WarmStart:
    """A configuration measured on another device class (:func:`warm_start_configs`)."""

    config: dict[str, Any]
    config_hash: str
    median_s: float


@dataclass(frozen=True)
class TrialOutcome:
    """A finished trial as the coordinator learns it: from the queue (:func:`fetch_unreported`,
    :func:`reported_outcomes`) or answered at once when enqueued (a cache hit, an illegal or
    known-invalid configuration). The numbers are those of its measurement (None without one)."""

    id: int
    config: dict[str, Any]
    config_hash: str
    state: TrialState
    #: ``search``, ``seed`` or ``cache`` (answered from another run's measurement or verdict).
    source: TrialSource
    #: ``search``, or ``confirm`` for a re-measurement of ``confirms_trial_id``.
    purpose: TrialPurpose
    median_s: float | None
    gflops: float | None
    compile_s: float | None
    error: str | None
    confirms_trial_id: int | None
    #: Claims so far (0: no worker ever saw it).
    attempt: int = 0

    def __post_init__(self) -> None:
        # The columns are text; the loop compares members of the vocabulary.
        object.__setattr__(self, "state", TrialState(self.state))
        object.__setattr__(self, "source", TrialSource(self.source))
        object.__setattr__(self, "purpose", TrialPurpose(self.purpose))

    @property
    def ruled_out(self) -> bool:
        """Rejected by the problem's own rules before any worker saw it (``invalid``, never
        claimed, not a verdict of the cache): it costs the run no evaluation. The
        coordinator's copy of the ``results.ruled_out`` view column."""
        return (
            self.state is TrialState.INVALID
            and self.attempt == 0
            and self.source is not TrialSource.CACHE
        )


@dataclass(frozen=True)
class InFlight:
    """A pending or running trial of the run (:func:`in_flight_trials`)."""

    id: int
    config: dict[str, Any]
    config_hash: str
    state: str
    purpose: TrialPurpose
    confirms_trial_id: int | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "purpose", TrialPurpose(self.purpose))


@dataclass(frozen=True)
class Queued:
    """A trial now pending (:func:`insert_trials`)."""

    id: int
    config_hash: str


@dataclass(frozen=True)
class KnownInvalid:
    """The earliest ``invalid`` verdict on a configuration under the same cache key, in
    another run (:func:`known_invalid`)."""

    config_hash: str
    config: dict[str, Any]
    error: str | None
    run_id: int


@dataclass(frozen=True)
class RunBest:
    """The run's best as ``best_per_run`` ranks it, with its confirmation's figures."""

    trial_id: int
    config: dict[str, Any]
    source: str
    median_s: float
    min_s: float | None
    gflops: float | None
    gbps: float | None
    confirmed: bool
    confirm_trial_id: int | None
    confirmed_median_s: float | None
    confirmed_gflops: float | None
    spread: float | None
    noise: float | None
    disagrees: bool | None
    agreement_p: float | None
    noisy: bool | None
    same_source: bool | None = None
    #: The verdict across processes (``tunefleet.spread``; None until judged), the run's
    #: between-process spread and the runner-up the best could not be told apart from.
    standing: str | None = None
    figure_s: float | None = None
    figure_gflops: float | None = None
    processes: int | None = None
    spread_tolerance: float | None = None
    spread_typical: float | None = None
    unseparated_trial_id: int | None = None
    #: The run's within-process noise (``run.spread_within``; None: not judged).
    spread_within: float | None = None


@dataclass(frozen=True)
class ConfirmCandidate:
    """One of the run's best search trials, with what a confirmation of it needs
    (:func:`confirmation_candidates`)."""

    trial_id: int
    config: dict[str, Any]
    config_hash: str
    #: The worker that measured it, and the input seed it was measured with (None: the
    #: protocol's default).
    worker_id: uuid.UUID | None
    median_s: float
    input_seed: int | None
    confirm_trial_id: int | None
    confirm_state: str | None


@dataclass(frozen=True)
class QueuedConfirmation:
    """A confirmation now pending (:func:`insert_confirmations`)."""

    id: int
    confirms_trial_id: int


# --- runs -------------------------------------------------------------------------------------
def insert_run(
    conn: Conn,
    *,
    problem: str,
    problem_args: Mapping[str, Any],
    space: Mapping[str, Any],
    device_class: str,
    protocol: Mapping[str, Any],
    cache_key: str,
    search: Mapping[str, Any],
    name: str | None = None,
    max_trials: int | None = None,
    max_seconds: float | None = None,
    target_gflops: float | None = None,
    patience: int | None = None,
) -> int:
    """Create a run in state ``running`` and return its id. Locks: the new row only."""
    row = conn.execute(
        """
        INSERT INTO tunefleet.run (name, problem, problem_args, space, device_class, protocol,
                                   cache_key, search, max_trials, max_seconds, target_gflops,
                                   patience)
        VALUES (%(name)s, %(problem)s, %(args)s, %(space)s, %(device_class)s, %(protocol)s,
                %(cache_key)s, %(search)s, %(max_trials)s, %(max_seconds)s, %(target)s,
                %(patience)s)
        RETURNING id
        """,
        {
            "name": name,
            "problem": problem,
            "args": Jsonb(dict(problem_args)),
            "space": Jsonb(dict(space)),
            "device_class": device_class,
            "protocol": Jsonb(dict(protocol)),
            "cache_key": cache_key,
            "search": Jsonb(dict(search)),
            "max_trials": max_trials,
            "max_seconds": max_seconds,
            "target": target_gflops,
            "patience": patience,
        },
    ).fetchone()
    assert row is not None
    return int(row["id"])


def get_run(conn: Conn, run_id: int) -> Row | None:
    """The run row plus its age in seconds on the database clock. Locks: none."""
    row: Row | None = conn.execute(
        """
        SELECT r.*, extract(epoch FROM now() - r.created_at)::float8 AS elapsed_s
          FROM tunefleet.run r
         WHERE r.id = %s
        """,
        (run_id,),
    ).fetchone()
    return row


def run_owner(conn: Conn, run_id: int) -> RunOwner | None:
    """The run's state and the coordinator that drives it, for taking it over or noticing it
    was ended from outside. Locks: none."""
    cur = conn.cursor(row_factory=class_row(RunOwner))
    return cur.execute(
        """
        SELECT state, stop_reason, coordinator_id, coordinator_heartbeat_at
          FROM tunefleet.run
         WHERE id = %s
        """,
        (run_id,),
    ).fetchone()


def try_lock_run(conn: Conn, run_id: int) -> bool:
    """Take the session-level advisory lock that says "this run is driven".

    Locks: advisory lock (RUN_LOCK_NAMESPACE, run_id) held by this *session* until
    :func:`unlock_run` or the connection closes (a killed coordinator's lock goes with its
    connection). Never waits: False when another session holds it."""
    row = conn.execute(
        "SELECT pg_try_advisory_lock(%s, %s) AS locked",
        (RUN_LOCK_NAMESPACE, _lock_key(run_id)),
    ).fetchone()
    return bool(row and row["locked"])


def unlock_run(conn: Conn, run_id: int) -> None:
    """Release the run's advisory lock taken by this session. Locks: releases it."""
    conn.execute("SELECT pg_advisory_unlock(%s, %s)", (RUN_LOCK_NAMESPACE, _lock_key(run_id)))


def _lock_key(run_id: int) -> int:
    # The two-key form takes int4 keys; ids beyond 2**31 wrap (collisions need 2**31 runs).
    return run_id % 2_147_483_647


def take_run(
    conn: Conn,
    run_id: int,
    coordinator_id: uuid.UUID,
    *,
    max_trials: int | None = None,
    max_seconds: float | None = None,
    target_gflops: float | None = None,
    patience: int | None = None,
) -> DrivenRun | None:
    """Mark the run as driven by ``coordinator_id`` (state ``running``, stop reason cleared,
    heartbeat now) and replace any budget value given. Call only while holding
    :func:`try_lock_run`. Locks: the run row, for this statement. None if no such run."""
    cur = conn.cursor(row_factory=class_row(DrivenRun))
    return cur.execute(
        """
        UPDATE tunefleet.run
           SET coordinator_id = %(coordinator)s,
               coordinator_heartbeat_at = now(),
               state = 'running',
               stop_reason = NULL,
               finished_at = NULL,
               max_trials = coalesce(%(max_trials)s, max_trials),
               max_seconds = coalesce(%(max_seconds)s, max_seconds),
               target_gflops = coalesce(%(target)s, target_gflops),
               patience = coalesce(%(patience)s, patience)
         WHERE id = %(run)s
        RETURNING coordinator_id, problem, problem_args, space, device_class, protocol,
                  cache_key, search, max_trials, max_seconds, target_gflops, patience,
                  extract(epoch FROM now() - created_at)::float8 AS elapsed_s
        """,
        {
            "coordinator": coordinator_id,
            "run": run_id,
            "max_trials": max_trials,
            "max_seconds": max_seconds,
            "target": target_gflops,
            "patience": patience,
        },
    ).fetchone()


def heartbeat_run(conn: Conn, run_id: int, coordinator_id: uuid.UUID) -> RunBeat | None:
    """Refresh the coordinator heartbeat; return the run's state and age (seconds, database
    clock). None when the run is gone or another coordinator took it over.
    Locks: the run row, for this statement."""
    cur = conn.cursor(row_factory=class_row(RunBeat))
    return cur.execute(
        """
        UPDATE tunefleet.run
           SET coordinator_heartbeat_at = now()
         WHERE id = %s AND coordinator_id = %s
        RETURNING state, stop_reason, extract(epoch FROM now() - created_at)::float8 AS elapsed_s
        """,
        (run_id, coordinator_id),
    ).fetchone()


def finish_run(
    conn: Conn,
    run_id: int,
    coordinator_id: uuid.UUID,
    stop_reason: str,
    state: str = RunState.FINISHED,
) -> bool:
    """Mark the run ``finished`` (a stop rule) or ``stopped`` (by the user; resumable) with its
    reason, and let go of it (coordinator_id cleared). Only the driving coordinator can.
    Locks: the run row, for this statement."""
    row = conn.execute(
        """
        UPDATE tunefleet.run
           SET state = %s, stop_reason = %s, finished_at = now(), coordinator_id = NULL
         WHERE id = %s AND coordinator_id = %s
        RETURNING id
        """,
        (state, stop_reason, run_id, coordinator_id),
    ).fetchone()
    return row is not None


# --- workers and the queue ------------------------------------------------------------------
class LiveWorkers(NamedTuple):
    """The live workers able to serve a run, and how many trials they hold at most."""

    workers: int
    capacity: int


def count_live_workers(
    conn: Conn, device_class: str, alive_s: float, run_id: int | None = None
) -> LiveWorkers:
    """Active workers able to serve runs of ``device_class`` whose heartbeat is younger than
    ``alive_s`` (every active worker for class ``any``), with their summed capacity. With
    ``run_id``, a worker standing aside from that run does not count: it will not claim it.
    Locks: none (worker_active_idx, then the stand_aside primary key per worker)."""
    row = conn.execute(
        """
        SELECT count(*) AS n, coalesce(sum(w.capacity), 0) AS capacity
          FROM tunefleet.worker w
         WHERE w.state = 'active'
           AND w.heartbeat_at > now() - make_interval(secs => %(alive)s)
           AND (w.device_class = %(class)s OR %(class)s = 'any')
           AND NOT EXISTS (SELECT 1 FROM tunefleet.stand_aside s
                            WHERE s.worker_id = w.id AND s.run_id = %(run)s::bigint)
        """,
        {"class": device_class, "alive": alive_s, "run": run_id},
    ).fetchone()
    return LiveWorkers(int(row["n"]), int(row["capacity"])) if row else LiveWorkers(0, 0)


def device_limits(conn: Conn, device_class: str) -> DeviceLimits | None:
    """The limits every registered device of ``device_class`` allows (the loosest of their
    registrations: :meth:`~tunefleet.devices.DeviceLimits.loosest`), or ``None`` while none
    is registered. Devices stay registered after their workers leave, so a run resumed
    without workers still knows them. Locks: none (a scan of the small device table)."""
    rows = conn.execute(
        "SELECT details FROM tunefleet.device WHERE device_class = %s", (device_class,)
    ).fetchall()
    # A row whose details are not an object tells no limit: DeviceLimits.loosest then knows
    # none, rather than trust the other rows' tighter ones.
    return DeviceLimits.loosest(
        row["details"] if isinstance(row["details"], dict) else {} for row in rows
    )


def standing_aside(conn: Conn, run_id: int, alive_s: float) -> list[StandingAside]:
    """The live workers standing aside from the run, earliest first.
    Locks: none (stand_aside_run_idx)."""
    cur = conn.cursor(row_factory=class_row(StandingAside))
    return cur.execute(
        """
        SELECT s.worker_id, w.host, s.reason
          FROM tunefleet.stand_aside s
          JOIN tunefleet.worker w ON w.id = s.worker_id
         WHERE s.run_id = %(run)s AND w.state = 'active'
           AND w.heartbeat_at > now() - make_interval(secs => %(alive)s)
         ORDER BY s.at, s.worker_id
        """,
        {"run": run_id, "alive": alive_s},
    ).fetchall()


def live_worker_classes(conn: Conn, alive_s: float) -> list[str]:
    """Device classes of the live workers, for choosing a run's default class. Locks: none."""
    rows = conn.execute(
        """
        SELECT DISTINCT device_class
          FROM tunefleet.worker
         WHERE state = 'active' AND heartbeat_at > now() - make_interval(secs => %s)
         ORDER BY device_class
        """,
        (alive_s,),
    ).fetchall()
    return [r["device_class"] for r in rows]


def queue_depth(conn: Conn, run_id: int) -> int:
    """Pending plus running trials of the run. Locks: none (trial_run_state_idx)."""
    row = conn.execute(
        """
        SELECT count(*) AS n FROM tunefleet.trial
         WHERE run_id = %s AND state IN ('pending', 'running')
        """,
        (run_id,),
    ).fetchone()
    return int(row["n"]) if row else 0


def insert_trials(
    conn: Conn,
    run_id: int,
    device_class: str,
    trials: Sequence[Mapping[str, Any]],
    *,
    timeout_s: float | None = None,
    max_attempts: int = 3,
) -> list[Queued]:
    """Enqueue configurations as pending trials of the run, then one
    ``NOTIFY tunefleet_trials, <device_class>`` for the whole batch (delivered at commit,
    i.e. when this statement ends; PostgreSQL folds repeats within a transaction into one).

    ``trials`` items: ``config``, ``config_hash``, ``source`` (``search`` or ``seed``).
    A configuration the run already has is left alone, except a ``cancelled`` one (from an
    earlier stop), which is queued again with its attempt history. Returns the rows now
    pending. Locks: the inserted/revived rows, for this
    statement; conflicting rows are only read."""
    if not trials:
        return []
    payload = [
        {"config": t["config"], "config_hash": t["config_hash"], "source": t.get("source")}
        for t in trials
    ]
    cur = conn.cursor(row_factory=class_row(Queued))
    return cur.execute(
        """
        WITH ins AS (
            INSERT INTO tunefleet.trial AS t
                   (run_id, device_class, config, config_hash, source, timeout_s, max_attempts)
            SELECT %(run)s, %(class)s, c.config, c.config_hash, coalesce(c.source, 'search'),
                   %(timeout)s, %(attempts)s
              FROM jsonb_to_recordset(%(trials)s) AS c(config jsonb, config_hash text,
                                                       source text)
            ON CONFLICT (run_id, config_hash) WHERE purpose = 'search' DO UPDATE
               SET state = 'pending', timeout_s = excluded.timeout_s, finished_at = NULL,
                   reported = false, error = NULL,
                   max_attempts = greatest(t.max_attempts, t.attempt + 1)
             WHERE t.state = 'cancelled'
            RETURNING t.id, t.config_hash
        ), wake AS (
            SELECT pg_notify(%(channel)s, %(class)s) FROM (SELECT 1 FROM ins LIMIT 1) AS one
        )
        SELECT ins.id, ins.config_hash FROM ins LEFT JOIN wake ON true
        """,
        {
            "run": run_id,
            "class": device_class,
            "timeout": timeout_s,
            "attempts": max_attempts,
            "trials": Jsonb(payload),
            "channel": NOTIFY_CHANNEL,
        },
    ).fetchall()


def insert_cached_trials(
    conn: Conn,
    run_id: int,
    device_class: str,
    cache_key: str,
    config_hashes: Sequence[str],
) -> list[TrialOutcome]:
    """The cache: for each hash already measured under ``cache_key`` (same problem,
    arguments, device class and protocol) in any run, or imported, insert the run's trial
    directly as
    ``done`` / source ``cache`` / reported, with a copy of the earliest such measurement
    linked to it so every view shows its numbers. Such trials never reach the queue.
    A ``cancelled`` trial of the run is answered the same way. Only rows the queue produced
    answer (``source`` ``measured``: a lease holder's completion, or a copy of one) or that
    an import made (``imported``); an ``unverified`` row never does.

    Returns one outcome per cache hit (state ``done``, source ``cache``). Locks: the
    inserted rows, for this statement; measurements are only read (measurement_cache_idx)."""
    if not config_hashes:
        return []
    cur = conn.cursor(row_factory=class_row(TrialOutcome))
    return cur.execute(
        """
        WITH hit AS (
            SELECT DISTINCT ON (m.config_hash) m.*
              FROM tunefleet.measurement m
             WHERE m.cache_key = %(key)s AND m.config_hash = ANY(%(hashes)s)
               AND m.source IN ('measured', 'imported')
             ORDER BY m.config_hash, m.id
        ), ins AS (
            INSERT INTO tunefleet.trial AS t
                   (run_id, device_class, config, config_hash, state, source, reported,
                    started_at, finished_at)
            SELECT %(run)s, %(class)s, hit.config, hit.config_hash, 'done', 'cache', true,
                   now(), now()
              FROM hit
            ON CONFLICT (run_id, config_hash) WHERE purpose = 'search' DO UPDATE
               SET state = 'done', source = 'cache', reported = true, finished_at = now(),
                   error = NULL
             WHERE t.state = 'cancelled'
            RETURNING t.id, t.config_hash
        ), copy AS (
            INSERT INTO tunefleet.measurement
                   (trial_id, run_id, attempt, cache_key, config_hash, problem, problem_args,
                    config, device_id, worker_id, median_s, min_s, samples_s, gflops, gbps,
                    flop_count, byte_count, protocol, compile_s, validation, versions, code,
                    source, created_at)
            SELECT ins.id, %(run)s, NULL, hit.cache_key, hit.config_hash, hit.problem,
                   hit.problem_args, hit.config, hit.device_id, hit.worker_id, hit.median_s,
                   hit.min_s, hit.samples_s, hit.gflops, hit.gbps, hit.flop_count,
                   hit.byte_count, hit.protocol, hit.compile_s, hit.validation, hit.versions,
                   hit.code, hit.source, hit.created_at
              FROM ins JOIN hit USING (config_hash)
            RETURNING trial_id, config_hash, config, median_s, gflops, compile_s
        )
        SELECT trial_id AS id, config, config_hash, 'done' AS state, 'cache' AS source,
               'search' AS purpose, median_s, gflops, compile_s, NULL::text AS error,
               NULL::bigint AS confirms_trial_id
          FROM copy
        """,
        {
            "key": cache_key,
            "hashes": list(config_hashes),
            "run": run_id,
            "class": device_class,
        },
    ).fetchall()


def known_invalid(
    conn: Conn, run_id: int, cache_key: str, config_hashes: Sequence[str]
) -> list[KnownInvalid]:
    """Configurations a worker already found ``invalid`` under ``cache_key`` (same problem,
    arguments, device class and protocol) in another run: an illegal configuration stays
    illegal, so the cache answers them like measurements. One row per hash, the earliest
    verdict. Read-only, no locks
    (run_cache_key_idx, then each run's (run_id, config_hash) key)."""
    if not config_hashes:
        return []
    cur = conn.cursor(row_factory=class_row(KnownInvalid))
    return cur.execute(
        """
        SELECT DISTINCT ON (t.config_hash) t.config_hash, t.config, t.error, t.run_id
          FROM tunefleet.run r
          JOIN tunefleet.trial t ON t.run_id = r.id
         WHERE r.cache_key = %(key)s AND r.id <> %(run)s
           AND t.config_hash = ANY(%(hashes)s) AND t.state = 'invalid'
           AND t.purpose = 'search'
         ORDER BY t.config_hash, t.id
        """,
        {"key": cache_key, "run": run_id, "hashes": list(config_hashes)},
    ).fetchall()


def insert_invalid_trials(
    conn: Conn, run_id: int, device_class: str, trials: Sequence[Mapping[str, Any]]
) -> list[TrialOutcome]:
    """Record configurations the coordinator already knows to be illegal (the problem's
    device-free rules rejected them) as ``invalid`` trials, reported, never queued.

    ``trials`` items: ``config``, ``config_hash``, ``source``, ``error``. A configuration the
    run already has is left alone, except a ``cancelled`` one. Returns the outcomes written
    (state ``invalid``, no numbers). Locks: those rows, for this
    statement."""
    if not trials:
        return []
    payload = [
        {
            "config": t["config"],
            "config_hash": t["config_hash"],
            "source": t.get("source"),
            "error": t["error"],
        }
        for t in trials
    ]
    cur = conn.cursor(row_factory=class_row(TrialOutcome))
    return cur.execute(
        """
        INSERT INTO tunefleet.trial AS t
               (run_id, device_class, config, config_hash, state, source, reported,
                started_at, finished_at, error)
        SELECT %(run)s, %(class)s, c.config, c.config_hash, 'invalid',
               coalesce(c.source, 'search'), true, now(), now(), c.error
          FROM jsonb_to_recordset(%(trials)s) AS c(config jsonb, config_hash text,
                                                   source text, error text)
        ON CONFLICT (run_id, config_hash) WHERE purpose = 'search' DO UPDATE
           SET state = 'invalid', reported = true, finished_at = now(), error = excluded.error
         WHERE t.state = 'cancelled'
        RETURNING t.id, t.config, t.config_hash, t.state, t.source, t.purpose,
                  NULL::float8 AS median_s, NULL::float8 AS gflops, NULL::float8 AS compile_s,
                  t.error, t.confirms_trial_id, t.attempt
        """,
        {"run": run_id, "class": device_class, "trials": Jsonb(payload)},
    ).fetchall()


def cancel_pending(conn: Conn, run_id: int, purpose: TrialPurpose | None = None) -> int:
    """Cancel the run's pending trials (running ones finish and are kept), only those of
    ``purpose`` (``search`` or ``confirm``) when given; returns how many.
    Locks: the pending rows of the run, for this statement; a row a worker is claiming at
    this instant is skipped by neither side twice (the claim's SKIP LOCKED or this update
    waits for the other's row lock, then re-checks ``state``)."""
    return conn.execute(
        """
        UPDATE tunefleet.trial
           SET state = 'cancelled', finished_at = now()
         WHERE run_id = %s AND state = 'pending' AND (%s::text IS NULL OR purpose = %s::text)
        """,
        (run_id, purpose, purpose),
    ).rowcount


# --- outcomes ---------------------------------------------------------------------------------
def fetch_unreported(conn: Conn, run_id: int) -> list[TrialOutcome]:
    """Finished trials of the run the coordinator has not been told about, marked reported in
    the same statement, in finishing order, with their measurement (NULLs for invalid, failed
    and timed-out trials) and ``purpose`` (a ``confirm`` trial names the search trial it
    re-measured in ``confirms_trial_id``; it is never told to the search). Locks: those trial
    rows, for this statement (trial_unreported_idx); workers never touch finished rows."""
    cur = conn.cursor(row_factory=class_row(TrialOutcome))
    return cur.execute(
        """
        WITH o AS (
            UPDATE tunefleet.trial t
               SET reported = true
             WHERE t.run_id = %s AND NOT t.reported
               AND t.state IN ('done', 'invalid', 'failed', 'timed_out')
            RETURNING t.id, t.config, t.config_hash, t.state, t.source, t.error, t.finished_at,
                      t.purpose, t.confirms_trial_id, t.attempt
        )
        SELECT o.id, o.config, o.config_hash, o.state, o.source, o.error, o.purpose,
               o.confirms_trial_id, m.median_s, m.gflops, m.compile_s, o.attempt
          FROM o LEFT JOIN tunefleet.measurement m ON m.trial_id = o.id
         ORDER BY o.finished_at, o.id
        """,
        (run_id,),
    ).fetchall()


def reported_outcomes(conn: Conn, run_id: int) -> list[TrialOutcome]:
    """Resume read: every finished trial of the run already marked reported (the ones not
    yet reported come from :func:`fetch_unreported`), in finishing order, with their
    measurement. Locks: none."""
    cur = conn.cursor(row_factory=class_row(TrialOutcome))
    return cur.execute(
        """
        SELECT o.id, o.config, o.config_hash, o.state, o.source, o.error, o.purpose,
               o.confirms_trial_id, m.median_s, m.gflops, m.compile_s, o.attempt
          FROM tunefleet.trial o
          LEFT JOIN tunefleet.measurement m ON m.trial_id = o.id
         WHERE o.run_id = %s AND o.reported
           AND o.state IN ('done', 'invalid', 'failed', 'timed_out')
         ORDER BY o.finished_at, o.id
        """,
        (run_id,),
    ).fetchall()


def in_flight_trials(conn: Conn, run_id: int) -> list[InFlight]:
    """Pending and running trials of the run, in id order. Locks: none."""
    cur = conn.cursor(row_factory=class_row(InFlight))
    return cur.execute(
        """
        SELECT id, config, config_hash, state, purpose, confirms_trial_id
          FROM tunefleet.trial
         WHERE run_id = %s AND state IN ('pending', 'running')
         ORDER BY id
        """,
        (run_id,),
    ).fetchall()


def best_of_run(conn: Conn, run_id: int) -> RunBest | None:
    """The run's best done trial as ``best_per_run`` ranks it (by its confirmed figure where
    a confirmation measured one), with its numbers and its confirmation's. Locks: none."""
    cur = conn.cursor(row_factory=class_row(RunBest))
    return cur.execute(
        """
        SELECT b.trial_id, t.config, t.source, b.median_s, b.min_s, b.gflops, b.gbps,
               coalesce(b.confirmed, false) AS confirmed, b.confirm_trial_id,
               b.confirmed_median_s, b.confirmed_gflops, b.spread, b.noise, b.disagrees,
               b.agreement_p, b.noisy, b.same_source, b.standing, b.figure_s,
               b.figure_gflops, b.processes, b.spread_tolerance, b.spread_typical,
               b.unseparated_trial_id, r.spread_within
          FROM tunefleet.best_per_run b
          JOIN tunefleet.trial t ON t.id = b.trial_id
          JOIN tunefleet.run r ON r.id = b.run_id
         WHERE b.run_id = %s
        """,
        (run_id,),
    ).fetchone()


# --- confirmations ----------------------------------------------------------------------------
def confirmation_candidates(conn: Conn, run_id: int, limit: int) -> list[ConfirmCandidate]:
    """The ``limit`` best done search trials of the run, ranked as ``best_per_run`` ranks
    them (confirmed figure where one exists, failed re-measurements last), with what a
    confirmation of each needs: the worker that measured it, its input seed (from the
    protocol it was measured with) and its first confirmation so far (None when none; the
    shoot-out's further rounds are :mod:`tunefleet.queries.spread`'s). Locks: none."""
    cur = conn.cursor(row_factory=class_row(ConfirmCandidate))
    return cur.execute(
        """
        SELECT t.id AS trial_id, t.config, t.config_hash, m.worker_id, m.median_s,
               (m.protocol->>'seed')::bigint AS input_seed,
               c.id AS confirm_trial_id, c.state AS confirm_state
          FROM tunefleet.trial t
          JOIN tunefleet.measurement m ON m.trial_id = t.id
          LEFT JOIN tunefleet.trial c ON c.confirms_trial_id = t.id AND c.purpose = 'confirm'
                                     AND c.confirm_round = 1
          LEFT JOIN tunefleet.measurement mc ON mc.trial_id = c.id
         WHERE t.run_id = %(run)s AND t.state = 'done' AND t.purpose = 'search'
         ORDER BY coalesce(c.state IN ('invalid', 'failed', 'timed_out'), false),
                  coalesce(mc.median_s, m.median_s), t.id
         LIMIT %(limit)s
        """,
        {"run": run_id, "limit": limit},
    ).fetchall()


def insert_confirmations(
    conn: Conn,
    run_id: int,
    device_class: str,
    confirmations: Sequence[Mapping[str, Any]],
    *,
    avoid_s: float,
    timeout_s: float | None = None,
    max_attempts: int = 3,
) -> list[QueuedConfirmation]:
    """Enqueue re-measurements of search trials (purpose ``confirm``, ahead of search trials:
    priority -1), then one ``NOTIFY`` for the batch. They bypass the cache: each is a
    pending trial for a worker, never answered from a measurement.

    ``confirmations`` items: ``trial_id`` (the search trial), ``config``, ``config_hash``,
    ``avoid_worker`` (the worker that measured it; the claim leaves the confirmation to
    another live worker for ``avoid_s`` seconds), ``input_seed`` (the fresh inputs) and
    optionally ``confirm_round`` (default 1; 2 and on: the shoot-out's further processes).
    A search trial that has a confirmation of that round keeps it, except a ``cancelled``
    one (a stop during confirmation), which is queued again. Returns the rows now pending.
    Locks: the inserted/revived rows, for this statement."""
    if not confirmations:
        return []
    payload = [
        {
            "trial_id": int(c["trial_id"]),
            "config": c["config"],
            "config_hash": c["config_hash"],
            "avoid_worker": None if c.get("avoid_worker") is None else str(c["avoid_worker"]),
            "input_seed": int(c["input_seed"]),
            "confirm_round": int(c.get("confirm_round", 1)),
        }
        for c in confirmations
    ]
    cur = conn.cursor(row_factory=class_row(QueuedConfirmation))
    return cur.execute(
        """
        WITH ins AS (
            INSERT INTO tunefleet.trial AS t
                   (run_id, device_class, config, config_hash, source, priority, timeout_s,
                    max_attempts, purpose, confirms_trial_id, avoid_worker, avoid_until,
                    input_seed, confirm_round)
            SELECT %(run)s, %(class)s, c.config, c.config_hash, 'search', -1, %(timeout)s,
                   %(attempts)s, 'confirm', c.trial_id, c.avoid_worker,
                   now() + make_interval(secs => %(avoid_s)s), c.input_seed, c.confirm_round
              FROM jsonb_to_recordset(%(items)s) AS c(trial_id bigint, config jsonb,
                                                      config_hash text, avoid_worker uuid,
                                                      input_seed integer, confirm_round integer)
            ON CONFLICT (confirms_trial_id, confirm_round) WHERE purpose = 'confirm' DO UPDATE
               SET state = 'pending', timeout_s = excluded.timeout_s, finished_at = NULL,
                   reported = false, error = NULL, avoid_until = excluded.avoid_until,
                   disagrees = NULL, agreement_p = NULL,
                   max_attempts = greatest(t.max_attempts, t.attempt + 1)
             WHERE t.state = 'cancelled'
            RETURNING t.id, t.confirms_trial_id
        ), wake AS (
            SELECT pg_notify(%(channel)s, %(class)s) FROM (SELECT 1 FROM ins LIMIT 1) AS one
        )
        SELECT ins.id, ins.confirms_trial_id FROM ins LEFT JOIN wake ON true
        """,
        {
            "run": run_id,
            "class": device_class,
            "timeout": timeout_s,
            "attempts": max_attempts,
            "avoid_s": float(avoid_s),
            "items": Jsonb(payload),
            "channel": NOTIFY_CHANNEL,
        },
    ).fetchall()


# --- seeds ------------------------------------------------------------------------------------
def warm_start_configs(
    conn: Conn,
    problem: str,
    problem_args: Mapping[str, Any],
    device_class: str,
    limit: int,
) -> list[WarmStart]:
    """The fastest distinct configurations measured for the same problem and arguments on
    another device class (the class of the measuring device or of its run), best first;
    never an ``unverified`` row. Locks: none."""
    cur = conn.cursor(row_factory=class_row(WarmStart))
    return cur.execute(
        """
        SELECT config, config_hash, median_s FROM (
            SELECT DISTINCT ON (m.config_hash) m.config, m.config_hash, m.median_s
              FROM tunefleet.measurement m
              LEFT JOIN tunefleet.device d ON d.id = m.device_id
              LEFT JOIN tunefleet.run r ON r.id = m.run_id
             WHERE m.problem = %(problem)s AND m.problem_args = %(args)s
               AND m.source IN ('measured', 'imported')
               AND (d.device_class = %(class)s OR r.device_class = %(class)s)
             ORDER BY m.config_hash, m.median_s
        ) best
         ORDER BY median_s, config_hash
         LIMIT %(limit)s
        """,
        {
            "problem": problem,
            "args": Jsonb(dict(problem_args)),
            "class": device_class,
            "limit": limit,
        },
    ).fetchall()


def measured_device_classes(conn: Conn, problem: str, problem_args: Mapping[str, Any]) -> list[str]:
    """Device classes with measurements of this problem and these arguments, both the
    classes of the measuring devices and those of their runs (to name the choices when a
    warm start finds nothing). Locks: none."""
    rows = conn.execute(
        """
        SELECT DISTINCT c.device_class
          FROM tunefleet.measurement m
          LEFT JOIN tunefleet.device d ON d.id = m.device_id
          LEFT JOIN tunefleet.run r ON r.id = m.run_id
         CROSS JOIN LATERAL (VALUES (d.device_class), (r.device_class)) AS c(device_class)
         WHERE m.problem = %s AND m.problem_args = %s AND c.device_class IS NOT NULL
           AND m.source IN ('measured', 'imported')
         ORDER BY 1
        """,
        (problem, Jsonb(dict(problem_args))),
    ).fetchall()
    return [r["device_class"] for r in rows]
