"""Owns what "busy" means for a worker of a run: the one definition that ``status``, the
plot's timeline and the dashboard's timeline all quote.

A worker is *busy* while it holds at least one of the run's finished trials: from the claim
to the result (code generation, the wait for the device, the timing), cache answers excluded
(nobody worked on them). Its *busy share* is that time, trials held at once counted once (a
prefetching worker holds several), over the fleet's window: from the first claim of any
worker on the run to the last result. A worker that joined late or sat idle shows less than
100 %; a worker that always held a trial shows 100 % even while its device waited for code
generation.

That is not the share of its life a worker's device spent timing (``worker.device_busy``,
which the worker reports itself, over every run it served): reports show that one as
*timing*, never as busy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def busy_shares(intervals: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The busy share (0-1) of each worker, keyed by its id as text, from a run's
    :func:`~tunefleet.queries.report.worker_intervals` (``worker_id``, ``start_s``,
    ``end_s``)."""
    if not intervals:
        return {}
    lanes: dict[str, list[tuple[float, float]]] = {}
    for iv in intervals:
        lanes.setdefault(str(iv["worker_id"]), []).append((iv["start_s"], iv["end_s"]))
    window = max(iv["end_s"] for iv in intervals) - min(iv["start_s"] for iv in intervals)
    out: dict[str, float] = {}
    for worker, spans in lanes.items():
        spans.sort()
        held, cur_start, cur_end = 0.0, spans[0][0], spans[0][1]
        for start, end in spans[1:]:
            if start > cur_end:
                held += cur_end - cur_start
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        held += cur_end - cur_start
        out[worker] = held / window if window > 0 else 1.0
    return out


def busy_text(share: float) -> str:
    """A busy share as every report writes it: ``42% busy``."""
    return f"{100 * share:.0f}% busy"
