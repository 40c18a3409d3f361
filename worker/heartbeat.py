"""The heartbeat thread: keeps every claimed trial's lease alive, the worker row fresh and the
device lease held, on the worker's one session.

Every third of the lease it sends one statement (``tunefleet.heartbeat``, database clock,
fenced by the lease tokens) on the main loop's own connection: the link lets a beat go
before the main loop's next call, so a beat waits for at most the one statement in flight
(bounded by ``statement_timeout``). A held claim that the database no longer lets us extend
has been lost (our lease expired and the trial was requeued, maybe claimed by another
worker): the thread marks it lost and wakes the main loop, which abandons it. A device lease
that could not be extended (it expired and another worker took the device, or the worker row
was stopped, which frees it) is lost too: the main loop stops timing and exits.

**Liveness.** A separate thread would keep a stuck worker's leases alive forever (a main
loop blocked in a read that never returns, a bug that loops): nobody else could ever measure
those trials. So the thread beats only while the main loop moves (:class:`Liveness`): a
loop that has not turned, finished a database call or entered a bounded wait for more than
its allowance (the lease, or the bound it declared for a long step such as opening the
device) is stuck, its beats stop, its leases expire and the reaper requeues its trials, as
for a dead worker. The main loop turns at least every half of that allowance when it is well.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from uuid import UUID

from tunefleet.queries import queue
from tunefleet.queries.queue import Lease

from .link import DatabaseDown, Link

log = logging.getLogger("tunefleet.worker")

Key = Lease  # trial id, attempt and lease token: with the worker id, the claim's fence


class HeldLeases:
    """The claims this worker holds, shared by the main loop and the heartbeat thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[Key] = set()
        self._lost: set[Key] = set()

    def add(self, key: Key) -> None:
        with self._lock:
            self._held.add(key)

    def remove(self, key: Key) -> None:
        with self._lock:
            self._held.discard(key)
            self._lost.discard(key)

    def snapshot(self) -> list[Key]:
        with self._lock:
            return sorted(self._held)

    def mark_lost(self, keys: list[Key]) -> list[Key]:
        """Mark claims lost; returns those still held (a claim completed meanwhile is not)."""
        with self._lock:
            fresh = [k for k in keys if k in self._held]
            self._lost.update(fresh)
            return fresh

    def take_lost(self) -> set[Key]:
        with self._lock:
            lost, self._lost = self._lost, set()
            return lost

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


class Liveness:
    """Whether the main loop still moves, for the heartbeat thread (see the module
    docstring). The main loop calls :meth:`stamp` on every turn (its link stamps every call
    it finishes) and wraps a step that may take long in :meth:`blocking`."""

    def __init__(self, allowance_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.allowance_s = allowance_s
        self.clock = clock
        self.owner = threading.current_thread()
        self._at = clock()
        self._until = 0.0

    def stamp(self) -> None:
        """The main loop moved (a turn, a finished database call); other threads' calls do
        not count."""
        if threading.current_thread() is self.owner:
            self._at = self.clock()

    @contextmanager
    def blocking(self, up_to_s: float) -> Iterator[None]:
        """A step of the main loop that may take up to ``up_to_s`` seconds."""
        self._until = self.clock() + up_to_s
        try:
            yield
        finally:
            self._until = 0.0
            self.stamp()

    def stalled_s(self, now: float | None = None) -> float:
        """How long the main loop has been stuck past its allowance (0: it is not)."""
        now = self.clock() if now is None else now
        deadline = max(self._at, self._until) + self.allowance_s
        return max(0.0, now - deadline)


class Heartbeat(threading.Thread):
    def __init__(
        self,
        link: Link,
        *,
        worker_id: UUID,
        worker_secret: str,
        lease_s: float,
        interval_s: float,
        held: HeldLeases,
        on_lost: Callable[[], None],
        liveness: Liveness | None = None,
        holds_device: bool = False,
        on_device_lost: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="tunefleet-heartbeat", daemon=True)
        self.link = link
        self.worker_id = worker_id
        self.worker_secret = worker_secret
        self.lease_s = lease_s
        self.interval_s = interval_s
        self.held = held
        self.on_lost = on_lost
        self.liveness = liveness
        self.holds_device = holds_device
        self.on_device_lost = on_device_lost
        self._stop_event = threading.Event()
        self.beats = 0
        #: Beats left out because the main loop was stuck.
        self.withheld = 0
        self.device_lost = False

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            try:
                self.beat()
            except Exception:  # never let the thread die: leases would expire silently
                log.exception("heartbeat failed")

    def beat(self) -> None:
        if self.liveness is not None:
            stuck = self.liveness.stalled_s()
            if stuck > 0:
                if not self.withheld:
                    log.error(
                        "the worker's main loop has not moved for %.0f s (more than the %.0f s "
                        "it may take): heartbeats stop, so its leases expire and its trials "
                        "go to other workers",
                        stuck + self.liveness.allowance_s,
                        self.liveness.allowance_s,
                    )
                self.withheld += 1
                return
            if self.withheld:
                log.warning("the main loop moves again: heartbeats resume")
                self.withheld = 0
        held = self.held.snapshot()
        try:
            beat = self.link.run(
                queue.heartbeat,
                worker_id=self.worker_id,
                secret=self.worker_secret,
                held=held,
                lease_s=self.lease_s,
                urgent=True,
            )
        except DatabaseDown:
            return  # the link logs the outage and reconnects on a later beat
        self.beats += 1
        lost = self.held.mark_lost([k for k in held if k.trial_id not in beat.kept])
        for key in lost:
            log.warning(
                "heartbeat rejected: lease of trial %s (attempt %s) lost; abandoning it",
                key.trial_id,
                key.attempt,
            )
        if lost:
            self.on_lost()
        if self.holds_device and not (beat.alive and beat.devices) and not self.device_lost:
            self.device_lost = True
            if self.on_device_lost is not None:
                self.on_device_lost()

    def stop(self) -> None:
        """Stop beating (the link stays open: it is the main loop's)."""
        self._stop_event.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=10.0)
