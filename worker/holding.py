"""The trials one worker holds: each claimed trial's :class:`~tunefleet.worker.results.Held`,
in claim order, and their leases, which the heartbeat thread renews
(:class:`~tunefleet.worker.heartbeat.HeldLeases`).

Every stage reads and moves the held trials; this is the one place that adds and forgets
them, so a trial and its lease come and go together, and the questions the stages ask of
them (the first one in a stage, how many count against the capacity, whether the device has
something ready) are answered the same way everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from tunefleet.queries.queue import ClaimedTrial

from .heartbeat import HeldLeases
from .judge import Trial
from .results import Held
from .supervise import Child
from .timeline import Marks
from .vocabulary import Stage

#: The stages in which a trial is ready for the device or on it.
READY_FOR_DEVICE = (Stage.PREPARED, Stage.MEASURING)
#: The stages in which a trial still waits for its code: the device starves on these.
BEFORE_CODE = (Stage.CLAIMED, Stage.PREPARING)


class Holding:
    """The held trials of one worker, keyed by trial id, in the order they were claimed."""

    def __init__(self, leases: HeldLeases | None = None) -> None:
        self.leases = leases if leases is not None else HeldLeases()
        self._held: dict[int, Held] = {}

    def take(self, claims: Sequence[ClaimedTrial], at: float | None = None) -> list[Held]:
        """Hold ``claims`` (claimed at ``at``, monotonic seconds) and their leases."""
        taken = time.monotonic() if at is None else at
        added = []
        for claim in claims:
            held = Held(claim, marks=Marks(taken))
            self._held[claim.trial_id] = held
            self.leases.add(claim.key)
            added.append(held)
        return added

    def forget(self, held: Held) -> None:
        """Stop holding ``held`` (sent, released, or lost): the heartbeat no longer renews
        its lease."""
        self._held.pop(held.claim.trial_id, None)
        self.leases.remove(held.key)

    def get(self, trial_id: int) -> Held | None:
        return self._held.get(trial_id)

    def __getitem__(self, trial_id: int) -> Held:
        return self._held[trial_id]

    def __iter__(self) -> Iterator[Held]:
        return iter(list(self._held.values()))

    def __len__(self) -> int:
        return len(self._held)

    def __bool__(self) -> bool:
        return bool(self._held)

    def first(self, stage: Stage, cold: bool | None = None) -> Held | None:
        """The first held trial (in claim order) in ``stage`` and, given ``cold``, of that
        kind (a confirmation's cold build or not)."""
        return next(
            (
                h
                for h in self._held.values()
                if h.stage == stage and (cold is None or h.cold == cold)
            ),
            None,
        )

    def in_stages(self, *stages: Stage) -> list[Held]:
        return [h for h in self._held.values() if h.stage in stages]

    def any_in(self, *stages: Stage) -> bool:
        return any(h.stage in stages for h in self._held.values())

    def counted(self) -> list[Held]:
        """The held trials that count against the capacity: all but the suspects (which
        wait for the run's next verdict on this worker, using nothing)."""
        return [h for h in self._held.values() if h.stage != Stage.SUSPECT]

    def ready_for_device(self) -> int:
        """How many are ready for the device or on it: none means the device waits (on code
        generation, or for work)."""
        return sum(h.stage in READY_FOR_DEVICE for h in self._held.values())

    def of_child(self, child: Child) -> Held | None:
        """The held trial ``child`` works on, if any."""
        return next((h for h in self._held.values() if h.child is child), None)

    def children(self) -> list[Child]:
        """The children tied to a held trial."""
        return [h.child for h in self._held.values() if h.child is not None]

    def seen(self) -> list[Trial]:
        """The held trials as the fault policy sees them."""
        return [h.seen() for h in self._held.values()]

    def unfinished(self) -> list[Held]:
        """The held trials that have not finished (a finished one only waits to be sent)."""
        return [h for h in self._held.values() if h.stage != Stage.FINISHED]
