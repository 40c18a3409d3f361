"""The database flags of every command that opens a database: ``--db`` (which database) and
``--wait-for-db`` (how long a long-lived process waits for it at start-up)."""

from __future__ import annotations

import argparse
import math

from tunefleet.errors import UsageError


def add_db_flag(parser: argparse.ArgumentParser) -> None:
    """The ``--db`` flag every database-using command shares."""
    parser.add_argument(
        "--db",
        metavar="URL",
        default=None,
        help="PostgreSQL URL (default: $TUNEFLEET_DATABASE_URL, else the embedded server); "
        "put the password in PGPASSWORD or a pgpass file, never in the URL",
    )


def add_wait_flag(parser: argparse.ArgumentParser) -> None:
    """``--wait-for-db``, for the long-lived processes a scheduler may start before the
    database is up (workers, the coordinator)."""
    parser.add_argument(
        "--wait-for-db",
        type=float,
        metavar="SECONDS",
        default=None,
        help="at start-up, keep retrying this long while the database is unreachable or "
        "its schema is not yet at head (default $TUNEFLEET_WAIT_FOR_DB_S, else 0: fail at once)",
    )


def wait_for_db_s(args: argparse.Namespace) -> float | None:
    """The ``--wait-for-db`` value, checked (``None`` when not given)."""
    value: float | None = args.wait_for_db
    if value is not None and not (value >= 0 and math.isfinite(value)):
        raise UsageError(f"--wait-for-db {value:g}: use zero or a positive number of seconds")
    return value
