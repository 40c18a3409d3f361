"""feinsum's SQLite timing archive, and how its rows map to our measurements.

The layout is the one feinsum (2025.x, archive format v6) creates in
``feinsum.sql_utils._create_timings_table_if_non_existent`` and reads in ``query``,
``retrieve``, ``get_timed_einsums_in_db`` and the tuner's ``seed_configurations``: one table
``FEINSUM_TIMING_FACTS`` with an ``ID INTEGER PRIMARY KEY AUTOINCREMENT`` and eleven fact
columns (:data:`LAYOUT`). feinsum looks rows up by *string equality* on ``subscripts``,
``index_to_length``, ``args``, ``arg_to_dtype`` and ``device_name`` (plus
``transform_params`` and ``giga_op_info`` in its tuner), so every string here is rendered
exactly as feinsum renders it: ``json.dumps`` with default separators and sorted keys
(``args`` keeps its row order), subscripts as ``"a,b -> c"`` in feinsum's canonical naming,
the device name with feinsum's character substitutions, ``compiler_version`` as
``"<vendor>-<driver version>"``, ``giga_op_info`` as ``{dtype: giga-ops at
long_dim_length}`` and ``timestamp`` as ``%Y_%m_%d_%H%M%S`` in America/Chicago time.

One archive row <-> one measurement (``source = 'imported'``, ``trial_id`` NULL):

=================  =========================================================================
problem            ``feinsum``
problem_args       ``{"space": feinsum:<transform_id> (or the path), "einsum": {the four
                   einsum columns, decoded}, "long_dim_length": 100000 unless told}``
config             ``transform_params`` decoded (tuples are JSON lists, as in feinsum)
device             a ``device`` row: name from ``device_name`` (``_`` -> space,
                   ``DOT`` -> ``.``), vendor and driver from ``compiler_version``, platform
                   ``feinsum archive``; its class is the slug of that name unless overridden
protocol           :data:`FEINSUM_PROTOCOL` (statistic ``feinsum-wall-mean``: feinsum's
                   wall-clock mean), so imported numbers share a cache key only with runs
                   measured the same way; warm starts match on problem and arguments only
median_s = min_s   ``runtime_in_sec``; ``samples_s`` is that single number
flop_count/gflops  the sum of ``giga_op_info`` (feinsum ranks by the summed rate)
versions           ``{"feinsum_fact": {the eleven columns, verbatim, and row_key}}``
created_at         ``timestamp``
=================  =========================================================================

Measurements taken by our workers carry the same ``versions["feinsum_fact"]`` (the canonical
einsum strings, op counts and compiler string that only feinsum and the device know), which
is what an export writes back.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tunefleet.devices import DeviceInfo
from tunefleet.errors import ArchiveError, ProblemError
from tunefleet.feinsum_support.einsum_spec import EinsumSpec
from tunefleet.feinsum_support.spaces import (
    feinsum_installed,
    space_from_transform_id,
    transform_id,
)
from tunefleet.problems.base import Protocol
from tunefleet.space import canonical_json, config_hash

TABLE = "FEINSUM_TIMING_FACTS"
#: (column, declared type) in feinsum's order; ``ID`` is ``INTEGER PRIMARY KEY AUTOINCREMENT``.
LAYOUT: tuple[tuple[str, str], ...] = (
    ("ID", "INTEGER"),
    ("subscripts", "TEXT"),
    ("index_to_length", "TEXT"),
    ("args", "TEXT"),
    ("arg_to_dtype", "TEXT"),
    ("device_name", "TEXT"),
    ("transform_id", "TEXT"),
    ("transform_params", "TEXT"),
    ("runtime_in_sec", "REAL"),
    ("compiler_version", "TEXT"),
    ("giga_op_info", "TEXT"),
    ("timestamp", "TEXT"),
)
FACT_COLUMNS: tuple[str, ...] = tuple(name for name, _ in LAYOUT[1:])
_CREATE = (
    "CREATE TABLE FEINSUM_TIMING_FACTS ("
    " ID INTEGER PRIMARY KEY AUTOINCREMENT,"
    + ",".join(f" {name} {kind}" for name, kind in LAYOUT[1:])
    + ")"
)
PROBLEM = "feinsum"
#: feinsum's default (``autotune``, ``record_facts``): the length of every long dimension.
DEFAULT_LONG_DIM_LENGTH = 100_000
TIMESTAMP_FORMAT = "%Y_%m_%d_%H%M%S"
TIMESTAMP_ZONE = "America/Chicago"
#: The statistic that stands for feinsum's own timing (``feinsum.measure.timeit``: 5 warm-up
#: launches, then batches of 5 until at least 10 launches and 2 s of wall-clock time; the mean
#: wall time per launch). Under it the other protocol fields are not used.
FEINSUM_STATISTIC = "feinsum-wall-mean"
#: The protocol imported rows are filed under: the default protocol with feinsum's statistic,
#: i.e. what a run gets from the protocol override ``{"statistic": "feinsum-wall-mean"}``.
FEINSUM_PROTOCOL: dict[str, Any] = Protocol(statistic=FEINSUM_STATISTIC).to_json()
#: Where a measurement keeps its feinsum-side identity (see the module docstring).
FACT_KEY = "feinsum_fact"


def _zone() -> Any:
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(TIMESTAMP_ZONE)
    except Exception:  # no time-zone database on this machine: UTC is the honest fallback
        return UTC


def format_timestamp(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(_zone()).strftime(TIMESTAMP_FORMAT)


def parse_timestamp(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, TIMESTAMP_FORMAT).replace(tzinfo=_zone())
    except (TypeError, ValueError):
        return None


def archive_device_name(name: str) -> str:
    """A device name the way feinsum's ``dump_device_name`` writes it."""
    for old, new in ((" ", "_"), ("-", "_"), ("@", "AT"), ("(", "_"), (")", "_"), (".", "DOT")):
        name = name.replace(old, new)
    return name


