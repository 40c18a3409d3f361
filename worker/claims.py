"""The claim stage: taking pending trials from the queue into this worker's
:class:`~tunefleet.worker.holding.Holding`, as many as its capacity leaves room for, and
what the worker learns when there is nothing to take.

Claiming is :func:`tunefleet.queries.queue.claim_trials` (``FOR UPDATE SKIP LOCKED``). When to
claim next is :mod:`tunefleet.worker.wake`'s decision (a jittered backoff, and LISTEN while
the device waits); a notification for this worker's device classes makes the next claim due
at once. Three answers need more than a retry:

* nothing to take: the suspects nothing else can settle are settled, a worker that stood
  aside from every open run says so and stops, and a draining worker ends when no work of
  its classes is left;
* a refused claim (a row in a state no statement of ours expects): claimed again one trial
  at a time; refused again, that trial is the bad row, logged and never claimed again here;
  when it cannot be told apart, the worker waits longer each time and never dies of it;
* ``--max-trials`` reached: nothing more is claimed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from uuid import UUID

import psycopg

from tunefleet.errors import StandingAside, first_line
from tunefleet.queries import queue
from tunefleet.vocabulary import ANY_DEVICE_CLASS

from .holding import Holding
from .judge import Judge, cannot_serve
from .link import DatabaseDown, Link
from .results import Held
from .settings import WorkerSettings
from .wake import Wakeups

log = logging.getLogger("tunefleet.worker")

#: Longest wait between claims the database keeps refusing (doubling from ``poll_s``).
CLAIM_BACKOFF_S = 60.0
#: Trials set aside in a row, without a claim that worked between them, before the worker
#: calls it something other than bad rows (and only waits and retries).
MAX_SKIPS_IN_ROW = 3


class Claims:
    """One worker's claims: when the next is due, what it has claimed, what it skips."""

    def __init__(
        self,
        settings: WorkerSettings,
        link: Link,
        wake: Wakeups,
        judge: Judge,
        holding: Holding,
        worker_id: UUID,
        host: str,
        *,
        settle: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.link = link
        self.wake = wake
        self.judge = judge
        self.holding = holding
        self.worker_id = worker_id
        self.host = host
        #: Settles the held suspects that nothing else will (``why``: for the log).
        self.settle = settle
        #: Set once the worker is registered and knows its device.
        self.secret = ""
        self.classes: list[str] = [ANY_DEVICE_CLASS]
        #: When the next claim is due (monotonic seconds; 0: now).
        self.next_at = 0.0
        #: Trials claimed so far (``--max-trials`` counts these).
        self.claimed = 0
        #: The last claim found nothing and nothing is held (logged once).
        self.idle = False
        #: A draining worker found no work of its classes left.
        self.drained = False
        #: Claims refused in a row.
        self.failures = 0
        #: Trials whose claim the database refused (one bad row), never claimed again here.
        self.skipped: dict[int, str] = {}
        self.skips_in_row = 0

    def due(self) -> None:
        """Claim at the next turn (a trial went out, a larger prefetch, a pending trial came
        back, a run stood aside from)."""
        self.next_at = 0.0

    @property
    def exhausted(self) -> bool:
        """``--max-trials`` is reached."""
        limit = self.settings.max_trials
        return limit is not None and self.claimed >= limit

    def step(self, capacity: int) -> list[Held]:
        """Claim what ``capacity`` leaves room for, if a claim is due and the database is
        there; return the trials now held."""
        limit = capacity - len(self.holding.counted())
        if self.failures:
            limit = min(limit, 1)  # find the one bad row: claim one at a time
        if self.settings.max_trials is not None:
            limit = min(limit, self.settings.max_trials - self.claimed)
            if limit <= 0:
                self.settle("no more trials may be claimed (--max-trials)")
        now = time.monotonic()
        if limit <= 0 or now < self.next_at or not self.link.ready():
            return []
        listen_first = self.wake.wants_listen(self.holding.ready_for_device())
        try:
            claims = self.link.run(
                queue.claim_trials,
                worker_id=self.worker_id,
                secret=self.secret,
                device_classes=self.classes,
                limit=limit,
                lease_s=self.settings.lease_s,
                excluded_runs=sorted(self.judge.excluded),
                skipped_trials=sorted(self.skipped),
                listen_first=listen_first,
            )
        except DatabaseDown:
            return []
        except psycopg.DatabaseError as exc:
            self.wake.listening |= listen_first  # the LISTEN went first, in its own commit
            self._refused(exc, limit, now)
            return []
        self.wake.listening |= listen_first
        self.failures = 0
        taken = self._take(claims) if claims else []
        if not claims:
            self._found_nothing()
        ready = self.holding.ready_for_device()
        self.next_at = self.wake.after_claim(now, len(claims), limit, ready)
        if self.wake.wants_unlisten(ready):
            try:
                self.link.run(queue.unlisten)
                self.wake.listening = False
            except DatabaseDown:
                pass
        return taken

    def pump_notifications(self) -> None:
        """Read notifications without waiting (psycopg also queues those that arrived during
        other statements); one for our classes makes the next claim due now."""
        for payload in self.link.notifies():
            if not payload or payload in self.classes:
                self.next_at = self.wake.woken(time.monotonic())

    def _take(self, claims: list[queue.ClaimedTrial]) -> list[Held]:
        self.skips_in_row = 0
        taken = self.holding.take(claims)
        for claim in claims:
            self.claimed += 1
            log.info(
                "claimed trial %s (run %s, attempt %s/%s)",
                claim.trial_id,
                claim.run_id,
                claim.attempt,
                claim.max_attempts,
            )
        self.drained = self.idle = False
        return taken

    def _found_nothing(self) -> None:
        """Nothing to claim: settle the suspects nothing else can, and (holding nothing)
        find out whether there is work left at all."""
        self.settle("no other trial of the run to compare with")
        if not self.holding and not self.idle:
            self.idle = True
            log.info(
                "waiting for work (polling, backing off to every %g s%s)",
                self.settings.poll_s,
                ", woken by notifications" if self.wake.listen else "",
            )
        excluded = self.judge.excluded
        if self.holding or not (self.settings.drain or excluded):
            return
        try:
            if excluded:
                work = self.link.run(queue.open_work, self.classes, sorted(excluded))
                if work.excluded and not work.servable:
                    raise StandingAside(cannot_serve(str(self.worker_id), self.host, excluded))
                open_work = work.servable or work.excluded
            else:
                open_work = self.link.run(queue.has_open_trials, self.classes)
        except DatabaseDown:
            return
        if self.settings.drain:
            self.drained = not open_work
            if self.drained:
                log.info(
                    "drained: no trial of classes %s is pending or running, and no live "
                    "coordinator drives a run of them",
                    self.classes,
                )

    def _refused(self, exc: psycopg.DatabaseError, limit: int, now: float) -> None:
        """Never die of one bad row. A claim the database refuses is tried again for one
        trial; refused again, that trial is the bad row: logged, never claimed again by this
        worker, and the worker goes on. While that cannot be told apart (nothing pending, a
        read that fails too, or several trials in a row refused: then it is not one row), it
        waits, longer each time."""
        reason = first_line(exc)
        self.failures += 1
        bad: int | None = None
        if limit == 1 and self.skips_in_row < MAX_SKIPS_IN_ROW:
            try:
                bad = self.link.run(
                    queue.next_pending,
                    device_classes=self.classes,
                    excluded_runs=sorted(self.judge.excluded),
                    skipped_trials=sorted(self.skipped),
                )
            except (DatabaseDown, psycopg.DatabaseError):
                bad = None
        if bad is not None:
            self.skipped[bad] = reason
            self.skips_in_row += 1
            self.failures = 0
            log.error(
                "trial %s cannot be claimed (%s); this worker leaves it alone and goes on",
                bad,
                reason,
            )
            return
        delay = 0.0
        if self.failures > 1:
            delay = min(self.settings.poll_s * 2 ** (self.failures - 2), CLAIM_BACKOFF_S)
        self.next_at = now + delay
        log.error("claim failed: %s; trying one trial at a time in %g s", reason, delay)
