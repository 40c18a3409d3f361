"""Owns the driving of a run: :class:`Coordinator` (ownership of the run and riding out a lost
database, :class:`_Outage`) and :class:`_Session` (one coordinator driving one run: resume,
the tick, outcomes, dispatch), with what a run reports (:class:`Progress`,
:class:`RunResult`).

Public API (what ``tunefleet coordinator`` and ``tunefleet tune`` call)::

    run_id = create_run(settings, db_url)     # tunefleet.coordinator.create: validate, store
    result = Coordinator(settings, db_url).run(run_id, progress_callback=print)
    result.best_config, result.stop_reason

A run is created by :mod:`.create`; configurations enter it through :mod:`.enqueue`; when a
stop rule ends the search, :mod:`.confirm` re-measures its best. A time budget
(``max_seconds``) bounds both phases: the search stops early enough for the confirmation, and
at the deadline whatever is in flight is handed back (:mod:`.budget`). Every row the session reads
is a frozen dataclass of :mod:`tunefleet.queries.search`.

A session runs its phases, the search and then the confirmation, in one tick
(:meth:`_Session._tick`), with a handful of statements however many trials move:

1. refresh the coordinator's heartbeat (every ``heartbeat_s``), noticing a run ended from
   outside;
2. read finished-but-unreported trials (one UPDATE ... RETURNING) and tell OpenTuner;
   ``invalid``, ``failed`` and ``timed_out`` are told as infinitely slow;
3. count the live workers (every ``heartbeat_s``);
4. the phase settles its view of the queue (:meth:`.phase.Phase.settle`), then a requested
   stop ends the phase;
5. the phase's step: the search checks the stop rules (:mod:`tunefleet.coordinator.rules`)
   and tops the queue up to its target depth: ask OpenTuner for the missing number of
   configurations (no database work per suggestion), answer repeats from the run's own
   outcomes, answer cache hits from the database in one statement, insert the rest in one
   statement with one NOTIFY; the confirmation queues re-measurements (:mod:`.confirm`);
6. report progress, and sleep ``poll_s`` when nothing happened.

Only the coordinator holding the run's advisory lock drives it; a second one gets
:class:`~tunefleet.errors.RunError`. After a crash, :meth:`Coordinator.run` on the same run
re-learns every finished trial, adopts pending and running ones, and enqueues nothing the run
already has.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tunefleet import spread
from tunefleet.backoff import Backoff
from tunefleet.db.engine import connect
from tunefleet.devices import DeviceLimits
from tunefleet.errors import (
    DatabaseUnavailable,
    InvalidConfiguration,
    ProblemError,
    RunError,
    first_line,
)
from tunefleet.problems.base import Problem
from tunefleet.queries import budget as qb
from tunefleet.queries import search as q
from tunefleet.queries import spread as qs
from tunefleet.settings import DatabaseSettings
from tunefleet.space import Config, Space, config_hash
from tunefleet.vocabulary import (
    ANY_DEVICE_CLASS,
    RunState,
    TrialPurpose,
    TrialSource,
    TrialState,
)

from .budget import Budget, Cut, Horizon, Speed, confirm_reserve, horizon, speed
from .confirm import Confirmation
from .create import coordinator_db_settings, create_run, raised, require_session_pooling
from .enqueue import NewTrial, enqueue
from .grid import GRID, check_size
from .phase import Confirmed, Phase, RuleHolds
from .rules import (
    Rate,
    RunStats,
    poll_slack,
    queue_target,
    stop_reason,
    trial_timeout,
)
from .settings import CoordinatorSettings

_log = logging.getLogger(__name__)

#: Spaces up to this size are enumerated when the search stalls; larger ones are sampled.
_ENUMERATE_LIMIT = 50_000


@dataclass(frozen=True)
class Progress:
    """A snapshot handed to ``progress_callback`` whenever the run moved."""

    run_id: int
    finished: int
    cached: int
    failed: int
    in_flight: int
    live_workers: int
    queue_target: int
    elapsed_s: float
    best_seconds: float | None
    best_gflops: float | None
    best_config: Config | None
    #: Why no live worker may serve the run now (every live one stands aside, or none is
    #: live), or None while some worker can.
    unserved: str | None = None
    #: The part of ``queue_target`` that covers what the fleet finishes during one poll.
    queue_slack: int = 0
    #: Confirmations pending or running (the run is confirming its best when > 0).
    confirming: int = 0
    #: The budget as it stood when the search began its end game (None: not yet).
    end_game: Horizon | None = None


@dataclass(frozen=True)
class RunResult:
    """How a run ended. ``state`` is ``finished`` (a stop rule) or ``stopped`` (the user)."""

    run_id: int
    state: str
    stop_reason: str
    trials: int
    cached: int
    failed: int
    cancelled: int
    best_config: Config | None = None
    best_median_s: float | None = None
    best_gflops: float | None = None
    best_trial_id: int | None = None
    #: The best was re-measured (``confirmed_*``: the confirmation's figures), how far apart
    #: the two measurements are (``spread``, relative), their samples' noise (IQR over
    #: median) and whether they disagree by :mod:`tunefleet.agreement` or the re-measurement
    #: failed (``disagrees``; ``agreement_p``: the rank test's p-value).
    confirmed: bool = False
    confirmed_median_s: float | None = None
    confirmed_gflops: float | None = None
    spread: float | None = None
    noise: float | None = None
    disagrees: bool | None = None
    #: What the time budget cut when it ended the run (None: the run had no time budget);
    #: ``handed_back`` running trials were cancelled at the deadline (a resume revives them).
    cut: Cut | None = None
    handed_back: int = 0
    agreement_p: float | None = None
    #: The best's own samples stayed noisier than its protocol's ``noise_limit``.
    noisy: bool | None = None
    #: The re-measurement generated the very code the search timed (None: no code stored).
    same_source: bool | None = None
    #: The verdict across processes (:mod:`tunefleet.spread`; None: not judged): ``agrees``
    #: or ``disagrees``, its figure (``figure_s`` / ``figure_gflops``: the median of its
    #: consistent processes), how many processes timed it, the run's between-process
    #: tolerance and typical spread, and the runner-up it could not be told apart from.
    standing: str | None = None
    figure_s: float | None = None
    figure_gflops: float | None = None
    processes: int | None = None
    spread_tolerance: float | None = None
    spread_typical: float | None = None
    unseparated_trial_id: int | None = None
    #: The run's within-process noise (:attr:`tunefleet.spread.Spread.within`).
    spread_within: float | None = None
    #: The fastest and slowest of its processes when one lies beyond the ± it is quoted with
    #: (:func:`tunefleet.spread.process_range`; None: all within it, or not judged).
    process_range_s: tuple[float, float] | None = None
    #: Its processes' launches, 10th to 90th percentile, when they reach beyond that ±
    #: (:func:`tunefleet.spread.launch_range`; None: within it, or not judged).
    launch_range_s: tuple[float, float] | None = None
    #: Fresh-process re-measurements the shoot-out added (beyond one per finalist).
    shootout: int = 0


def printed_ranges(
    conn: psycopg.Connection[Any], run_id: int, best: q.RunBest
) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """The range of ``best``'s processes' medians and of their launches that its report prints
    beside its ± (each None: it does not agree across processes, or they lie within it;
    :func:`tunefleet.spread.process_range`, :func:`tunefleet.spread.launch_range`)."""
    timings = qs.process_timings(conn, run_id).get(best.trial_id, qs.Timings())
    args = (best.standing, best.figure_s, best.spread_tolerance)
    measured = spread.process_range(*args, timings.medians)
    return measured, spread.launch_range(*args, measured, timings.samples)


# --- the session's pieces -------------------------------------------------------------------
@dataclass
class _Flight:
    """A trial of the run that is pending or running, and who in OpenTuner awaits it."""

    trial_id: int
    config: Config
    suggestions: list[Any] = field(default_factory=list)


@dataclass
class _Clock:
    """When a phase's tick last did its periodic steps (``time.monotonic()``)."""

    beat: float = -1e9
    live: float = -1e9
    progress: float = -1e9


