"""Between-process agreement: how far apart fresh processes time one kernel, and what a run's
finalists are worth once that is known.

Pure functions over the process medians of a run's finalists (a *process* is one
measurement: the search's, then each cold confirmation, every one in a process of its own).
The coordinator's confirmation (:mod:`tunefleet.coordinator.confirm`) calls them on every
judgement and stores what they decide; the views and reports read it.

Why not the samples alone: samples of one measurement come from one process and say nothing
about the next. On PoCL on a two-core machine fresh processes of one binary differ by up to
~25 % while one process's samples are so many and so steady that the rank test calls a 3 %
difference significant at p = 2e-10. The yardstick of a confirmation is therefore how far
apart *processes* measure one kernel, estimated from the finalists themselves:

- **typical spread**: the median, over every pair of processes that measured one
  configuration (pairs within a finalist only), of their relative difference
  ``(slower - faster) / faster``. The median, so that one outlying process (a confirmation
  timed while three others built beside it) does not set the yardstick it is judged by. It
  needs :data:`MIN_PAIRS` pairs from at least two finalists; with fewer there is no estimate.
- **within-process noise**: the median, over the same processes, of one process's noise
  (its samples' IQR over median, ``agreement.noise``).
- **tolerance**: the larger of ``FACTOR * typical`` and ``WITHIN_FACTOR * within``, between
  ``agreement.FLOOR`` and :data:`CEILING`. For normally distributed log times, the 95 % bound
  of the difference of two processes is about 2.9 times its median, so a second process of
  the same kernel lands within ``FACTOR * typical`` about 19 times in 20. The within term is
  there because a handful of processes can agree by luck: on a CPU device that shares its
  cores with other work, one process's launches run at two or more speeds (1.9, 3.8 and
  7.7 ms for one kernel beside one spinning process), a process's median is where the
  *shares* of those speeds put it, and the next process, meeting other shares, lands
  elsewhere. Three processes that agreed within 1 % (IQR over median 18-26 % each) were
  followed by three alone at 1.20-1.73 times their figure. :data:`WITHIN_FACTOR` is the
  smallest round factor that covers, under the ceiling, every best of the 30 published README
  runs of ``benchmarks/readme_agreement.py`` that measured alone beyond what its run printed
  (they lay 0.7-2.1 times that noise from the figure; docs/protocol.md has the forward
  measurement). With no pairs it is the within term or the floor, and the rank test decides
  beside it as before. A GPU's processes agree to well under the floor and its samples'
  noise is under 1 %, so the within term stays under the floor: GPU verdicts are unchanged.
  The ceiling is there because the finalists are chosen for measuring fast: when most of
  them were lucky in the search, their pairs are luck, not process noise, and an uncapped
  estimate would let every one of them agree.

A **finalist agrees** when a majority of its processes are consistent with its *reference*
process (the one whose median is nearest the median of its process medians): within the
tolerance, or not told apart by the rank test on their samples (which can only make two
processes agree: beyond the floor it is the old verdict). With two processes both must be
consistent; with three, two. Its **figure** is the median of its consistent processes'
medians (an outlying process is left out); a finalist that does not agree keeps the median
of all of them, and ranks after every finalist that agrees (among the rest, by figure).

The **shoot-out** (:func:`challengers`) re-measures, in one more fresh process each, only
what could change the headline: a finalist that does not agree and whose fastest process
beats the best agreeing figure by more than nothing within the tolerance, paired with that
best (both timed in the same round, under the same load); with no such finalist, on a device
whose processes differ beyond the floor, the best itself until it has
:data:`QUOTED_PROCESSES`. Two agreeing finalists whose
figures are closer than the tolerance scaled to medians of their processes
(:func:`separation`) cannot be separated by processes this noisy:
:func:`unseparated` names them and the report says so instead of paying for rounds that
could not settle it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import combinations

from tunefleet import agreement

#: The tolerance is this many times the typical spread (see the module's text).
FACTOR = 3.0
#: ... and at least this many times one process's typical noise (see the module's text).
WITHIN_FACTOR = 2.5
#: The tolerance never exceeds this: two processes 50 % apart never agree.
CEILING = 0.5
#: Pairs of processes (from at least two finalists) the typical spread needs.
MIN_PAIRS = 3
#: A configuration is timed in at most this many processes (the search's and fresh ones).
MAX_PROCESSES = 3
#: A run whose tolerance is over this quotes every figure with a warning (:func:`imprecise`).
QUOTABLE = 0.15
#: Where processes differ beyond the floor, the best is quoted only after this many processes
#: (:func:`challengers`): two that agree may both have met one of a machine's two speeds.
QUOTED_PROCESSES = 3
#: A speed that held this share of one process's launches is one a fresh process may run at
#: for most of its own (:func:`launch_range`: its processes' 10th to 90th percentiles).
LAUNCH_SHARE = 0.1
#: How the reports name that range.
LAUNCH_SHARE_TEXT = "10th to 90th percentile"


class Standing(StrEnum):
    """A finalist's standing across its processes (``trial.standing`` of a search trial)."""

    #: A majority of its processes are consistent: its figure can be quoted.
    AGREES = "agrees"
    #: Its processes do not agree, or a re-measurement failed: ranked after every finalist
    #: that agrees (a failed one after every other).
    DISAGREES = "disagrees"


