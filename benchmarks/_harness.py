"""What every benchmark script shares: a database to run against (a private embedded server in
a temporary directory, or ``--db``), synthetic runs and trials inserted through tunefleet's own
statements, process memory from ``/proc``, statistics, the printed table and the JSON file.

Scripts import it as ``from _harness import ...`` (they put their own directory and the
repository root on ``sys.path``), so each one runs from a plain checkout with one command.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from tunefleet.db.engine import connect  # noqa: E402
from tunefleet.problems.base import Protocol, cache_key  # noqa: E402
from tunefleet.problems.synthetic import Synthetic  # noqa: E402
from tunefleet.queries import search  # noqa: E402
from tunefleet.space import config_hash  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
#: Synthetic trials measure nothing real: keep their "launches" to the minimum.
FAST_PROTOCOL = Protocol(warmup=0, min_launches=3, min_seconds=0.0, max_launches=3)
#: Distinct configurations of the synthetic space (config hashes are unique per run).
SYNTHETIC_SPACE_SIZE = 512


# --- the database -----------------------------------------------------------------------------
@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Inside, SIGTERM raises ``SystemExit`` as Ctrl-C raises ``KeyboardInterrupt``.

    A ``kill`` or a batch system's time limit sends SIGTERM, whose default ends the process at
    once: the embedded servers a script started (daemons, not its children) would keep running
    and their temporary folders stay behind. Unwinding runs the ``finally`` blocks that stop and
    remove them. A handler someone else installed is left alone, and so is every thread but the
    main one (only it can set handlers).
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def unwind(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def database(url: str | None) -> Iterator[str]:
    """A database at the schema head: ``url`` (upgraded if behind) or a private embedded
    server in a temporary directory, stopped and removed afterwards (on SIGTERM too)."""
    from tunefleet.db.migrate import upgrade

    if url:
        upgrade(url)
        yield url
        return
    from tunefleet.db.embedded import EmbeddedServer

    base = Path(tempfile.mkdtemp(prefix="tunefleet-bench-"))
    server = EmbeddedServer(base / "postgres" / "data")
    with sigterm_unwinds():
        try:
            server.start()
            local = server.local_url()
            upgrade(local)
            yield local
        finally:
            with contextlib.suppress(Exception):
                server.stop()
            shutil.rmtree(base, ignore_errors=True)


def server_version(url: str) -> str:
    with connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row["server_version"]) if row else "?"


# --- runs and trials --------------------------------------------------------------------------
def synthetic_configs() -> list[dict[str, Any]]:
    """Every configuration of the synthetic space, in a fixed order."""
    space = Synthetic().space({})
    names = space.names()
    return [
        dict(zip(names, combo, strict=True))
        for combo in itertools.product(*(p.values() for p in space))
    ]


def create_synthetic_run(
    conn: psycopg.Connection[Any], args: Mapping[str, Any], name: str, device_class: str = "any"
) -> int:
    problem = Synthetic()
    norm = problem.normalise_args(dict(args))
    proto = FAST_PROTOCOL.to_json()
    return search.insert_run(
        conn,
        name=name,
        problem="synthetic",
        problem_args=norm,
        space=problem.space(norm).to_json(),
        device_class=device_class,
        protocol=proto,
        cache_key=cache_key("synthetic", norm, device_class, proto),
        search={"benchmark": name},
    )


def enqueue_synthetic(
    conn: psycopg.Connection[Any], count: int, args: Mapping[str, Any], name: str
) -> list[int]:
    """Insert ``count`` pending synthetic trials (spread over as many runs as the space needs)
    in one transaction, so they appear together with one wake-up. Returns the run ids."""
    configs = synthetic_configs()
    runs = []
    with conn.transaction():
        left, part = count, 0
        while left > 0:
            take = min(left, len(configs))
            run_id = create_synthetic_run(conn, args, f"{name}/{part}")
            search.insert_trials(
                conn,
                run_id,
                "any",
                [{"config": c, "config_hash": config_hash(c)} for c in configs[:take]],
            )
            runs.append(run_id)
            left -= take
            part += 1
    return runs


# --- processes --------------------------------------------------------------------------------
def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def process_memory(pid: int) -> dict[str, float]:
    """Resident (``rss``), proportional (``pss``, shared pages split among their users) and
    peak resident (``hwm``) memory of one process, in MiB; zeros for a vanished process."""
    out = {"rss": 0.0, "pss": 0.0, "hwm": 0.0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss"] = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                out["hwm"] = int(line.split()[1]) / 1024
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                out["pss"] = int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return out


def tree_memory(pid: int) -> dict[str, Any]:
    """Memory of a process and its descendants: per process and summed."""
    procs: list[dict[str, Any]] = []
    for p in descendants(pid):
        mem = process_memory(p)
        try:
            name = Path(f"/proc/{p}/comm").read_text().strip()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            continue
        procs.append({"pid": p, "name": name, "cmd": cmd.strip(), **mem})
    total = {k: sum(float(p[k]) for p in procs) for k in ("rss", "pss", "hwm")}
    return {"processes": procs, "count": len(procs), **total}


class CpuMeter:
    """Machine-wide CPU busy fraction between ``start()`` and ``stop()`` (``/proc/stat``):
    the whole machine, other users included, as a share of all its cores."""

    def __init__(self) -> None:
        self._start: tuple[int, int] | None = None

    @staticmethod
    def _read() -> tuple[int, int]:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError, IndexError):
            return (0, 0)
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields), idle)

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> float | None:
        if self._start is None:
            return None
        total, idle = self._read()
        d_total, d_idle = total - self._start[0], idle - self._start[1]
        return None if d_total <= 0 else 1.0 - d_idle / d_total


# --- numbers ----------------------------------------------------------------------------------
def tunefleet(env: dict[str, str], *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``tunefleet ARGV`` as a user types it, in this interpreter, with ``env``; its output
    captured, no input."""
    return subprocess.run(
        [sys.executable, "-m", "tunefleet", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (linear interpolation); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    """Count, mean, median, p90, p99 and max."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "median": quantile(values, 0.5),
        "p90": quantile(values, 0.9),
        "p99": quantile(values, 0.99),
        "max": max(values),
    }


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: ``digits`` decimals, whole numbers from 10,000 up (never an exponent)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with right-aligned columns (GitHub Markdown compatible)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    return "\n".join(lines)


# --- provenance and output --------------------------------------------------------------------
def machine() -> dict[str, Any]:
    """Where and when the numbers were taken (load average included: the machine may be
    shared)."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    mem_total = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) / 1024**2
    meter = CpuMeter()
    meter.start()
    time.sleep(1.0)
    background = meter.stop()
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        # CPU already busy before the benchmark started (other users of a shared machine).
        "background_cpu_busy": background,
        "host_cpus": os.cpu_count(),
        "memory_gib": round(mem_total, 1),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit or None,
    }


def write_json(name: str, data: Mapping[str, Any], out: str | Path | None) -> Path:
    """Write ``data`` to ``out`` (a ``.json`` file, or a folder that gets ``<name>.json``);
    default ``benchmarks/results/<name>.json``."""
    target = Path(out) if out else RESULTS_DIR
    if target.suffix != ".json":
        target = target / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    print(f"wrote {target}", flush=True)
    return target


def _jsonable(value: Any) -> Any:
    if isinstance(value, float | int):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)


def elapsed(since: float) -> str:
    return f"{time.monotonic() - since:6.1f}s"
