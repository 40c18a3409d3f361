"""Owns replays: the coordinator's own search run against a recorded space, without a device.

:func:`replay` drives :class:`~.tuner.Tuner` (the OpenTuner search the engine drives, with
its techniques, seeds and repeats handling) the way the engine does, against a
:class:`~tunefleet.recording.Recording`, as a discrete-event simulation of ``workers``
virtual workers: each takes a suggestion, spends the recorded seconds of that configuration
(code generation and timed launches) of virtual time, and answers with the recorded median.
The result is the best-so-far curve against evaluations and against virtual wall time.

Policies, stated because they decide what a replay means:

- **Rules first.** A suggestion the problem's device-free rules reject, or whose footprint
  exceeds the limits the recording gives for its device, is told to the search as infinitely
  slow at once, costs no evaluation and no time (the engine stores such a configuration as
  ``invalid`` without a worker ever seeing it). Counted as ``rejected``.
- **Missing configurations** (the recording holds a few hundred points of a space of tens of
  thousands) are answered by the nearest recorded configuration that the rules allow: the
  distance counts steps of ordered parameters (a power of two doubled is one step, the next
  option of an ordered choice is one step) plus one per switch or unordered choice that
  differs; ties go to the earlier row. Counted as ``missing``: a replay whose evaluations
  are mostly missing measures the search on the recording's Voronoi landscape, not the
  device's.
- **Nothing new to propose.** When the search proposes only configurations it already has
  while a virtual worker idles, a uniform draw of a configuration not yet evaluated is
  measured and the search learns it, as the engine tops up its queue.

A seed fixes everything: the search's own random state (:class:`~.tuner.Tuner`) and the
simulation's draws, so the same recording, technique and seed give the same curve.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.recording import Recording, Row
from tunefleet.space import Bool, Choice, Config, IntRange, PowerOfTwo, Space, config_hash

from .budget import horizon
from .tuner import Tuner

#: Whether a configuration passes what the coordinator checks before queuing it.
Rules = Callable[[Config], bool]


class Oracle(Protocol):
    """What a replay asks of a space: a recording's :class:`Answers`, or a device-free
    :class:`~.landscape.Landscape` that answers every configuration from a formula."""

    @property
    def space(self) -> Space: ...

    def legal(self, config: Config, key: str | None = None) -> bool: ...

    def answer(self, config: Config) -> tuple[Row, bool]: ...

    def cost_s(self, row: Row) -> float: ...


@dataclass(frozen=True)
class Curve:
    """One replayed search. ``best_s[i]`` is the best median seconds after evaluation
    ``i + 1`` (inf until one succeeded), ``at_s[i]`` the virtual time it ended."""

    best_s: tuple[float, ...]
    at_s: tuple[float, ...]
    missing: int
    rejected: int
    drawn: int
    #: CPU seconds the search itself took (its asks and tells: what a coordinator spends
    #: proposing), and the longest single ask per proposal it returned; timings, so two
    #: curves of one seed compare equal without them.
    search_s: float = field(default=0.0, compare=False)
    slowest_ask_s: float = field(default=0.0, compare=False)

    def ratio(self, best_s: float, evaluations: int) -> float:
        """Speed of the best found within ``evaluations`` over the recording's best (<= 1)."""
        if not self.best_s:
            return 0.0
        found = self.best_s[min(evaluations, len(self.best_s)) - 1]
        return best_s / found if math.isfinite(found) else 0.0


class Answers:
    """What a recording says about any configuration of its space (the module's policy)."""

    def __init__(self, recording: Recording, rules: Rules | None = None) -> None:
        self.recording = recording
        self.rules = rules
        self._exact = recording.by_hash()
        self._legal: dict[str, bool] = {}
        allowed = [r for r in recording.rows if rules is None or rules(r.config)]
        if not allowed:
            raise ProblemError(f"{recording.source}: no recorded configuration passes the rules")
        self._rows = allowed
        params = recording.space.params
        self._values = [p.values() for p in params]
        self._ordered = np.array([_ordered(p) for p in params])
        self._matrix = np.array([self._encode(r.config) for r in allowed], dtype=np.int64)
        known = [r.worker_s for r in recording.rows if r.worker_s is not None]
        #: Seconds of a configuration recorded without its cost (a build that failed early).
        self.unknown_cost_s = statistics.median(known) if known else 1.0

    @property
    def space(self) -> Space:
        return self.recording.space

    def _encode(self, config: Config) -> list[int]:
        names = self.recording.space.names()
        return [values.index(config[n]) for n, values in zip(names, self._values, strict=True)]

    def legal(self, config: Config, key: str | None = None) -> bool:
        """Whether the rules allow ``config`` (remembered by hash: replays of many seeds
        ask about the same configurations again and again)."""
        if self.rules is None:
            return True
        key = key or config_hash(config)
        known = self._legal.get(key)
        if known is None:
            known = self._legal[key] = self.rules(config)
        return known

    def answer(self, config: Config) -> tuple[Row, bool]:
        """The row that answers ``config`` and whether it is the configuration itself."""
        row = self._exact.get(config_hash(config))
        if row is not None:
            return row, True
        x = np.array(self._encode(config), dtype=np.int64)
        diff = np.abs(self._matrix - x)
        distance = np.where(self._ordered, diff, diff > 0).sum(axis=1)
        return self._rows[int(np.argmin(distance))], False

    def cost_s(self, row: Row) -> float:
        return row.worker_s if row.worker_s is not None else self.unknown_cost_s


