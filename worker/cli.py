"""``tunefleet worker``: claim trials from the queue and time them on one device.

Settings are resolved here once (flag, then ``TUNEFLEET_*`` variable, then default) and the
database URL is checked to be at the schema head before anything starts; problems the user can
fix (device busy or missing, database unreachable, schema behind) end as one line on stderr
and a non-zero exit.
"""

from __future__ import annotations

import argparse
import logging

from tunefleet.options import flags
from tunefleet.options.db import add_db_flag, add_wait_flag, wait_for_db_s


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``tunefleet worker``."""
    p = sub.add_parser(
        "worker",
        help="claim trials and time them on one device",
        description="Claim trials from the queue, build and time them on one device, and "
        "write the results back. Start as many as you have devices, anywhere that reaches "
        "the database. First SIGTERM/SIGINT: finish the trial being timed, release the "
        "others, exit 0; a second one exits at once.",
    )
    add_db_flag(p)
    add_wait_flag(p)
    p.add_argument(
        "--device",
        metavar="PATTERN",
        default=None,
        help="device to serve: its index, part of its platform or device name or class "
        "(e.g. h200, pocl), or 'host' for synthetic runs only "
        "(default $TUNEFLEET_WORKER_DEVICE, else the first GPU, else the first device)",
    )
    p.add_argument(
        "--drain",
        action="store_true",
        default=None,
        help="exit once no trial of this device's classes is pending or running and no live "
        "coordinator drives a run of them (default: wait for more work)",
    )
    p.add_argument(
        "--max-trials",
        type=flags.count("--max-trials"),
        metavar="N",
        default=None,
        help="stop this worker after N trials",
    )
    p.add_argument(
        "--lease",
        type=flags.seconds("--lease", high=flags.MAX_TIMEOUT_S),
        metavar="SECONDS",
        default=None,
        help="lease of a claimed trial without heartbeat (default 30; the heartbeat, reaper "
        "and sizing report follow it; 90 for fleets of thousands behind one pooler)",
    )
    flags.add(p, flags.WORKER_FLAGS)
    p.add_argument(
        "--stand-aside-after",
        type=flags.count("--stand-aside-after", low=0, high=flags.MAX_COUNT),
        metavar="K",
        default=None,
        help="stand aside from a run after the same unexplained error on K of its "
        "configurations in a row, before any of them worked here (default 3; 0 = never)",
    )
    p.add_argument(
        "--poll",
        type=flags.seconds("--poll", high=flags.MAX_TIMEOUT_S),
        metavar="SECONDS",
        default=None,
        help="longest wait between claims that find nothing: the worker polls after 0.25 s, "
        "then twice as long each time up to this (default 5)",
    )
    p.add_argument(
        "--listen",
        action="store_true",
        default=None,
        help="while the device waits, LISTEN for new trials (picked up at once instead of "
        "within --poll); for small fleets: a notification wakes every listener at once "
        "(default $TUNEFLEET_WORKER_LISTEN, else off, on for tune's own workers; never behind "
        "a transaction pooler)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        dest="worker_verbose",
        action="count",
        default=0,
        help="log claims and outcomes (repeat for debug)",
    )
    p.set_defaults(func=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    from tunefleet.db.resolve import database_url

    from .loop import Worker
    from .settings import WorkerSettings

    if args.worker_verbose:
        level = logging.INFO if args.worker_verbose == 1 else logging.DEBUG
        logging.getLogger().setLevel(min(logging.getLogger().level, level))
        if args.worker_verbose == 1:
            logging.getLogger("alembic").setLevel(logging.WARNING)
    settings = WorkerSettings.build(
        db=args.db,
        wait_for_db_s=wait_for_db_s(args),
        device=args.device,
        drain=args.drain,
        max_trials=args.max_trials,
        lease_s=args.lease,
        timeout_s=args.timeout,
        prefetch=args.prefetch,
        prepare_workers=args.prepare_workers,
        cores=args.cores,
        poll_s=args.poll,
        listen=args.listen,
        prebuild=args.prebuild,
        pause_codegen=args.pause_codegen,
        stand_aside_after=args.stand_aside_after,
    )
    url = database_url(settings.db)
    return Worker(settings, url).run()
