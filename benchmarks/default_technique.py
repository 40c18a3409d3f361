"""Which technique should be the default: held-out deceptive landscapes, Optuna's TPE sampler
beside ours, and what each costs the coordinator per evaluation.

Device-free replays (:func:`tunefleet.coordinator.replay.replay`) of ``--runs`` runs of
``--evals`` evaluations at each of ``--workers`` virtual workers, per technique of
``--techniques``, on the **held-out landscapes** (:func:`held_out`): variants and shapes no
technique was tuned on. The techniques were developed on the published deceptive landscapes,
variants 0-49 of the default shape (``benchmarks/search_quality.py``), and ModelSearch's
current settings chosen on the development set (``--set dev``: variants 500 on, the same
shapes); run ``r`` here searches variant ``HELD_OUT_FIRST + r`` (1000 on) of shape
``SHAPES[r % 4]`` with search seed ``r``:

======  =====================================================================================
shape   what differs from the published landscapes
======  =====================================================================================
0       nothing but the variant (the basin's floor at 0.82 of the optimum, three key tiles)
1       a shallower trap, a narrower global basin: floor 0.88, sharpness 10, slope 1.0
2       a deeper trap, a steeper basin: floor 0.75, sharpness 6, slope 1.5
3       two key tiles, a sharper global basin: keys 2, sharpness 12
======  =====================================================================================

``optuna-tpe`` (needs ``pip install optuna``) is Optuna's TPE sampler (``TPESampler(seed=r)``,
its defaults; with several workers ``constant_liar=True``, Optuna's advice for parallel
trials) searching the same landscape through ask/tell under the same rules as ours: the same
virtual workers and costs (``workers`` configurations in flight, the next asked for as one
finishes), a configuration the problem's rules reject answered at once as a failed trial
and costing no evaluation, a repeat answered from memory. Ordered parameters are integer
indices (so TPE sees their order), the others categorical.

Counted per technique and worker count: runs ending within 5 % of the optimum (fraction of
its speed >= 0.95), runs at or below the deceptive floor (within 0.01 of the floor's
fraction, or slower), and the search's own CPU seconds
(asks and tells, the coordinator's cost) per evaluation: median and worst over runs, and the
slowest single ask per proposal. A fleet evaluating 400 configurations a minute leaves the
coordinator 0.15 s per evaluation for everything.

``importance`` part: after a default search of ``--importance-trials`` trials of the planted
landscape that two register tiles decide (``tests/helpers/planted.py``), seeds
0..``--importance-seeds``-1 at each worker count: where ``tunefleet importance`` ranks the
two decisive parameters (both in the first three is the issue's criterion).

    python benchmarks/default_technique.py --out benchmarks/published/default_technique.json
    (published: default_technique_heldout_2cores.json, run as two processes and merged)
    python benchmarks/default_technique.py --quick      # a smoke run: seconds
"""

from __future__ import annotations

import argparse
import heapq
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import ROOT, fmt, machine, table, write_json

from tunefleet.coordinator.landscape import Landscape, LandscapeSettings
from tunefleet.coordinator.replay import _ordered, replay
from tunefleet.coordinator.tuner import check_techniques
from tunefleet.settings import DEFAULT_TECHNIQUE
from tunefleet.space import config_hash

#: Within this fraction of the optimum's speed a run counts as having found it.
NEAR = 0.95
#: Variant of held-out run 0 (the published landscapes, which techniques were tuned on, are
#: variants 0-49).
HELD_OUT_FIRST = 1000
#: The held-out shapes, cycled by run (the module docstring's table).
SHAPES: tuple[dict[str, Any], ...] = (
    {},
    {"basin": 0.88, "sharpness": 10.0, "slope": 1.0},
    {"basin": 0.75, "sharpness": 6.0, "slope": 1.5},
    {"keys": 2, "sharpness": 12.0},
)
#: The pseudo-technique name of Optuna's TPE sampler.
TPE = "optuna-tpe"
#: Asks per evaluation after which an Optuna search that proposes nothing new stops.
_MAX_ASKS_PER_EVAL = 50


#: Variant of development run 0 (``--set dev``): the same shapes, other variants, for trying
#: a change without looking at the held-out set.
DEV_FIRST = 500
#: The landscape set a run of this script uses (``--set``).
_FIRST = {"held-out": HELD_OUT_FIRST, "dev": DEV_FIRST}
_set = "held-out"


def held_out(run: int) -> LandscapeSettings:
    """The held-out landscape of run ``run`` (the development one under ``--set dev``)."""
    return LandscapeSettings(variant=_FIRST[_set] + run, **SHAPES[run % len(SHAPES)])


