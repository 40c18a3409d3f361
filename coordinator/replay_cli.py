"""``tunefleet replay``: the coordinator's search replayed against a recorded space, many
seeds, no device (:mod:`.replay` does the work; this module reads flags and prints)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from tunefleet.errors import UsageError
from tunefleet.options.db import add_db_flag
from tunefleet.options.flags import count

DESCRIPTION = """\
Replay the coordinator's search against a recorded space: a recording file
(benchmarks/published/recording_*.json), or what a database holds for a run id or cache key,
or landscape:N, a device-free landscape of the gemm space with a broad deceptive basin at
0.82 of the optimum (variant N; every configuration answered, none missing).
Each seed is one search of up to the largest --evals evaluations by --workers virtual
workers; virtual time comes from the recorded code-generation and timing seconds.

Configurations the problem's rules reject cost nothing (as in a live run); configurations the
recording does not hold are answered by the nearest recorded one (steps of ordered
parameters, one per differing switch) and counted in the "missing" column.

The table gives, per evaluation budget, the best found over the recording's best (1.0: the
recording's best was found): median, worst and best over the seeds; then the median virtual
seconds the largest budget took. --save writes every seed's curve (best so far after each
evaluation, and when it ended in virtual seconds).
"""

#: Largest evaluation budget of one replay (the recording answers the rest anyway).
MAX_EVALS = 100_000
MAX_SEEDS = 10_000


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "replay",
        help="replay the search against a recorded space over many seeds (no device)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="FILE|RUN|CACHE_KEY|landscape:N")
    p.add_argument(
        "--technique",
        action="append",
        metavar="NAME",
        help="search technique to replay (default: the coordinator's); repeat to compare several",
    )
    p.add_argument(
        "--seeds",
        type=count("--seeds", high=MAX_SEEDS),
        default=20,
        metavar="N",
        help="seeded searches per technique (seeds 0..N-1; default 20)",
    )
    p.add_argument(
        "--evals",
        type=_budgets,
        default=(100, 300, 1000),
        metavar="N,N,...",
        help="evaluation budgets to report (default 100,300,1000)",
    )
    p.add_argument(
        "--workers",
        type=count("--workers", high=10_000),
        default=1,
        metavar="W",
        help="virtual workers evaluating at once (default 1)",
    )
    p.add_argument("--save", metavar="PATH", help="also write every curve and the table as JSON")
    add_db_flag(p)
    p.set_defaults(func=_run)


def _budgets(text: str) -> tuple[int, ...]:
    parts = [t.strip() for t in text.split(",") if t.strip()]
    try:
        values = sorted({int(t) for t in parts})
    except ValueError:
        raise UsageError(
            f"--evals {text!r}: write whole numbers separated by commas, e.g. --evals 100,300"
        ) from None
    if not values or values[0] < 1 or values[-1] > MAX_EVALS:
        raise UsageError(f"--evals {text!r}: each budget between 1 and {MAX_EVALS}")
    return tuple(values)


def _recording(source: str, db: str | None) -> Any:
    from tunefleet import recording

    if source.isdigit() or re.fullmatch(r"[0-9a-f]{32}", source):
        from tunefleet.db.resolve import open_db
        from tunefleet.queries.recording import recording_of

        with open_db(db) as conn:
            return recording_of(conn, source)
    return recording.load(source)


def _run(args: argparse.Namespace) -> int:
    from .landscape import from_source
    from .replay import Answers, Oracle, problem_rules, replay, summarise
    from .settings import default_techniques
    from .tuner import check_techniques

    if args.save and not Path(args.save).parent.is_dir():
        raise UsageError(f"--save {args.save!r}: its folder does not exist; create it first")
    techniques = check_techniques(args.technique) if args.technique else ()
    answers: Oracle
    landscape = from_source(args.source)
    if landscape is not None:
        answers, best, recorded = landscape, landscape.best_s, landscape.space.size()
        source, problem, problem_args = landscape.source, landscape.problem, landscape.problem_args
    else:
        rec = _recording(args.source, args.db)
        answers = Answers(rec, problem_rules(rec))
        best, recorded = rec.best.median_s or 0.0, len(rec.rows)
        source, problem, problem_args = rec.source, rec.problem, dict(rec.problem_args)
    budgets = args.evals
    compared: list[tuple[str, ...]] = [(t,) for t in techniques] or [default_techniques()]
    out: dict[str, Any] = {
        "source": source,
        "problem": problem,
        "problem_args": dict(problem_args),
        "recorded": recorded,
        "best_s": best,
        "seeds": args.seeds,
        "workers": args.workers,
        "evals": list(budgets),
        "techniques": {},
    }
    held = "configurations" if landscape else "recorded configurations"
    print(
        f"{source}: {problem}, {recorded} {held}, "
        f"best {best:.6g} s; {args.seeds} seeds, {args.workers} worker(s)"
    )
    head = [
        "technique",
        *(f"{n}: median / worst / best" for n in budgets),
        f"virtual s at {budgets[-1]}",
        "missing",
    ]
    lines = [head]
    for names in compared:
        curves = [
            replay(answers, names, seed=s, evaluations=budgets[-1], workers=args.workers)
            for s in range(args.seeds)
        ]
        summary = summarise("+".join(names), curves, best, budgets)
        lines.append(
            [summary.technique]
            + [f"{m:.3f} / {w:.3f} / {b:.3f}" for m, w, b in (summary.at[n] for n in budgets)]
            + [f"{summary.virtual_s[budgets[-1]]:.0f}", f"{summary.missing_share:.0%}"]
        )
        out["techniques"][summary.technique] = {
            "at": {
                str(n): dict(zip(("median", "worst", "best"), summary.at[n], strict=True))
                for n in budgets
            },
            "virtual_s": {str(n): summary.virtual_s[n] for n in budgets},
            "missing_share": summary.missing_share,
            "rejected_per_eval": summary.rejected_per_eval,
            "curves_at_s": [list(c.at_s) for c in curves],
            "curves": [
                [best / b if b > 0 and b != float("inf") else 0.0 for b in c.best_s] for c in curves
            ],
        }
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    for row in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if args.save:
        Path(args.save).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.save}", file=sys.stderr)
    return 0
