"""The dashboard's ``/api/runs/RUN/importance``: parameter importance of a run or of every run
of its cache key (:mod:`tunefleet.importance`), with the fitted forests remembered.

Reports are kept per (run, scope, top, method) and given again while the trials they were
computed from are unchanged: a cheap fingerprint of the rows (their count, newest finish and
ids: :func:`tunefleet.queries.dashboard.importance_fingerprint`) is read on every request,
the rows only when it changed, so an open page of a finished run, or a second person
opening it, costs one small statement. The
variance method takes a few hundred milliseconds on 10,000 trials; a forest takes seconds,
and fits run one at a time, so a head node's cores are not all taken by people opening
pages.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import psycopg

from tunefleet import importance
from tunefleet.queries import dashboard as q

Conn = psycopg.Connection[Any]
#: Forest reports remembered (least recently used goes first).
CACHED = 16
SCOPES = ("run", "key")
MAX_TOP = 100


class ImportanceCache:
    def __init__(self, bad_request: type[Exception]) -> None:
        self._bad = bad_request
        self._lock = threading.Lock()
        self._fit = threading.Lock()
        self._reports: OrderedDict[tuple[Any, ...], tuple[str, dict[str, Any]]] = OrderedDict()

    def clear(self) -> None:
        """Forget every kept report (the next request computes its own)."""
        with self._lock:
            self._reports.clear()

    def _param(self, params: dict[str, list[str]], name: str, choices: tuple[str, ...]) -> str:
        value = (params.get(name) or [choices[0]])[-1]
        if value not in choices:
            raise self._bad(f"{name}={value!r} must be one of {', '.join(choices)}")
        return value

    def answer(self, conn: Conn, run_id: int, params: dict[str, list[str]]) -> dict[str, Any]:
        scope = self._param(params, "scope", SCOPES)
        method = self._param(params, "method", ("variance", "forest"))
        raw_top = (params.get("top") or ["10"])[-1]
        if not raw_top.isdigit() or not 1 <= int(raw_top) <= MAX_TOP:
            raise self._bad(f"top={raw_top!r} must be a whole number from 1 to {MAX_TOP}")
        top = int(raw_top)
        missing = importance.forest_available()
        if method == "forest" and missing is not None:
            return {"importance": None, "forest_missing": missing}
        all_runs = scope == "key"
        digest = q.importance_fingerprint(conn, run_id, all_runs=all_runs)
        key = (run_id, scope, top, method)
        with self._lock:
            hit = self._reports.get(key)
            if hit is not None and hit[0] == digest:
                self._reports.move_to_end(key)
                return {"importance": hit[1], "forest_missing": missing, "cached": True}
        rows = q.importance_trials(conn, run_id, all_runs=all_runs)
        if method == "variance":
            report = importance.report(
                rows, run_id=run_id, all_runs=all_runs, method="variance", top=top
            )
        else:
            with self._fit:
                report = importance.report(
                    rows, run_id=run_id, all_runs=all_runs, method="forest", top=top
                )
        with self._lock:
            self._reports[key] = (digest, report)
            self._reports.move_to_end(key)
            while len(self._reports) > CACHED:
                self._reports.popitem(last=False)
        return {"importance": report, "forest_missing": missing, "cached": False}
