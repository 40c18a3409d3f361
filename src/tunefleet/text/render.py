"""What a run's reports say, shared by the commands that print them: ``status`` (and its
``--watch``), ``runs``, ``best`` and the end of ``tune``, and the reproduce command that
``best`` and the dashboard show.

Each function takes a connection (or rows) and returns text; the commands own their flags,
connections and output. Reads go through :mod:`tunefleet.queries.report`. Nothing here
imports a command module, so ``tune`` prints the best as ``best`` does without importing the
``best`` command.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tunefleet import agreement, spread
from tunefleet.busy import busy_shares
from tunefleet.errors import RunError, first_line
from tunefleet.options.args import command_line_args, problem_sizes, shell_join
from tunefleet.queries import report
from tunefleet.queries import spread as qspread
from tunefleet.text.output import (
    Column,
    age,
    args_text,
    compact_json,
    finished_count,
    gflops,
    plus_minus,
    remeasured_text,
    ruled_out_count,
    seconds,
    short_id,
    table,
    trial_counts,
)
from tunefleet.timeline import DEVICE_WORK, Phase, clean, share_text
from tunefleet.vocabulary import (
    ANY_DEVICE_CLASS,
    FAULT_TRIAL_STATES,
    BestStatus,
    RunState,
    TrialPurpose,
    TrialState,
    WorkerState,
    best_status,
)

Row = dict[str, Any]


# --- runs and status ----------------------------------------------------------------


def require_run(conn: Any, run_id: int) -> Row:
    """The run's row; RunError, naming ``tunefleet runs``, when the database has no such run."""
    row = report.run_row(conn, run_id)
    if row is None:
        raise RunError(f"run {run_id} does not exist in this database; `tunefleet runs` lists them")
    return row


_RUN_COLUMNS = (
    Column("RUN", "run_id", right=True),
    Column("PROBLEM", "problem"),
    Column("ARGS", "problem_args", args_text),
    Column("DEVICE CLASS", "device_class"),
    Column("STATE", "run_state"),
    Column("FINISHED", "finished", right=True),
    Column("DONE", "done", right=True),
    Column("RUNNING", "running", right=True),
    Column("PENDING", "pending", right=True),
    Column("INVALID", "invalid_apart", right=True),
    Column("RULED OUT", "ruled_out", right=True),
    Column("FAILED", "failed_all", right=True),
    Column("BEST GFLOP/s", "best_gflops", gflops, right=True),
    Column("BEST IS", "best_status", lambda v: v or "-"),
    Column("EVAL/MIN", "evaluations_per_minute", lambda v: f"{float(v):.1f}", right=True),
    Column("ELAPSED", "elapsed_s", seconds, right=True),
)

_WORKER_COLUMNS = (
    Column("WORKER", "worker_id", short_id),
    Column("HOST", "host"),
    Column("PID", "pid", right=True),
    Column("DEVICE", "device_name"),
    Column("STATE", "liveness"),
    Column("HEARTBEAT", "heartbeat_age_s", age),
    Column("CODEGEN", "codegen"),
    Column("PREFETCH", "prefetch", right=True),
    Column("BUSY", "busy", right=True),
    Column("TIMING", "timing", right=True),
    Column("TRIAL", "current_trial", right=True),
    Column("MEASURED", "measured", right=True),
)


def _with_failed(row: Row) -> Row:
    row = dict(row)
    row["failed_all"] = int(row.get("failed") or 0) + int(row.get("timed_out") or 0)
    # Counted as tune's summary counts them (trial_counts): the view's ``invalid`` holds the
    # rule rejections too, which no worker saw and no budget paid for.
    row["ruled_out"] = ruled_out_count(row)
    row["invalid_apart"] = int(row.get("invalid") or 0) - row["ruled_out"]
    done = finished_count(row)
    row["finished"] = f"{done}/{row['max_trials']}" if row.get("max_trials") else str(done)
    return row


