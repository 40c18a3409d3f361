"""The worker's last stage: what a finished trial leaves in the database, and the books the
worker keeps of what it wrote.

A finished trial goes out one of two ways: its result through the fenced completion
(:func:`tunefleet.queries.queue.complete_trial`: trial, attempt, lease token and worker must
still match, so a zombie's late result changes nothing), or, after an environment fault, the
trial itself back to the queue uncounted. Either may meet a database that is away: the trial
then stays finished and is sent again later (:attr:`Sent.LATER`), while the lease may still
be ours. The runs this worker stood aside from are written here too, once the database takes
them.

The books: outcomes by kind (the worker's closing summary), the seconds its device spent
timing (its timing share), and the fastest median it measured per run (the racing bound,
``dispatch.RACE_FACTOR``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from enum import Enum
from uuid import UUID

import psycopg

from tunefleet.errors import first_line
from tunefleet.queries import queue
from tunefleet.timeline import Phase

from .link import DatabaseDown, Link
from .results import Held
from .vocabulary import Verdict

log = logging.getLogger("tunefleet.worker")


class Sent(Enum):
    """What became of a finished trial this worker tried to write."""

    #: Written (or refused by the fence, or unwritable and dropped): forget it.
    GONE = "gone"
    #: The database is away: keep it finished, send it again after reconnecting.
    LATER = "later"
    #: Its result could not be stored as it was; it is now a failure, to be sent next turn.
    AGAIN = "again"


class Outbox:
    """The fenced writes of one worker's finished trials, and its books of them."""

    def __init__(self, link: Link, worker_id: UUID) -> None:
        self.link = link
        self.worker_id = worker_id
        self.outcomes: Counter[str] = Counter()
        #: Seconds this worker's device spent timing kernels, from the timelines it sent.
        self.timed_s = 0.0
        #: The fastest median this worker measured per run.
        self.best_s: dict[int, float] = {}
        #: Runs stood aside from whose ``stand_aside`` row is not written yet (the database
        #: was away), with the reason.
        self.unrecorded: dict[int, str] = {}

    def send(self, held: Held) -> Sent:
        """The fenced completion of one finished trial."""
        c = held.claim
        held.sends += 1
        timeline = held.marks.phases(time.monotonic())
        try:
            state = self.link.run(
                queue.complete_trial,
                trial_id=c.trial_id,
                attempt=c.attempt,
                token=c.lease_token,
                worker_id=self.worker_id,
                state=held.state,
                error=held.error,
                measurement=held.measurement,
                timeline=timeline,
            )
        except DatabaseDown:
            return Sent.LATER
        except psycopg.DatabaseError as exc:
            # The result itself cannot be stored (a value the table refuses): record the
            # attempt as failed rather than crash; the fence still applies.
            reason = first_line(exc, repr(exc))
            if held.state == Verdict.DONE:
                held.finish(Verdict.FAILED, f"the result could not be stored: {reason}")
                return Sent.AGAIN
            log.error("trial %s: completion failed (%s); dropping it", c.trial_id, reason)
            return Sent.GONE
        if state is None and held.sends > 1:
            # The first send may have committed before the connection broke.
            try:
                recorded = self.link.run(
                    queue.attempt_outcome,
                    trial_id=c.trial_id,
                    attempt=c.attempt,
                    worker_id=self.worker_id,
                )
            except DatabaseDown:
                return Sent.LATER
            if recorded == held.state:
                state = "recorded"
        if state is None:
            log.warning(
                "completion rejected: trial %s attempt %s is no longer ours (lease lost); "
                "dropping its %s result",
                c.trial_id,
                c.attempt,
                held.state,
            )
            self.outcomes["dropped"] += 1
            return Sent.GONE
        self.outcomes[str(held.state)] += 1
        self.timed_s += timeline.get(Phase.TIMING, 0.0)
        if held.measurement is not None and not held.cold:
            run, median = c.run_id, held.measurement.median_s
            self.best_s[run] = min(self.best_s.get(run, median), median)
        log.info(
            "trial %s attempt %s: %s%s -> trial %s",
            c.trial_id,
            c.attempt,
            held.state,
            f" ({held.error})" if held.error else "",
            state,
        )
        return Sent.GONE

    def hand_back(self, held: Held) -> Sent:
        """Release one trial uncounted after an environment fault."""
        c = held.claim
        try:
            released = self.link.run(
                queue.release_trials,
                worker_id=self.worker_id,
                held=[c.key],
                reason=f"{queue.ENVIRONMENT_PREFIX}{held.error}",
            )
        except DatabaseDown:
            return Sent.LATER
        except psycopg.DatabaseError as exc:
            # The trial's lease expires and the reaper requeues it; we go on.
            log.error("trial %s: could not hand it back: %s", c.trial_id, first_line(exc))
            released = set()
        if c.trial_id in released:
            log.info("trial %s handed back (not counted): %s", c.trial_id, held.error)
            self.outcomes["handed back"] += 1
        return Sent.GONE

    def record_stand_asides(self, secret: str) -> bool:
        """Write the stand-aside rows not written yet (presenting the worker's ``secret``);
        False while the database is away."""
        for run, reason in list(self.unrecorded.items()):
            try:
                self.link.run(
                    queue.stand_aside,
                    worker_id=self.worker_id,
                    secret=secret,
                    run_id=run,
                    reason=reason,
                )
            except DatabaseDown:
                return False
            except psycopg.DatabaseError as exc:  # e.g. the run was deleted meanwhile
                log.error("could not record standing aside from run %s: %s", run, first_line(exc))
            del self.unrecorded[run]
        return True
