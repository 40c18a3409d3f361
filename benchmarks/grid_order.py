"""Which order should the grid technique walk a space in: best found after 1, 10, 30 and
100 % of the valid configurations, per order, on device-free landscapes (no database).

Orders (``tunefleet.coordinator.grid``): ``interleaved`` (the grid's: rings around the box's
centre alternating with a fixed shuffle), ``rings`` alone, ``shuffled`` alone (one fixed
draw), ``lexicographic`` (the box's nested loops), and ``random``, the median and worst of
``--seeds`` fresh shuffles (what any uniform order gives). Configurations the rules reject
cost nothing, as in a run: the fractions count valid configurations.

Landscapes: ``synthetic`` (the synthetic problem's objective: its optimum sits near the
centre of the box), ``ruled`` (the same, tiles of 64 and more ruled out), ``planted`` (the
deceptive register-tile landscape of ``tests/helpers/planted.py``, its optimum at an edge of
the box, on the subspace with the prefetch switches off and ``vec_i = 1``: 47,250 points)
and ``corner`` (a smooth bowl on that subspace whose optimum is a corner of the box: the
worst case for rings around the centre).
The published recordings hold a few hundred points of spaces of 50,000 and more: a grid over
them would measure the nearest-neighbour answers, not the device, so they are left out.

    python benchmarks/grid_order.py --out benchmarks/published/grid_order.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _harness import fmt, machine, table, write_json

from tests.helpers import planted
from tunefleet.coordinator import grid
from tunefleet.problems.synthetic import Synthetic, objective
from tunefleet.space import Choice, Config, Space, config_hash

FRACTIONS = (0.01, 0.1, 0.3, 1.0)
Landscape = tuple[Space, Callable[[Config], float | None]]


#: The planted landscape's subspace: these parameters fixed.
FIXED = {"prefetch_a": False, "prefetch_b": False, "vec_i": 1}


def corner(space: Space) -> Callable[[Config], float | None]:
    """A smooth bowl whose optimum is the box's first corner (every ordered parameter at
    its smallest value, every switch off): the worst case for rings around the centre."""
    axes = grid.axes_of(space)

    def seconds(c: Config) -> float | None:
        log_t = 0.0
        for a in axes:
            i = a.values.index(c[a.name])
            log_t += i / max(1, len(a.values) - 1) if a.ordered else 0.3 * (i > 0)
        return 1e-3 * math.exp(log_t)

    return seconds


def landscapes() -> dict[str, Landscape]:
    synthetic = Synthetic().space({})
    sub = Space.of(
        [Choice(p.name, (FIXED[p.name],)) if p.name in FIXED else p for p in planted.SPACE.params]
    )
    return {
        "synthetic": (synthetic, objective),
        "ruled": (synthetic, lambda c: None if c["tile"] >= 64 else objective(c)),
        "planted": (sub, planted.seconds),
        "corner": (sub, corner(sub)),
    }


def curve(times: Sequence[float | None]) -> list[float]:
    """Best time after each valid configuration, in the order given."""
    best, out = math.inf, []
    for t in times:
        if t is None:
            continue
        best = min(best, t)
        out.append(best)
    return out


def ratios(best_curve: Sequence[float], optimum: float) -> dict[str, float]:
    n = len(best_curve)
    return {
        f"{int(f * 100)}%": optimum / best_curve[max(1, math.ceil(f * n)) - 1] for f in FRACTIONS
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=50, help="fresh shuffles for 'random'")
    p.add_argument("--landscape", action="append", help="landscapes (default: every one)")
    p.add_argument("--out", help="JSON file or folder (default benchmarks/results/)")
    args = p.parse_args(argv)
    started = time.monotonic()
    known = landscapes()
    names = args.landscape or list(known)
    results: dict[str, Any] = {}
    rows = []
    for name in names:
        space, timed = known[name]
        configs = list(grid.configurations(space, "lexicographic"))
        times = [timed(c) for c in configs]
        optimum = min(t for t in times if t is not None)
        at = {config_hash(c): t for c, t in zip(configs, times, strict=True)}
        per: dict[str, Any] = {
            order: ratios(
                curve([at[config_hash(c)] for c in grid.configurations(space, order)]), optimum
            )
            for order in grid.ORDERS
        }
        rng = np.random.default_rng(0)
        draws = [ratios(curve([times[i] for i in rng.permutation(len(times))]), optimum)
                 for _ in range(args.seeds)]  # fmt: skip
        per["random (median)"] = {k: statistics.median(d[k] for d in draws) for k in draws[0]}
        per["random (worst)"] = {k: min(d[k] for d in draws) for k in draws[0]}
        valid = sum(t is not None for t in times)
        results[name] = {"points": len(times), "valid": valid, "orders": per}
        for order, r in per.items():
            rows.append([name, valid, order, *(fmt(r[f"{int(f * 100)}%"]) for f in FRACTIONS)])
    headers = ["landscape", "valid", "order", *(f"best at {int(f * 100)}%" for f in FRACTIONS)]
    print(table(headers, rows))
    seconds = round(time.monotonic() - started, 1)
    write_json(
        "grid_order",
        {"machine": machine(), "seeds": args.seeds, "seconds": seconds, "landscapes": results,
         "metric": "optimum time / best time found after that share of the valid points"},
        args.out,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
