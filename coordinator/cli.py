"""``tunefleet coordinator``: create (or resume) a run and drive its search until it stops.

Progress goes to stderr, one line every few seconds; the outcome goes to stdout: the run id,
why it stopped, and the best configuration as JSON. The engine is imported only when the
command runs, so ``tunefleet --help`` stays fast and OpenTuner-free.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tunefleet import agreement
from tunefleet.errors import UsageError
from tunefleet.options import flags
from tunefleet.options.args import add_problem_flags, raw_problem_args
from tunefleet.options.db import add_db_flag, add_wait_flag, wait_for_db_s
from tunefleet.text.lines import write_line
from tunefleet.text.render import range_text

#: Flags that describe a new run, refused together with --resume.
_NEW_RUN_FLAGS = {
    "problem": "PROBLEM",
    "size": "--size",
    "dtype": "--dtype",
    "arg": "--arg",
    "device_class": "--device-class",
    "seed_config": "--seed-config",
    "warm_start_from": "--warm-start-from",
}


def confirmation_line(result: Any) -> str:
    """One line on whether the best was confirmed, with the spread and the noise."""
    if not result.confirmed:
        return "confirmed: no (the best was measured once; see --confirm)"
    verdict = agreement.verdict_text(
        result.spread or 0.0, result.noise, result.disagrees, result.agreement_p, result.same_source
    )
    return f"confirmed: {result.confirmed_median_s:.6g} s on re-measurement, {verdict}"


def processes_line(result: Any) -> str | None:
    """One line on the best judged across processes (:mod:`tunefleet.spread`), or None."""
    if result.standing is None or result.figure_s is None:
        return None
    tolerance = f" ± {100 * result.spread_tolerance:.0f} %" if result.spread_tolerance else ""
    tie = (
        f"; not separated from trial {result.unseparated_trial_id}"
        if result.unseparated_trial_id is not None
        else ""
    )
    measured = range_text(
        result.process_range_s, result.spread_tolerance, result.launch_range_s, result.figure_s
    )
    return (
        f"across processes: {result.figure_s:.6g} s{tolerance} from {result.processes} "
        f"processes{measured}, {result.standing}{tie}"
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``tunefleet coordinator``."""
    p = sub.add_parser(
        "coordinator",
        help="run the search of a tuning run (create it, or --resume one)",
        description="Create a tuning run and drive its OpenTuner search through the queue "
        "until a stop rule holds; workers started anywhere measure the trials.",
    )
    p.add_argument(
        "problem",
        nargs="?",
        metavar="PROBLEM",
        help="built-in problem name, path/to/problem.py[:Class] or module:attr",
    )
    add_problem_flags(p)
    p.add_argument(
        "--device-class",
        metavar="CLASS",
        help="device class the run targets (default: 'any' for problems without OpenCL, "
        "else the class of the live workers when they agree)",
    )
    flags.add(p, (*flags.SEARCH_FLAGS, *flags.SEED_FLAGS))
    add_db_flag(p)
    add_wait_flag(p)
    p.set_defaults(func=_coordinator)


def _coordinator(args: argparse.Namespace) -> int:
    from tunefleet.processes import started_monotonic

    from .budget import Budget
    from .settings import CoordinatorSettings, parse_seed_configs

    # --max-time bounds this command, as for `tune`: a resumed run gets the budget again
    # rather than finding it spent by its age.
    clock_start = started_monotonic()

    if args.resume is not None:
        given = [flag for dest, flag in _NEW_RUN_FLAGS.items() if getattr(args, dest)]
        if given:
            raise UsageError(
                f"--resume continues run {args.resume} as it was created; drop {given[0]} "
                "(budget flags may change)"
            )
    problem_args: dict[str, Any] = raw_problem_args(args)
    seeds = [c for text in args.seed_config or () for c in parse_seed_configs(text)]
    settings = CoordinatorSettings.build(
        problem=args.problem,
        problem_args=problem_args,
        device_class=args.device_class,
        name=args.name,
        seed_configs=seeds,
        warm_start_from=args.warm_start_from,
        techniques=args.technique,
        search_seed=args.search_seed,
        resume=args.resume,
        budget=Budget.build(
            max_trials=args.max_trials,
            max_seconds=args.max_time,
            target_gflops=args.target,
            patience=args.patience,
        ),
        confirm=args.confirm,
    )

    from tunefleet.db.resolve import database_url
    from tunefleet.settings import DatabaseSettings

    db = DatabaseSettings.build(
        args.db, wait_s=wait_for_db_s(args), application_name="tunefleet-coordinator"
    )
    url = database_url(db)

    from .create import create_run
    from .engine import Coordinator, Progress
    from .session import SearchSession

    coordinator = Coordinator(settings, url, clock_start=clock_start)
    run_id = settings.resume if settings.resume is not None else create_run(settings, url)
    if settings.resume is None:
        write_line(f"created run {run_id}", sys.stderr)

    def show(line: str | None, p: Progress) -> None:
        if line is not None:
            write_line(line, sys.stderr)

    # Driven as `tune` drives its search (one implementation): a second signal ends a stop
    # that hangs, exit 130 (`tunefleet: interrupted`).
    session = SearchSession(coordinator, run_id, db, url, every_s=2.0)
    try:
        result = session.run(show)
    finally:
        session.close()
    from .rules import STOP_REASONS

    why = STOP_REASONS.get(result.stop_reason, result.stop_reason)
    print(f"run {result.run_id} {result.state}: {why} ({result.stop_reason})")
    print(
        f"trials: {result.trials} ({result.cached} cached, {result.failed} failed), "
        f"{result.cancelled} pending cancelled"
    )
    if result.cut is not None and result.cut.anything:
        resume = f"`tunefleet coordinator --resume {result.run_id}`"
        print(result.cut.sentence(resume))
    if result.best_config is None:
        print("best: none measured")
    else:
        gflops = "" if result.best_gflops is None else f", {result.best_gflops:.4g} GFLOP/s"
        print(f"best: {result.best_median_s:.6g} s{gflops} (trial {result.best_trial_id})")
        print(confirmation_line(result))
        if (across := processes_line(result)) is not None:
            print(across)
        print(json.dumps(result.best_config, sort_keys=True))  # the last line, for scripts
    return 0