def device_from_archive(device_name: str, compiler_version: str) -> DeviceInfo:
    """Our best reading of an archive's device (its platform is not recorded)."""
    name = device_name.replace("DOT", ".").replace("_", " ").strip() or device_name
    vendor, sep, driver = compiler_version.partition("-")
    return DeviceInfo(
        platform="feinsum archive",
        vendor=vendor if sep else compiler_version,
        name=name,
        driver_version=driver if sep else "unknown",
        extra={"feinsum_device_name": device_name, "feinsum_compiler_version": compiler_version},
    )


@dataclass(frozen=True)
class Fact:
    """One row of ``FEINSUM_TIMING_FACTS`` (every column as feinsum stores it)."""

    subscripts: str
    index_to_length: str
    args: str
    arg_to_dtype: str
    device_name: str
    transform_id: str
    transform_params: str
    runtime_in_sec: float
    compiler_version: str
    giga_op_info: str
    timestamp: str
    row_id: int | None = field(default=None, compare=False)

    def values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, c) for c in FACT_COLUMNS)

    def row_key(self) -> str:
        """Identity of the fact across copies of an archive (the ID is not part of it)."""
        return hashlib.sha256(canonical_json(list(self.values())).encode()).hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        data = dict(zip(FACT_COLUMNS, self.values(), strict=True))
        data["row_key"] = self.row_key()
        return data


# --- reading ---------------------------------------------------------------------------------


