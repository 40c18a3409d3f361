"""The dispatch stage: which process works on which held trial next.

Three kinds of process take held trials:

* the code-generation processes (:mod:`tunefleet.worker.pool`) take claimed search trials,
  in claim order, one each, and prepare them (code, build, inputs) beside the device;
* cold builds (:mod:`tunefleet.worker.cold`) take claimed confirmations, each in a fresh
  process of its own, as many at once as the cores allow (more while code-generation
  processes stand idle);
* the device process takes the next prepared trial and times it, only when nothing else times:
  a prepared cold build first (a run's time budget waits for its confirmations), then the
  prepared search trials in claim order. Without code-generation processes it prepares and
  times a claimed trial in one request.

Timing gets what code generation left of the evaluation's one limit; a search trial whose
first launch is far slower than the best this worker measured of its run is *raced*
(:data:`RACE_FACTOR`). Nothing here waits: each request is sent and its reply collected by
the loop's ``collect`` step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from tunefleet.devices import HOST_DEVICE, DeviceInfo
from tunefleet.queries.queue import ClaimedTrial

from .cold import ColdBuilds, at_once
from .heartbeat import Liveness
from .holding import Holding
from .pool import CodegenPool
from .results import Held
from .settings import WorkerSettings
from .supervise import Child, Measure, Prepare, Reply
from .vocabulary import ReplyKind, Stage

log = logging.getLogger("tunefleet.worker")

#: How long opening the device (or finding it) may take before we give up.
DEVICE_START_TIMEOUT_S = 120.0
#: A search trial whose first launch takes this many times the best this worker measured of
#: its run is raced: a couple of timed launches, not the protocol's count (kernels of a GEMM
#: space span three orders of magnitude; a 3 s kernel took 39 s of a 60 s run in full).
RACE_FACTOR = 5.0


class Dispatch:
    """Hands one worker's held trials to its processes."""

    def __init__(
        self,
        settings: WorkerSettings,
        holding: Holding,
        pool: CodegenPool,
        colds: ColdBuilds,
        device_child: Child,
        liveness: Liveness,
        best_s: Mapping[int, float],
        *,
        open_device: Callable[[], None],
        on_reply: Callable[[Held, Reply], None],
    ) -> None:
        self.settings = settings
        self.holding = holding
        self.pool = pool
        self.colds = colds
        self.device_child = device_child
        self.liveness = liveness
        #: The fastest median this worker measured per run (the racing bound).
        self.best_s = best_s
        #: Opens the device in a (re)started device process.
        self.open_device = open_device
        #: Ends a held trial with a reply that did not come from a child.
        self.on_reply = on_reply
        #: The device served (known once the worker has found it).
        self.device: DeviceInfo = HOST_DEVICE

    def device_busy(self) -> bool:
        """Something times on the device: the device process, or a cold build."""
        return self.device_child.busy or self.colds.holds_device

    def step(self) -> None:
        """Start code generation for the claimed trials the idle processes can take, and the
        device on the next ready trial if it is free."""
        inline = not self.pool.children
        for child in self.pool.active():
            if child.busy:
                continue
            held = self.holding.first(Stage.CLAIMED, cold=False)
            if held is None:
                break
            self._prepare(held, child)
        idle = sum(not child.busy for child in self.pool.active())
        while len(self.colds) < at_once(self.pool.resources.cores, idle):
            held = self.holding.first(Stage.CLAIMED, cold=True)
            if held is None:
                break
            self._prepare_cold(held)
        if self.device_busy():
            return
        held = self.next_to_time(inline)
        if held is None:
            return
        if held.cold:
            self._time_cold(held)
        else:
            self._time(held, inline)

    def next_to_time(self, inline: bool) -> Held | None:
        """The held trial the device takes next: a prepared cold build first (a
        confirmation, which a run's time budget waits for), else the first (in claim order)
        that is prepared, or claimed when there are no code-generation processes
        (``inline``)."""
        cold = self.holding.first(Stage.PREPARED, cold=True)
        if cold is not None:
            return cold
        ready = Stage.CLAIMED if inline else Stage.PREPARED
        return self.holding.first(ready, cold=False)

    def race_above(self, c: ClaimedTrial) -> float | None:
        """The racing bound of claim ``c``: :data:`RACE_FACTOR` times the best this worker
        measured of its run (a confirmation is a cold build, never raced)."""
        best = self.best_s.get(c.run_id)
        return None if best is None else RACE_FACTOR * best

    def timeout(self, claim: ClaimedTrial) -> float:
        """The limit of timing ``claim``: the run's (adaptive) timeout, or the worker's."""
        return claim.timeout_s if claim.timeout_s else self.settings.timeout_s

    def evaluation_limit(self, claim: ClaimedTrial) -> float:
        """The one limit of a whole evaluation (code generation, build, validation, timing)
        with code-generation processes, and of a cold build. It is never less than the
        worker's own timeout: the run's adaptive timeout follows its best kernel time, and
        loopy's code generation time varies far more between configurations than the slowest
        one seen early in a run predicts (a 256^3 GEMM on PoCL: 6.4 s the slowest of the
        first results, over 19 s for two later ones). A slow code generation is not a bad
        configuration; a hung one is still cut off."""
        return max(self.timeout(claim), self.settings.timeout_s)

    def _prepare(self, held: Held, child: Child) -> None:
        c = held.claim
        child.submit(
            Prepare(c.problem, c.problem_args, c.config, self.device, self.settings.prebuild),
            self.evaluation_limit(c),
            tag=c.key,
        )
        held.stage, held.child = Stage.PREPARING, child
        held.marks.prepare_sent = time.monotonic()

    def _time(self, held: Held, inline: bool) -> None:
        c = held.claim
        if not self.device_child.alive:
            with self.liveness.blocking(DEVICE_START_TIMEOUT_S):
                self.device_child.start()
                self.open_device()
        race = self.race_above(c)
        if inline:
            self.device_child.submit(
                self._measure(c, inline_prepare=True, race_above_s=race), self.timeout(c), c.key
            )
        else:
            # Timing gets what code generation left of the evaluation's one limit (never more
            # than the trial's own): a slow build followed by a slow timing is one slow
            # evaluation, cut off at the limit, not after the two limits added up.
            limit = self.evaluation_limit(c)
            left, own = limit - held.spent_s, self.timeout(c)
            self.device_child.submit(
                self._measure(c, prepared=held.prepared, inline_prepare=False, race_above_s=race),
                min(own, left),
                tag=c.key,
                limit_s=limit if left < own else own,
            )
        held.stage, held.child, held.prepared = Stage.MEASURING, self.device_child, None
        held.marks.measure_sent = time.monotonic()
        log.debug("timing trial %s", c.trial_id)

    def _prepare_cold(self, held: Held) -> None:
        """The first half of a cold build (:mod:`tunefleet.worker.cold`): a fresh process
        with caches of its own generates, builds and readies ``held`` beside the device's
        other work."""
        c = held.claim
        child = self.colds.start(c.trial_id)
        child.submit(
            Prepare(
                c.problem, c.problem_args, c.config, self.device, keep=True, protocol=c.protocol
            ),
            self.evaluation_limit(c),
            tag=c.key,
        )
        held.stage, held.child = Stage.PREPARING, child
        held.marks.prepare_sent = time.monotonic()
        log.info("trial %s: a cold build in a fresh process", c.trial_id)

    def _time_cold(self, held: Held) -> None:
        """The second half: the cold build's own process times what it kept, while the device
        process stands idle (one timing at a time)."""
        c = held.claim
        child = self.colds.child(c.trial_id)
        if child is None or not child.alive:  # what it kept went with it
            self.on_reply(held, Reply(ReplyKind.DIED, message="ended before it was timed"))
            return
        limit = self.evaluation_limit(c)
        child.submit(
            self._measure(c, kept=True, cold=True), limit - held.spent_s, tag=c.key, limit_s=limit
        )
        self.colds.timing(c.trial_id)
        held.stage, held.child = Stage.MEASURING, child
        held.marks.measure_sent = time.monotonic()

    def _measure(self, c: ClaimedTrial, **how: Any) -> Measure:
        """The request that times claim ``c`` on this worker's device (``how``: the prepared
        kernel or inline preparation, a cold build)."""
        return Measure(c.problem, c.problem_args, c.config, self.device, c.protocol, **how)
