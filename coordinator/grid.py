"""Owns the planning of exhaustive (``grid``) searches: which order a box of configurations is
visited in, whether a box is small enough to enumerate, and when a run picks the grid by itself.

Pure functions, no database and no OpenTuner (:mod:`.grid_technique` drives OpenTuner with
these plans), so the order is unit-tested and benchmarked without either.

The order (:func:`plan`) depends on the box alone, so a coordinator that restarts in the
middle of a grid (after a clean stop or a SIGKILL) walks the very same order and skips what the
run's trials already hold. It interleaves two walks, one proposal each in turn:

- **rings around the centre**: configurations by their distance from the middle value of
  every ordered parameter (each axis scaled to its length, so a parameter of 3 values and one
  of 12 count alike; an unordered switch or choice has no middle and adds no distance), ties
  in a fixed pseudo-random order. Kernel spaces are built around workable values, and tile
  sizes, unroll factors and work-group sizes are rarely best at their extremes;
- **a fixed shuffle of the whole box**: even coverage from the start, so an optimum at an edge
  of the box (where the rings come last) is found about as early as a random search finds it.

``benchmarks/grid_order.py`` compares this order with the rings alone, the shuffle alone and
the box's lexicographic order (best found at 10, 30 and 100 % of the space).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunefleet.errors import UsageError
from tunefleet.space import Choice, Config, IntRange, PowerOfTwo, Space

#: The name of the technique (``--technique grid``).
GRID = "grid"
#: The largest box a grid enumerates: its plan holds every point (about 100 bytes each).
MAX_POINTS = 200_000
#: The automatic choice counts a box's valid points only when it is at most this many times
#: the trial budget: the rules run once per point, and a box mostly invalid is rare.
COUNT_FACTOR = 20
#: Orders :func:`plan` knows (the benchmark compares them; ``interleaved`` is the grid's).
ORDERS = ("interleaved", "rings", "shuffled", "lexicographic")
#: Seed of the fixed pseudo-random orders: part of the plan, never changed by a run.
_PLAN_SEED = 41


@dataclass(frozen=True)
class Axis:
    """One parameter of a box: its values in order, and whether the order means nearness."""

    name: str
    values: tuple[Any, ...]
    ordered: bool


def axes_of(space: Space) -> list[Axis]:
    """The axes of a space, in its parameter order."""
    out = []
    for p in space.params:
        values = tuple(p.values())
        ordered = isinstance(p, IntRange | PowerOfTwo) or (
            isinstance(p, Choice) and _ordered_numbers(values)
        )
        out.append(Axis(p.name, values, ordered))
    return out


def _ordered_numbers(values: Sequence[Any]) -> bool:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    return numbers and all(a < b for a, b in itertools.pairwise(values))


def box_size(axes: Sequence[Axis]) -> int:
    return math.prod(len(a.values) for a in axes)


def check_size(size: int) -> None:
    """Refuse a box the grid cannot enumerate (a one-line UsageError saying what to do)."""
    if size > MAX_POINTS:
        raise UsageError(
            f"the space has {size:,} configurations, more than the grid technique enumerates "
            f"({MAX_POINTS:,}); fix some parameters to narrow it, or pick another --technique"
        )


def plan(axes: Sequence[Axis], order: str = "interleaved") -> Iterator[tuple[int, ...]]:
    """Every point of the box exactly once, as value indices per axis, in ``order``."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: use one of {', '.join(ORDERS)}")
    check_size(box_size(axes))
    lengths = [len(a.values) for a in axes]
    n = math.prod(lengths)
    if order == "lexicographic":
        yield from itertools.product(*(range(k) for k in lengths))
        return
    grid = np.indices(lengths).reshape(len(lengths), n).T if axes else np.zeros((1, 0), int)
    rng = np.random.default_rng(_PLAN_SEED)
    shuffled = rng.permutation(n)
    if order == "shuffled":
        yield from (tuple(int(v) for v in grid[i]) for i in shuffled)
        return
    rings = _rings(axes, grid, rng)
    if order == "rings":
        yield from (tuple(int(v) for v in grid[i]) for i in rings)
        return
    seen = np.zeros(n, dtype=bool)
    for i in itertools.chain.from_iterable(itertools.zip_longest(rings, shuffled)):
        if i is None or seen[i]:
            continue
        seen[i] = True
        yield tuple(int(v) for v in grid[i])


def _rings(axes: Sequence[Axis], grid: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Point indices by scaled squared distance from the box's centre (ties: a fixed draw)."""
    distance = np.zeros(grid.shape[0])
    for j, axis in enumerate(axes):
        k = len(axis.values)
        if not axis.ordered or k < 2:
            continue
        offset = (grid[:, j] - (k - 1) / 2) / (k - 1)
        distance += offset * offset
    tie = np.asarray(rng.random(size=int(grid.shape[0])))
    rounded: np.ndarray = np.round(distance, 9)  # equal distances tie exactly
    return np.lexsort((tie, rounded))


def configurations(space: Space, order: str = "interleaved") -> Iterator[Config]:
    """The plan of a space as configurations."""
    axes = axes_of(space)
    for point in plan(axes, order):
        yield {a.name: a.values[i] for a, i in zip(axes, point, strict=True)}


def valid_size(space: Space, allowed: Callable[[Config], bool]) -> int:
    """How many configurations of the space the rules allow (runs ``allowed`` on each)."""
    check_size(space.size())
    names = space.names()
    return sum(
        bool(allowed(dict(zip(names, combo, strict=True))))
        for combo in itertools.product(*(p.values() for p in space.params))
    )


def automatic_choice(
    space: Space, max_trials: int | None, allowed: Callable[[Config], bool] | None
) -> str | None:
    """Why a run without a named technique searches its whole space (the line ``tune``
    shows), or None when it should search as usual: the grid is chosen when every valid
    configuration fits the trial budget, so the run measures each once and ends with the
    space's true optimum instead of sampling it."""
    if max_trials is None:
        return None
    size = space.size()
    if size <= max_trials:
        return (
            f"search: grid (all {size:,} configurations of the space fit --max-trials "
            f"{max_trials:,}; each is measured once)"
        )
    if allowed is None or size > min(MAX_POINTS, COUNT_FACTOR * max_trials):
        return None
    valid = valid_size(space, allowed)
    if valid > max_trials:
        return None
    return (
        f"search: grid (the {valid:,} valid configurations of the space's {size:,} fit "
        f"--max-trials {max_trials:,}; each is measured once)"
    )
