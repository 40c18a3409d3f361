"""``tunefleet tune``: one command that runs a whole tuning campaign on this machine.

A thin layer over :func:`tunefleet.tune` (:mod:`tunefleet.api.tune`, which checks the
problem, opens the database, plans and starts the local workers, drives the search and stops
cleanly on Ctrl-C, SIGTERM or SIGHUP): this module turns the flags into its arguments and
prints what it reports on stdout: the run it tunes, progress lines (rewritten on a terminal,
a plain line every ``--progress-every`` seconds otherwise), then the best as ``tunefleet
best`` prints it and whether a re-measurement confirmed it. A stopped run exits 130 with
the command that resumes it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from tunefleet.api.display import ProgressDisplay
from tunefleet.cli.deprecated import notice
from tunefleet.errors import TuneInterrupted, UsageError
from tunefleet.options import flags
from tunefleet.options.args import add_problem_flags, raw_problem_args
from tunefleet.options.db import add_db_flag
from tunefleet.processes import started_monotonic
from tunefleet.text.lines import write_line


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "tune",
        help="tune a problem here: the search plus one worker per local device",
        description="Tune PROBLEM: create a run (or resume one), start local workers, drive "
        "the search and show progress until a stop rule ends it. Ctrl-C stops cleanly; "
        "continue later with --resume RUN.",
    )
    p.add_argument(
        "problem",
        nargs="?",
        metavar="PROBLEM",
        help="built-in name (see `tunefleet problems`), path/to/problem.py or module:attr",
    )
    add_problem_flags(p)
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="local workers (default: one per OpenCL device of the chosen class; 0: only the "
        "search, for workers started elsewhere with `tunefleet worker`)",
    )
    p.add_argument(
        "--device",
        metavar="PATTERN",
        help="the local workers' device: its index or part of its name (as for `worker`)",
    )
    p.add_argument(
        "--device-class",
        metavar="CLASS",
        help="with --workers 0: the device class the run targets, served by workers started "
        "elsewhere (as for `coordinator`; `tunefleet devices` on a worker machine shows it)",
    )
    # The coordinator's and the worker's flags a one-node user needs, defined once.
    flags.add(p, (*flags.SEARCH_FLAGS, *flags.SEED_FLAGS, *flags.WORKER_FLAGS))
    p.add_argument(
        "--progress-every",
        type=flags.seconds("--progress-every", high=flags.MAX_TIMEOUT_S),
        default=None,
        metavar="S",
        help="seconds between progress lines when stdout is not a terminal (default 5)",
    )
    add_db_flag(p)
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    # The time budget (--max-time) started when this process did: the interpreter's start,
    # the imports and the database's (an embedded server's start, even its first initdb)
    # are inside it, so that it bounds the command.
    clock_start = started_monotonic()
    from tunefleet.api.tune import TuneProgress, tune
    from tunefleet.coordinator.settings import parse_seed_configs

    if args.problem is None and args.resume is None:
        raise UsageError("name a PROBLEM to tune (see `tunefleet problems`) or --resume RUN")
    if args.resume is not None:
        given = [f for f, v in (("--seed-config", args.seed_config),
                                ("--warm-start-from", args.warm_start_from)) if v]  # fmt: skip
        if given:
            raise UsageError(
                f"--resume continues run {args.resume} as it was created; drop {given[0]}"
            )
    device = _device(args)
    every = args.progress_every if args.progress_every is not None else 5.0
    display = ProgressDisplay(sys.stdout, every)

    def show(p: TuneProgress) -> None:
        if p.phase == "start":
            write_line(p.line, sys.stdout)
            return
        if p.phase == "notice":
            display.end()  # a live line on a terminal keeps what it said
            write_line(f"tunefleet: note: {p.line}", sys.stderr)
            return
        display.show(p.line, force=p.phase == "end")
        if p.phase == "end":
            display.end()

    seeds = [c for text in args.seed_config or () for c in parse_seed_configs(text)]
    try:
        result = tune(
            args.problem,
            args=raw_problem_args(args) if args.resume is None else None,
            max_trials=args.max_trials,
            max_time=args.max_time,
            target_gflops=args.target,
            patience=args.patience,
            confirm=args.confirm,
            workers=args.workers,
            device=device,
            db=args.db,
            name=args.name,
            technique=args.technique,
            search_seed=args.search_seed,
            seed_configs=seeds or None,
            warm_start_from=args.warm_start_from,
            resume=args.resume,
            timeout=args.timeout,
            prefetch=args.prefetch,
            prepare_workers=args.prepare_workers,
            cores=args.cores,
            prebuild=args.prebuild,
            progress=show,
            clock_start=clock_start,
        )
    except TuneInterrupted as stopped:
        display.end()
        print(f"stopped run {stopped.run_id}; continue with "
              f"`tunefleet tune --resume {stopped.run_id}{_db_hint(args.db)}`",
              file=sys.stderr)  # fmt: skip
        return 130
    finally:
        display.end()
    print(f"run {result.run_id} finished: {result.stop_reason}", flush=True)
    cut = result.budget_cut
    if cut is not None and cut.anything:
        resume = f"`tunefleet tune --resume {result.run_id}{_db_hint(args.db)}`"
        print(cut.sentence(resume), flush=True)
    if result.best is None:
        # What `tunefleet best RUN` says when no trial succeeded.
        print(f"tunefleet: {result.report.splitlines()[0]}", file=sys.stderr)
        return 1
    print(result.report, flush=True)
    return 0


def _device(args: argparse.Namespace) -> str | None:
    """What ``tune`` hands the API as ``device``: the local workers' device, or with
    ``--workers 0`` the class the run targets (``--device-class``; ``--device CLASS`` was its
    old spelling there)."""
    if args.device_class is None:
        if args.workers == 0 and args.device is not None:
            notice("tune --workers 0 --device CLASS", "tune --workers 0 --device-class CLASS")
        return args.device  # type: ignore[no-any-return]
    if args.workers != 0:
        raise UsageError(
            f"--device-class {args.device_class}: the local workers' class is their device's; "
            "give --device-class with --workers 0 (the search only), or --device to pick "
            "the local device"
        )
    if args.device is not None:
        raise UsageError(
            f"--device {args.device} picks a local worker's device and --workers 0 starts "
            "none: drop --device"
        )
    return args.device_class  # type: ignore[no-any-return]


def _db_hint(db: Any) -> str:
    from tunefleet.db.engine import redact

    return "" if db is None else f" --db {shlex.quote(redact(db))}"
