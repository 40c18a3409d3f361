"""Owns the arithmetic of a run's time budget (``max_seconds``; the flag ``--max-time``,
``tunefleet.tune(max_time=...)``, ``$TUNEFLEET_MAX_SECONDS``): how long the confirmation needs,
when the search stops proposing trials to leave it that time, how many confirmations still fit,
and the one sentence that says what the deadline cut. The budget's value and its one range check
live below the coordinator, in :mod:`tunefleet.options.budget`, and are re-exported here.

Pure functions on what the database says of the run's pace (:class:`~tunefleet.queries.
budget.Pace`), so every rule is unit-tested. The engine applies them (:mod:`.engine`,
:mod:`.confirm`); without a time budget none of this applies.

The model. A trial that a worker starts now comes back after the run's median *turnaround*
(claim to result: code generation, any wait inside the worker, timing); after the first, the
fleet returns results at its measured *throughput* (results per second, between the run's
first and last result). So ``n`` re-measurements queued now take about
``turnaround + (n - 1) / throughput``. Before them the search's trials still running must
drain, and they end with the *slowest* of them, not at the throughput's pace: the trial a
worker claimed last still has a whole turnaround ahead of it, so the drain takes at least
the run's slow turnaround (its 90th percentile). The confirmation does not wait for that
drain: a worker prepares a cold build in a process of its own, beside the search's last
trials, and holds the device only to time it. So the search stops proposing when the time
left is :func:`confirm_reserve`, the longer of the drain and the confirmation; the
confirmation starts at once with the best so far, queues only what
:func:`confirmations_that_fit` the time left (a trial that lands later and ranks among the
best is confirmed too if it still fits); at the deadline whatever is still in flight is
handed back (cancelled, and revived by a resume), never waited for.

A confirmation is no search trial: it is a cold build, in a fresh process that shares no
cache with the search (code generation again, build, timing), planned one after another on
a worker (a worker of many cores prepares several at once, which only leaves time over):
:meth:`Speed.confirms` plans it from the run's confirmations so far, or from the search's
code generation time before the first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tunefleet.options.budget import (  # noqa: F401 (the budget's value, re-exported here)
    ENVIRONMENT,
    FLAGS,
    KEYWORDS,
    LIMITS,
    Budget,
    checked,
)
from tunefleet.queries.budget import Pace

#: A confirmation leaves the original's worker alone for at most this share of the time that
#: is left over once the confirmation's own time is counted (and never more than its usual
#: wait): with a deadline, waiting for another worker must not cost the confirmation itself.
AVOID_SHARE = 0.5


#: Seconds a cold build pays before its code generation: a fresh process that imports the
#: problem's modules (loopy, pyopencl) and opens the device (0.8 s of imports here, more on a
#: loaded node).
COLD_START_S = 2.0


@dataclass(frozen=True)
class Speed:
    """The run's pace as the plan uses it (seconds; per second)."""

    turnaround_s: float
    throughput: float
    #: The run's slow turnaround (its 90th percentile): what the last of the trials in
    #: flight needs at least (0: not known, the throughput alone decides).
    slow_s: float = 0.0
    #: Seconds one confirmation takes (a cold build, in a fresh process, one at a time per
    #: worker); 0: as a search trial (:meth:`takes`).
    cold_s: float = 0.0
    #: Live workers, which take confirmations side by side.
    workers: int = 1

    def confirms(self, n: int) -> float:
        """Seconds until ``n`` confirmations queued now are all back: cold builds, one at a
        time on each worker, none of the search's pipelining."""
        if n <= 0:
            return 0.0
        if self.cold_s <= 0:
            return self.takes(n)
        return math.ceil(n / max(self.workers, 1)) * self.cold_s

    def drains(self, running: int) -> float:
        """Seconds until the ``running`` trials in flight are all back: at the fleet's
        throughput, but never sooner than a slow trial that was claimed just now.

        Measured on an H200 worker holding 16 feinsum trials at 1.3 results/s: the
        throughput alone planned 12 s, the 16 took 22 s (their median turnaround was 9 s, the
        90th percentile 19 s), and the best, found among them, went unconfirmed."""
        if running <= 0:
            return 0.0
        return max(running / self.throughput, self.slow_s)

    def takes(self, n: int) -> float:
        """Seconds until ``n`` trials queued now are all back."""
        if n <= 0:
            return 0.0
        return self.turnaround_s + (n - 1) / self.throughput


def speed(pace: Pace, in_flight: int, workers: int = 1) -> Speed | None:
    """The plan's view of ``pace`` (None before any worker finished a trial: nothing to plan
    from, the deadline alone bounds the run). ``in_flight`` is how many trials the live
    workers hold at once (at least one each); ``workers`` how many workers are live.

    A confirmation is a cold build (:meth:`Speed.confirms`): what the run's finished
    confirmations took, or before any, :data:`COLD_START_S` plus the search's median code
    generation and build plus one trial's share of the device (``workers / throughput``,
    at most a turnaround). On an H200 a cold GEMM build took several times a search trial's
    share of the device: planned at the search's throughput, the confirmation would not fit.

    With a single result there is no span to measure a throughput over, so it follows from
    Little's law: ``in_flight`` trials each one turnaround in the worker come back at
    ``in_flight / turnaround``. One trial per turnaround per *worker* would be wrong for a
    worker that prepares many trials at once: on one GPU worker holding nine feinsum trials
    whose first took 30 s, it planned 240 s just to drain them and stopped a 150 s search
    after its first result."""
    if pace.turnaround_s is None or pace.measured == 0:
        return None
    turnaround = max(pace.turnaround_s, 1e-3)
    if pace.measured > 1 and pace.span_s is not None and pace.span_s > 0:
        throughput = (pace.measured - 1) / pace.span_s
    else:
        throughput = max(in_flight, 1) / turnaround
    slow = max(turnaround, pace.slow_turnaround_s or 0.0)
    throughput = max(throughput, 1e-6)
    workers = max(workers, 1)
    if pace.cold_s is not None:
        cold = pace.cold_s
    else:
        device = min(workers / throughput, turnaround)
        cold = COLD_START_S + (pace.compile_s or 0.0) + device
    return Speed(turnaround, throughput, slow, cold, workers)


