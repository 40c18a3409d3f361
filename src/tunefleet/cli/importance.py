"""``tunefleet importance RUN``: which parameters decide the speed, and which make
configurations fail (the analysis is :mod:`tunefleet.importance`; the rows come from
:func:`tunefleet.queries.dashboard.importance_trials`, views only, so the reader role is
enough)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from tunefleet.db.resolve import open_db
from tunefleet.errors import RunError, UsageError
from tunefleet.options.db import add_db_flag
from tunefleet.options.flags import count, run_id_arg
from tunefleet.text.output import Column, args_text, gflops, jsonable, seconds, table

Row = dict[str, Any]

DESCRIPTION = """\
Rank a run's parameters by how much they decide its speed, and by how much they make
configurations fail, from its finished trials (or, with --all-runs, from every run of the
same problem, arguments, device class and protocol).

Speed is log(median time) of the measured configurations, so halving the time counts the
same on a fast and on a slow kernel. Two methods:

  variance  (NumPy only, always shown) the share of the variance of log time that lies
            between a parameter's values: a first-order (main-effect) index estimated from
            the measured configurations, corrected for what chance gives a parameter with
            that many values (epsilon-squared). A search samples unevenly: a parameter that
            travels with an important one gets credit too.
  forest    (scikit-learn: pip install 'tunefleet[importance]') a random forest of log time;
            a parameter's importance is the share of the forest's variance over every
            combination of the measured values (equally likely) that the parameter explains
            alone (fANOVA-style first-order index); "interactions" is the rest. The
            forest's out-of-bag R^2 (the share of log time it predicts on configurations a
            tree did not see) says how far to trust it: near 0, not at all.
  local     (always computed) the search's own one-parameter moves: over every pair of
            measured configurations that differ in one parameter alone, the typical factor
            by which that parameter's move changed the time. Where the search kept a
            parameter at one value in most trials, the report says so (a note) and ranks by
            this column: the two above then see little of that parameter's effect.

Failures (invalid, failed, timed out: no time) are counted apart from slow configurations:
per value its failure rate, per parameter a validity importance (the same between-value share
of the 0/1 "gave no time" outcome over every finished configuration).
"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "importance",
        help="which parameters decide a run's speed, and which make configurations fail",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", type=run_id_arg, metavar="RUN")
    add_db_flag(p)
    p.add_argument(
        "--all-runs",
        action="store_true",
        help="every run of RUN's cache key (same problem, arguments, device class and "
        "protocol), one row per configuration",
    )
    p.add_argument(
        "--method",
        choices=("auto", "variance", "forest"),
        default="auto",
        help="auto (default): forest where scikit-learn is installed, else variance; the "
        "variance column is always shown",
    )
    p.add_argument(
        "--top",
        type=count("--top", low=1, high=1000),
        default=10,
        metavar="N",
        help="the N fastest configurations, set against the rest (default 10)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the importance, speed per value and the top N against the rest",
    )
    p.set_defaults(func=cmd_importance)


def load(db: str | None, run_id: int, *, all_runs: bool, method: str, top: int) -> Row:
    """The report of a run (see :func:`tunefleet.importance.report`) with its settings under
    ``run``; a run that does not exist or has no finished trial is a one-line error."""
    from tunefleet import importance
    from tunefleet.queries import dashboard as q

    with open_db(db) as conn:
        run = q.run_settings(conn, run_id)
        if run is None:
            raise RunError(
                f"run {run_id} does not exist in this database; `tunefleet runs` lists them"
            )
        rows = q.importance_trials(conn, run_id, all_runs=all_runs)
    if not rows:
        raise RunError(
            f"run {run_id} has no finished trial yet: nothing to rank (`tunefleet status "
            f"{run_id}` shows its progress)"
        )
    try:
        data = importance.report(rows, run_id=run_id, all_runs=all_runs, method=method, top=top)
    except importance.ForestUnavailable as exc:
        raise UsageError(f"--method forest: {exc}") from None
    data["run"] = {
        k: run[k] for k in ("run_id", "name", "problem", "problem_args", "device_class", "state")
    }
    return data


def cmd_importance(args: argparse.Namespace) -> int:
    if args.plot and Path(args.plot).suffix.lower() != ".png":
        raise UsageError(f"--plot {args.plot!r}: the plot is a PNG; name the file FILE.png")
    data = load(args.db, args.run, all_runs=args.all_runs, method=args.method, top=args.top)
    # The text report says why the forest did not run in its method line; JSON output
    # carries it as data, so only there is the note said again, on stderr, for a person.
    reason = data["forest"]["reason"] if not data["forest"]["fitted"] else None
    if args.json and args.method == "auto" and reason:
        print(f"tunefleet: note: {reason}", file=sys.stderr)
    if args.plot:
        from tunefleet.cli.importance_plot import render

        render(Path(args.plot), title=title(data), report=data)
    if args.json:
        print(json.dumps(jsonable(data), indent=2, allow_nan=False))
    else:
        print(text(data), flush=True)
    if args.plot:
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def plot_importance(db: str | None, run_id: int, path: Path) -> str:
    """Draw the importance PNG of a run (method auto, top 10); the line that says so."""
    from tunefleet.cli.importance_plot import render

    data = load(db, run_id, all_runs=False, method="auto", top=10)
    render(path, title=title(data), report=data)
    first = data["parameters"][0]["name"] if data["parameters"] else "-"
    return f"wrote {path}: importance by {data['method']}, first {first}"


# --- text -----------------------------------------------------------------------------------


