"""When a worker claims next, and whether it listens for notifications meanwhile (pure: no
database, no clock of its own).

The coordinator sends one ``NOTIFY`` per batch of trials it inserts, and PostgreSQL (up to 18
at least) signals *every* session of the database that LISTENs, whatever the channel: each
listening server process wakes, reads the notification queue and sends the notification to
its client. A worker that claims when woken then joins every other woken worker in a herd of
concurrent ``SKIP LOCKED`` claims for the same first rows, each stepping over the others' row
locks through the lock manager (a tuple lock tried per locked row: a herd of k claims makes
about k^2/2 lock-manager calls), and every other statement queues behind the lock manager's
partition locks. Measured on two cores with 800 virtual workers at T = 10 s
(``benchmarks/fleet_sim.py``, ``benchmarks/published/fleet_sim_wakeups_2cores.json``): the
lock manager was the top wait event (38-48 % of the active sessions' samples) and efficiency
0.24-0.75 when every worker listened, 0.47 when only idle workers listened (an idle fleet
woken by one batch is the same herd, and a slowed fleet has ever more idle workers), against
0.99 polling and 0.98 polling through PgBouncer.

So a worker **polls**: after a claim that came back with fewer trials than it had room for,
the next one comes after :data:`POLL_FIRST_S`, doubling with every further short claim up to
the polling interval, each wait jittered (the "equal jitter" of exponential backoff: between
half and all of it) so that workers that found the queue empty together do not come back
together; a claim that got what it asked for resets it. A busy worker needs no wake-up: it
still holds the trial it times, its next claim has a whole trial's time to succeed, and the
coordinator keeps a poll's worth of trials queued beyond the workers' capacity, so in steady
state the claim after each completion finds one. The cost is an idle fleet's polls (N
workers: about N / 3.75 empty claims a second at the default 5 s) and up to one polling
interval before an idle worker sees a new run.

With ``listen`` (``--listen``, for small fleets that want the next run at once; ``tune``'s
own workers listen) a worker whose **device waits** (it holds no trial ready to time: none at
all, or only ones still in code generation, as at the end of a run's search), where its route
keeps a session, claims once
more at once with ``LISTEN`` in the same round trip (committed first: a batch committed after
it is notified, one committed before it is seen by that claim), is woken by the next batch,
and claims after a random delay of up to :data:`WAKE_SPREAD_S`; it sends ``UNLISTEN`` once it
holds a trial ready for its device again. Behind a transaction pooler (no LISTEN: the route
does not keep a session) it only polls.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

#: First wait after a short claim (the coordinator refills every 0.2 s).
POLL_FIRST_S = 0.25
#: A woken idle worker (``--listen``) claims after a random delay of up to this much.
WAKE_SPREAD_S = 0.1


@dataclass
class Wakeups:
    """One worker's claim schedule. ``listen``: whether its route keeps a session (it may
    LISTEN); ``listening``: whether it does now (set by the caller once the statement went
    through, cleared when its connection is lost)."""

    poll_s: float
    listen: bool
    rng: random.Random = field(default_factory=random.Random)
    first_s: float = POLL_FIRST_S
    spread_s: float = WAKE_SPREAD_S
    listening: bool = False
    #: Claims in a row that came back short (0 after one that got all it asked for).
    short_claims: int = 0

    def wants_listen(self, ready: int) -> bool:
        """Should the next claim start listening first (``LISTEN`` in the same round trip)?
        Only for a worker whose device waits (``ready``: the trials it holds ready for or on
        its device, none) and whose last claim came back short."""
        return self.listen and not self.listening and ready == 0 and self.short_claims > 0

    def wants_unlisten(self, ready: int) -> bool:
        """Listening while it holds a trial ready for its device again: stop being woken
        (``UNLISTEN``)."""
        return self.listening and ready > 0

    def after_claim(self, now: float, got: int, asked: int, ready: int) -> float:
        """When to claim next after a claim that got ``got`` of ``asked`` trials, the worker
        now holding ``ready`` ready for or on its device: at once after a full one (the
        caller claims only while it has room), else after the wait described in the module
        docstring."""
        if got >= asked:
            self.short_claims = 0
            return now
        self.short_claims += 1
        if self.wants_listen(ready):
            return now  # idle: LISTEN, then claim again, in one round trip
        return now + self.wait_s()

    def wait_s(self) -> float:
        """The jittered wait after the current streak of short claims (the polling interval
        itself while listening: a notification comes first)."""
        if self.listening:
            base = self.poll_s
        else:
            steps = max(self.short_claims - 1, 0)
            base = min(self.poll_s, self.first_s * 2.0 ** min(steps, 30))
        return base * (0.5 + 0.5 * self.rng.random())

    def woken(self, now: float) -> float:
        """A notification for our classes: claim soon (a random share of the spread)."""
        return now + self.spread_s * self.rng.random()

    def lost_session(self) -> None:
        """The connection went away: a new one listens to nothing."""
        self.listening = False
