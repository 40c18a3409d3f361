"""The database's vocabulary: the states of trials, runs and workers, how a trial's attempts
end, why a trial exists and where it and a measurement came from, each spelled once here.

Every Python module compares and writes these members, never the bare strings
(tests/unit/test_vocabulary.py greps the source for that). The schema's CHECK constraints are
generated from them (``tunefleet.db.schema``), and a test compares each enum with the CHECK
constraint of a migrated database (and a column's default with its member), so a new state
needs a migration as well as a member.
SQL text spells the values as literals (a partial index on ``state = 'pending'`` is only used
when the statement says ``'pending'``); the same test checks each such literal is a member.

Members are ``str``: they compare equal to the database's text, format as their value and
are sent to PostgreSQL as text.
"""

from __future__ import annotations

from enum import StrEnum

# Plain names the worker needs as well: here, not in tunefleet.db.schema, so that a worker
# and each of its device and code-generation processes never import SQLAlchemy (0.6 s of CPU
# each).

#: ``device_class`` value of a run that any worker may serve (the synthetic problem uses it).
ANY_DEVICE_CLASS = "any"
#: NOTIFY channel: one notification per inserted batch, payload = device class.
NOTIFY_CHANNEL = "tunefleet_trials"


class TrialState(StrEnum):
    """``pending -> running -> done | invalid | failed | timed_out``; ``running -> pending``
    when a lease expires with attempts left; ``pending | running -> cancelled`` when the run
    stopped (resuming enqueues them again)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    #: The configuration itself is bad (illegal, does not build, wrong numbers): never retried.
    INVALID = "invalid"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


#: A trial that was measured or judged: what a worker completes a trial with, what the search
#: learns from and what counts against the budget.
FINISHED_TRIAL_STATES: tuple[TrialState, ...] = (
    TrialState.DONE,
    TrialState.INVALID,
    TrialState.FAILED,
    TrialState.TIMED_OUT,
)
#: States that never change again (until a resume enqueues a cancelled configuration anew).
TERMINAL_TRIAL_STATES: tuple[TrialState, ...] = (*FINISHED_TRIAL_STATES, TrialState.CANCELLED)
#: A finished trial that yielded no time (the search learns it as infinitely slow).
FAULT_TRIAL_STATES: tuple[TrialState, ...] = (
    TrialState.INVALID,
    TrialState.FAILED,
    TrialState.TIMED_OUT,
)


class AttemptOutcome(StrEnum):
    """How one claim of a trial ended (``attempt.outcome``; NULL while it runs)."""

    #: The claim's worker finished the trial in this state (the trial's own state).
    DONE = TrialState.DONE.value
    INVALID = TrialState.INVALID.value
    FAILED = TrialState.FAILED.value
    TIMED_OUT = TrialState.TIMED_OUT.value
    #: The reaper took the trial back from a worker whose lease ran out.
    LEASE_EXPIRED = "lease_expired"
    #: Its worker gave the trial back on a graceful stop (the attempt does not count).
    RELEASED = "released"
    #: Allowed since the first schema for a claim whose end nobody saw; nothing writes it
    #: today (an expired lease is ``lease_expired``).
    LOST = "lost"


class RunState(StrEnum):
    """``running`` while a coordinator may drive it, ``finished`` after a stop rule,
    ``stopped`` when a user stopped it (it can be resumed)."""

    RUNNING = "running"
    FINISHED = "finished"
    STOPPED = "stopped"


class WorkerState(StrEnum):
    """A worker row is ``active`` from its registration until it stops (or is found gone)."""

    ACTIVE = "active"
    STOPPED = "stopped"


class TrialPurpose(StrEnum):
    """Why a trial exists (``trial.purpose``, default ``search``)."""

    #: A point of the search: one per configuration and run, told to the search, counted
    #: against the budget.
    SEARCH = "search"
    #: A re-measurement of a search trial (``confirms_trial_id``) with fresh inputs, ideally
    #: on another worker, before the run reports its best; never told to the search, never a
    #: trial of the budget.
    CONFIRM = "confirm"


class TrialSource(StrEnum):
    """Where a trial's configuration came from (``trial.source``, default ``search``)."""

    #: Suggested by the search (a confirmation keeps this source too).
    SEARCH = "search"
    #: Given at the run's creation: the problem's default, ``--seed-config``, a warm start.
    SEED = "seed"
    #: Answered from the database at once: another run's measurement under the same cache
    #: key, or its ``invalid`` verdict; no worker measured it for this run.
    CACHE = "cache"


class MeasurementSource(StrEnum):
    """Where a measurement row came from (``measurement.source``, default ``measured``)."""

    #: Written by a completion of the trial's lease holder, or a cache copy of one.
    MEASURED = "measured"
    #: An import run by the coordinator or migrator (``tunefleet feinsum import``).
    IMPORTED = "imported"
    #: A row the upgrade to ``0003_worker_functions`` could not prove a lease holder wrote
    #: (or a cache copy of one): kept readable, never served by the cache.
    UNVERIFIED = "unverified"


class BestStatus(StrEnum):
    """What a run's best figure is (``run_progress.best_status``), shown beside it
    everywhere: the progress line, ``runs``, ``status``, ``best``, the API, the dashboard."""

    #: Re-measured in a cold build (a fresh process sharing no cache with the search) and in
    #: agreement: the figures shown are the re-measurement's.
    CONFIRMED = "confirmed"
    #: The re-measurement disagreed, generated other code, or failed: the figures shown are the
    #: re-measurement's where there is one, and the best is not to be trusted to them.
    NOT_REPRODUCED = "not reproduced"
    #: Measured once so far (no re-measurement has finished yet).
    UNCONFIRMED = "unconfirmed"


def best_status(
    confirm_state: str | None, disagrees: bool | None, standing: str | None = None
) -> BestStatus:
    """The status of a best from its confirmation's trial state and verdict, as the
    ``run_progress`` view decides it (a failed re-measurement counts as a disagreement); once
    the finalists are judged across processes (``standing``, :mod:`tunefleet.spread`), that
    verdict decides."""
    if standing == "agrees":
        return BestStatus.CONFIRMED
    if standing == "disagrees":
        return BestStatus.NOT_REPRODUCED
    if disagrees or confirm_state in FAULT_TRIAL_STATES:
        return BestStatus.NOT_REPRODUCED
    if confirm_state == TrialState.DONE and disagrees is False:
        return BestStatus.CONFIRMED
    return BestStatus.UNCONFIRMED
