"""The heartbeat thread: keeps every claimed trial's lease alive and the worker row fresh.

It runs on its own database connection (a slow claim or completion on the main connection
never delays a heartbeat) every third of the lease, and extends all held leases in one
fenced statement using the database clock. A held claim that the database no longer lets us
extend has been lost (our lease expired and the trial was requeued, maybe claimed by another
worker): the thread marks it lost and wakes the main loop, which abandons it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
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
    ) -> None:
        super().__init__(name="tunefleet-heartbeat", daemon=True)
        self.link = link
        self.worker_id = worker_id
        self.worker_secret = worker_secret
        self.lease_s = lease_s
        self.interval_s = interval_s
        self.held = held
        self.on_lost = on_lost
        self._stop_event = threading.Event()
        self.beats = 0

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            try:
                self.beat()
            except Exception:  # never let the thread die: leases would expire silently
                log.exception("heartbeat failed")

    def beat(self) -> None:
        held = self.held.snapshot()
        try:
            if held:
                kept = self.link.run(
                    queue.heartbeat_trials,
                    worker_id=self.worker_id,
                    held=held,
                    lease_s=self.lease_s,
                )
                lost = self.held.mark_lost([k for k in held if k.trial_id not in kept])
                for key in lost:
                    log.warning(
                        "heartbeat rejected: lease of trial %s (attempt %s) lost; abandoning it",
                        key.trial_id,
                        key.attempt,
                    )
                if lost:
                    self.on_lost()
            self.link.run(queue.heartbeat_worker, self.worker_id, self.worker_secret)
            self.beats += 1
        except DatabaseDown:
            pass  # the link logs the outage and reconnects on a later beat

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=10.0)
        self.link.close()
