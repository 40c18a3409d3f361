"""Text output of the front-door commands: aligned tables and human-readable numbers.

Pure formatting, no database and no I/O besides returning strings, so every command prints
the same way and tests can compare plain text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tunefleet import jsonvalues
from tunefleet.vocabulary import FINISHED_TRIAL_STATES, BestStatus


@dataclass(frozen=True)
class Column:
    """One table column: header, the row key it shows, how to format it, alignment."""

    header: str
    key: str
    fmt: Callable[[Any], str] | None = None
    right: bool = False


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """Rows as an aligned text table (header line first); ``-`` for missing values."""
    cells = [[c.header for c in columns]]
    for row in rows:
        line = []
        for c in columns:
            value = row.get(c.key)
            if value is None:
                line.append("-")
            else:
                line.append(c.fmt(value) if c.fmt else str(value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    out = []
    for r in cells:
        parts = [
            (v.rjust(w) if c.right else v.ljust(w))
            for v, w, c in zip(r, widths, columns, strict=True)
        ]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def gflops(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def seconds(value: float | None) -> str:
    """A duration in the unit a person reads best (``2.73 ms``, ``1.2 s``, ``3m05s``)."""
    if value is None:
        return "-"
    v = float(value)
    if v < 1e-3:
        return f"{v * 1e6:.1f} us"
    if v < 1:
        return f"{v * 1e3:.3g} ms"
    if v < 120:
        return f"{v:.1f} s"
    minutes, secs = divmod(round(v), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def age(value: float | None) -> str:
    """How long ago, from a number of seconds."""
    return "-" if value is None else f"{seconds(max(float(value), 0.0))} ago"


def timestamp(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def short_id(value: Any) -> str:
    return str(value)[:8]


def compact_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str)


def args_text(args: Mapping[str, Any] | None) -> str:
    """Problem arguments as ``n=256 dtype=float32``."""
    if not args:
        return ""
    return " ".join(f"{k}={_scalar(v)}" for k, v in sorted(args.items()))


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


#: Rows from the database as JSON values (``tunefleet.jsonvalues.readable``); the commands
#: and the dashboard take it from here.
jsonable = jsonvalues.readable


def best_mark(status: str | None) -> str:
    """What a run's best figure is, written after it: nothing once confirmed (re-measured
    cold and in agreement), else `` (unconfirmed)`` or `` (NOT reproduced)``."""
    if status in (None, BestStatus.CONFIRMED):
        return ""
    return " (NOT reproduced)" if status == BestStatus.NOT_REPRODUCED else f" ({status})"


def finished_count(p: Mapping[str, Any]) -> int:
    """Search trials of a ``run_progress`` row that finished, whatever their verdict, less
    those the problem's rules rejected before any worker saw them: what ``--max-trials``
    counts."""
    finished = sum(int(p.get(str(s)) or 0) for s in FINISHED_TRIAL_STATES)
    return finished - ruled_out_count(p)


def ruled_out_count(p: Mapping[str, Any]) -> int:
    """Configurations the problem's rules rejected (free: no worker, no budget)."""
    return int(p.get("ruled_out") or 0)


def trial_counts(p: Mapping[str, Any]) -> str:
    """A run's search trials as every report writes them (a ``run_progress`` row):
    ``6/20 finished (3 done, 1 invalid, 1 failed, 1 timed out), 2 ruled out by the rules``.
    ``--max-trials`` counts search trials that finished, whatever their verdict, so the
    budget reads off the first figure; configurations the rules rejected before any worker
    saw them cost no evaluation and are counted apart (a 20-trial run showed "21/20
    finished" when one was counted in); re-measurements of the best are extra and never
    counted here (:func:`remeasured_text`)."""
    finished = finished_count(p)
    ruled_out = ruled_out_count(p)
    budget = f"/{p['max_trials']}" if p.get("max_trials") else ""
    timed_out = f", {p['timed_out']} timed out" if p.get("timed_out") else ""
    apart = f", {ruled_out} ruled out by the rules" if ruled_out else ""
    return (
        f"{finished}{budget} finished ({p['done']} done, {int(p['invalid']) - ruled_out} "
        f"invalid, {p['failed']} failed{timed_out}){apart}"
    )


def remeasured_text(p: Mapping[str, Any]) -> str:
    """The re-measurements of a run's best (extra trials, outside ``--max-trials``):
    ``2 re-measured, 1 re-measuring``, or an empty string when there are none."""
    parts = []
    if p.get("confirmed"):
        parts.append(f"{p['confirmed']} re-measured")
    if p.get("confirming"):
        parts.append(f"{p['confirming']} re-measuring")
    return ", ".join(parts)


def plus_minus(p: Mapping[str, Any]) -> str:
    """`` ± 24 %`` once the best agrees across processes (the run's between-process
    tolerance, ``run_progress.best_spread``), else nothing."""
    spread = p.get("best_spread")
    return "" if spread is None else f" ± {100 * float(spread):.0f} %"
