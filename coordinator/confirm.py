"""The confirmation phase: re-measure a run's best configurations before it reports its best.

When a stop rule ends the search (not a user's stop), the session runs this phase in its tick
(:mod:`.phase`): it cancels the pending search trials (a trial budget's, whose every trial is
queued when the search ends, are kept: they count), waits for the others (and ranks them), and
meanwhile re-measures the ``confirm`` best configurations (default 3): one ``confirm`` trial
each, queued ahead of everything, with fresh inputs (another input seed), for another worker
of the class than the one that measured it where one is live (the claim leaves it to the
others for :data:`CONFIRM_AVOID_S`), never answered from the cache. While a confirmation moves
a configuration out of the top ``confirm``, the next one is confirmed too (at most ``2 *
confirm`` per ending, and past those the best itself, one at a time, until the best is one
that was re-measured). Only then is the run finished; its best is the best by confirmed figure
(``best_per_run``). Confirmations are not trials of the search: the search never hears of them
and they do not count against ``max_trials``. With no live worker the phase ends with what is
confirmed so far.

The finalists are judged here across processes (:mod:`tunefleet.spread`): the search's
measurement and each cold confirmation are each a process of their own, and how far apart
processes time one kernel on this device is estimated from the finalists themselves (the
median difference of two processes of one configuration); a finalist agrees when a majority
of its processes are within the tolerance that estimate gives (with too few processes for an
estimate, within the floor or not told apart by the rank test, as one pair always was
judged). The judgement waits for the round in flight while it has no estimate (the first
confirmation back would otherwise be judged by the floor alone), and is stored whole each
time a process comes back (:func:`tunefleet.queries.spread.record_judgement`): each finalist's
standing and figure, each confirmation's verdict and the run's spread, which ``best_per_run``,
``tunefleet best`` and the run's own report read.

When the confirmations are done, the **shoot-out** re-times in one more fresh process each
only what could change the headline (:func:`tunefleet.spread.challengers`: a finalist that
does not agree but could beat the best agreeing one, paired with that best, both queued in
one round), or else, where processes differ beyond the floor (a CPU device), the best
itself until it has three processes, at most ``confirm`` such processes per ending and only
what the time budget still fits; a configuration is timed in at most
:data:`tunefleet.spread.MAX_PROCESSES` processes. Two agreeing finalists closer than the
noise allows to separate are not re-timed: the report names them instead.

Within a time budget (``max_seconds``) the confirmation is part of the run: the search stopped
early enough to leave it its time (:mod:`.budget`), the phase queues only the confirmations
that still come back before the deadline (:func:`.budget.confirmations_that_fit`, counting
those in flight), starts at once without waiting for the search's last trials (a worker
prepares a cold build beside them; a trial that lands later is ranked, and confirmed too if
it still fits), waits for another worker only within the time to spare, and ends at the
deadline whatever is still in flight (the session then hands it back). Without a time budget
it starts at once too, and waits for the search's last trials before it ends.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from tunefleet import agreement
from tunefleet import spread as sp
from tunefleet.queries import search as q
from tunefleet.queries import spread as qs
from tunefleet.vocabulary import TrialPurpose, TrialState

from .budget import Speed, avoid_seconds, confirmations_that_fit
from .phase import Confirmed
from .settings import CoordinatorSettings

_log = logging.getLogger(__name__)

#: A confirmation waits this long (seconds) for a worker other than the original's, while
#: one is live, before the original's worker may take it.
CONFIRM_AVOID_S = 60.0


def fresh_input_seed(measured_with: int, trial_id: int) -> int:
    """The input seed of a confirmation of ``trial_id``: never the seed the original was
    measured with, stable for one trial (a revived confirmation draws the same inputs)."""
    seed = (measured_with + 1 + trial_id) % 2**31
    return seed if seed != measured_with else (measured_with + 1) % 2**31


class Session(Protocol):
    """What the confirmation reads of the session driving the run (and the two things it
    asks of it)."""

    @property
    def conn(self) -> psycopg.Connection[Any]: ...

    @property
    def run_id(self) -> int: ...

    @property
    def device_class(self) -> str: ...

    @property
    def settings(self) -> CoordinatorSettings: ...

    @property
    def protocol(self) -> Mapping[str, Any]: ...

    @property
    def live_workers(self) -> int: ...

    @property
    def flights(self) -> Mapping[str, object]:
        """The run's search trials pending or running, by configuration hash."""
        ...

    @property
    def confirming(self) -> set[int]:
        """The ids of the run's confirmations pending or running."""
        ...

    @property
    def search_pending(self) -> int:
        """The run's search trials pending (not claimed yet)."""
        ...

    def refresh_flights(self) -> None:
        """Bring ``flights`` and ``confirming`` to what the database has in flight now."""
        ...

    def trial_timeout(self) -> float | None:
        """The evaluation timeout of a trial queued now (None: the workers' default)."""
        ...

    def time_left(self) -> float | None:
        """Seconds until the time budget ends (negative: past it); None without one."""
        ...

    def speed(self) -> Speed | None:
        """How fast the run's trials come back (None: not known yet)."""
        ...


