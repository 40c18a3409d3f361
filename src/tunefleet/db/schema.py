"""The database schema, in SQLAlchemy Core: tables, indexes and the views people query.

Everything lives in the PostgreSQL schema ``tunefleet`` so the database can be shared. This
module is the source of truth that ``migrations/`` must reproduce exactly (a test runs
Alembic's autogenerate comparison and expects no difference). DDL never reaches a database
from here directly: only through the migrations.

Tables
------
``run``          one tuning campaign (problem, arguments, target device class, budget, state)
``trial``        one configuration of one run and its queue state (the queue *is* this table);
                 a ``confirm`` trial re-measures a search trial before the run reports its best
``attempt``      the history of every claim of a trial: who, when, how it ended
``measurement``  the outcome of a trial on a device; doubles as the cross-run cache
``worker``       one row per worker process (fresh UUID per start), with its heartbeat
``device``       one row per device fingerprint (platform, vendor, name, driver)
``stand_aside``  a worker process that cannot run a run's problem, and why (one row per
                 worker and run): it no longer claims that run's trials
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, DOUBLE_PRECISION, JSONB, UUID

from tunefleet.vocabulary import (
    AttemptOutcome,
    MeasurementSource,
    RunState,
    TrialPurpose,
    TrialSource,
    TrialState,
    WorkerState,
)

SCHEMA = "tunefleet"

#: Why a trial exists (:class:`~tunefleet.vocabulary.TrialPurpose`).
TRIAL_PURPOSES = tuple(TrialPurpose)
#: How an attempt ended (:class:`~tunefleet.vocabulary.AttemptOutcome`, in the order the
#: CHECK constraint has listed them since the first migration).
ATTEMPT_OUTCOMES = tuple(AttemptOutcome)
#: Where a measurement row came from; :data:`CACHE_SOURCES` are the ones the cache serves.
MEASUREMENT_SOURCES = tuple(MeasurementSource)
CACHE_SOURCES = (MeasurementSource.MEASURED, MeasurementSource.IMPORTED)


def _in(column: str, values: Iterable[str]) -> str:
    quoted = ", ".join(f"'{v}'" for v in values)
    return f"{column} IN ({quoted})"


metadata = MetaData(schema=SCHEMA)

_now = text("now()")

run = Table(
    "run",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("name", Text, nullable=True),
    Column("problem", Text, nullable=False),
    Column("problem_args", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # The serialised parameter space, so the coordinator never needs loopy or OpenCL.
    Column("space", JSONB, nullable=False),
    Column("device_class", Text, nullable=False),
    # The measurement protocol every trial of this run is measured with.
    Column("protocol", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # Hash of problem + arguments + device class + protocol: the cross-run cache key.
    Column("cache_key", Text, nullable=False),
    # Search settings (technique, seed, queue depth, evaluation timeout, ...).
    Column("search", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("max_trials", Integer, nullable=True),
    Column("max_seconds", DOUBLE_PRECISION, nullable=True),
    Column("target_gflops", DOUBLE_PRECISION, nullable=True),
    Column("patience", Integer, nullable=True),
    # How far apart fresh processes time one kernel on this run's device, estimated by the
    # confirmation from its finalists (tunefleet.spread): ``spread_typical`` the median
    # relative difference of two processes of one configuration (NULL: too few to tell),
    # ``spread_tolerance`` what a re-measurement must stay within (the ± a best is quoted
    # with), ``spread_processes`` the process measurements it rests on,
    # ``unseparated_trial_id`` the runner-up the best could not be told apart from, and
    # ``spread_within`` the median noise (IQR over median) of one of those processes' samples,
    # which the tolerance is kept above a multiple of.
    Column("spread_typical", DOUBLE_PRECISION, nullable=True),
    Column("spread_tolerance", DOUBLE_PRECISION, nullable=True),
    Column("spread_processes", Integer, nullable=True),
    Column("unseparated_trial_id", BigInteger, nullable=True),
    Column("spread_within", DOUBLE_PRECISION, nullable=True),
    Column("state", Text, nullable=False, server_default=text("'running'")),
    Column("stop_reason", Text, nullable=True),
    Column("coordinator_id", UUID(as_uuid=True), nullable=True),
    Column("coordinator_heartbeat_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    CheckConstraint(_in("state", RunState), name="run_state_valid"),
    CheckConstraint("max_trials IS NULL OR max_trials > 0", name="run_max_trials_positive"),
    CheckConstraint("max_seconds IS NULL OR max_seconds > 0", name="run_max_seconds_positive"),
    CheckConstraint("patience IS NULL OR patience > 0", name="run_patience_positive"),
)
Index("run_cache_key_idx", run.c.cache_key)

device = Table(
    "device",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("fingerprint", Text, nullable=False, unique=True),
    Column("device_class", Text, nullable=False),
    Column("platform", Text, nullable=False),
    Column("vendor", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("driver_version", Text, nullable=False),
    Column("compute_units", Integer, nullable=True),
    Column("global_mem_bytes", BigInteger, nullable=True),
    Column("details", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("first_seen_at", DateTime(timezone=True), nullable=False, server_default=_now),
)

worker = Table(
    "worker",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("device_id", BigInteger, ForeignKey("device.id"), nullable=True),
    Column("device_class", Text, nullable=False),
    Column("version", Text, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'active'")),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("stopped_at", DateTime(timezone=True), nullable=True),
    # Trials the worker holds at once (1 + prefetch): the coordinator keeps at least the sum
    # of its live workers' capacities queued, or prefetching would find nothing to claim.
    Column("capacity", Integer, nullable=False, server_default=text("2")),
    # The worker's own sizing (worker.sizing), as it last reported it: its code-generation
    # processes, its prefetch, what chose them (auto, flags or mixed) and the share of the
    # time since its first claim that its device was busy.
    Column("prepare_workers", Integer, nullable=True),
    Column("prefetch", Integer, nullable=True),
    Column("sizing", Text, nullable=True),
    Column("device_busy", DOUBLE_PRECISION, nullable=True),
    # SHA-256 of the secret ``tunefleet.register_worker`` returned to the process (never the
    # secret itself): claims, the worker heartbeat and its stop need the secret.
    Column("secret_hash", BYTEA, nullable=True),
    CheckConstraint(_in("state", WorkerState), name="worker_state_valid"),
    CheckConstraint("capacity > 0", name="worker_capacity_positive"),
    CheckConstraint(
        "prepare_workers IS NULL OR prepare_workers >= 0", name="worker_prepare_workers_valid"
    ),
    CheckConstraint("prefetch IS NULL OR prefetch >= 0", name="worker_prefetch_valid"),
    CheckConstraint(
        "sizing IS NULL OR sizing IN ('auto', 'flags', 'mixed')", name="worker_sizing_valid"
    ),
    CheckConstraint(
        "device_busy IS NULL OR (device_busy >= 0 AND device_busy <= 1)",
        name="worker_device_busy_valid",
    ),
)
# Live workers of a class: the coordinator sizes the queue from this.
Index(
    "worker_active_idx",
    worker.c.device_class,
    worker.c.heartbeat_at,
    postgresql_where=text("state = 'active'"),
)

# The live workers of one host: every sizing report counts them (0011_fleet_shape).
Index("worker_host_active_idx", worker.c.host, postgresql_where=text("state = 'active'"))

trial = Table(
    "trial",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", BigInteger, ForeignKey("run.id", ondelete="CASCADE"), nullable=False),
    # Copied from the run so the claim can filter on one table with one index.
    Column("device_class", Text, nullable=False),
    Column("config", JSONB, nullable=False),
    Column("config_hash", Text, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'pending'")),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False, server_default=text("3")),
    # Per-trial evaluation timeout chosen by the coordinator (seconds); NULL = worker default.
    Column("timeout_s", DOUBLE_PRECISION, nullable=True),
    # Where the configuration came from: search, seed, cache (answered without the queue).
    Column("source", Text, nullable=False, server_default=text("'search'")),
    Column("lease_owner", UUID(as_uuid=True), ForeignKey("worker.id"), nullable=True),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    # SHA-256 of the lease token the claim returned (never the token): heartbeat, completion
    # and release of this claim need the token. NULL when nobody holds the trial.
    Column("lease_token_hash", BYTEA, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    # The search has been told about this trial's outcome (resume re-tells nothing twice).
    Column("reported", Boolean, nullable=False, server_default=text("false")),
    Column("error", Text, nullable=True),
    Column("purpose", Text, nullable=False, server_default=text("'search'")),
    # The search trial a confirmation re-measures (NULL for search trials).
    Column(
        "confirms_trial_id",
        BigInteger,
        ForeignKey("trial.id", ondelete="CASCADE"),
        nullable=True,
    ),
    # A confirmation is measured by another worker than the original's where one is live:
    # the claim skips it for ``avoid_worker`` until ``avoid_until`` (then takes it anyway).
    # No foreign key: a worker row may go while the confirmation still waits.
    Column("avoid_worker", UUID(as_uuid=True), nullable=True),
    Column("avoid_until", DateTime(timezone=True), nullable=True),
    # Replaces the run protocol's input seed for this trial (fresh inputs); NULL: the run's.
    Column("input_seed", Integer, nullable=True),
    # A done confirmation's verdict, decided by the coordinator (tunefleet.agreement): its
    # samples and the original's disagree; and the rank test's p-value. NULL: not judged yet.
    Column("disagrees", Boolean, nullable=True),
    Column("agreement_p", DOUBLE_PRECISION, nullable=True),
    # A confirmation's round: 1 for the first re-measurement of its search trial, 2 and on
    # for the shoot-out's further fresh processes (tunefleet.spread). NULL for search trials.
    Column("confirm_round", Integer, nullable=True),
    # A confirmed search trial's verdict across its processes, decided by the coordinator
    # (tunefleet.spread): ``standing`` agrees / disagrees, ``figure_s`` the median of its
    # consistent processes' medians (the figure a report quotes), ``processes`` how many
    # processes timed it (the search's included). NULL until judged.
    Column("standing", Text, nullable=True),
    Column("figure_s", DOUBLE_PRECISION, nullable=True),
    Column("processes", Integer, nullable=True),
    CheckConstraint(_in("state", TrialState), name="trial_state_valid"),
    CheckConstraint(_in("purpose", TRIAL_PURPOSES), name="trial_purpose_valid"),
    CheckConstraint(
        "(purpose = 'confirm') = (confirms_trial_id IS NOT NULL)",
        name="trial_confirm_names_its_trial",
    ),
    CheckConstraint(
        "(purpose = 'confirm') = (confirm_round IS NOT NULL) AND coalesce(confirm_round, 1) >= 1",
        name="trial_confirm_round_valid",
    ),
    CheckConstraint(
        "standing IS NULL OR (purpose = 'search' AND standing IN ('agrees', 'disagrees'))",
        name="trial_standing_valid",
    ),
    CheckConstraint("attempt >= 0 AND max_attempts > 0", name="trial_attempts_valid"),
    CheckConstraint(
        "state <> 'running' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)",
        name="trial_running_has_lease",
    ),
    CheckConstraint(_in("source", TrialSource), name="trial_source_valid"),
)
# One search trial per configuration and run (confirmations repeat a configuration).
Index(
    "trial_run_config_unique",
    trial.c.run_id,
    trial.c.config_hash,
    unique=True,
    postgresql_where=text("purpose = 'search'"),
)
# One confirmation per search trial and round (a resumed run revives a cancelled one, never
# adds more).
Index(
    "trial_confirms_unique",
    trial.c.confirms_trial_id,
    trial.c.confirm_round,
    unique=True,
    postgresql_where=text("purpose = 'confirm'"),
)
# The claim: ORDER BY priority, id over pending rows of the worker's device classes.
Index(
    "trial_claim_idx",
    trial.c.device_class,
    trial.c.priority,
    trial.c.id,
    postgresql_where=text("state = 'pending'"),
)
# Lease recovery: the reaper scans running rows by expiry.
Index(
    "trial_lease_idx",
    trial.c.lease_expires_at,
    postgresql_where=text("state = 'running'"),
)
# The coordinator reads finished-but-unreported outcomes of its run.
Index(
    "trial_unreported_idx",
    trial.c.run_id,
    trial.c.id,
    postgresql_where=text("NOT reported AND state IN ('done', 'invalid', 'failed', 'timed_out')"),
)
Index("trial_run_state_idx", trial.c.run_id, trial.c.state)

# One row per claim. A claim given back on graceful shutdown (outcome ``released``) does not
# count: the trial's attempt number is handed back, so the next claim reuses it. Hence a
# surrogate key, and uniqueness of (trial_id, attempt) only among counted claims.
attempt = Table(
    "attempt",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("trial_id", BigInteger, ForeignKey("trial.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker_id", UUID(as_uuid=True), ForeignKey("worker.id"), nullable=False),
    Column("claimed_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("outcome", Text, nullable=True),
    Column("error", Text, nullable=True),
    # Seconds per phase of the evaluation, as the worker that ran it saw them
    # (tunefleet.timeline; 0015_timeline): NULL for released claims and older rows.
    Column("timeline", JSONB, nullable=True),
    CheckConstraint(
        "outcome IS NULL OR " + _in("outcome", ATTEMPT_OUTCOMES), name="attempt_outcome_valid"
    ),
)
Index(
    "attempt_counted_unique",
    attempt.c.trial_id,
    attempt.c.attempt,
    unique=True,
    postgresql_where=text("outcome IS DISTINCT FROM 'released'"),
)
# Claims handed back: a worker judging an error streak asks whether another worker already
# handed these trials back for the same reason.
Index(
    "attempt_released_idx",
    attempt.c.trial_id,
    postgresql_where=text("outcome = 'released'"),
)

# A worker whose environment cannot run a run's problem (the problem does not import, a
# dependency is missing, its device process dies loading it, the same error on every
# configuration) hands the trial back uncounted and stops claiming that run: one row per
# worker process and run. The coordinator counts only the live workers without such a row as
# able to serve the run, and says so when none is left.
stand_aside = Table(
    "stand_aside",
    metadata,
    Column("worker_id", UUID(as_uuid=True), ForeignKey("worker.id"), primary_key=True),
    Column("run_id", BigInteger, ForeignKey("run.id", ondelete="CASCADE"), primary_key=True),
    Column("reason", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=_now),
)
# "Who stands aside from this run": the coordinator's and status's question.
Index("stand_aside_run_idx", stand_aside.c.run_id)

# One device of one host, held by one worker at a time (0011_fleet_shape): the device lock
# as a leased row, with the rules of a trial's lease (taken by ``tunefleet.take_device``,
# extended by the worker's heartbeats, free once expired or its holder stopped). Host and
# fingerprint are copied from the worker's own rows; identical GPUs differ by index.
device_lease = Table(
    "device_lease",
    metadata,
    Column("host", Text, primary_key=True),
    Column("fingerprint", Text, primary_key=True),
    Column("device_index", Integer, primary_key=True),
    Column(
        "worker_id",
        UUID(as_uuid=True),
        ForeignKey("worker.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("taken_at", DateTime(timezone=True), nullable=False, server_default=_now),
)
Index("device_lease_worker_idx", device_lease.c.worker_id)

measurement = Table(
    "measurement",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    # NULL for measurements imported from elsewhere (an archive), which no trial produced.
    Column(
        "trial_id",
        BigInteger,
        ForeignKey("trial.id", ondelete="SET NULL"),
        nullable=True,
        unique=True,
    ),
    Column("run_id", BigInteger, ForeignKey("run.id", ondelete="SET NULL"), nullable=True),
    Column("attempt", Integer, nullable=True),
    Column("cache_key", Text, nullable=False),
    Column("config_hash", Text, nullable=False),
    Column("problem", Text, nullable=False),
    Column("problem_args", JSONB, nullable=False),
    Column("config", JSONB, nullable=False),
    Column("device_id", BigInteger, ForeignKey("device.id"), nullable=True),
    Column("worker_id", UUID(as_uuid=True), ForeignKey("worker.id"), nullable=True),
    Column("median_s", DOUBLE_PRECISION, nullable=False),
    Column("min_s", DOUBLE_PRECISION, nullable=False),
    Column("samples_s", ARRAY(DOUBLE_PRECISION), nullable=False),
    Column("gflops", DOUBLE_PRECISION, nullable=True),
    Column("gbps", DOUBLE_PRECISION, nullable=True),
    Column("flop_count", Float, nullable=True),
    Column("byte_count", Float, nullable=True),
    Column("protocol", JSONB, nullable=False),
    Column("compile_s", DOUBLE_PRECISION, nullable=True),
    # Validation verdict: {"passed": bool, "max_abs_err": ..., "max_rel_err": ..., "rtol": ...}
    Column("validation", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # Versions of tunefleet, loopy, pyopencl, the driver, ... at measurement time.
    Column("versions", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # The generated OpenCL source, so a result can be inspected and reproduced years later.
    Column("code", Text, nullable=True),
    # ``measured``: written by a completion of the trial's lease holder (or a cache copy of
    # such a row); ``imported``: by an import the coordinator or migrator ran; ``unverified``:
    # written before workers lost direct table access and not provably one of those. Only the
    # first two ever answer the cache.
    Column("source", Text, nullable=False, server_default=text("'measured'")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    CheckConstraint("median_s > 0 AND min_s > 0", name="measurement_times_positive"),
    CheckConstraint(_in("source", MEASUREMENT_SOURCES), name="measurement_source_valid"),
)
Index("measurement_cache_idx", measurement.c.cache_key, measurement.c.config_hash)
Index("measurement_run_idx", measurement.c.run_id)


# --- Views: the SQL people type. Created by the migrations, documented in docs/sql.md. ------

VIEWS: dict[str, str] = {
    # What the search found: one row per finished search trial (done, invalid, failed,
    # timed out; never a confirmation, never a trial still queued), with its numbers and where
    # it was measured, flat (scalars only: no samples, code or protocol) so that it loads into
    # a spreadsheet or a data frame as it is. `tunefleet export` writes it (plus the raw
    # samples), the dashboard pages through it and sums its failures. `trial_details` is the
    # wide view of any one trial. ``ruled_out``: an invalid trial the problem's own rules
    # rejected before any worker saw it (never claimed, not a verdict of the cache); it cost
    # the run no evaluation and --max-trials does not count it. The one definition of the
    # term: run_progress counts these rows. ``standing`` / ``figure_s`` / ``processes``: a
    # confirmed trial's verdict across processes (tunefleet.spread; NULL until judged), the
    # figure it is ranked and quoted by, and how many processes timed it.
    "results": """
