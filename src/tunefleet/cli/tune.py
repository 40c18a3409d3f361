"""``tunefleet tune``: one command that runs a whole tuning campaign on this machine.

It checks the problem and its arguments, opens the database (the embedded server without
``--db``), plans the local workers (one per OpenCL device of the chosen class, the host
pseudo-device for problems that need no OpenCL, none with ``--workers 0``), creates or resumes
the run through the coordinator's engine, starts the workers as child processes, drives the
search in this process and shows progress until a stop rule ends the run. Ctrl-C (or
SIGTERM, SIGHUP) stops the search, marks the run stopped (resumable with ``--resume RUN``)
and stops the workers with one SIGTERM each, so they hand back what they hold. Should this
process be killed outright, its workers get SIGTERM from the kernel (parent-death signal).

Workers run in their own session: the terminal's Ctrl-C reaches only this process, which then
signals each worker exactly once (a second signal would make a worker abort without handing
its trials back).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tunefleet.cli import flags, render
from tunefleet.cli.args import add_problem_flags, raw_problem_args
from tunefleet.cli.db import add_db_flag
from tunefleet.cli.output import args_text, seconds
from tunefleet.cli.progress import ProgressReader
from tunefleet.errors import DeviceError, RunError, TunefleetError, UsageError
from tunefleet.processes import die_with_parent, process_age_s
from tunefleet.settings import DatabaseSettings, home_dir
from tunefleet.vocabulary import RunState

if TYPE_CHECKING:
    # The coordinator itself loads only when a run is tuned (``tunefleet --help`` without it).
    from tunefleet.coordinator.engine import RunResult

#: How long the search waits for its local workers to register before it starts anyway (a
#: worker registers once it has found its device, before it opens it).
WORKERS_UP_S = 30.0
#: How long local workers get to exit once a run ended by its time budget (the run handed
#: their trials back, so they only drop them and leave) before they are killed: the budget
#: bounds the command, so a worker mid-compile or mid-timing must not hold it up.
BUDGET_STOP_S = 3.0


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
        help="device index, part of its name, or (with --workers 0) the device class to target",
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


# --- planning -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerPlan:
    """Which device class the run targets and the ``--device`` of each local worker."""

    device_class: str
    devices: tuple[str, ...]
    description: str


def plan_workers(needs_opencl: bool, workers: int | None, pattern: str | None) -> WorkerPlan:
    """Decide the run's device class and the local workers; raise a one-line error when the
    machine cannot serve the request."""
    from tunefleet.devices import ANY_DEVICE_CLASS, device_class_of

    if workers is not None and workers < 0:
        raise UsageError(f"--workers {workers}: give 0 or more workers")
    if not needs_opencl:
        if pattern not in (None, "host"):
            raise UsageError(
                f"--device {pattern!r}: this problem needs no OpenCL and runs on the host "
                "pseudo-device; drop --device"
            )
        n = 1 if workers is None else workers
        where = "host pseudo-device" if n else f"remote workers of class {ANY_DEVICE_CLASS}"
        return WorkerPlan(ANY_DEVICE_CLASS, ("host",) * n, where)

    if workers == 0:
        if not pattern:
            raise UsageError(
                "--workers 0 needs --device CLASS, the device class the remote workers serve "
                "(`tunefleet devices` on a worker machine shows it, e.g. nvidia-h200)"
            )
        try:
            matches = _matching_devices(pattern)
        except DeviceError:
            matches = []  # a login node without OpenCL: the pattern is the class itself
        cls = matches[0].device_class if matches else device_class_of(pattern)
        return WorkerPlan(cls, (), f"remote workers of class {cls}")

    matches = _matching_devices(pattern)
    cls = matches[0].device_class
    same = [d for d in matches if d.device_class == cls]
    n = len(same) if workers is None else workers
    if n > len(same):
        raise UsageError(
            f"--workers {n}: this machine has {len(same)} device(s) of class {cls} and a device "
            "takes one worker (two would corrupt each other's timings); use --workers "
            f"{len(same)} and start more workers on other machines with `tunefleet worker`"
        )
    chosen = same[:n]
    names = ", ".join(f"{d.index}: {d.name}" for d in chosen)
    return WorkerPlan(cls, tuple(str(d.index) for d in chosen), names)


def _matching_devices(pattern: str | None) -> list[Any]:
    from tunefleet.worker.device import list_devices

    devices = list_devices()
    if not devices:
        raise DeviceError(
            "no OpenCL device found; install a driver, or pip install 'tunefleet[pocl]' for a "
            "CPU device, or run the search only (--workers 0 --device CLASS)"
        )
    if pattern is None or pattern == "":
        gpus = [d for d in devices if "gpu" in d.extra.get("type", "")]
        return gpus or devices
    text = pattern.strip()
    if text.isdigit():
        idx = int(text)
        if idx >= len(devices):
            raise DeviceError(
                f"--device {idx}: this machine has {len(devices)} device(s); "
                "`tunefleet devices` lists them"
            )
        return [devices[idx]]
    needle = text.lower()
    matches = [d for d in devices if needle in _searchable(d)]
    if not matches:
        raise DeviceError(
            f"no OpenCL device matches --device {pattern!r}; `tunefleet devices` lists them"
        )
    return matches


def _searchable(d: Any) -> str:
    """What a ``--device`` pattern matches: name, platform, class, OpenCL version string
    (``pocl`` appears only there) and type (``cpu``, ``gpu``)."""
    parts = (d.name, d.platform, d.device_class, d.extra.get("opencl_version", ""))
    return " ".join((*parts, d.extra.get("type", ""))).lower()


# --- local worker processes ---------------------------------------------------------------


@dataclass
class LocalWorkers:
    """The worker processes this command started, with their log files."""

    url: str
    log_dir: Path
    procs: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def start(self, devices: tuple[str, ...], extra: list[str]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # The workers share this machine's cores: each sizes its code generation for its part
        # from the start, before the others have registered in the database.
        env = {**os.environ, "TUNEFLEET_WORKER_PEERS": str(max(len(devices), 1))}
        for i, device in enumerate(devices):
            log = self.log_dir / f"worker-{i}.log"
            cmd = [sys.executable, "-m", "tunefleet", "worker", "--db", self.url]
            cmd += ["--device", device, *extra]
            with open(log, "ab") as fh:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # the terminal's Ctrl-C is ours to forward, once
                    preexec_fn=functools.partial(_die_with_parent, os.getpid()),
                )
            self.procs.append((proc, log))

    def wait_registered(
        self, conn: Any, timeout_s: float, give_up: Callable[[], bool] = lambda: False
    ) -> bool:
        """Wait until every local worker has registered, so the search sizes its first
        queue for all of them rather than for whichever came up first; stop early when one
        exits or ``give_up()`` says so. Returns whether all registered."""
        from tunefleet.queries import report

        host = socket.gethostname()
        pids = {proc.pid for proc, _ in self.procs}
        deadline = time.monotonic() + timeout_s
        while True:
            seen = {w["pid"] for w in report.fleet(conn) if w["host"] == host}
            if pids <= seen:
                return True
            if time.monotonic() > deadline or give_up() or self.exited():
                return False
            time.sleep(0.1)

    def exited(self) -> list[tuple[int, Path]]:
        """Workers that ended on their own: (exit status, log file)."""
        return [(p.returncode, log) for p, log in self.procs if p.poll() is not None]

    def stop(self, timeout: float = 30.0) -> None:
        """One SIGTERM each (graceful: finish or hand back held trials), then wait; SIGKILL
        what is still there after ``timeout`` (its leases expire and the reaper requeues)."""
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc, _ in self.procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _die_with_parent(parent_pid: int) -> None:
    """In the worker child before exec: get SIGUSR1 (the worker's graceful stop that never
    escalates) when this process dies without stopping it, e.g. SIGKILLed; not SIGTERM,
    whose second delivery aborts a worker."""
    die_with_parent(parent_pid, signal.SIGUSR1, exit_code=1)


def last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


# --- progress -----------------------------------------------------------------------------


class ProgressDisplay:
    """Rewrites one line on a terminal; prints a plain line every ``every`` seconds
    otherwise (logs, CI, pipes)."""

    def __init__(self, stream: TextIO, every: float) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.every = every
        self._last: float | None = None
        self._width = 0

    def show(self, line: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            # A line longer than the terminal would wrap and "\r" could not rewrite it.
            line = line[: max(shutil.get_terminal_size().columns - 1, 20)]
            pad = max(self._width - len(line), 0)
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
            self.stream.flush()
        elif force or self._last is None or now - self._last >= self.every:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last = now

    def end(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


# --- the command --------------------------------------------------------------------------


def cmd_tune(args: argparse.Namespace) -> int:
    # The time budget (--max-time) started when this process did: the interpreter's start,
    # the imports and the database's (an embedded server's start, even its first initdb)
    # are inside it, so that it bounds the command.
    clock_start = time.monotonic() - process_age_s()
    from tunefleet.db.engine import connect
    from tunefleet.db.resolve import database_url
    from tunefleet.problems.registry import get_problem
    from tunefleet.queries import report

    if args.problem is None and args.resume is None:
        raise UsageError("name a PROBLEM to tune (see `tunefleet problems`) or --resume RUN")
    if args.resume is not None:
        given = [f for f, v in (("--seed-config", args.seed_config),
                                ("--warm-start-from", args.warm_start_from)) if v]  # fmt: skip
        if given:
            raise UsageError(
                f"--resume continues run {args.resume} as it was created; drop {given[0]}"
            )

    settings = DatabaseSettings.build(args.db, application_name="tunefleet-tune")
    if args.resume is not None:
        url = database_url(settings)
        with connect(url, settings) as conn:
            run = report.run_row(conn, args.resume)
        if run is None:
            raise RunError(
                f"run {args.resume} does not exist in this database; `tunefleet runs` lists them"
            )
        if args.problem is not None and args.problem != run["problem"]:
            raise UsageError(
                f"run {args.resume} tunes {run['problem']!r}, not {args.problem!r}; "
                f"drop PROBLEM or use `tunefleet tune {run['problem']} --resume {args.resume}`"
            )
        problem = get_problem(run["problem"])
        problem_args = dict(run["problem_args"])
        stored_budget_s = run.get("max_seconds")
        plan = _resume_plan(problem.needs_opencl, args, run)
        _check_worker_flags(plan, args)
    else:
        # Check what the user typed before touching the database or any device.
        problem = get_problem(args.problem)
        problem_args = problem.normalise_args(raw_problem_args(args))
        problem.space(problem_args)
        plan = plan_workers(problem.needs_opencl, args.workers, args.device)
        _check_worker_flags(plan, args)
        url = database_url(settings)
        stored_budget_s = None

    from tunefleet.coordinator.create import create_run
    from tunefleet.coordinator.engine import Coordinator, Progress
    from tunefleet.coordinator.settings import CoordinatorSettings, parse_seed_configs

    seeds: list[dict[str, Any]] = []
    if args.resume is None:
        seeds = [*_baseline(problem, problem_args)]
        seeds += [c for text in args.seed_config or () for c in parse_seed_configs(text)]
    coord_settings = CoordinatorSettings.build(
        problem=None if args.resume is not None else args.problem,
        problem_args=problem_args,
        seed_configs=seeds,
        warm_start_from=args.warm_start_from,
        techniques=args.technique,
        device_class=plan.device_class,
        name=args.name,
        resume=args.resume,
        max_trials=args.max_trials,
        max_seconds=args.max_time,
        target_gflops=args.target,
        patience=args.patience,
        confirm=args.confirm,
    )
    engine_db = coordinator_db(settings, url)
    run_id = args.resume or create_run(coord_settings, url, engine_db)
    coordinator = Coordinator(coord_settings, url, engine_db, clock_start=clock_start)
    budget_s = coord_settings.max_seconds or stored_budget_s

    every = args.progress_every if args.progress_every is not None else 5.0
    display = ProgressDisplay(sys.stdout, every)
    where = f"{len(plan.devices)} local ({plan.description})" if plan.devices else plan.description
    verb = "resuming" if args.resume else "tuning"
    print(
        f"{verb} run {run_id}: {problem.name or args.problem} "
        f"{args_text(_changed_args(problem, problem_args))} on "
        f"{plan.device_class}; workers: {where}",
        flush=True,
    )
    workers = LocalWorkers(url, home_dir() / "logs" / f"run-{run_id}")
    worker_flags = flags.worker_argv(args)
    failure: list[str] = []
    interrupts = 0

    def on_signal(signum: int, frame: Any) -> None:
        # Ctrl-C, `kill`, a batch system's TERM or a closed terminal: stop cleanly, once.
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            raise KeyboardInterrupt  # a second one: stop waiting
        coordinator.request_stop()

    reader = ProgressReader(settings, url, run_id)
    with connect(url, settings) as conn:
        last_poll = 0.0

        def on_progress(progress: Progress) -> None:
            nonlocal last_poll
            now = time.monotonic()
            if now - last_poll < 0.5:
                return
            last_poll = now
            line = reader.line(progress.unserved)
            if line is not None:
                display.show(line)
            exited = workers.exited()
            if plan.devices and len(exited) == len(plan.devices) and not failure:
                rc, log = exited[0]
                failure.append(
                    f"every local worker exited (status {rc}): {last_line(log) or '?'} (log: {log})"
                )
                coordinator.request_stop()

        stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, on_signal) for sig in stop_signals}
        result = None
        try:
            workers.start(plan.devices, worker_flags)
            up_s = WORKERS_UP_S
            if budget_s is not None:
                up_s = min(up_s, max(0.0, budget_s - (time.monotonic() - clock_start)))
            workers.wait_registered(conn, up_s, give_up=lambda: interrupts > 0)
            result = coordinator.run(run_id, progress_callback=on_progress)
        except KeyboardInterrupt:
            interrupts = max(interrupts, 1)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            timed_out = result is not None and result.cut is not None
            workers.stop(BUDGET_STOP_S if timed_out else 30.0)
            display.end()
            _cancel_leftovers(url, engine_db, run_id)
        line = reader.line()
        reader.close()
        if line is not None:
            display.show(line, force=True)
            display.end()

    if failure:
        raise TunefleetError(failure[0])
    if interrupts or (result is not None and result.state == RunState.STOPPED):
        from tunefleet.db.engine import redact

        hint = "" if args.db is None else f" --db {shlex.quote(redact(args.db))}"
        print(
            f"stopped run {run_id}; continue with `tunefleet tune --resume {run_id}{hint}`",
            file=sys.stderr,
        )
        return 130
    assert result is not None
    print(f"run {run_id} finished: {result.stop_reason}", flush=True)
    if result.cut is not None and result.cut.anything:
        from tunefleet.db.engine import redact

        hint = "" if args.db is None else f" --db {shlex.quote(redact(args.db))}"
        print(result.cut.sentence(f"`tunefleet tune --resume {run_id}{hint}`"), flush=True)
    try:
        # What `tunefleet best RUN` says, then whether a re-measurement confirmed it.
        with connect(url, settings) as conn:
            text = render.best_text(render.read_best(conn, run_id))
    except RunError as exc:
        print(f"tunefleet: {exc}", file=sys.stderr)
        return 1
    print(text, flush=True)
    print(final_line(run_id, result, coord_settings.confirm), flush=True)
    return 0


def final_line(run_id: int, result: RunResult, confirm: int) -> str:
    """The last line of ``tune``: the best, and whether a re-measurement confirmed it."""
    if not result.confirmed:
        cut = result.cut
        if confirm == 0:
            why = "confirmation is off (--confirm 0)"
        elif cut is not None and cut.confirm_queued < cut.confirm_wanted:
            why = "the time budget left no time to re-measure it"
        else:
            why = "its re-measurement did not finish"
        return f"run {run_id}: best trial {result.best_trial_id} is NOT confirmed: {why}"
    text = (
        f"run {run_id}: best trial {result.best_trial_id} confirmed by re-measurement "
        f"({seconds(result.confirmed_median_s)}, spread {100 * result.spread:.2f} %"
    )
    if result.disagrees:
        return text + f", beyond the samples' noise of {100 * result.noise:.2f} %: DISAGREES)"
    return text + f", within the samples' noise of {100 * result.noise:.2f} %)"


def _check_worker_flags(plan: WorkerPlan, args: argparse.Namespace) -> None:
    given = flags.worker_argv(args)
    if given and not plan.devices:
        raise UsageError(
            f"{given[0]} sets up the workers this command starts, and --workers 0 starts "
            "none; give it to `tunefleet worker` on the worker machines"
        )


def _baseline(problem: Any, problem_args: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The problem's default configuration, measured first: every run then has a baseline
    to compare the search's best against (none when the default breaks the problem's rules)."""
    from tunefleet.errors import InvalidConfiguration

    try:
        return (problem.check_config(problem_args, problem.default_config(problem_args)),)
    except (InvalidConfiguration, TunefleetError):
        return ()


