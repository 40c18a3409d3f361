"""What a phase of a session is to the engine's tick, and how a phase says its work is over.

A session (:mod:`.engine`) drives a run through two phases, the search and then, when a stop
rule ended it, the confirmation (:mod:`.confirm`). Both run in the same tick: heartbeat,
outcomes, live workers, :meth:`Phase.settle`, the stop check, :meth:`Phase.step`, progress,
wait. A phase decides only what differs: what it brings up to date before the stop check and
what it does with the rest of the tick. Kept apart from the engine so that the confirmation
names these without importing the engine that imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RuleHolds:
    """The search is over: ``reason``, a stop rule of :mod:`.rules`, holds."""

    reason: str


@dataclass(frozen=True)
class Confirmed:
    """The confirmation is over: every confirmation it queued has finished, or no live
    worker is left to measure one (the run finishes with what is confirmed so far)."""


class Phase(Protocol):
    """One phase of a session, as the tick drives it."""

    @property
    def notices_unserved(self) -> bool:
        """Whether the tick watches for a run that no live worker may serve (the search
        does; the confirmation ends instead when no worker is live)."""
        ...

    def settle(self) -> None:
        """After the tick has read the outcomes and before its stop check: bring the
        session's view of the queue up to date."""
        ...

    def step(self, now: float) -> int | RuleHolds | Confirmed:
        """The phase's work in this tick: how many trials it added (a tick in which neither
        outcomes nor trials moved waits one poll), or the phase's end."""
        ...