SELECT t.run_id,
       t.id AS trial_id,
       r.name AS run_name,
       r.problem,
       r.problem_args,
       r.device_class,
       t.config,
       t.config_hash,
       t.state,
       t.source,
       t.attempt,
       t.error,
       m.median_s,
       m.min_s,
       m.gflops,
       m.gbps,
       m.compile_s,
       d.name AS device_name,
       d.driver_version,
       w.host AS worker_host,
       t.lease_owner AS worker_id,
       t.started_at,
       t.finished_at,
       n.noise,
       n.noise > (m.protocol ->> 'noise_limit')::double precision AS noisy,
       t.state = 'invalid' AND t.attempt = 0 AND t.source <> 'cache' AS ruled_out,
       t.standing,
       t.figure_s,
       t.processes
  FROM tunefleet.trial t
  JOIN tunefleet.run r ON r.id = t.run_id
  LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
  LEFT JOIN tunefleet.device d ON d.id = m.device_id
  LEFT JOIN tunefleet.worker w ON w.id = t.lease_owner
  LEFT JOIN LATERAL (SELECT (percentile_cont(0.75) WITHIN GROUP (ORDER BY x)
                             - percentile_cont(0.25) WITHIN GROUP (ORDER BY x))
                            / percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS noise
                       FROM unnest(m.samples_s) AS x) n ON m.id IS NOT NULL
 WHERE t.state IN ('done', 'invalid', 'failed', 'timed_out') AND t.purpose = 'search'