@dataclass(frozen=True)
class _UserStop:
    """A stop was requested (``request_stop``): the run ends ``stopped``, unconfirmed."""


@dataclass(frozen=True)
class _EndedOutside:
    """Someone else ended the run meanwhile (``tunefleet`` on another machine, a script):
    nothing more is written, this is how it ended."""

    result: RunResult


#: How a phase ended: its own work is over (:mod:`.phase`), or the session's is.
_PhaseEnd = RuleHolds | Confirmed | _UserStop | _EndedOutside


#: How long a run's lock may stay taken by a session that is ending (a coordinator just
#: killed) before the run counts as driven by another coordinator (seconds).
LOCK_GRACE_S = 3.0
#: After losing the database mid-run, the coordinator keeps reconnecting this long (seconds).
RECONNECT_FOR_S = 600.0
#: How long a coordinator asked to stop while reconnecting keeps trying (to record the stop).
_STOP_RECONNECT_S = 5.0


class _OwnLockLingers(Exception):
    """The run's lock is held by this coordinator's own lost session, which is still ending."""


class _Outage:
    """How a coordinator rides out losing the database mid-run: it reconnects with the shared
    backoff for up to RECONNECT_FOR_S, or for _STOP_RECONNECT_S once a stop was requested (so
    that a lost session still gets the run marked stopped), then gives up."""

    def __init__(self, run_id: int, stop: threading.Event) -> None:
        self.run_id = run_id
        self.stop = stop
        self.backoff = Backoff()  # the reconnect defaults, as the worker's links
        self.lost_at: float | None = None
        self.stop_seen_at: float | None = None

    @property
    def ongoing(self) -> bool:
        return self.lost_at is not None

    def over(self) -> None:
        """The database answers again (or never went away)."""
        if self.lost_at is not None:
            _log.warning(
                "run %d: database reachable again after %.1f s; resuming",
                self.run_id,
                time.monotonic() - self.lost_at,
            )
        self.lost_at = None
        self.backoff.reset()

    def wait(self, reason: str) -> None:
        """Wait before the next attempt; DatabaseUnavailable once it is time to give up."""
        now = time.monotonic()
        if self.lost_at is None:
            self.lost_at = now
            _log.warning("run %d: database connection lost (%s); reconnecting", self.run_id, reason)
        if self.stop.is_set() and self.stop_seen_at is None:
            self.stop_seen_at = now
        stop_gives_up = (
            self.stop_seen_at is not None and now - self.stop_seen_at > _STOP_RECONNECT_S
        )
        if stop_gives_up or now - self.lost_at > RECONNECT_FOR_S:
            why = "a stop was requested" if stop_gives_up else "giving up"
            raise DatabaseUnavailable(
                f"lost the database while driving run {self.run_id} ({reason}); {why} after "
                f"{now - self.lost_at:.0f} s; the run is intact: continue it with --resume "
                f"{self.run_id} once the database is back"
            )
        delay = self.backoff.next()
        if self.stop_seen_at is None:
            self.stop.wait(delay)
        else:
            time.sleep(delay)  # the stop event is set: waiting on it would not wait


