"""Which search technique finds a recorded space's best: many seeded replays, no device.

Replays each technique against each recording (``benchmarks/published/recording_*.json``
and ``recording_*.json.gz``: sparse ones of whole spaces measured on an H200, dense ones of
the good regions of ``benchmarks/inputs/regions.py`` measured whole on an H100) with
``--seeds`` seeds, one virtual worker, up to the largest budget of ``--evals`` evaluations
(see ``tunefleet replay --help`` for the policies: rule-rejected proposals are free, missing
configurations are answered by the nearest recorded one, which a dense recording never
needs). Prints the median and worst best-found over the recording's best at each budget, how
many seeds reached ``--bar`` (0.97) of it, and writes JSON.

    python benchmarks/replay_techniques.py --out benchmarks/published/replay_techniques.json
    python benchmarks/replay_techniques.py --recording \
        benchmarks/published/recording_gemm_region_h100.json.gz --evals 100,300 \
        --long ModelSearchSteady,ModelSearchSweep --short "" --workers 1,64

A cell of 50 seeds of a model search to 300 evaluations takes two to five minutes on one
shared core; the first run above (3 techniques to 1,000 evaluations, 4 more to 300, 50
seeds, 2 recordings) took 1,193 s (``seconds``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import fmt, machine, table, write_json

from tunefleet.coordinator.replay import Answers, problem_rules, replay, summarise
from tunefleet.coordinator.tuner import check_techniques
from tunefleet.recording import Recording, load
from tunefleet.settings import DEFAULT_TECHNIQUE

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "benchmarks" / "published"

#: Replayed to the largest budget: the table in docs/tuning.md.
LONG = (DEFAULT_TECHNIQUE, "AUCBanditMetaTechniqueA", "PureRandom")
#: Replayed to 300 evaluations: the other candidates.
#: (OpenTuner's PatternSearch, alone or in AUCBanditMetaTechniqueC, converges within a few
#: dozen evaluations and then proposes nothing new: its replay is the fallback's uniform
#: draws, and slow, since each ask walks its whole history. It is left out.)
SHORT = (
    "AUCBanditMetaTechniqueB",
    "NeighbourhoodMix",
    "NeighbourhoodSearchWide",
    "NeighbourhoodBandit",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--recording", action="append", help="recording files (default: published)")
    p.add_argument("--seeds", type=int, default=50)
    p.add_argument("--evals", default="100,300,1000", help="budgets, comma-separated")
    p.add_argument("--short-evals", type=int, default=300, help="largest budget of the others")
    p.add_argument("--long", default=",".join(dict.fromkeys(LONG)))
    p.add_argument("--short", default=",".join(SHORT))
    p.add_argument(
        "--workers",
        default="1",
        help="virtual worker counts, comma-separated; a cell of more than one worker is named "
        "TECHNIQUE xN",
    )
    p.add_argument(
        "--bar",
        type=float,
        default=0.97,
        help="count the seeds whose best reaches this share of the recording's best",
    )
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def rooted(rec: Recording) -> Recording:
    """The recording with a problem file named relative to the repository (the regions of
    benchmarks/inputs/regions.py) found from any directory, so its rules apply."""
    file, colon, attr = rec.problem.partition(":")
    if file.endswith(".py") and not Path(file).exists() and (ROOT / file).is_file():
        return dataclasses.replace(rec, problem=f"{ROOT / file}{colon}{attr}")
    return rec


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    budgets = sorted({int(b) for b in args.evals.split(",") if b})
    recordings = args.recording or sorted(
        str(p)
        for pattern in ("recording_*.json", "recording_*.json.gz")
        for p in PUBLISHED.glob(pattern)
    )
    plan = [(t, budgets) for t in check_techniques([t for t in args.long.split(",") if t])]
    short = [b for b in budgets if b <= args.short_evals] or budgets[:1]
    plan += [(t, short) for t in check_techniques([t for t in args.short.split(",") if t])]
    workers = sorted({int(w) for w in args.workers.split(",") if w.strip()})
    started = time.monotonic()
    data: dict[str, Any] = {
        "machine": machine(),
        "seeds": args.seeds,
        "evals": budgets,
        "bar": args.bar,
        "default": DEFAULT_TECHNIQUE,
        "workers": workers,
        "recordings": {},
    }
    rows = []
    for path in recordings:
        rec = rooted(load(path))
        # Keyed by the file (recording_gemm.json: "gemm"): one problem may have several.
        label = Path(path).name.split(".")[0].removeprefix("recording_")
        answers = Answers(rec, problem_rules(rec))
        best = rec.best.median_s or 0.0
        cells: dict[str, Any] = {}
        for (technique, evals), n_workers in itertools.product(plan, workers):
            t0 = time.monotonic()
            curves = [
                replay(answers, [technique], seed=s, evaluations=evals[-1], workers=n_workers)
                for s in range(args.seeds)
            ]
            summary = summarise(technique, curves, best, evals)
            name = technique if n_workers == 1 else f"{technique} x{n_workers}"
            cells[name] = {
                "at": {
                    str(n): dict(zip(("median", "worst", "best"), summary.at[n], strict=True))
                    for n in evals
                },
                "reached": {
                    str(n): sum(c.ratio(best, n) >= args.bar for c in curves) for n in evals
                },
                "virtual_s": {str(n): summary.virtual_s[n] for n in evals},
                "missing_share": summary.missing_share,
                "rejected_per_eval": summary.rejected_per_eval,
                "cpu_s": time.monotonic() - t0,
            }
            rows.append(
                [label, name]
                + [
                    f"{fmt(summary.at[n][0])} / {fmt(summary.at[n][1])}" if n in evals else "-"
                    for n in budgets
                ]
                + [
                    f"{cells[name]['reached'][str(evals[-1])]}/{args.seeds}",
                    f"{summary.missing_share:.0%}",
                    fmt(summary.rejected_per_eval, 2),
                ]
            )
            print(rows[-1], flush=True)
        data["recordings"][label] = {
            "source": Path(path).name,
            "recorded": len(rec.rows),
            "best_s": best,
            "space_size": rec.space.size(),
            "techniques": cells,
        }
    data["seconds"] = time.monotonic() - started
    headers = ["space", "technique"] + [f"{n}: median / worst" for n in budgets]
    reached = f">= {args.bar:g} at the last"
    print(table([*headers, reached, "missing", "rejected/eval"], rows))
    write_json("replay_techniques", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