""",
    # One row per confirmation: the search trial it re-measured, both figures, how far apart
    # they are (spread), how noisy the samples of either measurement were (noise: the larger
    # inter-quartile range over median), and whether the two disagree: the coordinator's
    # verdict (tunefleet.agreement's rank test behind a 3 % floor, or a cold rebuild whose
    # code differs; NULL until judged), or true when the re-measurement failed. ``same_source``:
    # the re-measurement generated the very code the search measured; ``cold_build``: it was
    # built and timed in a fresh process sharing no cache with the search (NULL where
    # neither stored code: problems without generated code). ``confirm_round``: 1 for the
    # first re-measurement, 2 and on for the shoot-out's further processes; ``disagrees`` of
    # such a row: its process is not consistent with its configuration's figure (outside the
    # run's between-process tolerance, ``run.spread_tolerance``).
    "confirmations": """
SELECT c.run_id,
       c.confirms_trial_id AS trial_id,
       c.id AS confirm_trial_id,
       o.config,
       c.state,
       c.input_seed,
       mo.median_s AS original_median_s,
       mc.median_s AS confirmed_median_s,
       mo.gflops AS original_gflops,
       mc.gflops AS confirmed_gflops,
       mo.worker_id AS original_worker_id,
       mc.worker_id AS confirm_worker_id,
       (greatest(mo.median_s, mc.median_s) - least(mo.median_s, mc.median_s))
         / least(mo.median_s, mc.median_s) AS spread,
       greatest(no.noise, nc.noise) AS noise,
       CASE WHEN c.state = 'done' THEN c.disagrees
            WHEN c.state IN ('invalid', 'failed', 'timed_out') THEN true
       END AS disagrees,
       c.finished_at,
       c.agreement_p,
       no.noise AS original_noise,
       nc.noise AS confirmed_noise,
       CASE WHEN mo.code IS NULL AND mc.code IS NULL THEN NULL
            ELSE mo.code IS NOT DISTINCT FROM mc.code END AS same_source,
       coalesce((mc.protocol ->> 'cold_build')::boolean, false) AS cold_build,
       c.confirm_round
  FROM tunefleet.trial c
  JOIN tunefleet.trial o ON o.id = c.confirms_trial_id
  LEFT JOIN tunefleet.measurement mo ON mo.trial_id = o.id
  LEFT JOIN tunefleet.measurement mc ON mc.trial_id = c.id
  LEFT JOIN LATERAL (SELECT (percentile_cont(0.75) WITHIN GROUP (ORDER BY x)
                             - percentile_cont(0.25) WITHIN GROUP (ORDER BY x))
                            / percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS noise
                       FROM unnest(mo.samples_s) AS x) no ON mo.id IS NOT NULL
  LEFT JOIN LATERAL (SELECT (percentile_cont(0.75) WITHIN GROUP (ORDER BY x)
                             - percentile_cont(0.25) WITHIN GROUP (ORDER BY x))
                            / percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS noise
                       FROM unnest(mc.samples_s) AS x) nc ON mc.id IS NOT NULL
 WHERE c.purpose = 'confirm'
