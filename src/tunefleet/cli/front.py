"""The front door: the commands a user types first.

``status``, ``runs``, ``best``, ``show``, ``export`` and ``plot`` read a database (every
statement in ``tunefleet.queries.report``; the text that ``status``, ``runs`` and ``best``
share with ``tune`` is :mod:`tunefleet.text.render`'s); ``problems`` lists the registry;
``devices`` the OpenCL devices of this machine; ``measure`` times one configuration locally
(the reproduce command that ``best`` prints); ``tune`` (registered here, in
``tunefleet.cli.tune``) runs a whole tuning campaign. Worker and coordinator code is imported
inside the functions that need it: the ``tunefleet`` package is the shared core and must
import without either.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

from tunefleet.cli import tune
from tunefleet.db.resolve import open_db
from tunefleet.errors import RunError, TunefleetError, UsageError
from tunefleet.options.args import (
    add_problem_flags,
    command_line_args,
    raw_problem_args,
)
from tunefleet.options.db import add_db_flag
from tunefleet.options.flags import run_id_arg
from tunefleet.queries import report
from tunefleet.text.output import (
    Column,
    args_text,
    best_mark,
    compact_json,
    gflops,
    jsonable,
    seconds,
    short_id,
    table,
    timestamp,
)
from tunefleet.text.render import (
    best_text,
    clipped,
    read_best,
    require_run,
    runs_table,
    status_text,
)
from tunefleet.vocabulary import (
    TrialPurpose,
    TrialState,
)

Row = dict[str, Any]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    tune.register(sub)

    p = sub.add_parser("status", help="live table of runs and workers (one run with RUN)")
    p.add_argument("run", nargs="?", type=run_id_arg, metavar="RUN", help="a run id")
    add_db_flag(p)
    p.add_argument(
        "--watch",
        type=float,
        metavar="S",
        default=None,
        help="refresh every S seconds until Ctrl-C",
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("runs", help="every run of the database with its progress")
    add_db_flag(p)
    p.add_argument("--limit", type=int, default=None, metavar="N", help="newest N runs only")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("best", help="the best configuration of a run and how to reproduce it")
    p.add_argument("run", type=run_id_arg, metavar="RUN")
    add_db_flag(p)
    p.add_argument("--top", type=int, default=1, metavar="K", help="show the K best (default 1)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("show", help="one trial: its configuration, measurement and code")
    p.add_argument("run", type=run_id_arg, metavar="RUN")
    p.add_argument("trial", type=run_id_arg, metavar="TRIAL")
    add_db_flag(p)
    p.add_argument("--code", action="store_true", help="print only the generated OpenCL source")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("export", help="every finished trial of a run as CSV or JSON")
    p.add_argument("run", type=run_id_arg, metavar="RUN")
    add_db_flag(p)
    p.add_argument(
        "--format",
        choices=("csv", "json", "feinsum-sqlite"),
        default="csv",
        help="csv or json (feinsum-sqlite is deprecated: use `tunefleet feinsum export`)",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "plot", help="PNG: best-so-far against time and trials, and a per-worker timeline"
    )
    p.add_argument("run", type=run_id_arg, metavar="RUN")
    add_db_flag(p)
    p.add_argument("-o", "--output", metavar="FILE.png", required=True)
    p.add_argument(
        "--importance",
        metavar="FILE.png",
        help="also a second PNG: parameter importance, speed per value, top 10 vs the rest "
        "(as `tunefleet importance RUN --plot`)",
    )
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("problems", help="the built-in problems, their arguments and spaces")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_problems)

    p = sub.add_parser("devices", help="the OpenCL devices of this machine")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser(
        "measure", help="build, validate and time one configuration here (no database)"
    )
    p.add_argument("problem", metavar="PROBLEM", help="built-in name, path.py or module:attr")
    add_problem_flags(p)
    p.add_argument("--config", metavar="JSON", help="the configuration (default: the default)")
    p.add_argument("--device", metavar="PATTERN", help="device index, name part, or 'host'")
    p.add_argument("--protocol", metavar="JSON", help="measurement protocol overrides")
    p.add_argument("--code", action="store_true", help="also print the generated source")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the measurement as one JSON object (times, samples, source hash)",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="build with caches of its own, as a run's confirmation does (slower)",
    )
    p.set_defaults(func=cmd_measure)


# --- shared helpers ---------------------------------------------------------------------


def _out(text: str = "") -> None:
    print(text, flush=True)


# --- status / runs ----------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch is not None and not args.watch > 0:
        raise UsageError(f"--watch {args.watch} must be a positive number of seconds")
    with open_db(args.db) as conn:
        if args.watch is None:
            _out(status_text(conn, args.run))
            return 0
        tty = sys.stdout.isatty()
        try:
            while True:
                text = status_text(conn, args.run)
                if tty:
                    sys.stdout.write("\x1b[H\x1b[2J")
                _out(text + ("\n" if not tty else ""))
                time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


def cmd_runs(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit {args.limit} must be a positive number")
    with open_db(args.db) as conn:
        runs = report.list_runs(conn, limit=args.limit)
    if args.json:
        _out(json.dumps(jsonable(runs), indent=2))
    elif not runs:
        _out("no runs yet; start one with `tunefleet tune PROBLEM`")
    else:
        _out(runs_table(runs))
    return 0


# --- best / show ------------------------------------------------------------------------


def cmd_best(args: argparse.Namespace) -> int:
    if args.top <= 0:
        raise UsageError(f"--top {args.top} must be a positive number")
    with open_db(args.db) as conn:
        found = read_best(conn, args.run, args.top)
    if args.json:
        _out(json.dumps({"run": jsonable(found.run), "best": jsonable(found.best)}, indent=2))
        return 0 if found.best else 1
    _out(best_text(found))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with open_db(args.db) as conn:
        require_run(conn, args.run)
        trial = report.trial_detail(conn, args.run, args.trial)
        if trial is None:
            raise RunError(
                f"run {args.run} has no trial {args.trial}; "
                f"`tunefleet export {args.run}` lists its trials"
            )
        attempts = report.trial_attempts(conn, args.trial)
    if args.code:
        if not trial["code"]:
            raise RunError(
                f"trial {args.trial} of run {args.run} has no stored code (state "
                f"{trial['state']}); only measured trials keep their generated source"
            )
        sys.stdout.write(trial["code"].rstrip("\n") + "\n")
        return 0
    if args.json:
        _out(json.dumps(jsonable({**trial, "attempts": attempts}), indent=2))
        return 0
    _out(f"trial {trial['trial_id']} of run {trial['run_id']}: {trial['state']}")
    _out(f"  config      {compact_json(trial['config'])}")
    _out(f"  source      {trial['source']}, attempt {trial['attempt']}/{trial['max_attempts']}")
    if trial.get("purpose") == TrialPurpose.CONFIRM:
        _out(
            f"  confirms    trial {trial['confirms_trial_id']} "
            f"(fresh inputs: input seed {trial['input_seed']})"
        )
    _out(f"  started     {timestamp(trial['started_at'])}")
    _out(f"  finished    {timestamp(trial['finished_at'])}")
    if trial["worker_host"]:
        _out(f"  worker      {short_id(trial['worker_id'])} on {trial['worker_host']}")
    if trial["error"]:
        _out(f"  error       {trial['error']}")
    if trial["measurement_id"] is not None:
        samples = trial["samples_s"] or []
        _out(
            f"  GFLOP/s     {gflops(trial['gflops'])}"
            + (f"   GB/s {gflops(trial['gbps'])}" if trial["gbps"] is not None else "")
        )
        _out(
            f"  time        median {seconds(trial['median_s'])}, min {seconds(trial['min_s'])}, "
            f"{len(samples)} samples"
        )
        _out(f"  compile     {seconds(trial['compile_s'])}")
        _out(
            f"  device      {trial['device_name']} ({trial['platform']}, {trial['driver_version']})"
        )
        _out(f"  validation  {compact_json(trial['validation'])}")
        _out(f"  protocol    {compact_json(trial['protocol'])}")
        if trial["code"]:
            _out(f"  code        {len(trial['code'].splitlines())} lines: add --code to print it")
    if attempts:
        _out("attempts:")
        _out(
            table(
                attempts,
                (
                    Column("#", "attempt", right=True),
                    Column("WORKER", "worker_id", short_id),
                    Column("HOST", "worker_host"),
                    Column("CLAIMED", "claimed_at", timestamp),
                    Column("ENDED", "ended_at", timestamp),
                    Column("OUTCOME", "outcome"),
                    Column("ERROR", "error", lambda e: clipped(e, 60)),
                ),
            )
        )
    return 0


# --- export / plot ----------------------------------------------------------------------


def export_text(rows: list[Row], fmt: str) -> str:
    """Rows as CSV (JSON-valued columns as compact JSON) or as a JSON array."""
    data = [jsonable(r) for r in rows]
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    buf = io.StringIO()
    columns = list(data[0]) if data else [*_EXPORT_EMPTY_COLUMNS]
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in data:
        writer.writerow(
            {
                k: json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else v
                for k, v in r.items()
            }
        )
    return buf.getvalue()


_EXPORT_EMPTY_COLUMNS = ("run_id", "trial_id", "problem", "config", "state", "median_s", "gflops")


def cmd_export(args: argparse.Namespace) -> int:
    if args.format == "feinsum-sqlite":
        from tunefleet.cli.deprecated import notice
        from tunefleet.cli.feinsum import export_feinsum

        if not args.output:
            raise UsageError(
                "--format feinsum-sqlite writes an SQLite file: give -o PATH.sqlite "
                "(created if missing, appended to otherwise)"
            )
        notice("export --format feinsum-sqlite -o PATH", "tunefleet feinsum export RUN PATH")
        written, skipped = export_feinsum(args.db, args.run, Path(args.output))
        print(
            f"wrote {written} rows of run {args.run} to {args.output}"
            + (f" ({skipped} identical rows were already there)" if skipped else ""),
            file=sys.stderr,
        )
        return 0
    with open_db(args.db) as conn:
        require_run(conn, args.run)
        rows = report.export_rows(conn, args.run)
    text = export_text(rows, args.format)
    if args.output:
        _write(Path(args.output), text)
        print(f"wrote {len(rows)} trials of run {args.run} to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise UsageError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


def cmd_plot(args: argparse.Namespace) -> int:
    from tunefleet.cli.plot import render

    path = Path(args.output)
    if path.suffix.lower() != ".png":
        raise UsageError(f"-o {args.output!r}: the plot is a PNG; name the file FILE.png")
    if args.importance and Path(args.importance).suffix.lower() != ".png":
        raise UsageError(f"--importance {args.importance!r}: a PNG; name the file FILE.png")
    with open_db(args.db) as conn:
        run = require_run(conn, args.run)
        series = report.progress_series(conn, args.run)
        intervals = report.worker_intervals(conn, args.run)
        progress = report.run_progress(conn, args.run)
    assert progress is not None  # the run exists
    title = f"run {run['id']}: {run['problem']} {args_text(run['problem_args'])} on "
    title += run["device_class"]
    render(path, title=title, series=series, intervals=intervals, run_best=progress)
    n_workers = len({str(i["worker_id"]) for i in intervals})
    _out(
        f"wrote {args.output}: {len(series)} evaluations, best "
        f"{gflops(progress['best_gflops'])} GFLOP/s{best_mark(progress['best_status'])}, "
        f"{n_workers} worker{'' if n_workers == 1 else 's'}"
    )
    if args.importance:
        from tunefleet.cli.importance import plot_importance

        _out(plot_importance(args.db, args.run, Path(args.importance)))
    return 0


# --- problems / devices / measure ---------------------------------------------------------


def problem_rows() -> list[Row]:
    """One row per built-in problem: description, default arguments and space size; a
    problem whose module cannot load shows the reason instead."""
    from tunefleet.problems.registry import builtin_names, get_problem

    rows: list[Row] = []
    for name in builtin_names():
        row: Row = {"name": name}
        try:
            problem = get_problem(name)
            defaults = problem.normalise_args({})
            specs = getattr(problem, "arguments", ()) or ()
            row.update(
                description=problem.description,
                needs_opencl=problem.needs_opencl,
                default_args=defaults,
                arguments=[spec.to_json() for spec in specs],
            )
            try:
                space = problem.space(defaults)
                row.update(parameters=space.names(), space_size=space.size())
            except TunefleetError as exc:
                # The problem loads but its space needs something this machine lacks (the
                # feinsum problem's shipped spaces without feinsum): say so, list it anyway.
                row.update(parameters=[], space_size=None, space_error=str(exc))
        except Exception as exc:  # one broken problem must not hide the others
            row.update(description=f"(unavailable: {exc})", error=str(exc))
        rows.append(row)
    return rows


def cmd_problems(args: argparse.Namespace) -> int:
    rows = problem_rows()
    if args.json:
        _out(json.dumps(jsonable(rows), indent=2))
        return 0
    for r in rows:
        _out(f"{r['name']}: {r.get('description') or ''}")
        if "error" in r:
            continue
        device = "an OpenCL device" if r["needs_opencl"] else "no OpenCL (host pseudo-device)"
        if r["arguments"]:
            sizes = {spec["name"] for spec in r["arguments"] if spec.get("size")}
            for i, spec in enumerate(r["arguments"]):
                flag = " ".join(command_line_args({spec["name"]: spec["default"]}, sizes))
                choices = spec.get("choices")
                extra = f" (one of {', '.join(map(str, choices))})" if choices else ""
                label = "arguments" if i == 0 else ""
                _out(f"  {label:<10} {flag:<28} {spec.get('help', '')}{extra}".rstrip())
        else:
            defaults = " ".join(command_line_args(r["default_args"], ())) or "(none)"
            _out(f"  arguments  {defaults}")
        if r.get("space_error"):
            _out(f"  space      not known here: {r['space_error']}")
        else:
            _out(f"  space      {r['space_size']} points over {', '.join(r['parameters'])}")
        _out(f"  needs      {device}")
    _out("")
    _out("user problems: tunefleet tune path/to/problem.py (or module:attr)")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from tunefleet.worker.device import list_devices

    devices = list_devices()
    if args.json:
        _out(json.dumps([d.to_json() for d in devices], indent=2))
        return 0 if devices else 1
    if not devices:
        raise_no_device()
    rows = [
        {
            **d.to_json(),
            "type": d.extra.get("type"),
            "mem": f"{(d.global_mem_bytes or 0) / 2**30:.1f} GiB",
            # The limits a configuration's kernel must fit (the coordinator rules out what
            # exceeds them): local memory per work-group, work-items per work-group.
            "local": "?" if d.local_mem_bytes is None else f"{d.local_mem_bytes // 1024} KiB",
            "group": "?" if d.max_work_group_size is None else str(d.max_work_group_size),
        }
        for d in devices
    ]
    _out(
        table(
            rows,
            (
                Column("#", "index", right=True),
                Column("NAME", "name"),
                Column("TYPE", "type"),
                Column("PLATFORM", "platform"),
                Column("DRIVER", "driver_version"),
                Column("CU", "compute_units", right=True),
                Column("MEMORY", "mem", right=True),
                Column("LOCAL", "local", right=True),
                Column("WORK-GROUP", "group", right=True),
                Column("DEVICE CLASS", "device_class"),
            ),
        )
    )
    _out("")
    _out("pick one with --device INDEX or a part of its name; --device host runs synthetic only")
    return 0


def raise_no_device() -> None:
    from tunefleet.errors import DeviceError

    raise DeviceError(
        "no OpenCL device found; install a driver, or pip install 'tunefleet[pocl]' for a CPU "
        "device (the synthetic problem needs none: --device host)"
    )


def _json_arg(text: str | None, flag: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{flag} is not valid JSON ({exc.msg}); write e.g. {flag} '{{...}}'"
        ) from None


def _measurement_json(
    problem: str, problem_args: dict[str, Any], config: dict[str, Any], device: Any, outcome: Any
) -> dict[str, Any]:
    details = outcome.details or {}
    return {
        "problem": problem,
        "problem_args": problem_args,
        "config": config,
        "device": device.name,
        "state": outcome.state,
        "error": outcome.error,
        "median_s": outcome.median_s,
        "min_s": outcome.min_s,
        "gflops": outcome.gflops,
        "gbps": outcome.gbps,
        "samples_s": list(outcome.samples_s),
        "source_sha256": details.get("source_sha256"),
        "compile_s": outcome.compile_s,
    }


#: How long ``tunefleet measure`` lets one evaluation (code generation, build, timing) run.
MEASURE_TIMEOUT_S = 3600.0


def _measure_in_child(
    args: argparse.Namespace,
    problem_args: dict[str, Any],
    config: dict[str, Any],
    device: Any,
    protocol: Any,
) -> Any:
    """Generate, build and time the configuration in a child process started as a worker
    starts its own (with ``--cold`` with caches of its own, as a confirmation)."""
    import tempfile

    from tunefleet.worker.supervise import Child, Measure, Open, cold_environment
    from tunefleet.worker.vocabulary import ReplyKind

    with tempfile.TemporaryDirectory(prefix="tunefleet-measure-") as scratch:
        child = Child("measure", cold_environment(scratch) if args.cold else None)
        try:
            opened = child.call(Open(device), MEASURE_TIMEOUT_S)
            if opened.kind != ReplyKind.OK:
                raise TunefleetError(f"opening {device.name} failed: {opened.message}")
            request = Measure(
                args.problem,
                problem_args,
                config,
                device,
                protocol.to_json(),
                inline_prepare=True,
                cold=args.cold,
            )
            reply = child.call(request, MEASURE_TIMEOUT_S)
        finally:
            child.close()
    if reply.kind == ReplyKind.OK:
        return reply.value
    if reply.kind == ReplyKind.INVALID:
        raise TunefleetError(f"configuration is invalid: {reply.message}")
    raise TunefleetError(f"the evaluation {reply.kind}: {reply.message}")


def cmd_measure(args: argparse.Namespace) -> int:
    from tunefleet.errors import InvalidConfiguration
    from tunefleet.problems.base import Protocol
    from tunefleet.problems.registry import get_problem

    problem = get_problem(args.problem)
    problem_args = problem.normalise_args(raw_problem_args(args))
    space = problem.space(problem_args)
    config = _json_arg(args.config, "--config")
    if config is None:
        config = problem.default_config(problem_args)
    if not isinstance(config, dict):
        raise UsageError("--config must be a JSON object of parameter: value")
    try:
        config = space.check(config)
    except InvalidConfiguration as exc:
        raise UsageError(f"--config: {exc}") from None
    overrides = _json_arg(args.protocol, "--protocol") or {}
    if not isinstance(overrides, dict):
        raise UsageError("--protocol must be a JSON object, e.g. '{\"min_launches\": 10}'")
    protocol = Protocol.from_json({**Protocol().to_json(), **overrides})

    from tunefleet.worker.device import select_device

    pattern = args.device if problem.needs_opencl else (args.device or "host")
    device = select_device(pattern)
    outcome = _measure_in_child(args, problem_args, config, device, protocol)
    if args.json:
        _out(json.dumps(_measurement_json(args.problem, problem_args, config, device, outcome)))
        return 0 if outcome.state == TrialState.DONE else 1
    _out(f"{args.problem} {args_text(problem_args)} on {device.name} ({device.platform})")
    _out(f"config: {compact_json(config)}")
    if outcome.state != TrialState.DONE:
        raise TunefleetError(f"configuration is {outcome.state}: {outcome.error or '(no reason)'}")
    _out(
        f"{gflops(outcome.gflops)} GFLOP/s, median {seconds(outcome.median_s)}, "
        f"min {seconds(outcome.min_s)}, {len(outcome.samples_s)} samples"
        + (f", {gflops(outcome.gbps)} GB/s" if outcome.gbps is not None else "")
    )
    if args.code and outcome.code:
        _out(outcome.code.rstrip("\n"))
    return 0
