"""The confirmation phase: re-measure a run's best configurations before it reports its best.

When a stop rule ends the search (not a user's stop), the session runs this phase in its
tick (:mod:`.phase`): it cancels the pending search trials, waits for the running ones, and
re-measures the ``confirm`` best configurations (default 3): one ``confirm`` trial each,
queued ahead of everything, with fresh inputs (another input seed), for another worker of
the class than the one that measured it where one is live (the claim leaves it to the others
for :data:`CONFIRM_AVOID_S`), never answered from the cache. While a confirmation moves a
configuration out of the top ``confirm``, the next one is confirmed too (at most
``2 * confirm`` per ending). Only then is the run finished; its best is the best by confirmed
figure (``best_per_run``). Confirmations are not trials of the search: the search never hears
of them and they do not count against ``max_trials`` (they do extend the run's wall time past
``max_seconds``). With no live worker the phase ends with what is confirmed so far.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import psycopg

from tunefleet.queries import search as q
from tunefleet.vocabulary import TrialPurpose, TrialState

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

    def refresh_flights(self) -> None:
        """Bring ``flights`` and ``confirming`` to what the database has in flight now."""
        ...

    def trial_timeout(self) -> float | None:
        """The evaluation timeout of a trial queued now (None: the workers' default)."""
        ...


class Confirmation:
    """The confirmation phase of one session (a :class:`~.phase.Phase`)."""

    notices_unserved = False

    def __init__(self, session: Session) -> None:
        self.session = session
        #: Confirmations queued so far (fresh or revived): at most ``2 * confirm``.
        self.enqueued = 0
        #: Pending search trials this phase cancelled (the run's result counts them).
        self.cancelled = 0

    def settle(self) -> None:
        s = self.session
        # The search is over: nothing of it waits in the queue (a released trial would come
        # back as pending), and what still runs is waited for, then ranked too.
        self.cancelled += q.cancel_pending(s.conn, s.run_id, TrialPurpose.SEARCH)
        s.refresh_flights()

    def step(self, now: float) -> int | Confirmed:
        s = self.session
        if s.live_workers == 0:
            # Nobody would measure (or reap) anything: end as the search did before.
            _log.warning(
                "run %d: no live worker to confirm the best configurations on; "
                "finishing with what is confirmed so far",
                s.run_id,
            )
            return Confirmed()
        if s.flights:
            return 0  # the search's last trials first: they are ranked too
        want = s.settings.confirm
        candidates = q.confirmation_candidates(s.conn, s.run_id, want)
        todo = [c for c in candidates if c.confirm_state in (None, TrialState.CANCELLED)]
        todo = todo[: max(0, 2 * want - self.enqueued)]
        if todo:
            self.enqueued += len(todo)
            return len(self._enqueue(todo))
        return 0 if s.confirming else Confirmed()

    def _enqueue(self, candidates: list[q.ConfirmCandidate]) -> list[q.QueuedConfirmation]:
        s = self.session
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
            avoid_s=CONFIRM_AVOID_S,
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