""",
    # The best configuration of each run: ranked by its confirmed figure where a confirmation
    # measured one (else by its search measurement); a configuration whose re-measurement
    # failed ranks after every other. ``measured_noise`` / ``noisy``: the search
    # measurement's samples (IQR over median) and whether that exceeds its protocol's
    # ``noise_limit`` (the worker took all the samples the protocol allows and it stayed so),
    # computed for the best alone. ``same_source`` / ``cold_build``: its confirmation's
    # (``confirmations``, first round). Once the coordinator has judged a run's finalists
    # across processes (tunefleet.spread), one that agrees ranks before any other (the rest
    # by ``figure_s`` where judged, else as before); ``figure_s`` is the median of its
    # consistent processes, ``figure_gflops`` that figure's GFLOP/s, ``processes`` how
    # many processes timed it, ``spread_tolerance`` / ``spread_typical`` the run's
    # between-process spread (the ± the best is quoted with), ``unseparated_trial_id`` the
    # runner-up it could not be told apart from (NULL: separated, or not judged).
    "best_per_run": """
SELECT b.run_id,
       b.problem,
       b.problem_args,
       b.device_class,
       b.trial_id,
       b.config,
       b.median_s,
       b.min_s,
       b.gflops,
       b.gbps,
       b.device_name,
       b.confirmed,
       b.confirm_trial_id,
       b.confirmed_median_s,
       b.confirmed_gflops,
       b.spread,
       b.noise,
       b.disagrees,
       b.agreement_p,
       n.noise AS measured_noise,
       n.noise > (b.protocol ->> 'noise_limit')::double precision AS noisy,
       b.same_source,
       b.cold_build,
       b.standing,
       b.figure_s,
       b.gflops * b.median_s / b.figure_s AS figure_gflops,
       b.processes,
       b.spread_tolerance,
       b.spread_typical,
       b.unseparated_trial_id
  FROM (SELECT DISTINCT ON (t.run_id)
               t.run_id,
               r.problem,
               r.problem_args,
               r.device_class,
               t.id AS trial_id,
               t.config,
               m.median_s,
               m.min_s,
               m.gflops,
               m.gbps,
               d.name AS device_name,
               c.state = 'done' AS confirmed,
               c.confirm_trial_id,
               c.confirmed_median_s,
               c.confirmed_gflops,
               c.spread,
               c.noise,
               c.disagrees,
               c.agreement_p,
               c.same_source,
               c.cold_build,
               m.samples_s,
               m.protocol,
               t.standing,
               t.figure_s,
               t.processes,
               r.spread_tolerance,
               r.spread_typical,
               CASE WHEN r.unseparated_trial_id <> t.id THEN r.unseparated_trial_id
               END AS unseparated_trial_id
          FROM tunefleet.trial t
          JOIN tunefleet.run r ON r.id = t.run_id
          JOIN tunefleet.measurement m ON m.trial_id = t.id
          LEFT JOIN tunefleet.device d ON d.id = m.device_id
          LEFT JOIN tunefleet.confirmations c ON c.trial_id = t.id AND c.confirm_round = 1
         WHERE t.state = 'done' AND t.purpose = 'search'
         ORDER BY t.run_id,
                  coalesce(c.state IN ('invalid', 'failed', 'timed_out'), false),
                  CASE WHEN t.standing = 'agrees' THEN 0 ELSE 1 END,
                  coalesce(t.figure_s, c.confirmed_median_s, m.median_s),
                  t.id) b
 CROSS JOIN LATERAL (SELECT (percentile_cont(0.75) WITHIN GROUP (ORDER BY x)
                             - percentile_cont(0.25) WITHIN GROUP (ORDER BY x))
                            / percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS noise
                       FROM unnest(b.samples_s) AS x) n
