"""Search quality against fleet size, on device-free landscapes with a deceptive basin.

Two parts, both replays (:func:`tunefleet.coordinator.replay.replay`) against
:class:`tunefleet.coordinator.landscape.Landscape` variants (the gemm space, 567,000
configurations, its rules, a broad deceptive basin at 0.82 of a known optimum), no device:

``fleet``  every technique of ``--techniques`` at every ``--workers`` count, ``--seeds`` seeds
           (seed ``s`` searches landscape variant ``s % --variants``): the median and worst
           fraction of the optimum's speed found within each budget of ``--evals``.
``basin``  the deceptive-basin criterion: ``--basin-runs`` independent runs (run ``r``:
           variant ``r``, seed ``r``) of ``--basin-evals`` evaluations at each of
           ``--basin-workers`` (from run ``--basin-first`` on, 0 unless given), per technique
           of ``--basin-techniques``: how many end within
           5 % of the optimum (fraction >= 0.95), and how many in the basin (<= 0.83).

Prints both tables and writes JSON (``seconds``: what the whole run took).

    python benchmarks/search_quality.py --out benchmarks/published/search_quality.json

The published run uses ``--seeds 50``; ModelSearch replays cost about 0.02-0.05 s per
evaluation (a refit and a scored candidate pool per proposal), the other techniques far less.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import fmt, machine, table, write_json

from tunefleet.coordinator.landscape import Landscape, LandscapeSettings
from tunefleet.coordinator.replay import Curve, replay
from tunefleet.coordinator.tuner import check_techniques, technique_names
from tunefleet.settings import DEFAULT_TECHNIQUE

#: Within this fraction of the optimum's speed a run counts as having found it.
NEAR = 0.95
#: At or below this fraction a run counts as ending in the deceptive basin (its floor: 0.82).
IN_BASIN = 0.83


def _grid() -> list[str]:
    """A grid (exhaustive) technique where one is registered."""
    return [n for n in technique_names() if n.lower() in ("grid", "gridsearch")]


def _ints(text: str) -> list[int]:
    return sorted({int(t) for t in text.split(",") if t.strip()})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    techniques = [DEFAULT_TECHNIQUE, "NeighbourhoodSearch", "ModelSearch", "PureRandom", *_grid()]
    p.add_argument("--techniques", default=",".join(dict.fromkeys(techniques)))
    p.add_argument("--workers", default="1,8,64", help="virtual worker counts")
    p.add_argument("--seeds", type=int, default=50)
    p.add_argument("--variants", type=int, default=5, help="landscape variants the seeds cycle")
    p.add_argument("--evals", default="100,300,1000", help="budgets, comma-separated")
    basin = dict.fromkeys([DEFAULT_TECHNIQUE, "NeighbourhoodSearch", "ModelSearch"])
    p.add_argument("--basin-techniques", default=",".join(basin))
    p.add_argument("--basin-workers", default="1,16")
    p.add_argument("--basin-runs", type=int, default=10)
    p.add_argument(
        "--basin-first", type=int, default=0, help="the first basin run's variant and seed"
    )
    p.add_argument("--basin-evals", type=int, default=300)
    p.add_argument("--parts", default="fleet,basin", help="fleet, basin or both")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


class Landscapes:
    """Each variant built once (its legality cache serves every seed)."""

    def __init__(self) -> None:
        self._built: dict[int, Landscape] = {}

    def __call__(self, variant: int) -> Landscape:
        if variant not in self._built:
            self._built[variant] = Landscape(LandscapeSettings(variant=variant))
        return self._built[variant]


def fleet(args: argparse.Namespace, landscapes: Landscapes) -> tuple[dict[str, Any], list[Any]]:
    budgets = _ints(args.evals)
    cells: dict[str, Any] = {}
    rows = []
    for technique in check_techniques([t for t in args.techniques.split(",") if t]):
        for workers in _ints(args.workers):
            t0 = time.monotonic()
            ratios: dict[int, list[float]] = {n: [] for n in budgets}
            for seed in range(args.seeds):
                land = landscapes(seed % args.variants)
                curve = replay(
                    land, [technique], seed=seed, evaluations=budgets[-1], workers=workers
                )
                for n in budgets:
                    ratios[n].append(curve.ratio(land.best_s, n))
            at = {
                str(n): {"median": statistics.median(r), "worst": min(r), "best": max(r)}
                for n, r in ratios.items()
            }
            cells.setdefault(technique, {})[str(workers)] = {
                "at": at,
                "cpu_s": time.monotonic() - t0,
            }
            rows.append(
                [technique, workers]
                + [f"{fmt(at[str(n)]['median'])} / {fmt(at[str(n)]['worst'])}" for n in budgets]
                + [fmt(time.monotonic() - t0, 1)]
            )
            print(rows[-1], flush=True)
    headers = ["technique", "workers", *(f"{n}: median / worst" for n in budgets), "cpu s"]
    return {"evals": budgets, "techniques": cells}, [headers, rows]


def basin(args: argparse.Namespace, landscapes: Landscapes) -> tuple[dict[str, Any], list[Any]]:
    cells: dict[str, Any] = {}
    rows = []
    for technique in check_techniques([t for t in args.basin_techniques.split(",") if t]):
        for workers in _ints(args.basin_workers):
            finals = []
            for run in range(args.basin_first, args.basin_first + args.basin_runs):
                land = landscapes(run)
                curve: Curve = replay(
                    land, [technique], seed=run, evaluations=args.basin_evals, workers=workers
                )
                finals.append(curve.ratio(land.best_s, args.basin_evals))
            near = sum(f >= NEAR for f in finals)
            trapped = sum(f <= IN_BASIN for f in finals)
            cells.setdefault(technique, {})[str(workers)] = {
                "finals": finals,
                "within_5pct": near,
                "in_basin": trapped,
            }
            rows.append(
                [
                    technique,
                    workers,
                    f"{near} / {len(finals)}",
                    f"{trapped} / {len(finals)}",
                    " ".join(fmt(f) for f in finals),
                ]
            )
            print(rows[-1], flush=True)
    headers = ["technique", "workers", "within 5 %", "<= 0.83 (basin or worse)", "final fractions"]
    return {
        "runs": args.basin_runs,
        "first": args.basin_first,
        "evals": args.basin_evals,
        "techniques": cells,
    }, [
        headers,
        rows,
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"fleet", "basin"}
    if unknown:
        print(f"--parts {args.parts!r}: use fleet, basin or fleet,basin", file=sys.stderr)
        return 2
    started = time.monotonic()
    landscapes = Landscapes()
    data: dict[str, Any] = {
        "machine": machine(),
        "default": DEFAULT_TECHNIQUE,
        "landscape": {
            "problem": "gemm",
            "basin": LandscapeSettings().basin,
            "variants": args.variants,
        },
        "seeds": args.seeds,
    }
    printed = []
    if "fleet" in parts:
        data["fleet"], printed_fleet = fleet(args, landscapes)
        printed.append(printed_fleet)
    if "basin" in parts:
        data["basin"], printed_basin = basin(args, landscapes)
        printed.append(printed_basin)
    data["seconds"] = time.monotonic() - started
    for headers, rows in printed:
        print(table(headers, rows))
    write_json("search_quality", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