def _ints(text: str) -> list[int]:
    return sorted({int(t) for t in text.split(",") if t.strip()})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    names = [DEFAULT_TECHNIQUE, "NeighbourhoodSearch", "ModelSearch", TPE]
    p.add_argument("--techniques", default=",".join(dict.fromkeys(names)))
    p.add_argument("--workers", default="1,16", help="virtual worker counts")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--first", type=int, default=0, help="the first held-out run")
    p.add_argument("--evals", type=int, default=300)
    p.add_argument("--importance-seeds", type=int, default=3)
    p.add_argument("--importance-trials", type=int, default=300)
    p.add_argument("--parts", default="landscapes,importance")
    p.add_argument(
        "--set",
        choices=sorted(_FIRST),
        default="held-out",
        help="held-out (the published numbers) or dev (variants 500 on, for development)",
    )
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: 2 runs of 20 evaluations, 1, 4 workers"
    )
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.evals, args.workers = 2, 20, "1,4"
        args.importance_seeds, args.importance_trials = 1, 40
    return args


def tpe_replay(land: Landscape, *, seed: int, evaluations: int, workers: int) -> dict[str, Any]:
    """Optuna's TPE sampler on ``land`` as :func:`replay` drives ours (module docstring):
    the best seconds after the last evaluation and the search's CPU seconds."""
    import optuna
    from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    params = land.space.params
    values = [p.values() for p in params]
    dists: dict[str, BaseDistribution] = {
        p.name: IntDistribution(0, len(v) - 1)
        if _ordered(p)
        else CategoricalDistribution(list(range(len(v))))
        for p, v in zip(params, values, strict=True)
    }
    sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=workers > 1)
    study = optuna.create_study(sampler=sampler, direction="minimize")
    outcomes: dict[str, float | None] = {}
    flight: dict[str, list[Any]] = {}  # config hash -> trials waiting for it
    busy: list[tuple[float, int, str, float]] = []
    best = math.inf
    evals = asks = rejected = seq = 0
    search_s = slowest = 0.0
    now = 0.0

    def tell(trial: Any, seconds: float | None) -> None:
        nonlocal search_s
        t0 = time.process_time()
        if seconds is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, math.log(seconds))
        search_s += time.process_time() - t0

    while evals < evaluations and asks < _MAX_ASKS_PER_EVAL * evaluations:
        while len(busy) < workers and asks < _MAX_ASKS_PER_EVAL * evaluations:
            t0 = time.process_time()
            trial = study.ask(dists)
            took = time.process_time() - t0
            search_s += took
            slowest = max(slowest, took)
            asks += 1
            config = {p.name: v[trial.params[p.name]] for p, v in zip(params, values, strict=True)}
            h = config_hash(config)
            if h in outcomes:
                tell(trial, outcomes[h])
            elif h in flight:
                flight[h].append(trial)
            elif not land.legal(config, h):
                outcomes[h] = None
                rejected += 1
                tell(trial, None)
            else:
                row, _ = land.answer(config)
                seq += 1
                assert row.median_s is not None
                heapq.heappush(busy, (now + land.cost_s(row), seq, h, row.median_s))
                flight[h] = [trial]
        if not busy:
            break
        now, _, h, seconds = heapq.heappop(busy)
        outcomes[h] = seconds
        for trial in flight.pop(h):
            tell(trial, seconds)
        best = min(best, seconds)
        evals += 1
    return {
        "best_s": best,
        "evaluations": evals,
        "rejected": rejected,
        "search_s": search_s,
        "slowest_ask_s": slowest,
    }


def one_run(technique: str, run: int, evals: int, workers: int) -> dict[str, Any]:
    land = Landscape(held_out(run))
    if technique == TPE:
        out = tpe_replay(land, seed=run, evaluations=evals, workers=workers)
        fraction = land.best_s / out["best_s"] if math.isfinite(out["best_s"]) else 0.0
        return {
            "fraction": fraction,
            "evaluations": out["evaluations"],
            "search_s": out["search_s"],
            "slowest_ask_s": out["slowest_ask_s"],
        }
    curve = replay(land, [technique], seed=run, evaluations=evals, workers=workers)
    return {
        "fraction": curve.ratio(land.best_s, evals),
        "evaluations": len(curve.best_s),
        "search_s": curve.search_s,
        "slowest_ask_s": curve.slowest_ask_s,
    }