@dataclass(frozen=True)
class Process:
    """One process's measurement of a configuration: the search's or a confirmation's."""

    #: The trial whose measurement it is (the search trial, or a confirmation).
    trial_id: int
    median_s: float
    samples: tuple[float, ...]


@dataclass(frozen=True)
class Finalist:
    """A search trial that was confirmed at least once: its processes, the search's first."""

    trial_id: int
    processes: tuple[Process, ...]
    #: A re-measurement of it failed (invalid, failed, timed out) or built other code.
    failed: bool = False


@dataclass(frozen=True)
class Spread:
    """How far apart processes measure one kernel on this run's device."""

    #: Median relative difference of two processes of one configuration (None: too few).
    typical: float | None
    #: What a confirmation must stay within: ``FACTOR * typical`` or ``WITHIN_FACTOR *
    #: within``, the larger, within [FLOOR, CEILING].
    tolerance: float
    #: Pairs of processes the estimate rests on.
    pairs: int
    #: Process measurements (of finalists timed at least twice) it rests on.
    processes: int
    #: Median noise (IQR over median) of one process's samples, over those processes (None:
    #: no process with two samples).
    within: float | None = None

    @property
    def estimated(self) -> bool:
        return self.typical is not None

    @property
    def set_by_within(self) -> bool:
        """Whether the within-process noise, not the processes' differences, set the
        tolerance (:func:`basis_text` says so)."""
        return within_sets(self.typical, self.within)


@dataclass(frozen=True)
class Judged:
    """A finalist's verdict across its processes."""

    trial_id: int
    standing: Standing
    #: The figure quoted for it: median of its consistent processes (all of them when it
    #: does not agree), seconds.
    figure_s: float
    #: Processes that measured it (the search's included).
    processes: int
    #: Trials of the processes that are consistent with its reference.
    consistent: tuple[int, ...]
    failed: bool = False

    @property
    def agrees(self) -> bool:
        return self.standing == Standing.AGREES and not self.failed


def relative(a: float, b: float) -> float:
    """``(slower - faster) / faster`` of two medians (``agreement.Agreement.spread``)."""
    lo, hi = min(a, b), max(a, b)
    return (hi - lo) / lo if lo > 0 else math.inf


def estimate(finalists: Sequence[Finalist]) -> Spread:
    """The run's between-process spread from its finalists' processes (see the module)."""
    diffs: list[float] = []
    timed_twice = [f for f in finalists if len(f.processes) >= 2]
    for f in timed_twice:
        diffs.extend(relative(a.median_s, b.median_s) for a, b in combinations(f.processes, 2))
    processes = sum(len(f.processes) for f in timed_twice)
    noises = [
        agreement.noise(p.samples) for f in timed_twice for p in f.processes if len(p.samples) > 1
    ]
    finite = [n for n in noises if math.isfinite(n)]
    within = agreement.median(finite) if finite else None
    typical = None
    if len(diffs) >= MIN_PAIRS and len(timed_twice) >= 2:
        typical = agreement.median(diffs)
    return Spread(typical, tolerance_of(typical, within), len(diffs), processes, within)


def tolerance_of(typical: float | None, within: float | None) -> float:
    """The tolerance of a typical between-process spread and a within-process noise (either
    unknown: None), see the module."""
    wanted = max(FACTOR * (typical or 0.0), WITHIN_FACTOR * (within or 0.0))
    return min(CEILING, max(agreement.FLOOR, wanted))


def within_sets(typical: float | None, within: float | None) -> bool:
    """Whether ``within`` rather than ``typical`` set a tolerance above the floor."""
    term = WITHIN_FACTOR * (within or 0.0)
    return term > agreement.FLOOR and term > FACTOR * (typical or 0.0)


def basis_text(typical: float | None, within: float | None) -> str | None:
    """What a run's tolerance rests on, for the reports: ``fresh processes of one kernel
    differ by 1.0 % here`` and, where it set the tolerance, ``, but one process's launches
    spread 19.3 % quartile to quartile: the ± is 2.5 times that``; None where neither was
    estimated or set it (the floor, with the rank test beside it)."""
    if typical is None and not within_sets(typical, within):
        return None
    if typical is not None:
        text = f"fresh processes of one kernel differ by {100 * typical:.1f} % here"
    else:
        text = "too few processes to tell how far apart fresh ones differ here"
    if within_sets(typical, within):
        assert within is not None
        text += (
            f", but one process's launches spread {100 * within:.1f} % quartile to quartile: "
            f"the ± is {WITHIN_FACTOR:g} times that"
        )
    return text


