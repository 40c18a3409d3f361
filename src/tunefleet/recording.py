"""Owns recorded spaces: what one device measured for one cache key, as data a replay reads.

A recording (format ``tunefleet-recording/1``, written by ``benchmarks/record_space.py``, or
built from a database by :func:`tunefleet.queries.recording.recording_of`) holds the problem,
its arguments, the space, the protocol, the device's limits where known (local memory,
work-group size, work-items per axis) and one row per configuration measured: its values in
the space's parameter order, its state (``done``, ``invalid``, ``failed``, ``timed_out``), the
median seconds of a launch, and the seconds a worker spent on it (code generation and the
timed launches), which give a replay its virtual wall time.

Loading checks the whole file and names the first bad thing (one line, a
:class:`~tunefleet.errors.UsageError`): a replay over a silently truncated recording would
report a wrong best.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunefleet.devices import DeviceLimits
from tunefleet.errors import InvalidConfiguration, ProblemError, UsageError
from tunefleet.space import Config, Space, config_hash
from tunefleet.vocabulary import TrialState

FORMAT = "tunefleet-recording/1"

#: The finished states a recording may hold (what a worker or the rules decided).
FINISHED = frozenset({TrialState.DONE, TrialState.INVALID, TrialState.FAILED, TrialState.TIMED_OUT})


@dataclass(frozen=True)
class Row:
    """One configuration as measured. ``median_s`` is None unless ``state`` is ``done``."""

    config: Config
    state: str
    median_s: float | None
    compile_s: float | None
    timing_s: float | None

    @property
    def worker_s(self) -> float | None:
        """What the configuration cost a worker (code generation and timing), when known."""
        if self.compile_s is None and self.timing_s is None:
            return None
        return (self.compile_s or 0.0) + (self.timing_s or 0.0)


@dataclass(frozen=True)
class Recording:
    """A recorded space; ``rows`` in the recording's order, one per configuration."""

    problem: str
    problem_args: Mapping[str, Any]
    space: Space
    rows: tuple[Row, ...]
    cache_key: str | None = None
    device_class: str | None = None
    source: str = ""
    #: What the recording's device allowed (``device_limits`` in the file), when known: a
    #: replay rules out what exceeds them, as the coordinator does.
    device_limits: DeviceLimits | None = None

    @property
    def best(self) -> Row:
        """The fastest measured row (the first of equals)."""
        done = [r for r in self.rows if r.median_s is not None]
        return min(done, key=lambda r: r.median_s or math.inf)

    def by_hash(self) -> dict[str, Row]:
        return {config_hash(r.config): r for r in self.rows}


