"""``tunefleet dashboard``: serve the read-only live web page (``tunefleet.dashboard``)."""

from __future__ import annotations

import argparse
import signal
import sys

from tunefleet.dashboard.settings import DEFAULT_HOST, DEFAULT_PORT, MAX_REFRESH_S
from tunefleet.errors import UsageError
from tunefleet.options.db import add_db_flag
from tunefleet.options.flags import count, seconds
from tunefleet.settings import DatabaseSettings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "dashboard",
        help="a live, read-only web page of the runs, their trials and the fleet",
        description="Serve a read-only web page of the database's views: every run, one run's "
        "progress, charts, configurations and code, and the fleet of workers. It reads views "
        "only, so the reader role is enough. It listens on 127.0.0.1: open it from a laptop "
        "with `ssh -L 8750:localhost:8750 HEAD_NODE`. Any other address needs an access token.",
    )
    add_db_flag(p)
    p.add_argument(
        "--host",
        default=None,
        help=f"address to listen on (default $TUNEFLEET_DASHBOARD_HOST, else {DEFAULT_HOST}); "
        "anything but loopback needs a token",
    )
    p.add_argument(
        "--port",
        type=count("--port", low=0, high=65535),
        default=None,
        help=f"TCP port (default $TUNEFLEET_DASHBOARD_PORT, else {DEFAULT_PORT}; 0: any free one)",
    )
    p.add_argument(
        "--token",
        default=None,
        help="access token every request must carry (default $TUNEFLEET_DASHBOARD_TOKEN; prefer "
        "the variable: a command line is visible to other users of the machine)",
    )
    p.add_argument(
        "--refresh",
        type=seconds("--refresh", high=MAX_REFRESH_S),
        default=None,
        metavar="S",
        help="how often an open page asks for news (default $TUNEFLEET_DASHBOARD_REFRESH_S, "
        "else 2)",
    )
    p.set_defaults(func=cmd_dashboard)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from tunefleet.dashboard.server import DashboardServer
    from tunefleet.dashboard.settings import DashboardSettings
    from tunefleet.db.engine import connect, redact
    from tunefleet.db.resolve import database_url

    settings = DashboardSettings.build(
        host=args.host, port=args.port, token=args.token, refresh_s=args.refresh
    )
    db = DatabaseSettings.build(args.db, application_name="tunefleet-dashboard")
    url = database_url(db)
    # Fail now, not on the first request, when the database is unreachable.
    connect(url, db).close()
    try:
        server = DashboardServer(settings, lambda: connect(url, db))
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {settings.host} port {settings.port}: {exc.strerror or exc}; "
            "pick another with --port (or --host)"
        ) from None
    where = redact(url) if db.url else "the embedded server"
    print(
        f"tunefleet dashboard on {server.url} (database: {where}); Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    # Explicit handlers: a process started in the background by a non-interactive shell
    # inherits SIGINT ignored (and Python then leaves it so), and SIGTERM is how batch
    # systems and service managers stop it. Both end the serving loop the same way.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