""",
    # The fastest configuration ever measured per problem, arguments and device class,
    # across runs and imported archives (never an unverified row).
    "best_per_problem_device": """
SELECT DISTINCT ON (m.problem, m.problem_args, d.device_class)
       m.problem,
       m.problem_args,
       d.device_class,
       d.name AS device_name,
       m.config,
       m.median_s,
       m.min_s,
       m.gflops,
       m.gbps,
       m.run_id,
       m.trial_id,
       m.created_at
  FROM tunefleet.measurement m
  JOIN tunefleet.device d ON d.id = m.device_id
 WHERE m.source <> 'unverified'
 ORDER BY m.problem, m.problem_args, d.device_class, m.median_s, m.id
""",
    # Progress of each run: counts per state, its best, throughput. The best is the one
    # every report shows (``best_per_run``'s): ``best_gflops`` / ``best_median_s`` are its
    # confirmed figures once a confirmation measured it, else the search's, and
    # ``best_status`` says which: ``confirmed`` (re-measured and in agreement),
    # ``not reproduced`` (its re-measurement disagreed, built other code or failed: the
    # figures are the re-measurement's where there is one), ``unconfirmed`` (measured once
    # so far); NULL before a successful trial. ``invalid`` counts every invalid search
    # trial, ``ruled_out`` those of them the rules rejected before any worker saw them
    # (``results.ruled_out``); ``evaluations_per_minute`` leaves those out. Once the
    # finalists are judged across processes the best's figures are its ``figure_s``
    # (``best_per_run``), ``best_spread`` the ± they are quoted with (the run's
    # between-process tolerance; NULL unless the best agrees), ``best_processes`` how many
    # processes timed it and ``unseparated_trial_id`` the runner-up it could not be told
    # apart from.
    "run_progress": """
