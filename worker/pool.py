"""The code-generation pool of one worker: its processes, its size, and the books the size is
decided from. The decisions themselves are :mod:`tunefleet.worker.sizing`'s (pure); this
module keeps the state they are made from and carries them out.

Books. Each turn of the loop books the time since the previous turn under what the device
was doing then: timing a trial (busy), idle while a held trial was still being generated
(starved), or neither; each finished code generation and timing adds its seconds. A window
lasts at least ``WINDOW_MIN_S`` and holds as many prepared trials as the pool has processes
(at least 2), or ends after ``WINDOW_MAX_S`` with whatever it saw. Then the controller may
grow or shrink the pool, and with it the prefetch; the loop reports the sizing, the device's
busy fraction and, in return, learns how many workers share its host
(:meth:`CodegenPool.share_with`).

Processes are started lazily (:class:`~tunefleet.worker.supervise.Child`); those beyond the
size are closed once idle (a busy one finishes its trial first).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

from .sizing import (
    CpuSampler,
    MachineSampler,
    PoolController,
    Resources,
    Sizing,
    Window,
    idle_cores,
    initial_sizing,
    pool_ceiling,
    prefetch_for,
)
from .supervise import Child

log = logging.getLogger("tunefleet.worker")

#: A sizing window lasts at least this long and holds as many prepared trials as the pool
#: has processes (at least 2), or ends after WINDOW_MAX_S with whatever it saw.
WINDOW_MIN_S = 2.0
WINDOW_MAX_S = 30.0


@dataclass
class Books:
    """What the device and the code generation did since the window started."""

    started: float
    busy_s: float = 0.0
    starved_s: float = 0.0
    prepare_s: list[float] = field(default_factory=list)
    measure_s: list[float] = field(default_factory=list)


class CodegenPool:
    """The code-generation processes, their sizing and its books. ``prepare_workers`` and
    ``prefetch`` are the flags (``None``: sized automatically); ``now`` is the monotonic
    clock, passed in by the caller on every call that books time."""

    def __init__(
        self,
        resources: Resources,
        prepare_workers: int | None,
        prefetch: int | None,
        now: float,
    ) -> None:
        self.resources = resources
        self._prepare_workers_flag = prepare_workers
        self._prefetch_flag = prefetch
        self.sizing: Sizing = initial_sizing(resources, prepare_workers, prefetch)
        self.controller = self._controller()
        self.children: list[Child] = []
        self._seq = 0
        self.grow()
        self.books = Books(now)
        self._booked_at = now
        self._was_busy = self._was_starved = False
        #: When the first trial was claimed.
        self.first_claim_at: float | None = None
        self._cpu = CpuSampler()
        self._machine = MachineSampler()

    def _controller(self) -> PoolController | None:
        if not self.sizing.auto_pool:
            return None
        return PoolController(self.sizing.prepare_workers, self.sizing.ceiling)

    # --- the processes ---------------------------------------------------------------------------
    def active(self) -> list[Child]:
        """The processes that take new trials (those beyond the size are on their way out,
        shrunk while busy)."""
        return self.children[: self.sizing.prepare_workers]

    def grow(self) -> None:
        """Add (unstarted) processes up to the size."""
        while len(self.children) < self.sizing.prepare_workers:
            self.children.append(Child(f"codegen-{self._seq}"))
            self._seq += 1

    def retire(self, in_use: Collection[Child]) -> None:
        """Close idle processes beyond the size, newest first; stop at one still busy or
        still tied to a held trial (``in_use``): it finishes its trial first."""
        while len(self.children) > self.sizing.prepare_workers:
            idle = next((c for c in reversed(self.children) if not c.busy), None)
            if idle is None or any(c is idle for c in in_use):
                return
            idle.close()
            self.children.remove(idle)

    def resize(self, pool: int, ceiling: int, in_use: Collection[Child]) -> None:
        """The new size and ceiling; an automatic prefetch follows the size."""
        prefetch = prefetch_for(pool) if self.sizing.auto_prefetch else self.sizing.prefetch
        self.sizing = replace(self.sizing, prepare_workers=pool, prefetch=prefetch, ceiling=ceiling)
        self.grow()
        self.retire(in_use)

    def share_with(self, peers: int, initial: bool) -> bool:
        """``peers`` workers share this host's cores now. At start-up (``initial``, before any
        process has started) an automatic pool is sized anew: True, the new sizing is to be
        reported. Later the count only lowers the controller's ceiling."""
        if peers == self.resources.peers:
            return False
        self.resources = self.resources.with_peers(peers)
        if not (initial and self.sizing.auto_pool):
            return False
        self.sizing = initial_sizing(
            self.resources, self._prepare_workers_flag, self._prefetch_flag
        )
        self.controller = self._controller()
        self.children = []  # none has started yet
        self.grow()
        return True

    # --- the books -------------------------------------------------------------------------------
    def timed(self, preparing: bool, seconds: float) -> None:
        """A code generation (``preparing``) or a timing took ``seconds``."""
        (self.books.prepare_s if preparing else self.books.measure_s).append(seconds)

    def book(self, now: float, busy: bool, starved: bool) -> None:
        """Book the time since the last call under what the device was doing then, and
        remember what it does now: timing a trial (``busy``), or waiting while a held trial
        is still being generated (``starved``)."""
        dt, self._booked_at = now - self._booked_at, now
        if self._was_busy:
            self.books.busy_s += dt
        elif self._was_starved:
            self.books.starved_s += dt
        self._was_busy, self._was_starved = busy, starved

    def end_window(self, now: float, pids: Sequence[int]) -> tuple[Window, bool] | None:
        """When the window is full: the window (the CPU of ``pids``, the worker's and device
        process's, and of the code-generation processes, sampled) and whether every process
        was there for all of it; a new window starts. ``None`` while it is not full."""
        b = self.books
        elapsed = now - b.started
        enough = len(b.prepare_s) >= max(2, self.sizing.prepare_workers)
        if elapsed < WINDOW_MIN_S or not (enough or elapsed >= WINDOW_MAX_S):
            return None
        self.books = Books(now)
        codegen = [c.proc.pid for c in self.children if c.proc is not None]
        sampled = [*pids, *codegen]
        per_pid = self._cpu.used(sampled)
        used = None if per_pid is None else sum(per_pid.values())
        codegen_cpu = None if per_pid is None else sum(per_pid.get(p, 0.0) for p in codegen)
        machine = self._machine.idle_cores()
        # A process that started during the window has no CPU figure for all of it (and spent
        # it starting): decide from the next window, one whose processes were all there.
        whole = per_pid is None or set(sampled) <= set(per_pid)
        window = Window(
            seconds=elapsed,
            device_busy_s=b.busy_s,
            device_starved_s=b.starved_s,
            prepare_s=tuple(b.prepare_s),
            measure_s=tuple(b.measure_s),
            # Cores given with --cores are this worker's to use whatever else runs here.
            idle_cores=idle_cores(
                self.resources.share,
                used,
                elapsed,
                None if self.resources.source == "--cores" else machine,
            ),
            codegen_cores=None if codegen_cpu is None else codegen_cpu / elapsed,
        )
        return window, whole

    def control(self, window: Window, in_use: Collection[Child]) -> bool:
        """Let the controller size the pool from ``window``; True when the size or the
        ceiling changed (a larger prefetch claims at once)."""
        if self.controller is None:
            return False
        ceiling = pool_ceiling(self.resources, prefetch=self._prefetch_flag)
        before = self.sizing.prepare_workers
        after = self.controller.observe(window, ceiling)
        if after == before and ceiling == self.sizing.ceiling:
            return False
        self.resize(after, ceiling, in_use)
        if after != before:
            log.info(
                "sizing: %s -> %s code-generation process(es) (%s; device busy %.0f%%, "
                "waited for code generation %.0f%%, %s prepared in %.1f s)",
                before,
                after,
                self.controller.last_reason,
                100 * window.busy_fraction,
                100 * window.starved_fraction,
                len(window.prepare_s),
                window.seconds,
            )
        return True