def _with_liveness(
    row: Row, busy: Mapping[str, float] | None = None, timing: Mapping[str, float] | None = None
) -> Row:
    row = dict(row)
    # The worker's sizing: code-generation processes and who chose them (auto: the worker
    # itself); its busy share on the run shown (tunefleet.busy, as the plot and the dashboard
    # say it; "-" in the fleet overview, which shows no one run); and its device's timing
    # share (tunefleet.timeline): on the run shown, from its attempts' timelines, else over
    # its life, as the worker reports it.
    pool = row.get("prepare_workers")
    row["codegen"] = "-" if pool is None else f"{pool} {row.get('sizing') or ''}".strip()
    share = None if busy is None else busy.get(str(row["worker_id"]))
    row["busy"] = "-" if share is None else f"{100 * share:.0f}%"
    timed = row.get("device_busy") if timing is None else timing.get(str(row["worker_id"]))
    row["timing"] = "-" if timed is None else f"{100 * float(timed):.0f}%"
    if row["state"] == WorkerState.STOPPED:
        row["liveness"] = WorkerState.STOPPED
    elif row["alive"]:
        row["liveness"] = "busy" if row["holding"] else "idle"
    else:
        row["liveness"] = "lost"  # active but silent: killed without a goodbye
    return row


def runs_table(runs: list[Row]) -> str:
    """Runs (``list_runs`` rows) as the table of ``runs`` and ``status``."""
    return table([_with_failed(r) for r in runs], _RUN_COLUMNS)


def status_text(conn: Any, run_id: int | None) -> str:
    """The text of ``tunefleet status [RUN]`` (also used by ``--watch``)."""
    lines: list[str] = []
    if run_id is None:
        runs = report.list_runs(conn, only_active=True)
        heading = "active runs"
        if not runs:
            runs = report.list_runs(conn, limit=5)
            heading = "no active runs; latest runs" if runs else "no runs yet"
        lines.append(f"{heading}:")
        if runs:
            lines.append(runs_table(runs))
        for r in runs:
            if unserved(r) or r.get("standing_aside"):
                lines.append(
                    f"run {r['run_id']}: {r['standing_aside']} worker(s) stand aside"
                    + ("; nobody can serve it" if unserved(r) else "")
                    + f" (see `tunefleet status {r['run_id']}`)"
                )
        workers = report.fleet(conn, include_stopped=False)
        lines.append("")
        lines.append(f"workers: {sum(1 for w in workers if w['alive'])} alive")
        if workers:
            lines.append(table([_with_liveness(w) for w in workers], _WORKER_COLUMNS))
        return "\n".join(lines)

    require_run(conn, run_id)
    p = report.run_progress(conn, run_id)
    assert p is not None
    lines.append(_progress_block(p))
    failures = report.failure_summary(conn, run_id)
    if failures:
        lines.append("failures:")
        for f in failures[:5]:
            lines.append(f"  {f['trials']:>4} {f['state']}: {clipped(f['error'], 90)}")
    lines += _stand_aside_lines(p, report.stand_asides(conn, run_id))
    lines += timeline_lines(
        report.run_timeline(conn, run_id), report.attempt_timelines(conn, run_id)
    )
    workers = report.fleet(conn, run_id=run_id, include_stopped=True)
    busy = busy_shares(report.worker_intervals(conn, run_id))
    timing = report.worker_timing(conn, run_id)
    lines.append("")
    lines.append(f"workers: {sum(1 for w in workers if w['alive'])} alive")
    if workers:
        lines.append(table([_with_liveness(w, busy, timing) for w in workers], _WORKER_COLUMNS))
    return "\n".join(lines)