SELECT a.run_id,
       a.name,
       a.problem,
       a.device_class,
       a.run_state,
       a.stop_reason,
       a.trials,
       a.pending,
       a.running,
       a.done,
       a.invalid,
       a.failed,
       a.timed_out,
       a.cancelled,
       a.cached,
       CASE WHEN b.figure_s IS NOT NULL THEN b.figure_gflops
            WHEN b.confirmed THEN b.confirmed_gflops ELSE b.gflops END AS best_gflops,
       CASE WHEN b.figure_s IS NOT NULL THEN b.figure_s
            WHEN b.confirmed THEN b.confirmed_median_s ELSE b.median_s END AS best_median_s,
       a.created_at,
       a.elapsed,
       (a.finished - a.ruled_out) / a.minutes AS evaluations_per_minute,
       a.confirmed,
       a.confirming,
       CASE WHEN b.trial_id IS NULL THEN NULL
            WHEN b.standing = 'agrees' THEN 'confirmed'
            WHEN b.standing = 'disagrees' THEN 'not reproduced'
            WHEN b.confirmed AND b.disagrees = false THEN 'confirmed'
            WHEN b.disagrees THEN 'not reproduced'
            ELSE 'unconfirmed' END AS best_status,
       b.trial_id AS best_trial_id,
       a.ruled_out,
       CASE WHEN b.standing = 'agrees' THEN b.spread_tolerance END AS best_spread,
       b.processes AS best_processes,
       b.unseparated_trial_id
  FROM (SELECT r.id AS run_id,
               r.name,
               r.problem,
               r.device_class,
               r.state AS run_state,
               r.stop_reason,
               count(t.id) AS trials,
               count(t.id) FILTER (WHERE t.state = 'pending') AS pending,
               count(t.id) FILTER (WHERE t.state = 'running') AS running,
               count(t.id) FILTER (WHERE t.state = 'done') AS done,
               count(t.id) FILTER (WHERE t.state = 'invalid') AS invalid,
               count(t.id) FILTER (WHERE t.state = 'failed') AS failed,
               count(t.id) FILTER (WHERE t.state = 'timed_out') AS timed_out,
               count(t.id) FILTER (WHERE t.state = 'cancelled') AS cancelled,
               count(t.id) FILTER (WHERE t.source = 'cache') AS cached,
               r.created_at,
               coalesce(r.finished_at, now()) - r.created_at AS elapsed,
               count(t.id) FILTER (WHERE t.state IN ('done', 'invalid', 'failed', 'timed_out'))
                 AS finished,
               greatest(extract(epoch FROM coalesce(r.finished_at, now()) - r.created_at)
                        / 60.0, 1e-9) AS minutes,
               (SELECT count(*) FROM tunefleet.results x WHERE x.run_id = r.id AND x.ruled_out)
                 AS ruled_out,
               (SELECT count(*) FROM tunefleet.trial c
                 WHERE c.run_id = r.id AND c.purpose = 'confirm'
                   AND c.state IN ('done', 'invalid', 'failed', 'timed_out')) AS confirmed,
               (SELECT count(*) FROM tunefleet.trial c
                 WHERE c.run_id = r.id AND c.purpose = 'confirm'
                   AND c.state IN ('pending', 'running')) AS confirming
          FROM tunefleet.run r
          LEFT JOIN tunefleet.trial t ON t.run_id = r.id AND t.purpose = 'search'
         GROUP BY r.id) a
  LEFT JOIN tunefleet.best_per_run b ON b.run_id = a.run_id
