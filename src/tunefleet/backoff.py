"""The one backoff: how long to wait before the next try at something that keeps failing.

The worker's database links (reconnects, and statements the database aborted), the start-up
wait for a database (``--wait-for-db``) and the coordinator's reconnect all wait
``first_s``, then twice as long each time, never more than
``max_s``, and start again from ``first_s`` after a success.
"""

from __future__ import annotations

#: Reconnecting to a database that was there a moment ago (the worker's links, the
#: coordinator): try again soon, then back off to a few seconds.
RECONNECT_FIRST_S = 0.2
RECONNECT_MAX_S = 5.0

#: A statement the database aborted on a healthy connection (a deadlock, a serialization
#: failure): the other transaction usually ends within milliseconds, so try again at once,
#: a few times, then leave it to the caller's next turn.
STATEMENT_RETRY_FIRST_S = 0.05
STATEMENT_RETRY_MAX_S = 0.5
STATEMENT_TRIES = 5


class Backoff:
    """``next()`` gives the pause before the next try; ``reset()`` after a success."""

    def __init__(self, first_s: float = RECONNECT_FIRST_S, max_s: float = RECONNECT_MAX_S) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(f"backoff needs 0 < first_s <= max_s, got {first_s}, {max_s}")
        self.first_s = first_s
        self.max_s = max_s
        #: The pause last given (0: none since the start or the last reset).
        self.current_s = 0.0

    def next(self) -> float:
        self.current_s = self.first_s if not self.current_s else min(self.current_s * 2, self.max_s)
        return self.current_s

    def reset(self) -> None:
        self.current_s = 0.0