def timeline_lines(run: Row | None, attempts: list[Row]) -> list[str]:
    """Where a run's wall time went (``status RUN``): the devices' timing share with what
    else their device processes did and how long they stood idle, and each phase's median
    over the run's search evaluations. Nothing before an attempt reported its timeline."""
    if run is None or not attempts or not run.get("window_s"):
        return []
    window = float(run["window_s"])

    def pct(x: float) -> str:
        return f"{100 * x / window:.0f}%"

    work = sorted(((p, float(run[f"{p}_s"] or 0.0)) for p in DEVICE_WORK), key=lambda w: -w[1])
    busy = sum(s for _, s in work)
    idle = max(window - float(run["timing_s"] or 0.0) - busy, 0.0)
    told = ", ".join(f"{p.value} {pct(s)}" for p, s in work if s >= 0.005 * window)
    lines = [
        f"  device    {share_text(run['timing_share'])} of {seconds(window)} "
        f"({int(run['workers'])} device(s)); other work in the device process {pct(busy)}"
        + (f" ({told})" if told else "")
        + f", idle {pct(idle)}"
    ]
    search = [clean(a["timeline"]) for a in attempts if a["purpose"] == TrialPurpose.SEARCH]
    if search:
        medians = {p.value: statistics.median(t.get(p.value, 0.0) for t in search) for p in Phase}
        shown = ", ".join(f"{name} {seconds(m)}" for name, m in medians.items() if m >= 0.0005)
        lines.append(f"  per eval  median {shown} ({len(search)} evaluations)")
    return lines


def stand_aside_line(row: Row) -> str:
    """``worker W on host H cannot run this problem: REASON``, as status and the live line
    say it."""
    gone = "" if row.get("alive", True) else " (gone)"
    return (
        f"worker {short_id(row['worker_id'])} on host {row['host']}{gone} cannot run this "
        f"problem: {' '.join(str(row['reason']).split())}"
    )


def unserved(p: Row) -> bool:
    """A running run with work in flight and no live worker that may serve it."""
    return (
        p["run_state"] == RunState.RUNNING
        and int(p["pending"]) + int(p["running"]) > 0
        and not int(p.get("servable_workers") or 0)
    )


def _stand_aside_lines(p: Row, asides: list[Row]) -> list[str]:
    lines = []
    if unserved(p):
        why = (
            "every live worker of its class stands aside from it"
            if any(a["alive"] for a in asides)
            else f"no live worker of class {p['device_class']}"
        )
        lines.append(f"nobody can serve this run: {why}; start a worker whose environment runs it")
    if asides:
        lines.append("standing aside (their environment cannot run this problem):")
        lines += [f"  {stand_aside_line(a)}" for a in asides]
    return lines


def clipped(text: str, width: int) -> str:
    """The first line of an error text, cut to ``width`` characters."""
    first = first_line(text or "", "")
    return first if len(first) <= width else first[: width - 3] + "..."


def _budget(p: Row) -> str:
    parts = []
    if p.get("max_trials"):
        parts.append(f"{p['max_trials']} trials")
    if p.get("max_seconds"):
        parts.append(seconds(p["max_seconds"]))
    if p.get("target_gflops"):
        parts.append(f"target {gflops(p['target_gflops'])} GFLOP/s")
    return ", ".join(parts) or "unlimited"


def _progress_block(p: Row) -> str:
    state = p["run_state"] + (f" ({p['stop_reason']})" if p.get("stop_reason") else "")
    name = f" {p['name']!r}" if p.get("name") else ""
    extra = remeasured_text(p)
    return "\n".join(
        [
            f"run {p['run_id']}{name}: {p['problem']} {args_text(p['problem_args'])} "
            f"on {p['device_class']}",
            f"  state     {state}, budget {_budget(p)}, elapsed {seconds(p['elapsed_s'])}",
            f"  trials    {trial_counts(p)}, {p['running']} running, {p['pending']} pending, "
            f"{p['cancelled']} cancelled ({p['cached']} from cache)",
            *(
                [f"  extra     {extra} (the best's re-measurements, outside the budget)"]
                if extra
                else []
            ),
            f"  best      {gflops(p['best_gflops'])} GFLOP/s{plus_minus(p)} "
            f"(median {seconds(p['best_median_s'])}){_best_status(p)}",
            f"  rate      {float(p['evaluations_per_minute']):.1f} evaluations/min",
            *_driver_line(p),
        ]
    )


def _best_status(p: Row) -> str:
    status = p.get("best_status")
    if status is None:
        return ""
    if status == BestStatus.CONFIRMED:
        return f", trial {p['best_trial_id']}, confirmed by a cold re-measurement"
    if status == BestStatus.NOT_REPRODUCED:
        return (
            f", trial {p['best_trial_id']}: NOT reproduced (its cold re-measurement disagreed; "
            f"`tunefleet best {p['run_id']}`)"
        )
    return f", trial {p['best_trial_id']}, unconfirmed (measured once so far)"