def load(path: str | Path) -> Recording:
    """Read and check a recording file."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(
            f"recording {str(p)!r} is not a file; give a recording JSON "
            "(benchmarks/published/recording_*.json) or a run id"
        )
    try:
        raw = p.read_bytes()
        # Dense recordings are published gzipped (a few MB of repetitive JSON each).
        data = json.loads(gzip.decompress(raw) if p.suffix == ".gz" else raw)
    except (
        UnicodeDecodeError,
        json.JSONDecodeError,
        gzip.BadGzipFile,
        EOFError,
        zlib.error,
    ) as exc:
        raise UsageError(
            f"recording {str(p)!r} is not JSON ({exc}); give a recording file"
        ) from None
    return from_json(data, source=str(p))


def from_json(data: Any, source: str = "recording") -> Recording:
    """A recording from its JSON form (a dict as :func:`to_json` writes it)."""

    def bad(what: str) -> UsageError:
        return UsageError(f"{source}: {what}; record the space again with record_space.py")

    if not isinstance(data, dict):
        raise bad(f"a {type(data).__name__}, not a recording object")
    if data.get("format") != FORMAT:
        raise bad(f"format {data.get('format')!r} is not {FORMAT!r}")
    for key in ("problem", "space", "params", "columns", "rows"):
        if key not in data:
            raise bad(f"no {key!r}")
    try:
        space = Space.from_json(data["space"])
    except ProblemError as exc:
        raise bad(f"unreadable space ({exc})") from None
    params = data["params"]
    if not isinstance(params, list) or sorted(map(str, params)) != sorted(space.names()):
        raise bad(f"params {params!r} are not the space's parameters {space.names()}")
    columns = data["columns"]
    need = ("values", "state", "median_s", "compile_s", "timing_s")
    if not isinstance(columns, list) or any(c not in columns for c in need):
        raise bad(f"columns {columns!r} lack one of {list(need)}")
    at = {c: columns.index(c) for c in need}
    rows: list[Row] = []
    seen: set[str] = set()
    raw_rows = data["rows"]
    if not isinstance(raw_rows, list):
        raise bad("rows is not a list")
    for i, raw in enumerate(raw_rows):
        where = f"row {i + 1}"
        if not isinstance(raw, list) or len(raw) != len(columns):
            raise bad(f"{where} does not have the {len(columns)} columns")
        values = raw[at["values"]]
        if not isinstance(values, list) or len(values) != len(params):
            raise bad(f"{where}: values do not match the {len(params)} params")
        try:
            config = space.check(dict(zip(params, values, strict=True)))
        except InvalidConfiguration as exc:
            raise bad(f"{where} is outside the space ({exc})") from None
        state = raw[at["state"]]
        if state not in FINISHED:
            raise bad(f"{where}: state {state!r} is not one of {sorted(FINISHED)}")
        median = _seconds(raw[at["median_s"]], f"{where}: median_s", bad)
        if (state == TrialState.DONE) != (median is not None):
            raise bad(f"{where}: a {state} row {'without' if median is None else 'with'} median_s")
        h = config_hash(config)
        if h in seen:
            raise bad(f"{where} repeats a configuration")
        seen.add(h)
        rows.append(
            Row(
                config=config,
                state=str(state),
                median_s=median,
                compile_s=_seconds(raw[at["compile_s"]], f"{where}: compile_s", bad, zero=True),
                timing_s=_seconds(raw[at["timing_s"]], f"{where}: timing_s", bad, zero=True),
            )
        )
    if not any(r.median_s is not None for r in rows):
        raise bad("no row was measured (state done)")
    return Recording(
        problem=str(data["problem"]),
        problem_args=dict(data.get("problem_args") or {}),
        space=space,
        rows=tuple(rows),
        cache_key=data.get("cache_key"),
        device_class=data.get("device_class"),
        source=source,
        device_limits=_limits(data.get("device_limits"), bad),
    )


#: The keys of a recording's ``device_limits``: integers, and a list of them per axis.
_LIMIT_KEYS = ("local_mem_bytes", "max_work_group_size")
_AXES_KEY = "max_work_item_sizes"


def _limits(value: Any, bad: Any) -> DeviceLimits | None:
    """A recording's ``device_limits`` (absent or null: not known)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not set(value) <= {*_LIMIT_KEYS, _AXES_KEY}:
        raise bad(
            f"device_limits {value!r} is not an object of {', '.join(_LIMIT_KEYS)} and {_AXES_KEY}"
        )
    # DeviceLimits.loosest leaves a limit unknown where its value is not a positive integer:
    # in a file, that is a mistake to name, not a limit to ignore.
    limits = DeviceLimits.loosest([value]) or DeviceLimits()
    given = [value[k] is not None for k in _LIMIT_KEYS if k in value]
    known = [getattr(limits, k) is not None for k in _LIMIT_KEYS if k in value]
    if given != known or (value.get(_AXES_KEY) and not limits.max_work_item_sizes):
        raise bad(f"device_limits {value!r} holds a limit that is not a positive integer")
    return limits


def _seconds(value: Any, what: str, bad: Any, zero: bool = False) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero):
        raise bad(f"{what} {value!r} is not a positive number of seconds")
    return float(value)


def to_json(recording: Recording, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON form :func:`from_json` reads (``extra`` keys are kept alongside)."""
    names = recording.space.names()
    return {
        "format": FORMAT,
        "problem": recording.problem,
        "problem_args": dict(recording.problem_args),
        "device_class": recording.device_class,
        "cache_key": recording.cache_key,
        **({} if recording.device_limits is None else {"device_limits": _limits_json(recording)}),
        "space": recording.space.to_json(),
        "params": names,
        "columns": ["values", "state", "median_s", "compile_s", "timing_s"],
        "rows": [
            [[r.config[n] for n in names], r.state, r.median_s, r.compile_s, r.timing_s]
            for r in recording.rows
        ],
        **dict(extra or {}),
    }


def _limits_json(recording: Recording) -> dict[str, Any]:
    limits = recording.device_limits
    assert limits is not None
    out: dict[str, Any] = {k: getattr(limits, k) for k in _LIMIT_KEYS}
    if limits.max_work_item_sizes:
        out[_AXES_KEY] = list(limits.max_work_item_sizes)
    return out


def rows_from(space: Space, found: Sequence[Mapping[str, Any]]) -> tuple[Row, ...]:
    """Rows from stored trials (dicts with config, state, median_s, compile_s, timing_s)."""
    return tuple(
        Row(
            config=space.check(f["config"]),
            state=str(f["state"]),
            median_s=f["median_s"] if f["state"] == TrialState.DONE else None,
            compile_s=f.get("compile_s"),
            timing_s=f.get("timing_s"),
        )
        for f in found
    )
