"""Owns the coordinator's arithmetic: queue depth, trial timeouts, stop rules, run statistics.

Pure functions and small classes, no database and no OpenTuner, so every rule is unit-tested.

Queue depth
    ``target = max(min_depth, ceil(depth_factor * live_workers), capacity)`` pending +
    running trials, where ``live_workers`` are the workers able to serve the run (its device
    class; every class for runs of class ``any``) whose heartbeat is recent and ``capacity``
    the trials they hold at most, summed (1 + prefetch each). With the defaults (factor 2,
    minimum 1, prefetch 1) each worker finds a next trial waiting when it finishes one, a
    worker with a deep prefetch finds enough to prepare ahead, and a run without workers keeps
    one trial queued for the first worker that arrives. Workers change their capacity as they
    size themselves; the coordinator re-reads it every heartbeat. On top of that comes
    ``ceil(rate * poll_s)``: the trials the fleet finishes (``rate`` per second, measured over
    the last seconds) while the coordinator sleeps one poll, so that with short trials the
    workers never find the queue empty between two of its top-ups and the poll never bounds
    the rate. The target never exceeds what is left of ``max_trials``.

Trial timeout (``trial.timeout_s``)
    ``None`` (the worker's default) until the run has a measured result; afterwards
    ``clamp(min_s, max_s, compile_allowance + timing_allowance)`` where
    ``compile_allowance = 3 * the slowest compile time seen`` (for the OpenCL build a device
    step still does when nothing was prebuilt; workers give code generation itself at least
    their own timeout) and
    ``timing_allowance = SLOWDOWN * best_median_s * (warmup + max_launches)`` of the run's
    protocol: a configuration more than SLOWDOWN (20) times slower than the best cannot win,
    so cutting it short loses nothing. The floor keeps fast kernels from timing out on a busy
    machine; the ceiling bounds what one hung kernel costs.

Stop rules (checked after every batch of outcomes; first match wins)
    ``max_trials``     finished trials (including cache answers) reached the budget
    ``max_seconds``    wall time since the command started (``tune``, ``coordinator``;
                       a library caller without a clock: since the run was created)
                       reached the budget; with a confirmation, the engine
                       also stops the search once the time left is what the confirmation
                       needs (:mod:`.budget`)
    ``target_gflops``  the best measured GFLOP/s reached the target
    ``patience``       the last K finished trials did not improve the best time
    ``space_exhausted`` every configuration of the space has an outcome
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tunefleet.space import Config

from .budget import Budget

#: A configuration this many times slower than the best is cut off by its timeout.
SLOWDOWN = 20.0
#: Multiple of the slowest compile time allowed per evaluation.
COMPILE_FACTOR = 3.0


def queue_target(
    live_workers: int,
    depth_factor: float,
    min_depth: int,
    budget_left: int | None = None,
    capacity: int = 0,
    rate: float = 0.0,
    poll_s: float = 0.0,
) -> int:
    """How many trials of the run should be pending or running."""
    target = max(min_depth, math.ceil(depth_factor * max(live_workers, 0)), capacity)
    target += poll_slack(rate, poll_s)
    if budget_left is not None:
        target = min(target, max(budget_left, 0))
    return target


def poll_slack(rate: float, poll_s: float) -> int:
    """Trials the fleet finishes during one poll of the coordinator (see the docstring)."""
    if rate > 0 and poll_s > 0 and math.isfinite(rate):
        return math.ceil(rate * poll_s)
    return 0


def trial_timeout(
    best_median_s: float | None,
    max_compile_s: float | None,
    protocol: Mapping[str, Any],
    min_s: float,
    max_s: float,
) -> float | None:
    """Seconds one evaluation may take (see the module docstring), or None before any result."""
    if best_median_s is None:
        return None
    launches = int(protocol.get("warmup", 2)) + int(protocol.get("max_launches", 200))
    allowance = SLOWDOWN * best_median_s * launches + COMPILE_FACTOR * (max_compile_s or 0.0)
    return min(max_s, max(min_s, allowance))


class Rate:
    """Outcomes per second over the last ``span_s`` seconds (a sliding window)."""

    def __init__(self, span_s: float = 10.0) -> None:
        self.span_s = span_s
        self._events: list[tuple[float, int]] = []

    def add(self, now: float, count: int) -> None:
        if count > 0:
            self._events.append((now, count))

    def per_second(self, now: float) -> float:
        self._events = [(t, n) for t, n in self._events if now - t <= self.span_s]
        if not self._events:
            return 0.0
        span = max(now - self._events[0][0], 1.0)  # a first burst is not a rate
        return sum(n for _, n in self._events) / span


@dataclass
class RunStats:
    """What the search has learned so far, in the order outcomes arrived."""

    finished: int = 0
    #: Rejected by the problem's rules before any worker saw them: not in ``finished``
    #: (they cost no evaluation, so no budget and no patience), but the space holds them.
    ruled_out: int = 0
    cached: int = 0
    failed: int = 0  # invalid, failed and timed out
    best_seconds: float | None = None
    best_gflops: float | None = None
    best_config: Config | None = None
    best_trial_id: int | None = None
    since_improvement: int = 0
    max_compile_s: float | None = None
    outcomes: dict[str, float | None] = field(default_factory=dict)

    def record(
        self,
        config_hash: str,
        config: Config,
        seconds: float | None,
        *,
        trial_id: int | None = None,
        gflops: float | None = None,
        compile_s: float | None = None,
        cached: bool = False,
        ruled_out: bool = False,
    ) -> bool:
        """Count one finished trial; True when it is the new best."""
        if config_hash in self.outcomes:
            return False
        self.outcomes[config_hash] = seconds
        if ruled_out:
            self.ruled_out += 1
            return False
        self.finished += 1
        self.cached += cached
        if compile_s is not None:
            self.max_compile_s = max(self.max_compile_s or 0.0, compile_s)
        if seconds is None:
            self.failed += 1
            self.since_improvement += 1
            return False
        if gflops is not None:
            self.best_gflops = max(self.best_gflops or 0.0, gflops)
        if self.best_seconds is None or seconds < self.best_seconds:
            self.best_seconds = seconds
            self.best_config = config
            self.best_trial_id = trial_id
            self.since_improvement = 0
            return True
        self.since_improvement += 1
        return False


def stop_reason(
    budget: Budget, stats: RunStats, elapsed_s: float, space_size: int, in_flight: int
) -> str | None:
    """The first stop rule that holds, or None to keep searching."""
    if budget.max_trials is not None and stats.finished >= budget.max_trials:
        return "max_trials"
    if budget.max_seconds is not None and elapsed_s >= budget.max_seconds:
        return "max_seconds"
    if (
        budget.target_gflops is not None
        and stats.best_gflops is not None
        and stats.best_gflops >= budget.target_gflops
    ):
        return "target_gflops"
    if budget.patience is not None and stats.since_improvement >= budget.patience:
        return "patience"
    if stats.finished + stats.ruled_out >= space_size and in_flight == 0:
        return "space_exhausted"
    return None


#: One line per stop reason, for people.
STOP_REASONS = {
    "max_trials": "the trial budget is spent",
    "max_seconds": "the time budget is spent",
    "target_gflops": "the GFLOP/s target is reached",
    "patience": "no improvement within the patience window",
    "space_exhausted": "every configuration of the space has been evaluated",
    "user": "stopped by the user",
}