def landscapes(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    names = [t for t in args.techniques.split(",") if t]
    check_techniques([t for t in names if t != TPE])
    if TPE in names:
        try:
            import optuna  # noqa: F401
        except ImportError:
            print(f"{TPE}: optuna is not installed (pip install optuna); left out", flush=True)
            names.remove(TPE)
    cells: dict[str, Any] = {}
    rows = []
    for technique in names:
        for workers in _ints(args.workers):
            ids = range(args.first, args.first + args.runs)
            runs = [one_run(technique, r, args.evals, workers) for r in ids]
            finals = [r["fraction"] for r in runs]
            per_eval = [r["search_s"] / max(r["evaluations"], 1) for r in runs]
            floors = [held_out(r).basin + 0.01 for r in ids]
            shapes = [r % len(SHAPES) for r in ids]
            cell = {
                "finals": finals,
                "within_5pct": sum(f >= NEAR for f in finals),
                "at_floor_or_worse": sum(f <= b for f, b in zip(finals, floors, strict=True)),
                "by_shape": {
                    str(s): sum(f >= NEAR for f, k in zip(finals, shapes, strict=True) if k == s)
                    for s in range(len(SHAPES))
                },
                "search_s_per_eval": {"median": statistics.median(per_eval), "max": max(per_eval)},
                "slowest_ask_s": max(r["slowest_ask_s"] for r in runs),
            }
            cells.setdefault(technique, {})[str(workers)] = cell
            rows.append(
                [
                    technique,
                    workers,
                    f"{cell['within_5pct']} / {len(finals)}",
                    f"{cell['at_floor_or_worse']} / {len(finals)}",
                    fmt(statistics.median(finals)),
                    fmt(min(finals)),
                    fmt(cell["search_s_per_eval"]["median"] * 1e3, 2),
                    fmt(cell["search_s_per_eval"]["max"] * 1e3, 2),
                    fmt(cell["slowest_ask_s"] * 1e3, 1),
                ]
            )
            print(rows[-1], flush=True)
    headers = [
        "technique",
        "workers",
        "within 5 %",
        "at the trap's floor",
        "median",
        "worst",
        "ms CPU / eval (median)",
        "(worst run)",
        "slowest ask ms / proposal",
    ]
    return {
        "runs": args.runs,
        "first": args.first,
        "evals": args.evals,
        "landscapes": {"set": _set, "first_variant": _FIRST[_set], "shapes": list(SHAPES)},
        "techniques": cells,
    }, [headers, rows]


def importance_part(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.helpers import planted
    from tunefleet import importance

    warnings.simplefilter("ignore")  # scikit-learn on a few out-of-bag rows
    out: dict[str, Any] = {}
    rows = []
    for workers in _ints(args.workers):
        runs = []
        for seed in range(args.importance_seeds):
            report = importance.analyse(
                planted.search(seed, args.importance_trials, workers=workers), seed=0
            )
            order = [p["name"] for p in report["parameters"]]
            ranks = {d: order.index(d) + 1 for d in planted.DECISIVE}
            runs.append(
                {"seed": seed, "ranks": ranks, "first_three": order[:3],
                 "ranked_by": report["ranked_by"]}
            )  # fmt: skip
        both = sum(max(r["ranks"].values()) <= 3 for r in runs)
        out[str(workers)] = {"both_in_first_three": both, "runs": runs}
        rows.append(
            [workers, f"{both} / {len(runs)}",
             "; ".join(",".join(r["first_three"]) + f" ({r['ranked_by']})" for r in runs)]
        )  # fmt: skip
        print(rows[-1], flush=True)
    headers = ["workers", "both decisive in first 3", "first three (ranked by)"]
    return {
        "technique": DEFAULT_TECHNIQUE,
        "trials": args.importance_trials,
        "decisive": list(planted.DECISIVE),
        "workers": out,
    }, [headers, rows]


def main(argv: list[str] | None = None) -> int:
    global _set
    args = parse_args(argv)
    _set = args.set
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if parts - {"landscapes", "importance"}:
        print(f"--parts {args.parts!r}: use landscapes, importance or both", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        import sklearn.ensemble  # noqa: F401  (imported once, not inside the first run's cost)
    except ImportError:
        pass
    data: dict[str, Any] = {"machine": machine(), "default": DEFAULT_TECHNIQUE, "set": args.set}
    printed = []
    if "landscapes" in parts:
        data["landscapes"], shown = landscapes(args)
        printed.append(shown)
    if "importance" in parts:
        data["importance"], shown = importance_part(args)
        printed.append(shown)
    data["seconds"] = time.monotonic() - started
    for headers, rows in printed:
        print(table(headers, rows))
    write_json("default_technique", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