def imprecise(tolerance: float | None) -> bool:
    """Whether a run's figures are too imprecise to quote to :data:`QUOTABLE`: its
    between-process ``tolerance`` (a fresh process of any of its kernels lands within that
    about 19 times in 20) is wider. On such a device a figure, confirmed or not, may be that
    far from what the kernel measures alone, so the reports say so beside every figure
    rather than let a confirmed 50 %-wide agreement read as a precise one. Unestimated
    (None): the floor applies and nothing is said."""
    return tolerance is not None and tolerance > QUOTABLE


def process_range(
    standing: str | None,
    figure_s: float | None,
    tolerance: float | None,
    medians: Sequence[float],
) -> tuple[float, float] | None:
    """The fastest and slowest of a judged configuration's process ``medians`` when it agrees
    across processes (only then is it quoted with a ±) and one of them lies beyond that ±
    (``figure_s * (1 ± tolerance)``), else None. A process left out as outlying (outvoted
    by the others) is still a time the kernel took in a fresh process here: on a device whose
    kernel times switch between speeds from process to process (docs/protocol.md), a run
    alone may land there too, so the reports print the range beside the ± instead of a ± its
    own processes contradict, and where a fresh one may land (:func:`landing_range`)."""
    if standing != Standing.AGREES or figure_s is None or tolerance is None or not medians:
        return None
    lo, hi = min(medians), max(medians)
    if lo >= figure_s * (1 - tolerance) and hi <= figure_s * (1 + tolerance):
        return None
    return lo, hi


def launch_range(
    standing: str | None,
    figure_s: float | None,
    tolerance: float | None,
    measured: Sequence[float] | None,
    samples: Sequence[Sequence[float]],
) -> tuple[float, float] | None:
    """The fastest 10th and slowest 90th percentile (:data:`LAUNCH_SHARE`) of the launches
    of a judged configuration's processes (``samples``, one sequence per process) when it
    agrees across processes and that range reaches, by more than the floor, beyond where its
    processes already say to expect it: the ± it is quoted with, or the range they measured
    (``measured``, :func:`process_range`; None: within the ±) widened by it
    (:func:`landing_range`). Else None.

    Why launches: a process's median is where the shares of a machine's speeds put it, and
    a handful of processes that met similar shares say nothing of the next one. On a CPU that
    shares its cores, a speed that held a tenth of one process's launches can hold most of
    the next process's: a README run's three processes measured 2.56-2.72 ms (± 18 %) while a
    quarter of one's launches ran at 4 ms, and its best alone measured 2.47, 4.15 and 4.36 ms.
    Over the 50 published README runs of ``benchmarks/readme_agreement.py`` the best's alone
    median lay within this range or the ± in 48 (docs/protocol.md). A GPU's launches spread
    under 1 %: never beyond the ±."""
    if standing != Standing.AGREES or figure_s is None or tolerance is None:
        return None
    timed = [sorted(s) for s in samples if s]
    if not timed:
        return None
    lo = min(agreement.quantile(s, LAUNCH_SHARE) for s in timed)
    hi = max(agreement.quantile(s, 1 - LAUNCH_SHARE) for s in timed)
    expected = landing_range(measured, tolerance) or (
        figure_s * (1 - tolerance),
        figure_s * (1 + tolerance),
    )
    if lo >= expected[0] * (1 - agreement.FLOOR) and hi <= expected[1] * (1 + agreement.FLOOR):
        return None
    return lo, hi


def landing_range(
    process_range: Sequence[float] | None,
    tolerance: float | None,
    launches: Sequence[float] | None = None,
    figure_s: float | None = None,
) -> tuple[float, float] | None:
    """Where a fresh process of a configuration may land, when its processes or their
    launches reach beyond its ± (None otherwise): the range its processes measured
    (``process_range``, :func:`process_range`) widened by the ``tolerance`` on each side, as
    the ± reads, together with the range its launches ran at (``launches``,
    :func:`launch_range`) and the ± around ``figure_s``. Each process was one draw of a
    machine's speeds; the next one lands within the tolerance of one of them, not only between
    them (a README run's processes measured 666 us to 1.28 ms, ± 12 %, and its best alone
    593-677 us), or at a speed some of their launches met."""
    if tolerance is None or (not process_range and not launches):
        return None
    bounds: list[float] = []
    if process_range:
        bounds += [process_range[0] * (1 - tolerance), process_range[1] * (1 + tolerance)]
    if launches:
        bounds += list(launches)
    if figure_s is not None:
        bounds += [figure_s * (1 - tolerance), figure_s * (1 + tolerance)]
    return min(bounds), max(bounds)