@dataclass(frozen=True)
class Judgement:
    """The last judgement of the run's finalists (what :meth:`Confirmation.judge` stored)."""

    finalists: tuple[sp.Finalist, ...]
    judged: tuple[sp.Judged, ...]
    spread: sp.Spread
    unseparated: tuple[int, int] | None
    #: The next confirmation round of each finalist, and what re-timing it needs.
    next_round: Mapping[int, int]
    rows: Mapping[int, qs.ProcessRow]


def _finalists(
    rows: list[qs.ProcessRow],
) -> tuple[list[sp.Finalist], bool, dict[int, int], dict[int, qs.ProcessRow]]:
    """The finalists as :mod:`tunefleet.spread` judges them (a finalist: a search trial with
    a confirmation that came back), whether any confirmation is still in flight, the next
    round of each, and each one's search row."""
    by_trial: dict[int, list[qs.ProcessRow]] = {}
    for r in rows:
        by_trial.setdefault(r.search_trial_id, []).append(r)
    out, in_flight, next_round, search_rows = [], False, {}, {}
    for trial_id, procs in by_trial.items():
        search = next((r for r in procs if r.round == 0), None)
        if search is None or search.median_s is None:
            continue  # not a done search measurement: nothing to compare with
        search_rows[trial_id] = search
        live = [r for r in procs if r.round > 0 and r.state != TrialState.CANCELLED]
        next_round[trial_id] = 1 + max((r.round for r in live), default=0)
        in_flight |= any(r.state in (TrialState.PENDING, TrialState.RUNNING) for r in live)
        failed = any(
            r.state in (TrialState.INVALID, TrialState.FAILED, TrialState.TIMED_OUT)
            or (r.state == TrialState.DONE and r.same_source is False)
            for r in live
        )
        done = [
            sp.Process(r.trial_id, r.median_s, tuple(r.samples or ()))
            for r in procs
            if r.median_s is not None and (r.round == 0 or r.same_source is not False)
        ]
        if len(done) >= 2 or failed:
            out.append(sp.Finalist(trial_id, tuple(done), failed=failed))
    return out, in_flight, next_round, search_rows