def _open_readonly(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise ArchiveError(f"feinsum archive {str(path)!r} does not exist")
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise ArchiveError(f"{str(path)!r} is not an SQLite database ({exc})") from None
    return conn


def table_layout(conn: sqlite3.Connection) -> list[tuple[str, str, int]]:
    """``(name, declared type, pk)`` of every column of the facts table, in order."""
    rows = conn.execute(f"PRAGMA table_info({TABLE})").fetchall()
    return [(str(r[1]), str(r[2]).upper(), int(r[5])) for r in rows]


def _check_layout(conn: sqlite3.Connection, where: str) -> None:
    layout = table_layout(conn)
    if not layout:
        raise ArchiveError(
            f"{where} has no {TABLE} table; it is not a feinsum archive (format v6, feinsum "
            "2025.x; convert older archives with feinsum's data/bin migration scripts)"
        )
    have = {name for name, _, _ in layout}
    missing = [c for c in FACT_COLUMNS if c not in have]
    if missing:
        raise ArchiveError(
            f"{where}: table {TABLE} lacks column(s) {', '.join(missing)}; "
            "it is not in feinsum's current (v6) layout"
        )


def read_facts(path: Path) -> list[Fact]:
    """Every row of an archive, checked for shape (types and non-empty strings)."""
    conn = _open_readonly(path)
    try:
        _check_layout(conn, repr(str(path)))
        cols = ", ".join(FACT_COLUMNS)
        try:
            rows = conn.execute(f"SELECT ID, {cols} FROM {TABLE} ORDER BY ID").fetchall()  # noqa: S608
        except sqlite3.DatabaseError as exc:
            raise ArchiveError(f"cannot read {TABLE} of {str(path)!r}: {exc}") from None
    finally:
        conn.close()
    facts: list[Fact] = []
    for row in rows:
        row_id, values = row[0], row[1:]
        data = dict(zip(FACT_COLUMNS, values, strict=True))
        for col in FACT_COLUMNS:
            if col == "runtime_in_sec":
                continue
            if not isinstance(data[col], str):
                raise ArchiveError(
                    f"{str(path)!r} row ID {row_id}: {col} is {data[col]!r}, not text"
                )
        runtime = data["runtime_in_sec"]
        if isinstance(runtime, int) and not isinstance(runtime, bool):
            runtime = float(runtime)
        if not isinstance(runtime, float):
            raise ArchiveError(
                f"{str(path)!r} row ID {row_id}: runtime_in_sec is {runtime!r}, not a number"
            )
        data["runtime_in_sec"] = runtime
        facts.append(Fact(row_id=row_id, **data))
    return facts


# --- archive row -> measurement ----------------------------------------------------------------


@dataclass(frozen=True)
class ImportedFact:
    """An archive row read as one of our measurements (see the module docstring)."""

    fact: Fact
    problem_args: dict[str, Any]
    config: dict[str, Any]
    device: DeviceInfo
    device_class: str
    median_s: float
    flop_count: float
    gflops: float
    created_at: datetime | None

    @property
    def config_hash(self) -> str:
        return config_hash(self.config)


def _transform_value(value: Any) -> bool:
    if isinstance(value, bool | int):
        return True
    if isinstance(value, list):
        return all(_transform_value(v) for v in value)
    return False


def problem_args(einsum: EinsumSpec, space: str, long_dim_length: int) -> dict[str, Any]:
    """The feinsum problem's arguments, exactly as its ``normalise_args`` returns them."""
    return {"space": space, "einsum": einsum.to_json(), "long_dim_length": long_dim_length}


def interpret(
    fact: Fact,
    *,
    long_dim_length: int = DEFAULT_LONG_DIM_LENGTH,
    device_class: str | None = None,
    where: str = "archive",
) -> ImportedFact:
    """Map one archive row to a measurement, or raise ArchiveError naming the row and column."""
    label = f"{where} row ID {fact.row_id}"
    try:
        einsum = EinsumSpec.from_json(
            {
                "subscripts": fact.subscripts,
                "index_to_length": fact.index_to_length,
                "args": fact.args,
                "arg_to_dtype": fact.arg_to_dtype,
            }
        )
        space = space_from_transform_id(fact.transform_id)
    except ProblemError as exc:
        raise ArchiveError(f"{label}: {exc}") from None
    try:
        config = json.loads(fact.transform_params)
    except ValueError:
        raise ArchiveError(f"{label}: transform_params is not valid JSON") from None
    if not isinstance(config, dict) or not all(_transform_value(v) for v in config.values()):
        raise ArchiveError(
            f"{label}: transform_params must be a JSON object of integers, booleans and lists"
        )
    try:
        op_info = json.loads(fact.giga_op_info)
    except ValueError:
        raise ArchiveError(f"{label}: giga_op_info is not valid JSON") from None
    if not isinstance(op_info, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in op_info.values()
    ):
        raise ArchiveError(f"{label}: giga_op_info must be a JSON object {{dtype: number}}")
    runtime = fact.runtime_in_sec
    if not (math.isfinite(runtime) and runtime > 0):
        raise ArchiveError(f"{label}: runtime_in_sec {runtime!r} is not a positive time")
    if not fact.device_name:
        raise ArchiveError(f"{label}: device_name is empty")
    device = device_from_archive(fact.device_name, fact.compiler_version)
    giga_ops = float(sum(op_info.values()))
    return ImportedFact(
        fact=fact,
        problem_args=problem_args(einsum, space, long_dim_length),
        config=config,
        device=device,
        device_class=device_class or device.device_class,
        median_s=runtime,
        flop_count=giga_ops * 1e9,
        gflops=giga_ops / runtime,
        created_at=parse_timestamp(fact.timestamp),
    )


# --- measurement -> archive row ----------------------------------------------------------------


def output_dtype(einsum: EinsumSpec) -> str:
    import numpy as np

    return str(np.result_type(*(np.dtype(d) for d in einsum.arg_to_dtype.values())).name)


def _canonical_key(einsum: EinsumSpec, measurement_id: Any) -> tuple[str, str, str, str]:
    """feinsum's canonical strings for an einsum, computed by feinsum where it is installed."""
    fix = (
        f"measurement {measurement_id} has no canonical einsum recorded and the run's einsum "
        f"{einsum.describe()} is not in feinsum's canonical form; export where feinsum is "
        "installed, or give the einsum in canonical form (see `tunefleet feinsum list`)"
    )
    if not feinsum_installed():
        raise ArchiveError(fix)
    from tunefleet.feinsum_support.canonical import canonical_archive_key

    try:
        return canonical_archive_key(einsum)
    except ProblemError as exc:
        raise ArchiveError(f"{fix} ({exc})") from None


def fact_from_measurement(
    args: Mapping[str, Any],
    measurement: Mapping[str, Any],
    device: Mapping[str, Any],
) -> Fact:
    """The archive row of one of our measurements of the feinsum problem.

    ``measurement`` needs ``config``, ``median_s``, ``flop_count``, ``versions`` and
    ``created_at``; ``device`` needs ``name``, ``vendor`` and ``driver_version``.
    """
    recorded = (measurement.get("versions") or {}).get(FACT_KEY) or {}
    einsum = EinsumSpec.from_json(args["einsum"])
    if all(k in recorded for k in ("subscripts", "index_to_length", "args", "arg_to_dtype")):
        key = (
            recorded["subscripts"],
            recorded["index_to_length"],
            recorded["args"],
            recorded["arg_to_dtype"],
        )
    elif einsum.looks_canonical():
        key = einsum.archive_key()
    else:
        key = _canonical_key(einsum, measurement.get("id"))
    giga_op_info = recorded.get("giga_op_info")
    if not isinstance(giga_op_info, str):
        flops = measurement.get("flop_count")
        if flops is None:
            raise ArchiveError(
                f"measurement {measurement.get('id')} has no operation count; cannot write "
                "giga_op_info"
            )
        giga_op_info = json.dumps({output_dtype(einsum): float(flops) / 1e9}, sort_keys=True)
    compiler = recorded.get("compiler_version") or f"{device['vendor']}-{device['driver_version']}"
    dev_name = recorded.get("device_name") or archive_device_name(str(device["name"]))
    created = measurement.get("created_at")
    stamp = recorded.get("timestamp") or (
        format_timestamp(created) if isinstance(created, datetime) else ""
    )
    return Fact(
        subscripts=key[0],
        index_to_length=key[1],
        args=key[2],
        arg_to_dtype=key[3],
        device_name=dev_name,
        transform_id=transform_id(str(args["space"])),
        transform_params=json.dumps(measurement["config"], sort_keys=True),
        runtime_in_sec=float(measurement["median_s"]),
        compiler_version=compiler,
        giga_op_info=giga_op_info,
        timestamp=stamp,
    )


# --- writing -----------------------------------------------------------------------------------


def write_facts(path: Path, facts: Iterable[Fact]) -> tuple[int, int]:
    """Append facts to an archive (created if missing); rows already present with every
    column equal are skipped. All or nothing. Returns ``(written, skipped)``."""
    try:
        # Explicit transactions: the CREATE TABLE must roll back with the rows.
        conn = sqlite3.connect(path, isolation_level=None)
    except sqlite3.DatabaseError as exc:
        raise ArchiveError(f"cannot open {str(path)!r} as SQLite: {exc}") from None
    written = skipped = 0
    try:
        try:
            conn.execute("BEGIN IMMEDIATE")
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            raise ArchiveError(f"{str(path)!r} is not an SQLite database ({exc})") from None
        if exists:
            _check_layout(conn, repr(str(path)))
        else:
            conn.execute(_CREATE)
        cols = ", ".join(FACT_COLUMNS)
        marks = ", ".join("?" for _ in FACT_COLUMNS)
        same = " AND ".join(f"{c} IS ?" for c in FACT_COLUMNS)
        for fact in facts:
            values = fact.values()
            if conn.execute(f"SELECT 1 FROM {TABLE} WHERE {same}", values).fetchone():  # noqa: S608
                skipped += 1
                continue
            conn.execute(f"INSERT INTO {TABLE} ({cols}) VALUES ({marks})", values)  # noqa: S608
            written += 1
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()
    return written, skipped