def consistent(a: Process, b: Process, spread: Spread) -> bool:
    """Whether two processes of one configuration time it alike under ``spread``."""
    if relative(a.median_s, b.median_s) <= spread.tolerance:
        return True
    if not a.samples or not b.samples:
        return False
    # Beyond the tolerance the rank test may still not tell them apart (few, noisy samples):
    # then they are alike, as a pair was always judged. It can only make two processes
    # agree, never disagree: within-process samples call 3 % significant where processes
    # differ by 25 %, and the tolerance already covers that.
    return agreement.rank_test(a.samples, b.samples) >= agreement.ALPHA


def judge(finalist: Finalist, spread: Spread) -> Judged:
    """A finalist's standing and figure under ``spread`` (see the module)."""
    procs = finalist.processes
    mid = agreement.median([p.median_s for p in procs])
    ref = min(procs, key=lambda p: abs(math.log(p.median_s / mid)))
    alike = [p for p in procs if p is ref or consistent(ref, p, spread)]
    agrees = len(procs) >= 2 and 2 * len(alike) > len(procs) and not finalist.failed
    used = alike if agrees else list(procs)
    return Judged(
        trial_id=finalist.trial_id,
        standing=Standing.AGREES if agrees else Standing.DISAGREES,
        figure_s=agreement.median([p.median_s for p in used]),
        processes=len(procs),
        consistent=tuple(p.trial_id for p in alike),
        failed=finalist.failed,
    )


def rank(judged: Sequence[Judged]) -> list[Judged]:
    """Agreeing finalists first, fastest figure first; then those that do not agree; failed
    re-measurements last (the order ``best_per_run`` ranks confirmed trials in)."""
    return sorted(judged, key=lambda j: (j.failed, not j.agrees, j.figure_s, j.trial_id))


def challengers(
    judged: Sequence[Judged], finalists: Sequence[Finalist], spread: Spread, limit: int
) -> list[int]:
    """Search trials to time once more, in a fresh process each, so that the headline is
    settled: every finalist that does not agree (and has not failed) whose fastest process
    is within the tolerance of beating the best agreeing figure, or the two fastest of them
    when none agrees, each paired with the best agreeing finalist; only those still under
    :data:`MAX_PROCESSES`, at most ``limit``.

    With no challenger, the best agreeing finalist itself where the run's processes differ
    beyond the floor (a CPU device) and it has fewer than :data:`QUOTED_PROCESSES`: on a
    machine whose kernels run at one of two speeds from process to process, two processes
    that agree may both have met one speed, and the figure quoted, or the range printed
    beside it (:func:`process_range`), would say nothing of the other. A GPU's processes
    agree within the floor: nothing more is timed there."""
    by_id = {f.trial_id: f for f in finalists}
    ranked = rank(judged)
    best = next((j for j in ranked if j.agrees), None)
    open_ = [j for j in ranked if not j.agrees and not j.failed and j.processes < MAX_PROCESSES]
    if best is None:
        picked = open_[:2]
    else:
        bar = best.figure_s * (1 + spread.tolerance)
        picked = [j for j in open_ if min(p.median_s for p in by_id[j.trial_id].processes) < bar]
    if not picked:
        noisy = spread.estimated and spread.tolerance > agreement.FLOOR
        if best is not None and noisy and best.processes < QUOTED_PROCESSES and limit > 0:
            return [best.trial_id]
        return []
    out = [j.trial_id for j in picked]
    if best is not None and best.processes < MAX_PROCESSES:
        # Paired: the best is timed in the same round, under whatever load the round meets.
        out.insert(0, best.trial_id)
    return out[: max(0, limit)]


def separation(a: Judged, b: Judged, spread: Spread) -> float:
    """How far apart two figures must be to tell them apart: the tolerance (made for two
    single processes) scaled to figures that are medians of ``a.processes`` and
    ``b.processes`` processes, ``sqrt((1/n_a + 1/n_b) / 2)`` (0.71 of it for two and two)."""
    n_a, n_b = max(1, len(a.consistent)), max(1, len(b.consistent))
    return spread.tolerance * math.sqrt((1 / n_a + 1 / n_b) / 2)


def unseparated(judged: Sequence[Judged], spread: Spread) -> tuple[int, int] | None:
    """The best and the runner-up when both agree and their figures are closer than
    :func:`separation` (processes this noisy cannot tell them apart), else None."""
    ranked = [j for j in rank(judged) if j.agrees]
    if len(ranked) < 2:
        return None
    a, b = ranked[0], ranked[1]
    if relative(a.figure_s, b.figure_s) <= separation(a, b, spread):
        return (a.trial_id, b.trial_id)
    return None
