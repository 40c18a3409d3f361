"""How long ModelSearch takes to propose, for a fleet, once it knows many outcomes.

The search is told ``--observations`` outcomes of a device-free landscape (the gemm space:
uniform draws, the rule-rejected ones as invalid), then asked for ``--workers``
configurations at once, ``--rounds`` times (between rounds it is told the previous round's
outcomes, as a coordinator is; a round that crosses the refit threshold pays for the refit).
The baseline is NeighbourhoodSearch (the default before ModelSearch, a local search that
learns no model), driven the same way in the same run.

Prints per technique the median and slowest seconds per proposal (a round's time over its
proposals) and the slowest round, the ratio to the baseline, and writes JSON.

    python benchmarks/model_proposal.py --out benchmarks/published/model_proposal_2cores.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import fmt, machine, table, write_json

from tunefleet.coordinator.landscape import Landscape, LandscapeSettings
from tunefleet.coordinator.tuner import Tuner, check_techniques


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--observations", type=int, default=2000)
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--techniques", default="NeighbourhoodSearch,ModelSearch")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def outcome(land: Landscape, config: dict[str, Any]) -> float | None:
    return land.seconds(config) if land.legal(config) else None


def measure(technique: str, land: Landscape, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(0)
    known = [land.space.sample(rng) for _ in range(args.observations)]
    tuner = Tuner(land.space, [technique], seed=0)
    try:
        t0 = time.perf_counter()
        tuner.learn([(c, outcome(land, c)) for c in known])
        learn_s = time.perf_counter() - t0
        rounds = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            batch = tuner.ask(args.workers)
            took = time.perf_counter() - t0
            rounds.append({"seconds": took, "proposals": len(batch)})
            tuner.tell_many([(s, outcome(land, s.config)) for s in batch])
    finally:
        tuner.close()
    per = [r["seconds"] / max(r["proposals"], 1) for r in rounds]
    return {
        "learn_s": learn_s,
        "rounds": rounds,
        "per_proposal_median_s": statistics.median(per),
        "per_proposal_max_s": max(per),
        "slowest_round_s": max(r["seconds"] for r in rounds),
        "distinct": all(r["proposals"] == args.workers for r in rounds),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    techniques = check_techniques([t for t in args.techniques.split(",") if t])
    land = Landscape(LandscapeSettings(variant=0))
    data: dict[str, Any] = {
        "machine": machine(),
        "observations": args.observations,
        "workers": args.workers,
        "rounds": args.rounds,
        "baseline": techniques[0],
        "techniques": {},
    }
    for technique in techniques:
        data["techniques"][technique] = measure(technique, land, args)
    base = data["techniques"][techniques[0]]["per_proposal_median_s"]
    rows = []
    for technique, cell in data["techniques"].items():
        cell["ratio_to_baseline"] = cell["per_proposal_median_s"] / base if base else None
        rows.append(
            [
                technique,
                fmt(cell["per_proposal_median_s"] * 1e3, 3),
                fmt(cell["per_proposal_max_s"] * 1e3, 3),
                fmt(cell["slowest_round_s"], 3),
                fmt(cell["ratio_to_baseline"], 3),
                "yes" if cell["distinct"] else "no",
            ]
        )
    headers = [
        "technique",
        "ms / proposal (median)",
        "ms / proposal (max)",
        f"slowest round of {args.workers} s",
        "x baseline",
        f"{args.workers} distinct",
    ]
    print(table(headers, rows))
    write_json("model_proposal", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