def _driver_line(p: Row) -> list[str]:
    """Whether a coordinator is driving a running run (its heartbeat is recent)."""
    if p["run_state"] != RunState.RUNNING:
        return []
    age_s = p.get("coordinator_age_s")
    if age_s is not None and age_s < 60:
        return [f"  search    coordinator heartbeat {age(age_s)}"]
    return [
        f"  search    no coordinator is driving it; continue with "
        f"`tunefleet tune --resume {p['run_id']}`"
    ]


# --- best -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BestOfRun:
    """A run's best trials, as ``best`` reports them (:func:`read_best`)."""

    run: Row
    #: Best first, each with its ``reproduce`` command; empty before a successful trial.
    best: list[Row]
    #: The run's progress row (``run_progress``): its trial counts.
    progress: Row
    #: The run's trial of the problem's default configuration (the baseline), if any.
    default: Row | None = None


def read_best(conn: Any, run_id: int, top: int = 1) -> BestOfRun:
    """The ``top`` best trials of a run; RunError when the run does not exist."""
    run = require_run(conn, run_id)
    best = report.best_trials(conn, run_id, limit=top)
    progress = report.run_progress(conn, run_id)
    assert progress is not None  # the run exists
    timings = qspread.process_timings(conn, run_id) if best else {}
    for b in best:
        b["reproduce"] = reproduce_command(run, b)
        b["imprecise"] = spread.imprecise(b.get("spread_tolerance"))
        judged = (b.get("standing"), b.get("figure_s"), b.get("spread_tolerance"))
        times = timings.get(b["trial_id"], qspread.Timings())
        b["process_range_s"] = measured = spread.process_range(*judged, times.medians)
        b["launch_range_s"] = spread.launch_range(*judged, measured, times.samples)
    default = _default_trial(conn, run)
    return BestOfRun(run, best, progress, default)


def _default_trial(conn: Any, run: Row) -> Row | None:
    """The run's trial of its problem's default configuration (``tune`` measures it first,
    as the baseline), or None: not queued, or the problem cannot be loaded here (a user
    problem that lives on the workers)."""
    from tunefleet.errors import TunefleetError
    from tunefleet.problems.registry import get_problem
    from tunefleet.space import config_hash

    try:
        problem = get_problem(run["problem"])
        args = problem.normalise_args(run["problem_args"])
        default = problem.check_config(args, problem.default_config(args))
    except (TunefleetError, ImportError):
        return None
    return report.search_trial_of(conn, run["id"], config_hash(default))


def baseline_text(best: Row, default: Row | None) -> str | None:
    """How the best compares with the problem's default configuration (the figure a run is
    worth: what tuning gained), or None when the run has no default measured."""
    if default is None:
        return None
    if default["trial_id"] == best["trial_id"]:
        return "over the default configuration: the best is the default itself"
    if default["state"] != TrialState.DONE or not default.get("median_s"):
        return (
            f"over the default configuration: not comparable (its trial {default['trial_id']} "
            f"is {default['state']})"
        )
    best_s = _figures(best)["headline_median_s"]
    return (
        f"over the default configuration: {default['median_s'] / best_s:.2f}x faster (the "
        f"default, trial {default['trial_id']}: median {seconds(default['median_s'])})"
    )