def confirm_reserve(pace: Speed | None, confirm: int, running: int) -> float:
    """Seconds before the deadline at which the search stops proposing trials: the longer of
    the drain of its ``running`` trials (:meth:`Speed.drains`) and ``confirm``
    re-measurements (:meth:`Speed.confirms`), which start at once, beside the drain, plus one
    trial's share of the device for the one that lands last. 0 without confirmation or
    before there is a pace to plan from."""
    if pace is None or confirm <= 0:
        return 0.0
    return max(pace.drains(running), pace.confirms(confirm)) + 1.0 / pace.throughput


def confirmations_that_fit(pace: Speed | None, want: int, left_s: float) -> int:
    """How many of ``want`` re-measurements queued now come back within ``left_s``; all of
    them when there is no pace to judge by (the deadline cuts what does not finish)."""
    if want <= 0 or left_s <= 0:
        return 0
    if pace is None:
        return want
    if pace.cold_s <= 0:
        if left_s < pace.turnaround_s:
            return 0
        return min(want, 1 + math.floor((left_s - pace.turnaround_s) * pace.throughput))
    rounds = math.floor(left_s / pace.cold_s)
    return min(want, rounds * max(pace.workers, 1))


@dataclass(frozen=True)
class Horizon:
    """How far a search is through its budget, in evaluations: ``spent`` finished or in
    flight, ``left`` still to start (under a time budget, an estimate at the run's pace).
    A search that knows its end is near spends what is left near its best
    (:class:`~.model_search.ModelSearch`'s ``end``) instead of opening new ground that
    it will not have the evaluations to follow up."""

    spent: int
    left: int

    def near_end(self, share: float, in_flight: int) -> bool:
        """Whether what is left is at most ``share`` of the whole budget, or at most twice
        the ``in_flight`` proposals (and the next): a proposal made later than that comes
        back too late to be followed up by the proposals after it."""
        return self.left <= max(share * (self.spent + self.left), 2 * (in_flight + 1))


def horizon(
    max_trials: int | None,
    finished: int,
    flying: int,
    search_left_s: float | None,
    pace: Speed | None,
) -> Horizon | None:
    """The search's :class:`Horizon`: trials left under ``max_trials`` (``finished`` and
    ``flying`` spent), and under a time budget the trials the fleet starts in the
    ``search_left_s`` seconds before the search must stop (:func:`confirm_reserve`), at its
    throughput; the fewer of the two. None with neither budget, or with only a time budget
    and no pace yet: the search then has no end in sight and behaves as one without."""
    spent = finished + flying
    lefts = []
    if max_trials is not None:
        lefts.append(max(0, max_trials - spent))
    if search_left_s is not None and pace is not None:
        lefts.append(max(0, math.floor(search_left_s * pace.throughput)))
    if not lefts:
        return None
    return Horizon(spent, min(lefts))


def avoid_seconds(usual_s: float, live_workers: int, slack_s: float | None) -> float:
    """How long a confirmation leaves the original's worker alone: ``usual_s`` without a time
    budget (``slack_s`` None); within one, not at all with one live worker (nobody else would
    take it), else at most :data:`AVOID_SHARE` of the ``slack_s`` seconds the budget spares."""
    if slack_s is None:
        return usual_s
    if live_workers <= 1:
        return 0.0
    return max(0.0, min(usual_s, AVOID_SHARE * slack_s))


@dataclass(frozen=True)
class Cut:
    """What a run's time budget cut when it ended (all zero: nothing)."""

    max_seconds: float
    #: In-flight trials handed back at the deadline (cancelled; a resume revives them).
    handed_back: int = 0
    #: Confirmations wanted, and how many were queued within the budget.
    confirm_wanted: int = 0
    confirm_queued: int = 0

    @property
    def anything(self) -> bool:
        return self.handed_back > 0 or self.confirm_queued < self.confirm_wanted

    def sentence(self, resume: str) -> str:
        """One line for people, e.g. ``stopped at the 30 s budget: 3 trials in flight handed
        back (resume with ...); confirmation shortened to 1 of 3``. ``resume`` is the
        command that continues the run."""
        parts = []
        if self.handed_back:
            what = "trial" if self.handed_back == 1 else "trials"
            parts.append(f"{self.handed_back} {what} in flight handed back (resume with {resume})")
        if self.confirm_queued < self.confirm_wanted:
            if self.confirm_queued == 0:
                parts.append(
                    f"no time left to confirm the best ({self.confirm_wanted} wanted); "
                    "give a longer --max-time"
                )
            else:
                parts.append(
                    f"confirmation shortened to {self.confirm_queued} of {self.confirm_wanted}"
                )
        cut = "; ".join(parts or ["nothing cut"])
        return f"stopped at the {self.max_seconds:g} s budget: {cut}"
