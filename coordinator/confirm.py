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

Each done confirmation is judged here, once, by :func:`tunefleet.agreement.compare` on the
two measurements' samples (a rank test behind a floor for the protocol's resolution), and the
verdict is stored on the confirmation trial: the ``confirmations`` view, ``tunefleet best``
and the run's own report read that one decision.

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
from typing import Any, Protocol

import psycopg

from tunefleet import agreement
from tunefleet.queries import search as q
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
            self.judge()
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
        return 0 if s.confirming or draining else Confirmed()

    def judge(self) -> int:
        """Decide and store the verdict of every done confirmation not judged yet; how many."""
        s = self.session
        judged = 0
        for u in q.unjudged_confirmations(s.conn, s.run_id):
            verdict = agreement.compare(u.original_samples, u.confirmed_samples)
            # Another kernel's time is no confirmation, however close the numbers.
            agrees = verdict.agrees and u.same_source is not False
            if q.record_agreement(s.conn, u.confirm_trial_id, not agrees, verdict.p_value):
                judged += 1
                # The run's own report says it to people; this is the log's record.
                _log.info(
                    "run %d: confirmation %d %s: %s%s",
                    s.run_id,
                    u.confirm_trial_id,
                    "agrees" if agrees else "DISAGREES",
                    verdict.describe(),
                    ""
                    if u.same_source is not False
                    else "; its cold build generated OTHER "
                    "code than the search measured (a cache answered with another kernel?)",
                )
        return judged

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