def title(data: Row) -> str:
    run = data["run"]
    scope = data["scope"]
    where = (
        f"runs {', '.join(str(r) for r in scope['runs'])} (every run of run {run['run_id']}'s "
        "cache key)"
        if scope["all_runs"]
        else f"run {run['run_id']}"
    )
    return f"{where}: {run['problem']} {args_text(run['problem_args'])} on {run['device_class']}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def method_line(data: Row) -> str:
    f = data["forest"]
    if f["fitted"]:
        line = (
            f"method: forest ({f['trees']} trees on {f['fitted_on']} measured configurations, "
            f"out-of-bag R^2 {f['oob_r2']:.2f}; interactions {pct(f['interactions'])}), "
            "variance beside it"
        )
        if f["oob_r2"] < 0.5:
            line += (
                "\n  the forest predicts under half of the variance of log time on trials it "
                "did not see: read its column with care"
            )
        return line
    return f"method: variance ({f['reason']})" if f["reason"] else "method: variance"


def _value_of(p: Row, pick: str) -> str:
    """The value with the fastest median time (``fast``) or the highest failure rate."""
    vals = p["values"]
    if pick == "fast":
        measured = [v for v in vals if v["time_s"] is not None]
        if not measured:
            return "-"
        v = min(measured, key=lambda v: v["time_s"]["median"])
        return f"{v['label']} ({seconds(v['time_s']['median'])})"
    failing = [v for v in vals if v["fail_rate"]]
    if not failing:
        return "-"
    v = max(failing, key=lambda v: (v["fail_rate"], v["trials"]))
    return f"{v['label']} ({pct(v['fail_rate'])} of {v['trials']})"


def text(data: Row) -> str:
    fitted = data["forest"]["fitted"]
    out = [
        title(data),
        f"{data['trials']} finished configurations: {data['measured']} measured, "
        f"{data['invalid']} invalid, {data['failed']} failed, {data['timed_out']} timed out",
        method_line(data),
        # Where the search looked: concentrated parameters, and what ranks them.
        *[f"note: {n}" for n in data.get("notes", ())],
        "",
    ]
    rows = [
        {
            "name": p["name"],
            "k": len(p["values"]),
            "forest": p["speed"]["forest"],
            "variance": p["speed"]["variance"],
            "local": p["speed"].get("local"),
            "validity": p["validity"]["variance"],
            "fast": _value_of(p, "fast"),
            "fails": _value_of(p, "fail"),
        }
        for p in data["parameters"]
    ]
    columns = [Column("PARAMETER", "name"), Column("VALUES", "k", right=True)]
    if fitted:
        columns.append(Column("SPEED (FOREST)", "forest", pct, right=True))
    if data.get("ranked_by") == "local":
        columns.append(Column("LOCAL EFFECT", "local", _factor, right=True))
    columns += [
        Column("SPEED (VARIANCE)", "variance", pct, right=True),
        Column("VALIDITY", "validity", pct, right=True),
        Column("FASTEST VALUE (MEDIAN)", "fast"),
        Column("MOST FAILING VALUE", "fails"),
    ]
    out.append(table(rows, columns))
    for p in data["parameters"]:
        out += ["", f"{p['name']}:"]
        out.append(
            table(
                [_value_row(v) for v in p["values"]],
                [
                    Column("  VALUE", "label"),
                    Column("TRIALS", "trials", right=True),
                    Column("MEASURED", "measured", right=True),
                    Column("INVALID", "invalid", right=True),
                    Column("FAILED", "failed_all", right=True),
                    Column("FAIL", "fail_rate", pct, right=True),
                    Column("BEST", "best", seconds, right=True),
                    Column("MEDIAN", "median", seconds, right=True),
                    Column("WORST", "worst", seconds, right=True),
                    Column("BEST GFLOP/s", "best_gflops", gflops, right=True),
                ],
            )
        )
    top = data["top"]
    if top["lines"]:
        out += [
            "",
            f"the {top['n']} fastest configurations as the search measured them (the run's "
            "best, re-measured: `tunefleet best`):",
        ]
        names = top["order"]
        values = {p["name"]: p["values"] for p in data["parameters"]}
        out.append(
            table(
                [
                    {
                        "trial": "  "
                        + (
                            f"{ln['run_id']}/{ln['trial_id']}"
                            if data["scope"]["all_runs"]
                            else str(ln["trial_id"])
                        ),
                        "median": ln["median_s"],
                        "gflops": ln["gflops"],
                        **{
                            n: values[n][c]["label"]
                            for n, c in zip(names, ln["codes"], strict=True)
                        },
                    }
                    for ln in top["lines"]
                ],
                [
                    Column("  RUN/TRIAL" if data["scope"]["all_runs"] else "  TRIAL", "trial"),
                    Column("MEDIAN", "median", seconds, right=True),
                    Column("GFLOP/s", "gflops", gflops, right=True),
                    *[Column(n, n) for n in names],
                ],
            )
        )
    return "\n".join(out)


def _factor(effect: float | None) -> str:
    """A local effect (mean absolute change of log time) as the time factor of one move."""
    return "-" if effect is None else f"x{math.exp(effect):.2f}"


def _value_row(v: Row) -> Row:
    t = v["time_s"] or {}
    g = v["gflops"] or {}
    return {
        "label": "  " + v["label"],
        "trials": v["trials"],
        "measured": v["measured"],
        "invalid": v["invalid"],
        "failed_all": v["failed"] + v["timed_out"],
        "fail_rate": v["fail_rate"],
        "best": t.get("min"),
        "median": t.get("median"),
        "worst": t.get("max"),
        "best_gflops": g.get("max"),
    }