def best_text(found: BestOfRun) -> str:
    """The text of ``tunefleet best``: the best trial, its confirmation, configuration and
    reproduce command, then a table when there are more; RunError when there is none yet."""
    run, best, progress = found.run, found.best, found.progress
    if not best:
        raise RunError(
            f"run {run['id']} has no successful trial yet ({progress['done']} done, "
            f"{progress['invalid']} invalid, {progress['failed']} failed); "
            f"see `tunefleet status {run['id']}`"
        )
    top = best[0]
    lines = [
        f"run {run['id']}: {run['problem']} {args_text(run['problem_args'])} "
        f"on {run['device_class']} ({run['state']}"
        + (f": {run['stop_reason']}" if run.get("stop_reason") else "")
        + f"; {trial_counts(progress)}"
        + (f"; {extra} (extra)" if (extra := remeasured_text(progress)) else "")
        + ")",
        *headline(top),
        confirmation_text(top),
        *filter(None, [noise_text(top), precision_text(top), baseline_text(top, found.default)]),
        f"device: {top['device_name'] or '-'} (driver {top['driver_version'] or '-'})",
        "configuration:",
    ]
    width = max((len(k) for k in top["config"]), default=0)
    for key, value in top["config"].items():
        lines.append(f"  {key.ljust(width)} = {compact_json(value)}")
    lines += ["reproduce:", f"  {top['reproduce']}"]
    if top["has_code"]:
        lines.append(f"generated code: tunefleet show {run['id']} {top['trial_id']} --code")
    if len(best) > 1:
        lines += [
            "",
            f"top {len(best)}, ranked by MEDIAN (across processes where its re-measurements "
            "were judged, else the re-measured median where one finished, else the search's; "
            "one whose processes agree ranks before the rest, a failed re-measurement "
            "last):",
        ]
        lines.append(
            table(
                [
                    {
                        **b,
                        **_figures(b),
                        "config_text": compact_json(b["config"]),
                        "spread_text": _spread(b),
                    }
                    for b in best
                ],
                (
                    Column("TRIAL", "trial_id", right=True),
                    Column("MEDIAN", "ranked_median_s", seconds, right=True),
                    Column("GFLOP/s", "headline_gflops", gflops, right=True),
                    Column("STATUS", "status"),
                    Column("SEARCH", "median_s", seconds, right=True),
                    Column("SPREAD", "spread_text", right=True),
                    Column("CONFIG", "config_text"),
                ),
            )
        )
    return "\n".join(lines)


def _figures(b: Row) -> Row:
    """A best's figures to quote: its figure across processes once judged
    (:mod:`tunefleet.spread`), else the re-measurement's where one finished, else the
    search's, and its :class:`~tunefleet.vocabulary.BestStatus`."""
    status = str(best_status(b.get("confirm_state"), b.get("disagrees"), b.get("standing")))
    if b.get("figure_s") is not None:
        rate = b.get("gflops")
        return {
            "headline_gflops": None if rate is None else rate * b["median_s"] / b["figure_s"],
            "headline_median_s": b["figure_s"],
            "status": status,
        }
    done = b.get("confirm_state") == TrialState.DONE
    return {
        "headline_gflops": b.get("confirmed_gflops") if done else b.get("gflops"),
        "headline_median_s": b.get("confirmed_median_s") if done else b.get("median_s"),
        "status": status,
    }


def spread_text(top: Row) -> str:
    """`` ± 24 % across 3 processes`` for a best judged to agree across processes (the run's
    between-process tolerance: a fresh process of it lands within that about 19 times in
    20), else nothing; with the range its processes or their launches measured when it
    reaches beyond that ± (:func:`range_text`)."""
    if top.get("standing") != "agrees" or top.get("spread_tolerance") is None:
        return ""
    text = f" ± {100 * top['spread_tolerance']:.0f} % across {top['processes']} processes"
    return text + range_text(
        top.get("process_range_s"),
        top.get("spread_tolerance"),
        top.get("launch_range_s"),
        top.get("figure_s"),
    )


def range_text(
    process_range: Any,
    tolerance: float | None,
    launches: Any = None,
    figure_s: float | None = None,
) -> str:
    """`` (they measured 1.43 ms to 2.48 ms; alone, expect 1.09 ms to 3.13 ms)`` for a
    process range (:func:`tunefleet.spread.process_range`), `` (their launches ran 1.00 ms
    to 2.33 ms, 10th to 90th percentile; alone, expect ...)`` for a launch range
    (:func:`tunefleet.spread.launch_range`), both joined where both reach beyond the ±;
    where to expect a fresh process from :func:`tunefleet.spread.landing_range`. Nothing
    without either."""
    landing = spread.landing_range(process_range, tolerance, launches, figure_s)
    if landing is None:  # neither range, or no tolerance to widen one by
        return ""
    told = []
    if process_range:
        told.append(f"they measured {seconds(process_range[0])} to {seconds(process_range[1])}")
    if launches:
        told.append(
            f"their launches ran {seconds(launches[0])} to {seconds(launches[1])}, "
            f"{spread.LAUNCH_SHARE_TEXT}"
        )
    return f" ({', '.join(told)}; alone, expect {seconds(landing[0])} to {seconds(landing[1])})"


