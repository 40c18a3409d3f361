"""When a worker claims next, and whether it listens for notifications meanwhile (pure: no
database, no clock of its own).

The coordinator sends one ``NOTIFY`` per batch of trials it inserts, and PostgreSQL (up to 18
at least) signals *every* session of the database that LISTENs, whatever the channel: each
listening server process wakes, reads the notification queue and sends the notification to
its client, which wakes too. A fleet that listened all the time paid that for every worker
at every batch (five a second from a coordinator polling every 0.2 s): 2,000 workers, 10,000
wake-ups a second, nearly all for workers that had no room for a trial anyway.

So a worker listens **only while it waits for work**: when a claim comes back with fewer
trials than it has room for, it claims once more at once, preceded by ``LISTEN`` in the same
round trip (committed first, so a batch committed after it is notified and one committed
before it is seen by the claim: nothing falls between); once it is full again it sends
``UNLISTEN``.
In steady state a worker finds the next trial on the claim that follows each completion (the
coordinator keeps a poll's worth queued beyond the workers' capacity) and never listens; the
listeners are the few workers that found the queue empty, and a batch wakes about as many
claims as it brings trials.

Where the route cannot keep a session (a transaction pooler: a LISTEN would stay on a server
connection lent to others), the worker polls instead: after a claim that came back short, the
next one after :data:`POLL_FIRST_S`, doubling with every further short claim up to the
polling interval, each wait jittered (the "equal jitter" of exponential backoff: between half
and all of it) so that workers that found the queue empty together do not come back
together. A claim that got a trial resets it. Listening workers keep a jittered fallback poll
at the polling interval (a notification is a hint).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

#: First wait after a short claim when polling (the coordinator refills every 0.2 s).
POLL_FIRST_S = 0.25


@dataclass
class Wakeups:
    """One worker's claim schedule. ``listen``: whether its route keeps a session (it may
    LISTEN); ``listening``: whether it does now (set by the caller once the statement went
    through, cleared when its connection is lost)."""

    poll_s: float
    listen: bool
    rng: random.Random = field(default_factory=random.Random)
    first_s: float = POLL_FIRST_S
    listening: bool = False
    #: Claims in a row that came back short (0 after one that got a trial).
    short_claims: int = 0

    def wants_listen(self, room: int) -> bool:
        """Should the next claim start listening first (``LISTEN`` in the same round trip)?
        Only after a short claim, while there is room."""
        return self.listen and not self.listening and room > 0 and self.short_claims > 0

    def wants_unlisten(self, room: int) -> bool:
        """Listening with no room left: stop being woken (``UNLISTEN``)."""
        return self.listening and room <= 0

    def after_claim(self, now: float, got: int, asked: int) -> float:
        """When to claim next after a claim that got ``got`` of ``asked`` trials: at once
        after a full one (the caller claims only while it has room), else after the wait
        described in the module docstring."""
        if got >= asked:
            self.short_claims = 0
            return now
        self.short_claims += 1
        if self.listen and not self.listening:
            return now  # start waiting: LISTEN, then claim again, in one round trip
        return now + self.wait_s()

    def wait_s(self) -> float:
        """The jittered wait after the current streak of short claims."""
        if self.listen:
            base = self.poll_s
        else:
            steps = max(self.short_claims - 1, 0)
            base = min(self.poll_s, self.first_s * 2.0 ** min(steps, 30))
        return base * (0.5 + 0.5 * self.rng.random())

    def woken(self, now: float) -> float:
        """A notification for our classes: claim now."""
        return now

    def lost_session(self) -> None:
        """The connection went away: a new one listens to nothing."""
        self.listening = False