""",
    # Workers standing aside from a run: who, where, why (their environment cannot run it).
    "standing_aside": """
SELECT s.run_id,
       s.worker_id,
       w.host,
       w.pid,
       d.name AS device_name,
       w.state AS worker_state,
       w.heartbeat_at,
       s.reason,
       s.at
  FROM tunefleet.stand_aside s
  JOIN tunefleet.worker w ON w.id = s.worker_id
  LEFT JOIN tunefleet.device d ON d.id = w.device_id
""",
    # Each run's own settings (problem, arguments, protocol, budget, coordinator heartbeat)
    # without its serialised space: the reader's way to the run row.
    "run_settings": """
SELECT r.id AS run_id,
       r.name,
       r.problem,
       r.problem_args,
       r.device_class,
       r.protocol,
       r.search,
       r.max_trials,
       r.max_seconds,
       r.target_gflops,
       r.patience,
       r.state,
       r.stop_reason,
       r.coordinator_heartbeat_at,
       r.created_at,
       r.finished_at
  FROM tunefleet.run r
""",
    # Every worker process with its device and the trials it holds now (never its secret).
    "workers": """
SELECT w.id AS worker_id,
       w.host,
       w.pid,
       w.state,
       w.device_class,
       w.version,
       d.name AS device_name,
       d.platform,
       d.vendor,
       d.driver_version,
       d.compute_units,
       w.started_at,
       w.heartbeat_at,
       w.stopped_at,
       w.capacity,
       w.prepare_workers,
       w.prefetch,
       w.sizing,
       w.device_busy,
       coalesce(h.holding, 0) AS holding,
       h.current_trial,
       h.holding_runs
  FROM tunefleet.worker w
  LEFT JOIN tunefleet.device d ON d.id = w.device_id
  LEFT JOIN (SELECT t.lease_owner,
                    count(*) AS holding,
                    min(t.id) AS current_trial,
                    array_agg(DISTINCT t.run_id ORDER BY t.run_id) AS holding_runs
               FROM tunefleet.trial t
              WHERE t.state = 'running'
              GROUP BY t.lease_owner) h ON h.lease_owner = w.id
""",
    # One row per trial in any state and of either purpose, with its measurement (samples,
    # protocol, validation, versions, the generated code), device and worker (who measured
    # it, else who holds it); ``lease_owner`` is who holds or last held it (a query that
    # needs only trial columns reads the trial table alone).
    "trial_details": """
SELECT t.run_id,
       t.id AS trial_id,
       t.purpose,
       t.confirms_trial_id,
       t.device_class,
       t.config,
       t.config_hash,
       t.state,
       t.source,
       t.attempt,
       t.max_attempts,
       t.error,
       t.input_seed,
       t.created_at,
       t.started_at,
       t.finished_at,
       m.median_s,
       m.min_s,
       m.samples_s,
       m.gflops,
       m.gbps,
       m.flop_count,
       m.byte_count,
       m.compile_s,
       m.protocol,
       m.validation,
       m.versions,
       m.code,
       m.source AS measurement_source,
       d.name AS device_name,
       d.platform,
       d.driver_version,
       coalesce(m.worker_id, t.lease_owner) AS worker_id,
       w.host AS worker_host,
       t.lease_owner
  FROM tunefleet.trial t
  LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
  LEFT JOIN tunefleet.device d ON d.id = m.device_id
  LEFT JOIN tunefleet.worker w ON w.id = coalesce(m.worker_id, t.lease_owner)
""",
    # Where each evaluation's wall time went: one row per ended attempt that reported its
    # timeline (tunefleet.timeline.Phase), each phase's seconds as a column (0 where the
    # attempt had none of it), the wait in the queue before the claim, the wall time on the
    # database clock and what the phases leave of it (``untracked_s``: the claim's and the
    # completion's own latency).
    "timeline": """