def separation_lines(top: Row) -> list[str]:
    """What the run could not settle about its best: finalists no process agreed on, or a
    runner-up it could not tell apart from the best."""
    if top.get("standing") == "disagrees":
        return [
            "settled: NO, no finalist's processes agreed within the run's between-process "
            "spread: it could not separate its finalists (this one ranks by its median)"
        ]
    other = top.get("unseparated_trial_id")
    if top.get("standing") == "agrees" and other is not None and other != top["trial_id"]:
        return [
            f"settled: NO, trial {top['trial_id']} and trial {other} are closer than fresh "
            "processes on this device tell apart (either may be the faster one)"
        ]
    return []


def headline(top: Row) -> list[str]:
    """The ``best:`` line (the figure every report quotes, and what it is) and, once a
    re-measurement gave that figure, the search's own figures beside it."""
    f = _figures(top)
    status = f["status"]
    judged = top.get("standing") is not None
    what = {
        BestStatus.CONFIRMED: "confirmed by a cold re-measurement",
        BestStatus.NOT_REPRODUCED: "NOT reproduced by its re-measurement (see below)",
        BestStatus.UNCONFIRMED: "unconfirmed (measured once)",
    }[BestStatus(status)]
    gbps = f", {gflops(top['gbps'])} GB/s" if top.get("gbps") is not None else ""
    search = (
        f"{gflops(top['gflops'])} GFLOP/s, median {seconds(top['median_s'])} "
        f"(min {seconds(top['min_s'])})"
    )
    if judged and status == BestStatus.CONFIRMED:
        what = "confirmed (its processes agree)"
    elif judged:
        what = f"NOT reproduced: its {top['processes']} processes disagree (see below)"
    if top.get("confirm_state") != TrialState.DONE and not judged:
        return [f"best: trial {top['trial_id']}, {search}{gbps}: {what}"]
    if judged:
        return [
            f"best: trial {top['trial_id']}, {gflops(f['headline_gflops'])} GFLOP/s"
            f"{spread_text(top)}, median {seconds(f['headline_median_s'])}: {what}",
            *separation_lines(top),
            f"search: {search}{gbps} (its first measurement)",
        ]
    return [
        f"best: trial {top['trial_id']}, {gflops(f['headline_gflops'])} GFLOP/s, median "
        f"{seconds(f['headline_median_s'])}: {what}",
        f"search: {search}{gbps} (its first measurement)",
    ]


def reproduce_command(run: Row, best: Row) -> str:
    """The exact command that rebuilds and times this configuration on this kind of device."""
    from tunefleet.problems.base import Protocol

    flags = command_line_args(run["problem_args"], problem_sizes(run["problem"]))
    words = ["tunefleet", "measure", run["problem"], *flags]
    words += ["--config", json.dumps(best["config"], sort_keys=True, separators=(",", ":"))]
    if run["device_class"] != ANY_DEVICE_CLASS and best.get("device_name"):
        words += ["--device", best["device_name"]]
    elif run["device_class"] == ANY_DEVICE_CLASS:
        words += ["--device", "host"]
    protocol = best.get("protocol") or run.get("protocol") or {}
    defaults = Protocol().to_json()
    # Only settings: a measurement also records facts about itself (the arguments it restored
    # before each launch), which follow from the problem and are no option of `measure`.
    differing = {k: v for k, v in protocol.items() if k in defaults and defaults[k] != v}
    if differing:
        words += ["--protocol", json.dumps(differing, sort_keys=True, separators=(",", ":"))]
    return shell_join(words)