class Confirmation:
    """The confirmation phase of one session (a :class:`~.phase.Phase`)."""

    notices_unserved = False

    def __init__(self, session: Session, keep_search: bool = False) -> None:
        self.session = session
        #: The search's trials still queued are part of its budget (a trial budget whose
        #: every trial is queued): they are waited for and ranked, never cancelled.
        self.keep_search = keep_search
        #: Confirmations queued so far (fresh or revived): at most ``2 * confirm``, and past
        #: those only the best's.
        self.enqueued = 0
        #: Pending search trials this phase cancelled (the run's result counts them).
        self.cancelled = 0
        #: Confirmations this phase wanted to queue (the time budget may queue fewer).
        self.wanted = 0
        self._said_no_time = False
        self._said_early = False
        self._said_waiting = False
        #: The shoot-out's further processes queued so far (at most ``confirm``).
        self.shootout = 0
        #: The last judgement stored, and the processes' states it was made on.
        self.judgement: Judgement | None = None
        self._judged_on: tuple[tuple[int, str], ...] | None = None

    def settle(self) -> None:
        s = self.session
        # The search is over: nothing of it waits in the queue (a released trial would come
        # back as pending), and what still runs is waited for, then ranked too; unless the
        # queued ones are the trial budget's own last trials.
        if not self.keep_search:
            self.cancelled += q.cancel_pending(s.conn, s.run_id, TrialPurpose.SEARCH)
        s.refresh_flights()

    def step(self, now: float) -> int | Confirmed:
        # Judged before anything else, and again on the way out: whichever way the phase
        # ends (done, the deadline, no worker left), what came back has its verdict.
        self.judge()
        outcome = self._step()
        if isinstance(outcome, Confirmed):
            self.judge(final=True)
        return outcome

    def _step(self) -> int | Confirmed:
        s = self.session
        left = s.time_left()
        if left is not None and left <= 0:
            if not self.wanted:
                # The search's last trials outlasted the budget: say what went unconfirmed.
                found = q.confirmation_candidates(s.conn, s.run_id, s.settings.confirm)
                unconfirmed = (None, TrialState.CANCELLED)
                self.wanted = sum(c.confirm_state in unconfirmed for c in found)
            return Confirmed()  # the deadline: what is in flight is handed back
        if s.live_workers == 0:
            # Nobody would measure (or reap) anything: end as the search did before.
            _log.warning(
                "run %d: no live worker to confirm the best configurations on; "
                "finishing with what is confirmed so far",
                s.run_id,
            )
            return Confirmed()
        draining = bool(s.flights)
        if self.keep_search and s.search_pending:
            # A trial budget's last trials not claimed yet: confirmations would go ahead of
            # them in the queue, and the run would end later, not sooner.
            if not self._said_waiting:
                self._said_waiting = True
                _log.info(
                    "run %d: every trial of its budget is queued; confirming its best once "
                    "the last %d are claimed",
                    s.run_id,
                    s.search_pending,
                )
            return 0
        if draining:
            # The confirmation starts at once: its cold builds prepare beside the drain (a
            # worker's device waits on the last trials' code generation anyway: 25 s of a
            # README run), and a trial that lands later and ranks is confirmed too (if it
            # still fits a time budget).
            self._confirm_early(left)
        want = s.settings.confirm
        candidates = q.confirmation_candidates(s.conn, s.run_id, want)
        fresh = [c for c in candidates if c.confirm_state in (None, TrialState.CANCELLED)]
        fresh = self._could_win(fresh)
        todo = fresh[: max(0, 2 * want - self.enqueued)]
        if not todo and fresh and fresh[0] is candidates[0]:
            # Past the cap the best itself is still re-measured: it is the figure the run
            # reports, and ending here reported a lucky one nobody had re-measured.
            todo = fresh[:1]
        self.wanted = max(self.wanted, self.enqueued + len(todo))
        if left is not None and todo:
            fit = confirmations_that_fit(s.speed(), len(s.confirming) + len(todo), left)
            todo = todo[: max(0, fit - len(s.confirming))]
            if not todo and not s.confirming:
                self._no_time(left)
                # What is still out may land before the deadline: it is kept, not confirmed.
                return 0 if draining else Confirmed()
        if todo:
            self.enqueued += len(todo)
            return len(self._enqueue(todo, left))
        if s.confirming or draining:
            return 0
        return self._shoot_out(left) or Confirmed()

    def _could_win(self, fresh: list[q.ConfirmCandidate]) -> list[q.ConfirmCandidate]:
        """The candidates a confirmation could still make the best: once a finalist agrees,
        one whose search median is slower than its figure by more than the tolerance cannot
        (its search measurement was the one chosen for being fast), so it is not confirmed
        when a disagreement pushes it into the top ``confirm``: the shoot-out re-times the
        one that disagreed instead."""
        j = self.judgement
        best = None if j is None else next((x for x in sp.rank(j.judged) if x.agrees), None)
        if j is None or best is None:
            return fresh
        bar = best.figure_s * (1 + j.spread.tolerance)
        return [c for c in fresh if c.median_s < bar]

    def judge(self, final: bool = False) -> int:
        """Judge the run's finalists across processes and store it, when a process came
        back since the last judgement; how many finalists it judged. Without an estimate
        of the spread it waits for the confirmations in flight, unless ``final``."""
        s = self.session
        rows = qs.finalist_processes(s.conn, s.run_id)
        seen = tuple((r.trial_id, r.state) for r in rows)
        if seen == self._judged_on:
            return 0
        finalists, in_flight, next_round, search_rows = _finalists(rows)
        spread = sp.estimate(finalists)
        if not finalists or (in_flight and not spread.estimated and not final):
            return 0
        judged = [sp.judge(f, spread) for f in finalists]
        unseparated = sp.unseparated(judged, spread)
        # Each confirmation's own verdict is on the pair its row shows (the search's
        # measurement and this one), under the same yardstick; the finalist's standing is
        # the verdict across all of its processes.
        verdicts = []
        for f in finalists:
            original = f.processes[0]
            for p in f.processes[1:]:
                p_value = (
                    agreement.compare(original.samples, p.samples).p_value
                    if original.samples and p.samples
                    else 1.0
                )
                disagrees = not sp.consistent(original, p, spread)
                verdicts.append(qs.ProcessVerdict(p.trial_id, disagrees, p_value))
        # A confirmation that built other code is a disagreement, whatever it measured.
        verdicts += [
            qs.ProcessVerdict(r.trial_id, True, 1.0)
            for r in rows
            if r.round > 0 and r.state == TrialState.DONE and r.same_source is False
        ]
        qs.record_judgement(
            s.conn,
            s.run_id,
            [qs.FinalistVerdict(j.trial_id, j.standing, j.figure_s, j.processes) for j in judged],
            verdicts,
            qs.RunSpread(
                spread.typical,
                spread.tolerance,
                spread.processes,
                None if unseparated is None else unseparated[1],
                spread.within,
            ),
        )
        self._judged_on = seen
        self.judgement = Judgement(
            tuple(finalists), tuple(judged), spread, unseparated, next_round, search_rows
        )
        self._log_judgement(finalists, judged, spread, unseparated)
        return len(judged)

    def _log_judgement(
        self,
        finalists: list[sp.Finalist],
        judged: list[sp.Judged],
        spread: sp.Spread,
        unseparated: tuple[int, int] | None,
    ) -> None:
        # The run's own report says it to people; this is the log's record.
        run_id = self.session.run_id
        if spread.estimated:
            _log.info(
                "run %d: fresh processes of one kernel differ by %.1f %% (median of %d pairs "
                "over %d process measurements): a re-measurement agrees within %.1f %%",
                run_id,
                100 * (spread.typical or 0.0),
                spread.pairs,
                spread.processes,
                100 * spread.tolerance,
            )
        for f, j in zip(finalists, judged, strict=True):
            _log.info(
                "run %d: trial %d %s across %d process(es) (%s us)%s: figure %.4g us",
                run_id,
                j.trial_id,
                "agrees" if j.agrees else "DISAGREES",
                j.processes,
                ", ".join(f"{1e6 * p.median_s:.4g}" for p in f.processes),
                "; a re-measurement failed or built other code" if f.failed else "",
                1e6 * j.figure_s,
            )
        if unseparated is not None:
            _log.info(
                "run %d: trials %d and %d are closer than these processes can separate",
                run_id,
                *unseparated,
            )

    def _shoot_out(self, left: float | None) -> int:
        """Queue one more fresh process for each finalist whose re-timing could change the
        headline (paired with the best), within ``confirm`` per ending and the time left;
        how many it queued."""
        s = self.session
        self.judge(final=True)
        j = self.judgement
        limit = s.settings.confirm - self.shootout
        if j is None or limit <= 0:
            return 0
        picks = sp.challengers(j.judged, j.finalists, j.spread, limit)
        if left is not None and picks:
            picks = picks[: confirmations_that_fit(s.speed(), len(picks), left)]
            if not picks:
                self._no_time(left)
        if not picks:
            return 0
        self.shootout += len(picks)
        base = int(s.protocol.get("seed") or 0)
        items = []
        for trial_id in picks:
            row = j.rows[trial_id]
            measured = row.input_seed if row.input_seed is not None else base
            rnd = j.next_round[trial_id]
            items.append(
                {
                    "trial_id": trial_id,
                    "config": row.config,
                    "config_hash": row.config_hash,
                    "avoid_worker": None,
                    # Each round draws inputs of its own.
                    "input_seed": fresh_input_seed(measured, trial_id + rnd - 1),
                    "confirm_round": rnd,
                }
            )
        rows = q.insert_confirmations(
            s.conn,
            s.run_id,
            s.device_class,
            items,
            avoid_s=0.0,
            timeout_s=s.trial_timeout(),
            max_attempts=s.settings.max_attempts,
        )
        s.confirming.update(r.id for r in rows)
        _log.info(
            "run %d: shoot-out: timing trials %s once more each, side by side in fresh "
            "processes (their processes differ by more than %.1f %%, or it is the best they "
            "are paired with)",
            s.run_id,
            ", ".join(str(t) for t in picks),
            100 * j.spread.tolerance,
        )
        return len(rows)

    def _confirm_early(self, left: float | None) -> None:
        if self._said_early:
            return
        self._said_early = True
        _log.info(
            "run %d: %sconfirming the best so far while %d search trial(s) are still out",
            self.session.run_id,
            "" if left is None else f"{left:.1f} s of the time budget left: ",
            len(self.session.flights),
        )

    def _no_time(self, left: float) -> None:
        if self._said_no_time:
            return
        self._said_no_time = True
        pace = self.session.speed()
        _log.warning(
            "run %d: %.1f s of the time budget left, too little to confirm its best (one "
            "confirmation takes about %s); finishing with what is confirmed so far",
            self.session.run_id,
            left,
            "?" if pace is None else f"{pace.confirms(1):.1f} s",
        )

    def _enqueue(
        self, candidates: list[q.ConfirmCandidate], left: float | None
    ) -> list[q.QueuedConfirmation]:
        s = self.session
        slack = None
        if left is not None:
            pace = s.speed()
            need = 0.0 if pace is None else pace.confirms(len(s.confirming) + len(candidates))
            slack = left - need
        base = int(s.protocol.get("seed") or 0)
        items = []
        for c in candidates:
            measured = c.input_seed if c.input_seed is not None else base
            items.append(
                {
                    "trial_id": c.trial_id,
                    "config": c.config,
                    "config_hash": c.config_hash,
                    "avoid_worker": c.worker_id,
                    "input_seed": fresh_input_seed(measured, c.trial_id),
                }
            )
        rows = q.insert_confirmations(
            s.conn,
            s.run_id,
            s.device_class,
            items,
            avoid_s=avoid_seconds(CONFIRM_AVOID_S, s.live_workers, slack),
            timeout_s=s.trial_timeout(),
            max_attempts=s.settings.max_attempts,
        )
        s.confirming.update(r.id for r in rows)
        _log.info(
            "run %d: confirming %d of its best configurations (trials %s)",
            s.run_id,
            len(rows),
            ", ".join(str(r.confirms_trial_id) for r in rows),
        )
        return rows