def _changed_args(problem: Any, problem_args: dict[str, Any]) -> dict[str, Any]:
    """The arguments that differ from the problem's defaults (what the user chose)."""
    try:
        defaults = problem.normalise_args({})
    except TunefleetError:
        return problem_args
    return {k: v for k, v in problem_args.items() if defaults.get(k) != v}


def coordinator_db(settings: DatabaseSettings, url: str) -> DatabaseSettings:
    """The in-process coordinator's database settings: the user's (every timeout, the connect
    timeout included) on the resolved URL, under the coordinator's name."""
    return dataclasses.replace(settings, url=url, application_name="tunefleet-coordinator")


def _cancel_leftovers(url: str, db: DatabaseSettings, run_id: int) -> None:
    """Trials the stopped workers handed back after the search ended go to ``cancelled``
    (a stopped or finished run keeps no pending work; a resume re-asks the search)."""
    from tunefleet.db.engine import connect
    from tunefleet.queries import search

    with connect(url, db) as conn:
        run = search.get_run(conn, run_id)
        if run is not None and run["state"] != RunState.RUNNING:
            search.cancel_pending(conn, run_id)


def _resume_plan(needs_opencl: bool, args: argparse.Namespace, run: dict[str, Any]) -> WorkerPlan:
    """Workers for a resumed run: they must serve the class the run targets."""
    cls = run["device_class"]
    if args.workers == 0:
        return WorkerPlan(cls, (), f"remote workers of class {cls}")
    plan = plan_workers(needs_opencl, args.workers, args.device)
    if plan.device_class != cls:
        raise DeviceError(
            f"run {run['id']} targets device class {cls}, but the local device is "
            f"{plan.device_class}; resume it where such a device is, or with --workers 0"
        )
    return plan