def _spread(b: Row) -> str:
    if b.get("confirm_state") in FAULT_TRIAL_STATES:
        return "failed!"
    if b.get("spread") is None:
        return "-"
    mark = "!" if b.get("disagrees") else ("?" if b.get("disagrees") is None else "")
    return f"{100 * b['spread']:.1f} %" + mark + (" noisy" if b.get("noisy") else "")


def confirmation_text(best: Row) -> str:
    """The ``confirmed:`` line of ``tunefleet best``: the re-measurement of the best, how far
    apart the two measurements are and whether that is more than their samples' noise."""
    state = best.get("confirm_state")
    if state is None:
        return "confirmed: no (measured once; runs confirm their best when the budget ends)"
    if state in (TrialState.PENDING, TrialState.RUNNING):
        return f"confirmed: not yet (trial {best['confirm_trial_id']} is {state})"
    if state == TrialState.CANCELLED:
        return f"confirmed: no (trial {best['confirm_trial_id']} was cancelled by a stop)"
    if state != TrialState.DONE:
        return (
            f"confirmed: NO, the re-measurement (trial {best['confirm_trial_id']}) ended "
            f"{state}: every configuration that re-measured ranks ahead of this one"
        )
    where = best.get("confirm_worker_host") or "?"
    same = best.get("confirm_worker_id") == best.get("worker_id")
    how = ["the same worker" if same else "another worker"]
    if best.get("cold_build"):
        how.append("cold build")
    if best.get("same_source") is not None:
        how.append("same code" if best["same_source"] else "OTHER code")
    text = (
        f"confirmed: median {seconds(best['confirmed_median_s'])}, "
        f"{gflops(best['confirmed_gflops'])} GFLOP/s (re-measured as trial "
        f"{best['confirm_trial_id']}, extra to the budget, on "
        f"{where}, {', '.join(how)}, input seed {best['confirm_input_seed']}); "
    )
    basis = spread.basis_text(best.get("spread_typical"), best.get("spread_within"))
    if basis is not None and best.get("same_source") is not False:
        # Judged against how far apart fresh processes time one kernel (tunefleet.spread).
        text += (
            f"{'DISAGREES' if best.get('disagrees') else 'agrees'}: the medians differ by "
            f"{100 * best['spread']:.2f} %, {'over' if best.get('disagrees') else 'within'} "
            f"the run's between-process tolerance of {100 * best['spread_tolerance']:.1f} % "
            f"({basis}, medians over the finalists)"
        )
        if best.get("processes") and best["processes"] > 2:
            text += f"; timed in {best['processes']} processes in all"
    else:
        text += agreement.verdict_text(
            best["spread"],
            best.get("noise"),
            best.get("disagrees"),
            best.get("agreement_p"),
            best.get("same_source"),
        )
    if best.get("disagrees") and best.get("standing") == "agrees":
        # The shoot-out's further process sided with the search: this one was the outlier.
        text += (
            "; outvoted: its other processes agree, and the figure is their median without this one"
        )
    elif best.get("disagrees"):
        text += "; the figures are not reproducible to that precision"
    return text


def precision_text(best: Row) -> str | None:
    """The ``precision:`` line when the run's processes differ too much to quote its figures
    to :data:`tunefleet.spread.QUOTABLE` (every figure of the run, the table's too;
    ``imprecise`` as :func:`read_best` set it)."""
    if not best.get("imprecise"):
        return None
    return (
        f"precision: every figure of this run is good to ± {100 * best['spread_tolerance']:.0f} "
        f"% only ({spread.basis_text(best.get('spread_typical'), best.get('spread_within'))}; "
        f"over {100 * spread.QUOTABLE:.0f} %: other work on its cores, or a device whose speed "
        "varies from process to process; see docs/protocol.md), so a figure here, confirmed or "
        "not, may be that far from the kernel's time alone"
    )


def noise_text(best: Row) -> str | None:
    """The ``noisy:`` line of ``tunefleet best`` when the best's samples stayed noisy."""
    if not best.get("noisy"):
        return None
    return (
        f"noisy: the search measurement's IQR/median is {100 * best['measured_noise']:.2f} % "
        "after every "
        "launch the protocol allows (other load on the host? see docs/protocol.md on CPU timings)"
    )
