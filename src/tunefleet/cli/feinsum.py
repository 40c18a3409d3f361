"""``tunefleet feinsum import | export | list | spaces``: feinsum archives in and out, and what
this machine knows about feinsum spaces, in one command group.

``feinsum import ARCHIVE``    archive rows become imported measurements (cache and warm start)
``feinsum export RUN PATH``   a feinsum run's measurements appended to an archive
``feinsum list ARCHIVE``      the einsums of an archive, as ``--arg einsum=...`` to tune them
``feinsum spaces``            the shipped transform spaces visible here

The old spellings ``import-feinsum``, ``export-feinsum`` and ``import --device`` still work for
one release (:mod:`tunefleet.cli.deprecated`), unlisted in ``--help``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from tunefleet.cli.deprecated import alias, notice
from tunefleet.errors import UsageError
from tunefleet.options.db import add_db_flag


def _import_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("archive", metavar="ARCHIVE.sqlite", help="a feinsum archive (format v6)")
    add_db_flag(p)
    p.add_argument(
        "--long-dim-length",
        type=int,
        default=None,
        metavar="N",
        help="length of the long dimensions the archive was timed at (default 100000)",
    )
    p.add_argument(
        "--archive-device",
        metavar="NAME",
        help="only rows of this device_name of the archive",
    )
    # The old name of --archive-device: `--device` means a device of this machine elsewhere.
    p.add_argument("--device", dest="old_device", metavar="NAME", help=argparse.SUPPRESS)
    p.add_argument(
        "--device-class",
        metavar="CLASS",
        help="file the rows under this device class (default: derived from device_name)",
    )


def _export_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", type=int, metavar="RUN")
    p.add_argument("path", metavar="PATH.sqlite", help="created if missing")
    add_db_flag(p)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    fe = sub.add_parser(
        "feinsum", help="feinsum archives: import, export, list their einsums; spaces here"
    )
    fesub = fe.add_subparsers(dest="feinsum_command", metavar="ACTION", required=True)
    p = fesub.add_parser(
        "import", help="import a feinsum timing archive (SQLite) as cached measurements"
    )
    _import_flags(p)
    p.set_defaults(func=cmd_import)
    p = fesub.add_parser(
        "export", help="append a feinsum run's measurements to a feinsum archive (SQLite)"
    )
    _export_flags(p)
    p.set_defaults(func=cmd_export)
    p = fesub.add_parser("list", help="the einsums of an archive, ready to tune")
    p.add_argument("archive", metavar="ARCHIVE.sqlite")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)
    p = fesub.add_parser("spaces", help="feinsum's shipped transform spaces visible here")
    p.set_defaults(func=cmd_spaces)

    # Old spellings, one release: no help= keeps them out of `tunefleet --help`.
    p = sub.add_parser("import-feinsum", description="Deprecated: `tunefleet feinsum import`.")
    _import_flags(p)
    p.set_defaults(func=alias("tunefleet import-feinsum", "tunefleet feinsum import", cmd_import))
    p = sub.add_parser("export-feinsum", description="Deprecated: `tunefleet feinsum export`.")
    _export_flags(p)
    p.set_defaults(func=alias("tunefleet export-feinsum", "tunefleet feinsum export", cmd_export))


def _connect(db: str | None) -> Any:
    from tunefleet.db.engine import connect
    from tunefleet.db.resolve import database_url
    from tunefleet.settings import DatabaseSettings

    settings = DatabaseSettings.build(db)
    return connect(database_url(settings), settings)


def cmd_import(args: argparse.Namespace) -> int:
    from tunefleet.feinsum_support import archive
    from tunefleet.feinsum_support.transfer import import_archive

    long_dim = args.long_dim_length
    if long_dim is None:
        long_dim = archive.DEFAULT_LONG_DIM_LENGTH
    if long_dim <= 0:
        raise UsageError(f"--long-dim-length {long_dim} is not a positive integer")
    device_name = args.archive_device
    if args.old_device is not None:
        notice("--device NAME", "--archive-device NAME")
        if device_name is not None and device_name != args.old_device:
            raise UsageError(
                f"--device {args.old_device} and --archive-device {device_name} disagree: "
                "give --archive-device alone"
            )
        device_name = args.old_device
    path = Path(args.archive)
    conn = _connect(args.db)
    try:
        report = import_archive(
            conn,
            path,
            long_dim_length=long_dim,
            device_class=args.device_class,
            device_name=device_name,
        )
    finally:
        conn.close()
    classes = ", ".join(f"{k} ({v} rows)" for k, v in sorted(report.device_classes.items()))
    print(
        f"imported {report.inserted} of {report.rows} rows from {path} "
        f"({report.skipped} already present); device classes: {classes or '-'}; "
        f"{len(report.cache_keys)} distinct (einsum, space, device) cache keys"
    )
    return 0


def export_feinsum(db: str | None, run: int, path: Path) -> tuple[int, int]:
    """The archive writer (``feinsum export`` and its old spellings); returns
    ``(written, skipped)``."""
    from tunefleet.feinsum_support.transfer import export_run

    conn = _connect(db)
    try:
        return export_run(conn, run, path)
    finally:
        conn.close()


def cmd_export(args: argparse.Namespace) -> int:
    path = Path(args.path)
    written, skipped = export_feinsum(args.db, args.run, path)
    print(
        f"wrote {written} rows of run {args.run} to {path}"
        + (f" ({skipped} identical rows were already there)" if skipped else ""),
        file=sys.stderr,
    )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from tunefleet.errors import ArchiveError
    from tunefleet.feinsum_support import archive

    facts = archive.read_facts(Path(args.archive))
    groups: dict[tuple[str, str, str, str, str], dict[str, Any]] = {}
    for fact in facts:
        key = (
            fact.subscripts,
            fact.index_to_length,
            fact.args,
            fact.arg_to_dtype,
            fact.device_name,
        )
        group = groups.setdefault(key, {"rows": 0, "spaces": set(), "best_gops": 0.0})
        group["rows"] += 1
        group["spaces"].add(fact.transform_id)
        try:
            rec = archive.interpret(fact)
        except ArchiveError:
            continue
        group["best_gops"] = max(group["best_gops"], rec.gflops)
    out = []
    for (subs, lengths, arg_rows, dtypes, device), group in sorted(groups.items()):
        einsum = {
            "subscripts": subs,
            "index_to_length": json.loads(lengths),
            "args": json.loads(arg_rows),
            "arg_to_dtype": json.loads(dtypes),
        }
        out.append(
            {
                "einsum": einsum,
                "device_name": device,
                "rows": group["rows"],
                "spaces": sorted(group["spaces"]),
                "best_gops": group["best_gops"],
            }
        )
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for item in out:
        arg = shlex.quote("einsum=" + json.dumps(item["einsum"], separators=(",", ":")))
        print(
            f"{item['device_name']}: {item['rows']} rows, best {item['best_gops']:.1f} GOp/s, "
            f"spaces {', '.join(item['spaces'])}\n  --arg {arg}"
        )
    return 0


def cmd_spaces(args: argparse.Namespace) -> int:
    from tunefleet.feinsum_support.spaces import IMPLS_ENV, shipped_spaces

    names = shipped_spaces()
    if not names:
        print(
            f"no shipped feinsum spaces found: install feinsum (Python >= 3.12) or set {IMPLS_ENV}",
            file=sys.stderr,
        )
        return 3
    print("\n".join(names))
    return 0