def _ordered(param: Any) -> bool:
    if isinstance(param, IntRange | PowerOfTwo):
        return True
    if isinstance(param, Bool):
        return False
    if isinstance(param, Choice):
        options = list(param.options)
        numbers = all(isinstance(o, int | float) and not isinstance(o, bool) for o in options)
        return numbers and options == sorted(options)
    return False


def problem_rules(recording: Recording) -> Rules | None:
    """What the coordinator rules out before a worker sees it: the recorded problem's
    device-free rules and, where the recording knows its device's limits, the configurations
    whose footprint exceeds them. None where the problem cannot be loaded here (a user's
    file): then every configuration goes to the recording."""
    from tunefleet.problems.registry import get_problem

    try:
        problem = get_problem(recording.problem)
    except (ProblemError, ImportError):
        return None
    args = dict(recording.problem_args)
    limits = recording.device_limits

    def rules(config: Config) -> bool:
        try:
            checked = problem.check_config(args, config)
        except InvalidConfiguration:
            return False
        return limits is None or limits.exceeded_by(problem.footprint(args, checked)) is None

    return rules


@dataclass(order=True)
class _Busy:
    """A virtual worker's evaluation, ordered by when it ends."""

    ends_at: float
    seq: int
    config: Config = field(compare=False)
    seconds: float | None = field(compare=False)
    exact: bool = field(compare=False)
    waiting: list[Any] = field(compare=False, default_factory=list)


def replay(
    answers: Oracle,
    techniques: Sequence[str] = (),
    *,
    seed: int,
    evaluations: int,
    workers: int = 1,
) -> Curve:
    """Replay one seeded search of ``evaluations`` evaluations (see the module docstring)."""
    space = answers.space
    tuner = Tuner(space, techniques, seed=seed)
    draws = random.Random(seed)
    outcomes: dict[str, float | None] = {}
    busy: list[_Busy] = []
    by_hash: dict[str, _Busy] = {}
    best = math.inf
    best_s: list[float] = []
    at_s: list[float] = []
    missing = rejected = drawn = seq = 0
    now = 0.0
    search_s = slowest_ask_s = 0.0

    def start(config: Config, waiting: list[Any]) -> None:
        nonlocal seq
        row, exact = answers.answer(config)
        seq += 1
        item = _Busy(now + answers.cost_s(row), seq, config, row.median_s, exact, waiting)
        heapq.heappush(busy, item)
        by_hash[config_hash(config)] = item

    try:
        while len(best_s) < evaluations:
            for _ in range(3):  # as the engine: a few asks while repeats free up room
                idle = workers - len(busy)
                if idle <= 0:
                    break
                told: list[tuple[Any, float | None]] = []
                started = 0
                left = horizon(evaluations, len(best_s), len(busy), None, None)
                t0 = time.process_time()
                asked = tuner.ask(idle, left)
                took = time.process_time() - t0
                search_s += took
                if asked:
                    slowest_ask_s = max(slowest_ask_s, took / len(asked))
                for sug in asked:
                    h = sug.config_hash
                    if h in outcomes:
                        told.append((sug, outcomes[h]))
                    elif h in by_hash:
                        by_hash[h].waiting.append(sug)
                    elif not answers.legal(sug.config, h):
                        outcomes[h] = None
                        rejected += 1
                        told.append((sug, None))
                    else:
                        start(sug.config, [sug])
                        started += 1
                if told:
                    t0 = time.process_time()
                    tuner.tell_many(told)
                    search_s += time.process_time() - t0
                if not told and not started:
                    break
            if not busy:
                config = _draw(space, answers, outcomes, draws)
                if config is None:
                    break  # every legal configuration was evaluated
                drawn += 1
                start(config, [])
            done = heapq.heappop(busy)
            now = done.ends_at
            h = config_hash(done.config)
            del by_hash[h]
            outcomes[h] = done.seconds
            missing += not done.exact
            t0 = time.process_time()
            if done.waiting:
                tuner.tell_many([(sug, done.seconds) for sug in done.waiting])
            else:
                tuner.learn([(done.config, done.seconds)])
            search_s += time.process_time() - t0
            if done.seconds is not None:
                best = min(best, done.seconds)
            best_s.append(best)
            at_s.append(now)
    finally:
        tuner.close()
    return Curve(tuple(best_s), tuple(at_s), missing, rejected, drawn, search_s, slowest_ask_s)


def _draw(
    space: Any, answers: Oracle, outcomes: dict[str, float | None], rng: random.Random
) -> Config | None:
    for _ in range(10_000):
        config = space.sample(rng)
        if config_hash(config) not in outcomes and answers.legal(config):
            return config
    return None


@dataclass(frozen=True)
class Summary:
    """Many seeded replays of one technique: ratios to the recording's best per budget."""

    technique: str
    seeds: int
    #: evaluations -> (median, worst, best) ratio to the recording's best.
    at: dict[int, tuple[float, float, float]]
    missing_share: float
    rejected_per_eval: float
    virtual_s: dict[int, float]  # evaluations -> median virtual seconds


def summarise(
    technique: str, curves: Sequence[Curve], best_s: float, budgets: Sequence[int]
) -> Summary:
    at = {}
    virtual = {}
    for n in budgets:
        ratios = [c.ratio(best_s, n) for c in curves]
        at[n] = (statistics.median(ratios), min(ratios), max(ratios))
        virtual[n] = statistics.median(c.at_s[min(n, len(c.at_s)) - 1] for c in curves)
    evals = sum(len(c.best_s) for c in curves) or 1
    return Summary(
        technique=technique,
        seeds=len(curves),
        at=at,
        missing_share=sum(c.missing for c in curves) / evals,
        rejected_per_eval=sum(c.rejected for c in curves) / evals,
        virtual_s=virtual,
    )
