"""``tunefleet.tune()``: a whole tuning campaign from Python, and the engine of the
``tunefleet tune`` command (which only turns its flags into these arguments and prints).

It checks the problem and its arguments, opens the database (the embedded server unless
``db`` is given), plans the local workers (one per OpenCL device of the chosen class, the
host pseudo-device for problems that need no OpenCL, none with ``workers=0``), creates or
resumes the run through the coordinator's engine, starts the workers as child processes,
drives the search in this process and reports progress until a stop rule ends the run.

A stop before the run finished (Ctrl-C, SIGTERM or SIGHUP while ``tune`` runs in the main
thread; ``KeyboardInterrupt`` or any other exception raised by the progress callback; a stop
from outside) stops the search, marks the run ``stopped`` and stops the workers with one
SIGTERM each, so they hand back what they hold. Then :class:`~tunefleet.errors.TuneInterrupted`
is raised (the callback's own exception, when it raised something else), carrying the run id:
``tune(resume=run_id)`` continues it.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import operator
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunefleet import agreement, spread
from tunefleet.api.display import ProgressDisplay
from tunefleet.api.fleet import (
    BUDGET_STOP_S,
    WORKERS_UP_S,
    LocalWorkers,
    WorkerPlan,
    cancel_leftovers,
    coordinator_db,
    last_line,
    plan_workers,
    resume_plan,
)
from tunefleet.api.problem_ref import problem_spec
from tunefleet.api.read import BestTrial, best_trial
from tunefleet.errors import RunError, TunefleetError, TuneInterrupted, UsageError
from tunefleet.options.flags import MAX_COUNT, MAX_ID
from tunefleet.settings import DatabaseSettings, home_dir
from tunefleet.text.lines import write_line
from tunefleet.vocabulary import RunState

if TYPE_CHECKING:
    from tunefleet.coordinator.budget import Cut
    from tunefleet.coordinator.engine import RunResult
    from tunefleet.db.embedded.keeper import ServerKeeper

#: Most local workers one call may ask for (a machine's devices, with room to spare).
MAX_WORKERS = 4096

#: ``progress=`` takes a callable, or False for silence; None is the default display.
ProgressCallback = Callable[["TuneProgress"], None]


@dataclass(frozen=True)
class TuneProgress:
    """What a progress callback gets: ``phase`` is ``start`` (once, before the search;
    ``line`` says what is tuned where), ``running`` (about twice a second while the run
    moves), ``notice`` (something that happened to the run worth a line of its own: the
    embedded server died under it and was started again; the search began its end game) or
    ``end`` (once, the run's last counts). ``line`` is the text ``tunefleet tune`` shows."""

    run_id: int
    phase: str
    line: str
    finished: int = 0
    in_flight: int = 0
    live_workers: int = 0
    elapsed_s: float = 0.0
    #: While the search runs: its fastest measurement so far (unconfirmed). At ``end``: the
    #: run's best as every report quotes it, and ``best_status`` says what it is
    #: (:class:`~tunefleet.vocabulary.BestStatus`).
    best_gflops: float | None = None
    best_status: str | None = None


@dataclass(frozen=True)
class TuneResult:
    """How a finished run ended and what it found.

    ``best`` is None when no trial succeeded. ``report`` is the text ``tunefleet best RUN``
    prints (or why there is no best); ``reproduce`` the command that times the best
    configuration again."""

    run_id: int
    state: str
    stop_reason: str
    trials: int
    best: BestTrial | None
    confirmed: bool
    report: str
    #: The coordinator's own figures of the end (``confirm`` re-measurement, spread, noise).
    confirmed_median_s: float | None = None
    spread: float | None = None
    noise: float | None = None
    disagrees: bool | None = None
    #: What the time budget cut when it ended the run (``handed_back`` trials in flight,
    #: ``confirm_wanted`` / ``confirm_queued``, ``sentence(resume)`` for people); None when
    #: the run had no time budget.
    budget_cut: Cut | None = None

    @property
    def config(self) -> dict[str, Any] | None:
        """The best configuration (None without a successful trial)."""
        return None if self.best is None else dict(self.best.config)

    @property
    def reproduce(self) -> str | None:
        return None if self.best is None else self.best.reproduce


def tune(
    problem: object = None,
    *,
    sizes: Mapping[str, int] | None = None,
    dtype: str | None = None,
    args: Mapping[str, Any] | None = None,
    max_trials: int | None = None,
    max_time: float | None = None,
    target_gflops: float | None = None,
    patience: int | None = None,
    confirm: int | None = None,
    workers: int | None = None,
    device: str | int | None = None,
    db: str | None = None,
    name: str | None = None,
    technique: str | Sequence[str] | None = None,
    search_seed: int | None = None,
    seed_configs: Sequence[Mapping[str, Any]] | None = None,
    warm_start_from: str | None = None,
    resume: int | None = None,
    timeout: float | None = None,
    prefetch: int | None = None,
    prepare_workers: int | None = None,
    cores: float | None = None,
    prebuild: bool | None = None,
    protocol: Mapping[str, Any] | None = None,
    progress: ProgressCallback | bool | None = None,
    clock_start: float | None = None,
) -> TuneResult:
    """Tune ``problem`` on this machine (and on any workers started elsewhere) until a stop
    rule ends the run; the same campaign as ``tunefleet tune`` with the same defaults.

    ``problem``: a built-in name (``"gemm"``), ``"path/to/problem.py[:Class]"``,
    ``"module:attr"``, or a :class:`tunefleet.Problem` subclass (or module-level instance)
    defined in a module file. ``sizes``/``dtype``/``args``: the problem's arguments
    (``--size``/``--dtype``/``--arg``). ``workers``: local workers (default one per OpenCL
    device of the chosen class; 0: only the search, for workers started elsewhere, with
    ``device`` naming their class). ``db``: a PostgreSQL URL (default the embedded
    server). ``search_seed``: seed of the search's random draws, stored with the run
    (``--search-seed``). ``protocol``: measurement protocol overrides of a new run (fields of
    :class:`tunefleet.Protocol`). ``progress``: called with a :class:`TuneProgress`; default
    a live line on stderr when it is a terminal, nothing otherwise; False: nothing.
    ``clock_start``: the ``time.monotonic()`` that ``max_time`` counts from (default: this
    call; ``tunefleet tune`` gives its process's start, so the budget bounds the command).

    Returns a :class:`TuneResult`; raises :class:`~tunefleet.errors.TuneInterrupted` when
    the run was stopped (it is resumable with ``resume=``), and another
    :class:`~tunefleet.errors.TunefleetError` (one line) for bad arguments or a machine
    that cannot serve the request, before anything is stored.

    >>> import tunefleet
    >>> result = tunefleet.tune("synthetic", args={"duration": 0.001},
    ...                         max_trials=8, progress=False)   # doctest: +SKIP
    >>> result.config                                             # doctest: +SKIP
    {'order': 'ikj', 'tile': 16, 'unroll': 4, 'vector': True}
    """
    if clock_start is None:
        clock_start = time.monotonic()
    from tunefleet.db.engine import connect
    from tunefleet.db.resolve import database_url
    from tunefleet.problems.registry import get_problem
    from tunefleet.queries import report

    spec = None if problem is None else problem_spec(problem)
    techniques = _techniques(technique)
    seed_list = _seed_configs(seed_configs)
    show = _callback(progress)
    worker_argv = _worker_argv(timeout, prefetch, prepare_workers, cores, prebuild)
    from tunefleet.coordinator.budget import KEYWORDS, Budget

    # The budget's one value, checked once here, spelled as this function's keywords.
    budget = Budget.build(
        max_trials=max_trials,
        max_seconds=max_time,
        target_gflops=target_gflops,
        patience=patience,
        spelling=KEYWORDS,
    )
    search_seed = _count("search_seed", search_seed, 0, MAX_COUNT)
    confirm = _count("confirm", confirm, 0, 1000)
    workers = _count("workers", workers, 0, MAX_WORKERS)
    pattern = None if device is None else str(device)
    if spec is None and resume is None:
        raise UsageError("name a problem to tune (see `tunefleet problems`) or resume a run")
    if protocol is not None and not isinstance(protocol, Mapping):
        raise UsageError(f"protocol={protocol!r}: give a dict of protocol settings")
    if resume is not None:
        resume = _count("resume", resume, 1, MAX_ID)
        if seed_configs or warm_start_from or protocol:
            what = (
                "seed_configs"
                if seed_configs
                else ("warm_start_from" if warm_start_from else "protocol")
            )
            raise UsageError(f"resuming continues run {resume} as it was created; drop {what}")

    settings = DatabaseSettings.build(db, application_name="tunefleet-tune")
    if resume is not None:
        url = database_url(settings)
        with connect(url, settings) as conn:
            run = report.run_row(conn, resume)
        if run is None:
            raise RunError(
                f"run {resume} does not exist in this database; `tunefleet runs` lists them"
            )
        if spec is not None and spec != run["problem"]:
            raise UsageError(
                f"run {resume} tunes {run['problem']!r}, not {spec!r}; drop the problem or "
                f"tune {run['problem']!r} with resume={resume}"
            )
        loaded = get_problem(run["problem"])
        problem_args = dict(run["problem_args"])
        stored_max_seconds = run.get("max_seconds")
        plan = resume_plan(loaded.needs_opencl, workers, pattern, run)
    else:
        # Check what the user gave before touching the database or any device.
        assert spec is not None
        loaded = get_problem(spec)
        problem_args = loaded.normalise_args(_raw_args(sizes, dtype, args))
        loaded.space(problem_args)
        plan = plan_workers(loaded.needs_opencl, workers, pattern)
        url = database_url(settings)
        stored_max_seconds = None
    if worker_argv and not plan.devices:
        raise UsageError(
            f"{worker_argv[0]} sets up the workers this command starts, and --workers 0 starts "
            "none; give it to `tunefleet worker` on the worker machines"
        )

    from tunefleet.coordinator.create import create_run
    from tunefleet.coordinator.engine import Coordinator
    from tunefleet.coordinator.settings import CoordinatorSettings

    seeds: list[dict[str, Any]] = []
    if resume is None:
        seeds = [*_baseline(loaded, problem_args), *seed_list]
    coord_settings = CoordinatorSettings.build(
        problem=None if resume is not None else spec,
        problem_args=problem_args,
        seed_configs=seeds,
        warm_start_from=warm_start_from,
        techniques=techniques,
        search_seed=search_seed,
        device_class=plan.device_class,
        name=name,
        protocol=protocol,
        resume=resume,
        budget=budget,
        confirm=confirm,
    )
    engine_db = coordinator_db(settings, url)
    run_id = resume or create_run(coord_settings, url, engine_db)
    coordinator = Coordinator(coord_settings, url, engine_db, clock_start=clock_start)
    max_seconds = budget.max_seconds or stored_max_seconds
    # The local workers' registration may not outlast what is left of the time budget.
    up_s = WORKERS_UP_S
    if max_seconds is not None:
        up_s = min(up_s, max(0.0, max_seconds - (time.monotonic() - clock_start)))

    where = f"{len(plan.devices)} local ({plan.description})" if plan.devices else plan.description
    choice = None if resume is not None else _search_choice(url, settings, run_id)
    from tunefleet.text.output import args_text

    start = TuneProgress(
        run_id,
        "start",
        f"{'resuming' if resume else 'tuning'} run {run_id}: {loaded.name or spec} "
        f"{args_text(_changed_args(loaded, problem_args))} on {plan.device_class}; "
        f"workers: {where}" + (f"; {choice}" if choice else ""),
    )
    result, failure, raised, interrupts = _drive(
        coordinator, run_id, plan, settings, url, engine_db, worker_argv, show, start, up_s
    )
    if raised is not None and not isinstance(raised, KeyboardInterrupt):
        raise raised
    if failure:
        raise TunefleetError(failure)
    if interrupts or result is None or result.state == RunState.STOPPED:
        raise TuneInterrupted(run_id)
    return _result(result, url, settings, coord_settings.confirm)


def _search_choice(url: str, settings: DatabaseSettings, run_id: int) -> str | None:
    """Why the new run searches its whole space (the coordinator chose the grid), or None."""
    from tunefleet.db.engine import connect
    from tunefleet.queries import report

    with connect(url, settings) as conn:
        run = report.run_row(conn, run_id)
    choice = ((run or {}).get("search") or {}).get("choice")
    return str(choice) if choice else None


def _drive(
    coordinator: Any,
    run_id: int,
    plan: WorkerPlan,
    settings: DatabaseSettings,
    url: str,
    engine_db: DatabaseSettings,
    worker_argv: list[str],
    show: ProgressCallback,
    start: TuneProgress,
    up_s: float,
) -> tuple[RunResult | None, str | None, BaseException | None, int]:
    """Say ``start``, start the workers, drive the search, stop everything: (result, why every
    local worker exited, what the progress callback raised, how many stop signals came). What
    the callback raises stops the run as Ctrl-C does: the run ends ``stopped``, resumable."""
    from tunefleet.coordinator.session import SearchSession
    from tunefleet.db.engine import connect
    from tunefleet.text.progress import progress_line

    workers = LocalWorkers(url, home_dir() / "logs" / f"run-{run_id}")
    failure: list[str] = []
    raised: list[BaseException] = []
    interrupts = 0
    # The search is driven as `tunefleet coordinator` drives it (one implementation, with the
    # one stop rule); this door adds its local workers and its display.
    session = SearchSession(coordinator, run_id, settings, url, every_s=0.5)
    # On the embedded server this command keeps it up: a postmaster that dies under the run
    # is started again here (everyone reconnects by themselves), not left to a person.
    keeper = _keeper() if settings.url is None else None

    def tell(p: TuneProgress) -> None:
        try:
            show(p)
        except BaseException as exc:  # the caller's code: stop the run cleanly first
            raised.append(exc)
            coordinator.request_stop()

    def say_restarts() -> None:
        for data_dir in keeper.restarts() if keeper is not None else ():
            line = (
                f"the embedded database server stopped under run {run_id} (its postmaster is "
                f"gone); restarted it (data: {data_dir}), the run goes on"
            )
            tell(TuneProgress(run_id, "notice", line))

    ending: list[bool] = []

    def say_end_game(p: Any) -> None:
        # Once: the search's proposals change character here, and a user watching the
        # progress line would otherwise see only its pace change.
        began = p.end_game
        if began is None or ending:
            return
        ending.append(True)
        line = (
            f"run {run_id}: about {began.left} of {began.spent + began.left} evaluations "
            "left; the search sweeps the neighbourhoods of its fastest configurations from now on"
        )
        tell(TuneProgress(run_id, "notice", line))

    def on_tick(line: str | None, p: Any) -> None:
        if raised:
            return
        say_restarts()
        say_end_game(p)
        if line is not None:
            tell(_progress(run_id, RunState.RUNNING, line, p))
        exited = workers.exited()
        if plan.devices and len(exited) == len(plan.devices) and not failure:
            rc, log = exited[0]
            failure.append(
                f"every local worker exited (status {rc}): {last_line(log) or '?'} (log: {log})"
            )
            coordinator.request_stop()

    result = None
    with keeper or contextlib.nullcontext(), connect(url, settings) as conn:

        def before() -> None:
            try:
                show(start)
            except BaseException as exc:  # the caller's code: the run stops before it starts
                raised.append(exc)
                coordinator.request_stop()
            if not raised:
                workers.start(plan.devices, worker_argv)
                workers.wait_registered(conn, up_s, give_up=lambda: session.signals > 0)

        try:
            result = session.run(on_tick, before)
        except KeyboardInterrupt:
            interrupts = 1
        finally:
            interrupts = max(interrupts, session.signals)
            timed_out = result is not None and result.cut is not None
            workers.stop(BUDGET_STOP_S if timed_out else 30.0)
            cancel_leftovers(url, engine_db, run_id)
        say_restarts()
    row = session.final_row()
    line = None if row is None else progress_line(row)
    if line is not None:
        try:
            show(
                TuneProgress(
                    run_id,
                    "end",
                    line,
                    best_gflops=row["best_gflops"] if row else None,
                    best_status=row["best_status"] if row else None,
                )
            )
        except BaseException as exc:
            raised.append(exc)
    if raised and isinstance(raised[0], KeyboardInterrupt):
        interrupts = max(interrupts, 1)
    return result, (failure[0] if failure else None), (raised[0] if raised else None), interrupts


def _keeper() -> ServerKeeper:
    """The keeper of the embedded server (imported only for a run on it)."""
    from tunefleet.db.embedded import default_server
    from tunefleet.db.embedded.keeper import ServerKeeper

    return ServerKeeper(default_server())


def _progress(run_id: int, phase: str, line: str, p: Any) -> TuneProgress:
    return TuneProgress(
        run_id,
        phase,
        line,
        finished=p.finished,
        in_flight=p.in_flight,
        live_workers=p.live_workers,
        elapsed_s=p.elapsed_s,
        best_gflops=p.best_gflops,
    )


def _result(result: RunResult, url: str, settings: DatabaseSettings, confirm: int) -> TuneResult:
    from tunefleet.db.engine import connect
    from tunefleet.text.render import best_text, read_best

    with connect(url, settings) as conn:
        found = read_best(conn, result.run_id)
    try:
        text = best_text(found)
    except RunError as exc:  # no successful trial: a result too
        text = str(exc)
    best = best_trial(found.best[0]) if found.best else None
    return TuneResult(
        run_id=result.run_id,
        state=result.state,
        stop_reason=result.stop_reason,
        trials=result.trials,
        best=best,
        confirmed=result.confirmed,
        report=text + "\n" + final_line(result, confirm),
        confirmed_median_s=result.confirmed_median_s,
        spread=result.spread,
        noise=result.noise,
        disagrees=result.disagrees,
        budget_cut=result.cut,
    )


def final_line(result: RunResult, confirm: int) -> str:
    """The last line of a tune: the best, and whether a re-measurement confirmed it."""
    from tunefleet.text.output import seconds

    run_id = result.run_id
    if not result.confirmed:
        cut = result.cut
        if confirm == 0:
            why = "confirmation is off (--confirm 0)"
        elif cut is not None and cut.confirm_queued < cut.confirm_wanted:
            why = "the time budget left no time to re-measure it"
        else:
            why = "its re-measurement did not finish"
        return f"run {run_id}: best trial {result.best_trial_id} is NOT confirmed: {why}"
    if result.standing is not None and result.figure_s is not None:
        return _judged_line(result)
    verdict = agreement.verdict_text(
        result.spread or 0.0,
        result.noise,
        result.disagrees,
        result.agreement_p,
        result.same_source,
    )
    noisy = "; its samples stayed noisy (see `tunefleet best`)" if result.noisy else ""
    how = {None: "re-measured", False: "confirmed by a cold re-measurement"}.get(
        result.disagrees, "NOT reproduced by its cold re-measurement"
    )
    return (
        f"run {run_id}: best trial {result.best_trial_id} {how} "
        f"({seconds(result.confirmed_median_s)}, {verdict}){noisy}"
    )


def _judged_line(result: RunResult) -> str:
    """The last line of a tune whose finalists were judged across processes
    (:mod:`tunefleet.spread`): the best with the ± its processes allow, or plainly that the
    run could not settle its best."""
    from tunefleet.text.output import gflops, seconds
    from tunefleet.text.render import range_text

    head = f"run {result.run_id}: best trial {result.best_trial_id}"
    rate = "" if result.figure_gflops is None else f"{gflops(result.figure_gflops)} GFLOP/s"
    extra = (
        f"; the shoot-out timed {result.shootout} more fresh process(es) of its finalists"
        if result.shootout
        else ""
    )
    if result.standing != "agrees":
        return (
            f"{head} is NOT reproduced: its {result.processes} processes disagree beyond "
            f"what fresh processes differ by here, and no finalist's agreed: the run could "
            f"not separate its finalists (it ranks by median {seconds(result.figure_s)}, "
            f"{rate}; see `tunefleet best {result.run_id} --top 5`){extra}"
        )
    tolerance = result.spread_tolerance or agreement.FLOOR
    how = spread.basis_text(result.spread_typical, result.spread_within) or (
        "too few processes to estimate how far apart they differ: the "
        f"{100 * agreement.FLOOR:g} % floor"
    )
    tie = (
        f"; it could NOT be separated from trial {result.unseparated_trial_id} (closer than "
        "these processes tell apart)"
        if result.unseparated_trial_id is not None
        else ""
    )
    return (
        f"{head}: {rate} ± {100 * tolerance:.0f} % across {result.processes} processes"
        f"{range_text(result.process_range_s, tolerance, result.launch_range_s, result.figure_s)}"
        ", confirmed "
        f"(median {seconds(result.figure_s)}; {how}){tie}{extra}"
    )


# --- arguments ------------------------------------------------------------------------


def _callback(progress: ProgressCallback | bool | None) -> ProgressCallback:
    if progress is None or progress is True:
        if not sys.stderr.isatty():
            return lambda p: None
        display = ProgressDisplay(sys.stderr, 5.0)

        def default(p: TuneProgress) -> None:
            if p.phase in ("start", "notice"):
                display.end()
                write_line(p.line, sys.stderr)
            else:
                display.show(p.line, force=p.phase == "end")
                if p.phase == "end":
                    display.end()

        return default
    if progress is False:
        return lambda p: None
    if not callable(progress):
        raise UsageError(f"progress={progress!r}: give a callable, or False for no progress")
    return progress


def _raw_args(
    sizes: Mapping[str, int] | None, dtype: str | None, args: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The raw problem arguments, checked as ``--size``/``--dtype``/``--arg`` are."""
    from tunefleet.options.args import MAX_JSON_INT, MAX_SIZE

    for what, given in (("sizes", sizes), ("args", args)):
        if given is not None and not isinstance(given, Mapping):
            raise UsageError(f"{what}={given!r}: give a dict, e.g. {what}={{'n': 256}}")
    raw: dict[str, Any] = dict(args or {})
    for key, value in (sizes or {}).items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UsageError(f"sizes[{key!r}]={value!r} is not a positive integer")
        if value > MAX_SIZE:
            raise UsageError(
                f"sizes[{key!r}]={value} is above the limit {MAX_SIZE} (kernels index with "
                "32-bit integers); use a smaller size"
            )
        raw[key] = value
    for key, value in raw.items():
        if not _finite(value):
            raise UsageError(f"args[{key!r}]={value!r} is not a finite number; give a number")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_JSON_INT:
            raise UsageError(f"args[{key!r}]={value} is above the limit {MAX_JSON_INT} (2^53)")
    if dtype is not None:
        if not isinstance(dtype, str):
            dtype = getattr(dtype, "__name__", None) or str(dtype)  # np.float32 -> 'float32'
        raw["dtype"] = dtype
    return raw


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    if isinstance(value, Mapping):
        return all(_finite(v) for v in value.values())
    return True


def _count(what: str, value: Any, low: int, high: int) -> int | None:
    """``value`` as an int (NumPy integers too), or None; UsageError outside ``low..high``."""
    if value is None:
        return None
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or isinstance(value, bool):
        raise UsageError(f"{what}={value!r} is not a whole number; give e.g. {what}=20")
    if not low <= number <= high:
        raise UsageError(f"{what}={number}: give a whole number from {low} to {high}")
    return number


def _seed_configs(configs: Any) -> list[dict[str, Any]]:
    if configs is None:
        return []
    if isinstance(configs, Mapping):
        configs = [configs]
    if isinstance(configs, str | bytes) or not isinstance(configs, Sequence):
        raise UsageError(f"seed_configs={configs!r}: give a list of configuration dicts")
    for config in configs:
        if not isinstance(config, Mapping):
            raise UsageError(f"seed_configs: {config!r} is not a configuration dict")
    return [dict(c) for c in configs]


def _techniques(technique: str | Sequence[str] | None) -> list[str] | None:
    if technique is None:
        return None
    if not isinstance(technique, str | Sequence):
        raise UsageError(f"technique={technique!r}: give a technique name or a list of names")
    names = [technique] if isinstance(technique, str) else list(technique)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise UsageError(f"technique={technique!r}: give a technique name or a list of names")
    return names


def _worker_argv(
    timeout: Any, prefetch: Any, prepare_workers: Any, cores: Any, prebuild: Any
) -> list[str]:
    """The worker options as ``tunefleet worker`` flags, each checked by the flag's own
    parser (one definition of every limit)."""
    from tunefleet.options import flags

    given = {"timeout": timeout, "prefetch": prefetch, "prepare_workers": prepare_workers}
    given |= {"cores": cores}
    parsed: dict[str, Any] = {"prebuild": prebuild}
    by_name = {f.names[0].lstrip("-").replace("-", "_"): f for f in flags.WORKER_FLAGS}
    for key, value in given.items():
        if value is None:
            parsed[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"{key}={value!r} is not a number")
        parse = dict(by_name[key].kwargs)["type"]
        try:
            parsed[key] = parse(str(value))
        except UsageError as exc:
            raise UsageError(f"{key}={value!r}: {str(exc).split(': ', 1)[-1]}") from None
    if prebuild is not None and not isinstance(prebuild, bool):
        raise UsageError(f"prebuild={prebuild!r}: give True or False")
    return flags.worker_argv(argparse.Namespace(**parsed))


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
