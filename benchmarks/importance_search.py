"""Does ``tunefleet importance`` find the parameters that decide the speed after a default
search? Device-free, no database: the planted register-tile landscape of
``tests/helpers/planted.py`` (speed decided by ``reg_i`` and ``reg_j``), searched by
``--technique`` (the default technique unless given; ``importance_search.json`` is
``NeighbourhoodSearch``'s, the default then, ``importance_search_modelsearch.json``
``ModelSearch``'s) for
``--trials`` trials from ``--seeds`` seeds, at each of ``--workers`` (configurations asked
for at a time, as the engine asks for a fleet). For every search:
whether both decisive parameters are among the first three

- ``before``: ranked by the forest (the ranking of every report until the sample's
  concentration was taken into account; the variance where scikit-learn is missing),
- ``after``: ranked as the report ranks now (``ranked_by``: local effects where the sample
  is concentrated),

with the share of the measured trials the most common value of each decisive parameter had.

    python benchmarks/importance_search.py --out benchmarks/published/importance_search.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import fmt, machine, table, write_json

from tests.helpers import planted
from tunefleet import importance
from tunefleet.settings import DEFAULT_TECHNIQUE


def ranks(report: dict[str, Any], column: str | None) -> dict[str, int]:
    """1-based rank of each decisive parameter, by ``column`` (None: the report's order)."""
    params = report["parameters"]
    if column is not None:
        params = sorted(params, key=lambda p: (-(p["speed"][column] or 0.0), p["name"]))
    order = [p["name"] for p in params]
    return {d: order.index(d) + 1 for d in planted.DECISIVE}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--workers", default="1,16", help="comma-separated (default 1,16)")
    p.add_argument("--technique", default=None, help="the search (default: the default's)")
    p.add_argument("--out", help="JSON file or folder (default benchmarks/results/)")
    args = p.parse_args(argv)
    started = time.monotonic()
    warnings.simplefilter("ignore")  # scikit-learn on a few out-of-bag rows
    rows, results = [], {}
    for workers in [int(w) for w in args.workers.split(",")]:
        runs = []
        for seed in range(args.seeds):
            techniques = [args.technique] if args.technique else []
            trials = planted.search(seed, args.trials, techniques, workers=workers)
            report = importance.analyse(trials, seed=0)
            before = ranks(report, "forest" if report["method"] == "forest" else "variance")
            after = ranks(report, None)
            share = {
                q["name"]: q["concentration"]["share"]
                for q in report["parameters"]
                if q["name"] in planted.DECISIVE and q["concentration"]
            }
            runs.append(
                {"seed": seed, "before": before, "after": after, "ranked_by": report["ranked_by"],
                 "method": report["method"], "concentration": share}
            )  # fmt: skip
        both_before = sum(max(r["before"].values()) <= 3 for r in runs)
        both_after = sum(max(r["after"].values()) <= 3 for r in runs)
        median_share = statistics.median(max(r["concentration"].values()) for r in runs)
        results[str(workers)] = {"both_before": both_before, "both_after": both_after, "runs": runs}
        rows.append(
            [workers, args.seeds, f"{both_before}/{args.seeds}", f"{both_after}/{args.seeds}",
             fmt(median_share, 2)]
        )  # fmt: skip
    print(
        table(
            ["workers", "seeds", "both in first 3: before", "after", "median top-value share"],
            rows,
        )
    )
    write_json(
        "importance_search",
        {"machine": machine(), "trials": args.trials, "seeds": args.seeds,
         "technique": args.technique or DEFAULT_TECHNIQUE,
         "decisive": list(planted.DECISIVE), "workers": results,
         "seconds": round(time.monotonic() - started, 1)},
        args.out,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