SELECT t.run_id,
       a.trial_id,
       a.attempt,
       t.purpose,
       a.worker_id,
       a.outcome,
       a.claimed_at,
       a.ended_at,
       extract(epoch FROM a.claimed_at
                          - coalesce((SELECT max(p.ended_at) FROM tunefleet.attempt p
                                       WHERE p.trial_id = a.trial_id AND p.id < a.id),
                                     t.created_at))::float8 AS queued_s,
       extract(epoch FROM a.ended_at - a.claimed_at)::float8 AS wall_s,
       coalesce((a.timeline ->> 'wait_codegen')::float8, 0) AS wait_codegen_s,
       coalesce((a.timeline ->> 'codegen')::float8, 0) AS codegen_s,
       coalesce((a.timeline ->> 'prebuild')::float8, 0) AS prebuild_s,
       coalesce((a.timeline ->> 'ready')::float8, 0) AS ready_s,
       coalesce((a.timeline ->> 'handoff')::float8, 0) AS handoff_s,
       coalesce((a.timeline ->> 'wait_device')::float8, 0) AS wait_device_s,
       coalesce((a.timeline ->> 'setup')::float8, 0) AS setup_s,
       coalesce((a.timeline ->> 'build')::float8, 0) AS build_s,
       coalesce((a.timeline ->> 'validation')::float8, 0) AS validation_s,
       coalesce((a.timeline ->> 'timing')::float8, 0) AS timing_s,
       coalesce((a.timeline ->> 'reference')::float8, 0) AS reference_s,
       coalesce((a.timeline ->> 'check')::float8, 0) AS check_s,
       coalesce((a.timeline ->> 'device_other')::float8, 0) AS device_other_s,
       coalesce((a.timeline ->> 'report')::float8, 0) AS report_s,
       extract(epoch FROM a.ended_at - a.claimed_at)::float8
         - (SELECT coalesce(sum(e.value::float8), 0)
              FROM jsonb_each_text(a.timeline) AS e) AS untracked_s,
       a.timeline
  FROM tunefleet.attempt a
  JOIN tunefleet.trial t ON t.id = a.trial_id
 WHERE a.timeline IS NOT NULL AND a.ended_at IS NOT NULL
""",
    # Per run and worker: the phases summed, the worker's window on the run (its first claim
    # to its last result) and its device's timing share (timing over that window).
    "worker_timeline": """
SELECT x.run_id,
       x.worker_id,
       count(*) AS attempts,
       extract(epoch FROM max(x.ended_at) - min(x.claimed_at))::float8 AS window_s,
       sum(x.queued_s) AS queued_s,
       sum(x.wall_s) AS wall_s,
       sum(x.wait_codegen_s) AS wait_codegen_s,
       sum(x.codegen_s) AS codegen_s,
       sum(x.prebuild_s) AS prebuild_s,
       sum(x.ready_s) AS ready_s,
       sum(x.handoff_s) AS handoff_s,
       sum(x.wait_device_s) AS wait_device_s,
       sum(x.setup_s) AS setup_s,
       sum(x.build_s) AS build_s,
       sum(x.validation_s) AS validation_s,
       sum(x.timing_s) AS timing_s,
       sum(x.reference_s) AS reference_s,
       sum(x.check_s) AS check_s,
       sum(x.device_other_s) AS device_other_s,
       sum(x.report_s) AS report_s,
       sum(x.untracked_s) AS untracked_s,
       least(sum(x.timing_s)
             / nullif(extract(epoch FROM max(x.ended_at) - min(x.claimed_at))::float8, 0),
             1.0) AS timing_share
  FROM tunefleet.timeline x
 GROUP BY x.run_id, x.worker_id
""",
    # Per run: the same over all its workers; ``timing_share`` is every device's timing over
    # the sum of their windows.
    "run_timeline": """
SELECT w.run_id,
       count(*) AS workers,
       sum(w.attempts) AS attempts,
       sum(w.window_s) AS window_s,
       sum(w.queued_s) AS queued_s,
       sum(w.wall_s) AS wall_s,
       sum(w.wait_codegen_s) AS wait_codegen_s,
       sum(w.codegen_s) AS codegen_s,
       sum(w.prebuild_s) AS prebuild_s,
       sum(w.ready_s) AS ready_s,
       sum(w.handoff_s) AS handoff_s,
       sum(w.wait_device_s) AS wait_device_s,
       sum(w.setup_s) AS setup_s,
       sum(w.build_s) AS build_s,
       sum(w.validation_s) AS validation_s,
       sum(w.timing_s) AS timing_s,
       sum(w.reference_s) AS reference_s,
       sum(w.check_s) AS check_s,
       sum(w.device_other_s) AS device_other_s,
       sum(w.report_s) AS report_s,
       sum(w.untracked_s) AS untracked_s,
       least(sum(w.timing_s) / nullif(sum(w.window_s), 0), 1.0) AS timing_share
  FROM tunefleet.worker_timeline w
 GROUP BY w.run_id
""",
}