class Coordinator:
    """Drives one run at a time. ``request_stop()`` may be called from any thread (or a
    signal handler): the loop then cancels pending trials and marks the run ``stopped``."""

    def __init__(
        self,
        settings: CoordinatorSettings,
        db_url: str,
        db_settings: DatabaseSettings | None = None,
        clock_start: float | None = None,
    ) -> None:
        self.settings = settings
        self.db_url = db_url
        self.db_settings = db_settings or coordinator_db_settings(db_url)
        #: When the time budget (``max_seconds``) started, on ``time.monotonic()``'s clock:
        #: ``tunefleet tune`` and ``tunefleet coordinator`` give their process's start, so
        #: that the budget bounds the command (and a resume gets it again). None: the run's
        #: creation (the database clock).
        self.clock_start = clock_start
        self.coordinator_id = uuid.uuid4()
        self._stop = threading.Event()

    def request_stop(self) -> None:
        self._stop.set()

    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def wait_for_stop(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``, waking at once when a stop is requested."""
        return self._stop.wait(timeout_s)

    def run(
        self,
        run_id: int | None = None,
        progress_callback: Callable[[Progress], None] | None = None,
    ) -> RunResult:
        """Drive ``run_id`` (default: ``settings.resume``, else a run created from the
        settings) until a stop rule holds or a stop is requested."""
        if run_id is None:
            run_id = self.settings.resume
        if run_id is None:
            run_id = create_run(self.settings, self.db_url, self.db_settings)
        # Once the run is ours, a lost connection (server restart, failover, a terminated
        # session) is survived like a crash: reconnect, take the run again and resume it from
        # the database, which holds everything the search knows.
        outage = _Outage(run_id, self._stop)
        connected = False
        while True:
            try:
                with connect(self.db_url, self.db_settings) as conn:
                    connected = True
                    require_session_pooling(conn, self.db_url, self.db_settings)
                    self._own(conn, run_id, ours_may_linger=outage.ongoing)
                    outage.over()
                    try:
                        session = _Session.take(self, conn, run_id, progress_callback)
                        return session.drive()
                    finally:
                        try:
                            q.unlock_run(conn, run_id)
                        except psycopg.Error:
                            pass  # the connection is gone, and the lock with it
            except (psycopg.OperationalError, psycopg.InterfaceError, DatabaseUnavailable) as exc:
                if not connected:
                    raise  # never reached the database: the caller's error (bad URL, down)
                outage.wait(first_line(exc))
            except _OwnLockLingers:
                outage.wait("the lock of our lost session is not released yet")

    def _own(
        self, conn: psycopg.Connection[Any], run_id: int, *, ours_may_linger: bool = False
    ) -> None:
        run = q.run_owner(conn, run_id)
        if run is None:
            raise RunError(f"run {run_id} does not exist; check the id with `tunefleet status`")
        if not self._lock(conn, run_id):
            if ours_may_linger and run.coordinator_id == self.coordinator_id:
                # Our previous session is still ending on the server (its lock goes with it).
                raise _OwnLockLingers
            beat = run.coordinator_heartbeat_at
            raise RunError(
                f"run {run_id} is already driven by coordinator {run.coordinator_id} "
                f"(last heartbeat {beat:%Y-%m-%d %H:%M:%S %Z}); stop that one first"
                if beat is not None
                else f"run {run_id} is already driven by another coordinator; stop that one first"
            )

    def _lock(self, conn: psycopg.Connection[Any], run_id: int) -> bool:
        """Take the run's lock, allowing a killed coordinator's session a moment to end on
        the server (its lock goes with it) before calling the run taken."""
        deadline = time.monotonic() + LOCK_GRACE_S
        while not q.try_lock_run(conn, run_id):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True


class _Session:
    """The state of one coordinator driving one run (lives for one :meth:`Coordinator.run`).
    Made by :meth:`take`, which marks the run as driven by this coordinator."""

    @classmethod
    def take(
        cls,
        owner: Coordinator,
        conn: psycopg.Connection[Any],
        run_id: int,
        progress_callback: Callable[[Progress], None] | None,
    ) -> _Session:
        """Mark the run as ours (budget values from the settings replace the stored ones) and
        start a session on what the database says the run is. Call holding the run's lock."""
        s = owner.settings
        run = q.take_run(
            conn,
            run_id,
            owner.coordinator_id,
            max_trials=s.budget.max_trials,
            max_seconds=s.budget.max_seconds,
            target_gflops=s.budget.target_gflops,
            patience=s.budget.patience,
        )
        if run is None:
            raise RunError(f"run {run_id} disappeared while it was being taken over")
        return cls(owner, conn, run_id, run, progress_callback)

    def __init__(
        self,
        owner: Coordinator,
        conn: psycopg.Connection[Any],
        run_id: int,
        run: q.DrivenRun,
        progress_callback: Callable[[Progress], None] | None,
    ) -> None:
        s = owner.settings
        self.owner = owner
        self.settings = s
        self.conn = conn
        self.run_id = run_id
        self.progress_callback = progress_callback
        self.device_class = run.device_class
        self.cache_key = run.cache_key
        self.protocol: dict[str, Any] = dict(run.protocol or {})
        self.budget = Budget(
            max_trials=run.max_trials,
            max_seconds=run.max_seconds,
            target_gflops=run.target_gflops,
            patience=run.patience,
        )
        try:
            self.space = Space.from_json(run.space)
        except ProblemError as exc:
            raise RunError(f"run {run_id} has an unreadable space: {exc}") from None
        self.space_size = self.space.size()
        self.problem_args: dict[str, Any] = dict(run.problem_args or {})
        self.problem = _rules_of(run.problem)
        techniques = s.techniques or tuple((run.search or {}).get("techniques") or ())
        if GRID in techniques:
            check_size(self.space_size)  # a resume may name the grid for a space too big
        # OpenTuner (and its SQLAlchemy) load only once a run is driven: creating a run,
        # the CLI's --help and the tune command's start-up do without them.
        from .tuner import Tuner

        seed = s.search_seed
        if seed is None:
            seed = (run.search or {}).get("search_seed")
        self.tuner = Tuner(self.space, techniques, seed=seed)
        self.stats = RunStats()
        self.flights: dict[str, _Flight] = {}
        #: Confirmation trials of the run pending or running (their ids).
        self.confirming: set[int] = set()
        #: Search trials of the run pending (not claimed), as of ``refresh_flights``.
        self.search_pending = 0
        self.live_workers = 0
        self.live_capacity = 0
        #: What the run's devices allow (their work-group and local memory), as registered;
        #: None while no device of its class is (or for runs of class ``any``).
        self.limits: DeviceLimits | None = None
        self.rate = Rate()
        self.slack = 0
        self.target = 0
        self.unserved: str | None = None
        self._unserved_since: float | None = None
        self._elapsed_at = (float(run.elapsed_s), time.monotonic())
        #: How fast the run's trials come back, for the time budget's plan (:mod:`.budget`).
        self.pace = qb.Pace(0, None, None)
        #: Running trials the deadline handed back (cancelled) when the run ended.
        self.handed_back = 0
        #: The confirmation phase, once the search is over (None before, or without one).
        self.confirmation: Confirmation | None = None
        self._rng = random.Random(run_id)
        self._walk: Iterator[tuple[Any, ...]] | None = None

    # --- life cycle ---------------------------------------------------------------------
    def drive(self) -> RunResult:
        """Resume, search until a stop rule holds, confirm the best, finish; or stop early
        when asked to or when the run is ended from outside."""
        try:
            self._resume()
            end = self._run(_Search(self))
            cancelled = 0
            if isinstance(end, RuleHolds) and self.settings.confirm > 0:
                # A trial budget whose every trial is queued: the last ones still count.
                keep = end.reason == "max_trials"
                confirmation = self.confirmation = Confirmation(self, keep_search=keep)
                confirmed = self._run(confirmation)
                cancelled = confirmation.cancelled
                if not isinstance(confirmed, Confirmed):
                    end = confirmed  # a stop, or the run ended from outside: no finish
            return self._end(end, cancelled)
        finally:
            self.tuner.close()

    def _resume(self) -> None:
        """Adopt the run's queue and re-learn its outcomes (a fresh run has only seeds)."""
        self._absorb(q.reported_outcomes(self.conn, self.run_id))
        self._absorb(q.fetch_unreported(self.conn, self.run_id))
        # What a stop cut short (handed back at a deadline, released by a stopping worker)
        # goes first, within what is left of the trial budget: it stays exact.
        left = None
        if self.budget.max_trials is not None:
            flying = q.in_flight_trials(self.conn, self.run_id)
            busy = sum(t.purpose == TrialPurpose.SEARCH for t in flying)
            left = max(0, self.budget.max_trials - self.stats.finished - busy)
        revived = qb.revive_handed_back(self.conn, self.run_id, left) if left != 0 else 0
        for trial in q.in_flight_trials(self.conn, self.run_id):
            if trial.purpose == TrialPurpose.CONFIRM:
                self.confirming.add(trial.id)
            else:
                self.flights[trial.config_hash] = _Flight(trial.id, trial.config)
        self.pace = qb.run_pace(self.conn, self.run_id)
        if self.stats.finished or self.flights:
            _log.info(
                "run %d: resumed with %d outcomes and %d trials in flight (%d handed back "
                "by its last stop, queued again)",
                self.run_id,
                self.stats.finished,
                len(self.flights),
                revived,
            )

    def _run(self, phase: Phase) -> _PhaseEnd:
        """Tick until the phase is over, a stop is requested or the run is ended from
        outside. Each phase starts with every periodic step due."""
        clock = _Clock()
        while True:
            end = self._tick(phase, clock)
            if end is not None:
                return end

    def _tick(self, phase: Phase, clock: _Clock) -> _PhaseEnd | None:
        """One tick of a phase (the module docstring): None while the phase goes on."""
        s = self.settings
        now = time.monotonic()
        if now - clock.beat >= s.heartbeat_s:
            clock.beat = now
            external = self._heartbeat()
            if external is not None:
                return _EndedOutside(external)
        outcomes = q.fetch_unreported(self.conn, self.run_id)
        self.rate.add(now, len(outcomes))  # what the workers finish, for the queue depth
        self._absorb(outcomes)
        if outcomes and self.budget.max_seconds is not None:
            self.pace = qb.run_pace(self.conn, self.run_id)
        # After the outcomes: a worker that finished the last trial in flight and left
        # (``--drain``) must not make the run look unserved.
        if now - clock.live >= s.heartbeat_s:
            clock.live = now
            self.live_workers, self.live_capacity = q.count_live_workers(
                self.conn, self.device_class, s.worker_alive_s, self.run_id
            )
            if self.device_class != ANY_DEVICE_CLASS and self.problem is not None:
                self.limits = q.device_limits(self.conn, self.device_class)
            if phase.notices_unserved:
                self._check_served(now)
        phase.settle()
        if self.owner.stop_requested():
            return _UserStop()
        moved = phase.step(now)
        if isinstance(moved, RuleHolds | Confirmed):
            return moved
        if self.progress_callback and (outcomes or moved or now - clock.progress > 1.0):
            clock.progress = now
            self.progress_callback(self._progress())
        if not outcomes and not moved:
            self.owner.wait_for_stop(s.poll_s)
        return None

    def _end(self, end: _PhaseEnd, cancelled: int) -> RunResult:
        """The run's result once its phases are over (``cancelled``: pending search trials
        the confirmation cancelled)."""
        match end:
            case _EndedOutside(result=result):
                return result
            case _UserStop():
                return self._finish("user", RunState.STOPPED, cancelled)
            case RuleHolds(reason=reason):
                return self._finish(reason, RunState.FINISHED, cancelled)
            case Confirmed():
                raise AssertionError("the search ends by a stop rule, not by a confirmation")

    def _check_served(self, now: float) -> None:
        """Notice a run with work that no live worker may serve, instead of spending its
        time budget in silence; notice too when a worker turns up that can."""
        if self.live_workers or not self.flights:
            if self.unserved is not None:
                _log.info("run %d: %d worker(s) can serve it again", self.run_id, self.live_workers)
            self.unserved, self._unserved_since = None, None
            return
        if self._unserved_since is None:
            self._unserved_since = now
        aside = q.standing_aside(self.conn, self.run_id, self.settings.worker_alive_s)
        if aside:
            first = aside[0]
            why = (
                f"every live worker of class {self.device_class} stands aside from it "
                f"({len(aside)}; worker {first.worker_id} on host {first.host} cannot "
                f"run this problem: {first.reason})"
            )
        elif now - self._unserved_since >= self.settings.unserved_s:
            why = (
                f"no live worker of class {self.device_class} for "
                f"{now - self._unserved_since:.0f} s"
            )
        else:
            return
        if self.unserved is None:
            # Info, not a warning: every door's progress line carries ``unserved`` already,
            # and `tune`, whose local workers all stand aside, stops with one error line.
            _log.info(
                "nobody can serve run %d: %s; start a worker whose environment runs its "
                "problem (a worker joining later picks the run up)",
                self.run_id,
                why,
            )
        self.unserved = f"nobody can serve it: {why}"

    def refresh_flights(self) -> None:
        """Keep ``flights`` and ``confirming`` to what the database has in flight now."""
        search, confirming, pending = set(), set(), 0
        for trial in q.in_flight_trials(self.conn, self.run_id):
            if trial.purpose == TrialPurpose.CONFIRM:
                confirming.add(trial.id)
            else:
                search.add(trial.config_hash)
                pending += trial.state == TrialState.PENDING
        self.flights = {h: f for h, f in self.flights.items() if h in search}
        self.confirming = confirming
        self.search_pending = pending

    def trial_timeout(self) -> float | None:
        """The evaluation timeout of a trial queued now (None: the workers' default)."""
        return trial_timeout(
            self.stats.best_seconds,
            self.stats.max_compile_s,
            self.protocol,
            self.settings.trial_timeout_min_s,
            self.settings.trial_timeout_max_s,
        )

    def _heartbeat(self) -> RunResult | None:
        """Refresh our heartbeat; a RunResult when someone else ended the run meanwhile."""
        beat = q.heartbeat_run(self.conn, self.run_id, self.owner.coordinator_id)
        if beat is not None and beat.state == RunState.RUNNING:
            self._elapsed_at = (beat.elapsed_s, time.monotonic())
            return None
        run = q.run_owner(self.conn, self.run_id)
        if run is None:
            raise RunError(f"run {self.run_id} was deleted while it was being driven")
        _log.warning("run %d was ended from outside (%s)", self.run_id, run.state)
        return self._result(run.state, run.stop_reason or "user", cancelled=0)

    def elapsed(self) -> float:
        base, at = self._elapsed_at
        return base + time.monotonic() - at

    def budget_elapsed(self) -> float:
        """Seconds of the time budget spent: since the coordinator's ``clock_start`` when it
        has one (``tunefleet tune``: since the command started), else the run's age."""
        start = self.owner.clock_start
        return self.elapsed() if start is None else time.monotonic() - start

    def time_left(self) -> float | None:
        """Seconds until the time budget ends (negative: past it); None without one."""
        if self.budget.max_seconds is None:
            return None
        return self.budget.max_seconds - self.budget_elapsed()

    def horizon(self) -> Horizon | None:
        """How far the search is through its trial and time budgets (:func:`.budget.horizon`):
        under a time budget, until the search must stop to leave the confirmation its time."""
        search_left_s = self.time_left()
        pace = self.speed()
        if search_left_s is not None:
            running = min(len(self.flights), self.in_flight())
            search_left_s -= confirm_reserve(pace, self.settings.confirm, running)
        return horizon(
            self.budget.max_trials, self.stats.finished, len(self.flights), search_left_s, pace
        )

    def speed(self) -> Speed | None:
        """The run's pace as the time budget's plan uses it (:func:`.budget.speed`)."""
        return speed(self.pace, self.in_flight(), self.live_workers)

    def in_flight(self) -> int:
        """Trials the live workers hold at once: the run's flights up to the workers' summed
        capacity (the one timed plus the prefetched), never fewer than one per worker."""
        return max(self.live_workers, min(len(self.flights), self.live_capacity))

    def out_of_time(self) -> bool:
        left = self.time_left()
        return left is not None and left <= 0

    def _finish(self, reason: str, state: str, cancelled: int = 0) -> RunResult:
        """Cancel what is pending and mark the run ``state`` for ``reason``; ``cancelled``
        trials were cancelled before (by the confirmation). Past the time budget, what is
        still running is handed back too (:func:`tunefleet.queries.budget.hand_back`): the
        run never waits for work that cannot finish in time."""
        if state == RunState.FINISHED and self.out_of_time():
            given = qb.hand_back(
                self.conn,
                self.run_id,
                f"handed back: the run's time budget ({self.budget.max_seconds:g} s) ended "
                "before it finished; a resume queues it again",
            )
            self.handed_back += given.running
            cancelled += given.total
            if given.running:
                _log.info(
                    "run %d: %d running trial(s) handed back at the time budget",
                    self.run_id,
                    given.running,
                )
        cancelled += q.cancel_pending(self.conn, self.run_id)
        # A stop can land between the poll and the stop check (while the search is being
        # told): what finished since that poll belongs to this run's count and best, not to
        # whoever resumes it.
        self._absorb(q.fetch_unreported(self.conn, self.run_id))
        q.finish_run(self.conn, self.run_id, self.owner.coordinator_id, reason, state)
        if not self.flights:
            # Nothing is left to serve; a run that ends with work nobody could take keeps
            # saying so on its last line.
            self.unserved = None
        if self.progress_callback:
            self.progress_callback(self._progress())
        _log.info("run %d %s: %s (%d pending cancelled)", self.run_id, state, reason, cancelled)
        return self._result(state, reason, cancelled)

    def _result(self, state: str, reason: str, cancelled: int) -> RunResult:
        best = q.best_of_run(self.conn, self.run_id)
        cut = None
        if self.budget.max_seconds is not None and state == RunState.FINISHED:
            confirmation = self.confirmation
            cut = Cut(
                max_seconds=self.budget.max_seconds,
                handed_back=self.handed_back,
                confirm_wanted=confirmation.wanted if confirmation else 0,
                confirm_queued=confirmation.enqueued if confirmation else 0,
            )
        result = RunResult(
            run_id=self.run_id,
            state=state,
            stop_reason=reason,
            trials=self.stats.finished,
            cached=self.stats.cached,
            failed=self.stats.failed,
            cancelled=cancelled,
            cut=cut,
            handed_back=self.handed_back,
        )
        if best is None:
            return result
        ranges = printed_ranges(self.conn, self.run_id, best)
        return dataclasses.replace(
            result,
            best_config=best.config,
            best_median_s=best.median_s,
            best_gflops=best.gflops,
            best_trial_id=best.trial_id,
            confirmed=best.confirmed,
            confirmed_median_s=best.confirmed_median_s,
            confirmed_gflops=best.confirmed_gflops,
            spread=best.spread,
            noise=best.noise,
            disagrees=best.disagrees,
            agreement_p=best.agreement_p,
            noisy=best.noisy,
            same_source=best.same_source,
            standing=best.standing,
            figure_s=best.figure_s,
            figure_gflops=best.figure_gflops,
            processes=best.processes,
            spread_tolerance=best.spread_tolerance,
            spread_typical=best.spread_typical,
            unseparated_trial_id=best.unseparated_trial_id,
            spread_within=best.spread_within,
            process_range_s=ranges[0],
            launch_range_s=ranges[1],
            shootout=self.confirmation.shootout if self.confirmation else 0,
        )

    def _progress(self) -> Progress:
        st = self.stats
        return Progress(
            run_id=self.run_id,
            finished=st.finished,
            cached=st.cached,
            failed=st.failed,
            in_flight=len(self.flights),
            live_workers=self.live_workers,
            queue_target=self.target,
            queue_slack=self.slack,
            elapsed_s=self.elapsed(),
            best_seconds=st.best_seconds,
            best_gflops=st.best_gflops,
            best_config=st.best_config,
            unserved=self.unserved,
            confirming=len(self.confirming),
            end_game=self.tuner.end_game,
        )

    # --- outcomes -----------------------------------------------------------------------
    def _absorb(self, outcomes: list[q.TrialOutcome]) -> None:
        """Count finished trials and tell the search, in one batch."""
        told: list[tuple[Any, float | None]] = []
        learned: list[tuple[Config, float | None]] = []
        for o in outcomes:
            if o.purpose == TrialPurpose.CONFIRM:
                # A re-measurement: the best_per_run ranking reads it from the database; the
                # search and the budget never hear of it.
                self.confirming.discard(o.id)
                continue
            seconds = o.median_s if o.state == TrialState.DONE else None
            flight = self.flights.pop(o.config_hash, None)
            self.stats.record(
                o.config_hash,
                o.config,
                seconds,
                trial_id=o.id,
                gflops=o.gflops,
                compile_s=o.compile_s,
                cached=o.source == TrialSource.CACHE,
                ruled_out=o.ruled_out,
            )
            if flight is not None and flight.suggestions:
                told += [(sug, seconds) for sug in flight.suggestions]
            else:
                learned.append((o.config, seconds))
        if told:
            self.tuner.tell_many(told)
        if learned:
            try:
                self.tuner.learn(learned)
            except InvalidConfiguration as exc:
                _log.warning(
                    "run %d: an outcome outside the space was ignored: %s", self.run_id, exc
                )

    # --- dispatch -----------------------------------------------------------------------
    def dispatch(self, polled_at: float) -> int:
        """Top the queue up; returns how many trials were added (queued or cache hits)."""
        s = self.settings
        left = None
        if self.budget.max_trials is not None:
            left = self.budget.max_trials - self.stats.finished
        # The rate as of the poll that counted the outcomes: telling the search can take
        # longer than the rate's window on a loaded machine, and the slack must not vanish
        # exactly when the coordinator is slow.
        rate = self.rate.per_second(polled_at)
        self.slack = poll_slack(rate, s.poll_s)
        self.target = queue_target(
            self.live_workers,
            s.depth_factor,
            s.min_depth,
            left,
            self.live_capacity,
            rate=rate,
            poll_s=s.poll_s,
        )
        need = self.target - len(self.flights)
        if need <= 0:
            return 0
        batch: dict[str, _Flight] = {}
        answered: list[tuple[Any, float | None]] = []
        for _ in range(3):  # a few asks: repeats answered from memory free up room
            suggestions = self.tuner.ask(need - len(batch), self.horizon())
            if not suggestions:
                break
            for sug in suggestions:
                h = sug.config_hash
                if h in self.stats.outcomes:
                    answered.append((sug, self.stats.outcomes[h]))
                elif h in self.flights:
                    self.flights[h].suggestions.append(sug)
                elif h in batch:
                    batch[h].suggestions.append(sug)
                else:
                    batch[h] = _Flight(0, sug.config, [sug])
            if len(batch) >= need:
                break
        if answered:
            self.tuner.tell_many(answered)
        # OpenTuner may fall short: while it waits for outcomes, or once it has converged and
        # proposes mostly configurations it already has. Rather than let workers idle, top
        # the queue up to one trial per live worker with configurations never tried.
        short = min(need, max(1, self.live_workers) - len(self.flights)) - len(batch)
        if short > 0:
            batch.update(self._unexplored(short, batch))
        return self._enqueue(batch) if batch else 0

    def _enqueue(self, batch: dict[str, _Flight]) -> int:
        """Put the batch into the run (:func:`.enqueue.enqueue`); returns how many trials it
        added."""
        timeout = self.trial_timeout()
        illegal = self._illegal(batch)
        done = enqueue(
            self.conn,
            self.run_id,
            self.device_class,
            self.cache_key,
            {h: NewTrial(f.config, _source(f), illegal.get(h)) for h, f in batch.items()},
            timeout_s=timeout,
            max_attempts=self.settings.max_attempts,
        )
        for outcome in done.answered:
            # Route the answer to the suggestions waiting for it.
            self.flights[outcome.config_hash] = batch.pop(outcome.config_hash)
        self._absorb(done.answered)
        for row in done.queued:
            flight = batch.pop(row.config_hash)
            flight.trial_id = row.id
            self.flights[row.config_hash] = flight
        for h in done.skipped:
            # The run already holds this configuration in a state we did not expect (someone
            # else wrote to it): never wait for it, never measure it twice.
            _log.warning("run %d: configuration %s is already in the run; skipped", self.run_id, h)
            self.tuner.tell_many([(sug, None) for sug in batch.pop(h).suggestions])
        return len(done.answered) + len(done.queued)

    def _illegal(self, batch: Mapping[str, _Flight]) -> dict[str, str]:
        """Why the problem's device-free rules (divisibility, register budget, ...) or the
        limits of the run's devices (a work-group or local memory larger than they allow)
        reject configurations of the batch, by hash: they become ``invalid`` trials at once,
        which cost the run no evaluation, and no worker spends a build on them."""
        if self.problem is None:
            return {}
        illegal = {}
        for h, flight in batch.items():
            try:
                config = self.problem.check_config(self.problem_args, flight.config)
                why = self._over_limits(config)
                if why is not None:
                    illegal[h] = f"{why} ({self.device_class}, ruled out by the coordinator)"
            except InvalidConfiguration as exc:
                illegal[h] = str(exc)
            except Exception as exc:  # a user problem's own bug: let the workers judge
                _log.warning(
                    "run %d: the problem's check_config or footprint raised %s; "
                    "configurations go to the workers unchecked",
                    self.run_id,
                    raised(exc),
                )
                self.problem = None
                return {}
        return illegal

    def _over_limits(self, config: Config) -> str | None:
        """Why ``config``'s kernel would not fit the run's devices, if the problem can tell
        its footprint and a device of the run's class has registered its limits."""
        if self.limits is None or self.problem is None:
            return None
        return self.limits.exceeded_by(self.problem.footprint(self.problem_args, config))

    def _unexplored(self, need: int, taken: Mapping[str, _Flight]) -> dict[str, _Flight]:
        """Up to ``need`` configurations without an outcome, not in flight, not in ``taken``."""
        found: dict[str, _Flight] = {}
        for config in self._candidates():
            h = config_hash(config)
            if h in self.stats.outcomes or h in self.flights or h in taken or h in found:
                continue
            found[h] = _Flight(0, config)
            if len(found) >= need:
                break
        return found

    def _candidates(self) -> Iterator[Config]:
        """Random configurations: a shuffled walk through a small space (remembered across
        calls, restarted when spent), random draws from a large one."""
        params = self.space.params
        if self.space_size > _ENUMERATE_LIMIT:
            for _ in range(1000):
                yield {p.name: self._rng.choice(p.values()) for p in params}
            return
        for _ in range(2):
            if self._walk is None:
                order = list(itertools.product(*(p.values() for p in params)))
                self._rng.shuffle(order)
                self._walk = iter(order)
            for combo in self._walk:
                yield {p.name: v for p, v in zip(params, combo, strict=True)}
            self._walk = None


class _Search:
    """The search phase of a session (a :class:`~.phase.Phase`): stop rules, then dispatch."""

    notices_unserved = True

    def __init__(self, session: _Session) -> None:
        self.session = session

    def settle(self) -> None:
        pass  # the session's flights follow the search's own enqueues and outcomes

    def step(self, now: float) -> int | RuleHolds:
        s = self.session
        reason = stop_reason(s.budget, s.stats, s.budget_elapsed(), s.space_size, len(s.flights))
        if reason is None and self._leave_time_to_confirm():
            reason = "max_seconds"
        if reason is None and self._all_proposed():
            reason = "max_trials"
        return RuleHolds(reason) if reason else s.dispatch(now)

    def _all_proposed(self) -> bool:
        """Whether every trial of a trial budget is finished or queued, so that the
        confirmation may start beside the last ones (they are waited for, not cancelled,
        and ranked too: the budget stays exact). A time budget has its own plan for that
        (:meth:`_leave_time_to_confirm`), and its deadline still ends the run."""
        s = self.session
        max_trials = s.budget.max_trials
        return (
            max_trials is not None
            and s.budget.max_seconds is None
            and s.settings.confirm > 0
            and bool(s.flights)
            and s.stats.finished + len(s.flights) >= max_trials
        )

    def _leave_time_to_confirm(self) -> bool:
        """Whether the search must stop now so that its running trials and the confirmation
        still end within the time budget (:func:`.budget.confirm_reserve`)."""
        s = self.session
        left = s.time_left()
        if left is None or s.settings.confirm <= 0:
            return False
        # The queued trials beyond what the workers hold are cancelled when the search
        # stops; only the held ones are waited for.
        running = min(len(s.flights), s.in_flight())
        reserve = confirm_reserve(s.speed(), s.settings.confirm, running)
        if left > reserve:
            return False
        _log.info(
            "run %d: %.1f s of the time budget left, what its %d running trial(s) and %d "
            "confirmation(s) need: the search stops here",
            s.run_id,
            left,
            running,
            s.settings.confirm,
        )
        return True


def _rules_of(spec: str) -> Problem | None:
    """The run's problem, for its device-free configuration rules; None (the workers judge
    alone) when it cannot be loaded here, e.g. a user file that lives on the workers only."""
    from tunefleet.problems.registry import get_problem

    try:
        return get_problem(spec)
    except (ProblemError, ImportError) as exc:
        _log.warning(
            "problem %r cannot be loaded here (%s); workers check configurations", spec, exc
        )
        return None


def _source(flight: _Flight) -> TrialSource:
    return TrialSource.SEED if any(s.seed for s in flight.suggestions) else TrialSource.SEARCH
