"""Moving results between our database and feinsum archives.

:func:`import_archive` reads and checks *every* row of an archive before it touches the
database, then inserts all of them in one transaction (nothing is stored when any row is
bad; rows already imported are skipped, so importing twice adds nothing). Imported rows are
measurements with ``source = 'imported'``; the cross-run cache and warm starts find them by
the cache key of (``feinsum``, arguments, device class, :data:`~.archive.FEINSUM_PROTOCOL`).

:func:`export_run` writes the measurements of a run's finished trials into an archive that
feinsum's ``query``/``retrieve`` read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tunefleet.errors import ArchiveError, RunError, UsageError
from tunefleet.feinsum_support import archive
from tunefleet.problems.base import cache_key
from tunefleet.queries import feinsum as q


@dataclass
class ImportReport:
    rows: int = 0
    inserted: int = 0
    skipped: int = 0
    #: device class -> number of archive rows
    device_classes: dict[str, int] = field(default_factory=dict)
    cache_keys: set[str] = field(default_factory=set)


def import_archive(
    conn: psycopg.Connection[Any],
    path: Path,
    *,
    long_dim_length: int = archive.DEFAULT_LONG_DIM_LENGTH,
    device_class: str | None = None,
    device_name: str | None = None,
) -> ImportReport:
    """Import an archive (see the module docstring). ``device_name`` keeps only the rows of
    that feinsum device name; ``device_class`` overrides the class derived from it (only for
    an archive, or a selection, of one device)."""
    if isinstance(long_dim_length, bool) or long_dim_length <= 0:
        raise UsageError(f"--long-dim-length {long_dim_length} is not a positive integer")
    facts = archive.read_facts(path)
    if device_name is not None:
        names = sorted({f.device_name for f in facts})
        facts = [f for f in facts if f.device_name == device_name]
        if not facts:
            raise UsageError(
                f"{str(path)!r} has no rows of device {device_name!r}; it has "
                f"{', '.join(names) or 'no rows'}"
            )
    if device_class is not None:
        names = sorted({f.device_name for f in facts})
        if len(names) > 1:
            raise UsageError(
                f"--device-class applies to one device but {str(path)!r} holds {len(names)} "
                f"({', '.join(names)}); select one with --device NAME"
            )
    where = repr(str(path))
    records = [
        archive.interpret(
            f, long_dim_length=long_dim_length, device_class=device_class, where=where
        )
        for f in facts
    ]
    report = ImportReport(rows=len(records))
    with conn.transaction():
        q.lock_imports(conn)
        device_ids: dict[str, int] = {}
        rows: list[dict[str, Any]] = []
        for rec in records:
            fp = rec.device.fingerprint
            if fp not in device_ids:
                device_ids[fp] = q.upsert_device(conn, rec.device, rec.device_class)
            key = cache_key(
                archive.PROBLEM, rec.problem_args, rec.device_class, archive.FEINSUM_PROTOCOL
            )
            report.cache_keys.add(key)
            report.device_classes[rec.device_class] = (
                report.device_classes.get(rec.device_class, 0) + 1
            )
            rows.append(
                {
                    "cache_key": key,
                    "config_hash": rec.config_hash,
                    "problem": archive.PROBLEM,
                    "problem_args": rec.problem_args,
                    "config": rec.config,
                    "device_id": device_ids[fp],
                    "median_s": rec.median_s,
                    "gflops": rec.gflops,
                    "flop_count": rec.flop_count,
                    "protocol": archive.FEINSUM_PROTOCOL,
                    "validation": {"passed": True, "by": "feinsum (validated before recording)"},
                    "versions": {archive.FACT_KEY: rec.fact.to_json()},
                    "created_at": rec.created_at.isoformat() if rec.created_at else None,
                    "row_key": rec.fact.row_key(),
                }
            )
        report.inserted = q.insert_imported(conn, rows)
    report.skipped = report.rows - report.inserted
    return report


def export_run(conn: psycopg.Connection[Any], run_id: int, path: Path) -> tuple[int, int]:
    """Write a feinsum run's measured trials to an archive; returns ``(written, skipped)``."""
    run = q.run_row(conn, run_id)
    if run is None:
        raise RunError(f"run {run_id} does not exist; `tunefleet runs` lists the runs")
    if run["problem"] != archive.PROBLEM:
        raise ArchiveError(
            f"run {run_id} tunes {run['problem']!r}, not feinsum; only feinsum runs can be "
            "written as a feinsum archive (use --format csv or json)"
        )
    facts = []
    for m in q.run_measurements(conn, run_id):
        device = {
            "name": m["device_name"] or "unknown",
            "vendor": m["device_vendor"] or "unknown",
            "driver_version": m["device_driver_version"] or "unknown",
        }
        facts.append(archive.fact_from_measurement(run["problem_args"], m, device))
    return archive.write_facts(path, facts)
