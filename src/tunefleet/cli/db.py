"""``tunefleet db start | stop | status | url | upgrade | roles``: the embedded server,
migrations and the least-privilege roles of a shared deployment."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tunefleet.db.embedded import EmbeddedServer, default_server
from tunefleet.errors import SchemaOutOfDate, TunefleetError, UsageError
from tunefleet.options.db import add_db_flag
from tunefleet.settings import DatabaseSettings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    db = sub.add_parser("db", help="the embedded PostgreSQL server and schema migrations")
    dbsub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)

    start = dbsub.add_parser(
        "start",
        help="start (or reuse) the embedded server",
        description="Start the embedded server, or reuse it while it runs. Without --listen "
        "and --port it comes back on the address it last had (port, TCP addresses, socket "
        "directory), so running coordinators and workers reconnect by themselves.",
    )
    where = start.add_mutually_exclusive_group()
    where.add_argument("--listen", metavar="HOST", help="also serve TCP on HOST (e.g. 0.0.0.0)")
    where.add_argument(
        "--local",
        action="store_true",
        help="serve the local socket only (forget an earlier --listen)",
    )
    start.add_argument(
        "--port", type=int, metavar="P", help="port (default: the last one; 5432 for TCP)"
    )
    start.set_defaults(func=_start)

    stop = dbsub.add_parser(
        "stop",
        help="stop the embedded server",
        description="Stop the embedded server. While a run is in flight (a live coordinator, "
        "or live workers holding trials) it refuses and names them, unless --force.",
    )
    stop.add_argument(
        "--force",
        action="store_true",
        help="stop even with a run in flight (its processes reconnect after `db start`)",
    )
    stop.set_defaults(func=_stop)

    status = dbsub.add_parser("status", help="is the embedded server running, and where")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status)

    url = dbsub.add_parser("url", help="print the DSN to hand to workers")
    url.add_argument("--remote", action="store_true", help="the TCP DSN for other machines")
    url.add_argument("--host", help="host name other machines reach this one by")
    url.set_defaults(func=_url)

    upgrade = dbsub.add_parser("upgrade", help="migrate a database to the current schema")
    add_db_flag(upgrade)
    upgrade.add_argument("--revision", default="head", help="target revision (default head)")
    upgrade.set_defaults(func=_upgrade)

    roles = dbsub.add_parser(
        "roles",
        help="create/refresh the migrator, coordinator, worker and reader roles (least privilege)",
        description="Create (idempotently) the roles PREFIXmigrator, PREFIXcoordinator, "
        "PREFIXworker and PREFIXreader and grant each the least it needs. Run it as a superuser "
        "after `tunefleet db upgrade` (and again after every upgrade). Passwords come from "
        "TUNEFLEET_MIGRATOR_PASSWORD, TUNEFLEET_COORDINATOR_PASSWORD, TUNEFLEET_WORKER_PASSWORD "
        "and TUNEFLEET_READER_PASSWORD; a new role without one gets a generated password "
        "written to the pgpass file.",
    )
    add_db_flag(roles)
    roles.add_argument(
        "--prefix",
        default=None,
        help="role name prefix (default: $TUNEFLEET_ROLE_PREFIX, else tunefleet_)",
    )
    roles.add_argument(
        "--pgpass",
        type=Path,
        metavar="FILE",
        default=None,
        help="pgpass file that receives generated passwords (default: "
        "$TUNEFLEET_HOME/roles.pgpass); hand it to workers as PGPASSFILE",
    )
    roles.add_argument(
        "--rotate",
        action="store_true",
        help="generate new passwords for existing roles that have no password variable set",
    )
    roles.set_defaults(func=_roles)

    check = dbsub.add_parser(
        "check", help="is the database at the schema this tunefleet needs (exit 1 if not)"
    )
    add_db_flag(check)
    check.set_defaults(func=_check)


def _start(args: argparse.Namespace) -> int:
    if args.port is not None and not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port; use 1-65535")
    server = default_server()
    server.start(listen="" if args.local else args.listen, port=args.port)
    url = server.local_url()
    from tunefleet.db.resolve import upgrade_to_head

    upgrade_to_head(url)
    print(f"embedded PostgreSQL running (data: {server.data_dir})")
    print(f"local URL: {url}")
    if server.status().listen:
        print(f"remote URL: {server.remote_url()}")
        print(f"password file: {server.pgpass_path} (copy to the workers, set PGPASSFILE)")
    return 0


def _stop(args: argparse.Namespace) -> int:
    server = default_server()
    if not args.force and server.status().running:
        _refuse_stop_in_flight(server)
    stopped = server.stop()
    print("embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL was not running")
    return 0


def _refuse_stop_in_flight(server: EmbeddedServer) -> None:
    """Raise, naming them, when stopping would cut off a live coordinator or workers
    holding trials. A server we cannot ask (no schema, refusing logins) is stopped."""
    import psycopg

    from tunefleet.db.engine import connect
    from tunefleet.queries.report import live_clients
    from tunefleet.settings import COORDINATOR_ALIVE_S

    try:
        with connect(server.local_url(), connect_timeout=5) as conn:
            clients = live_clients(conn, coordinator_alive_s=COORDINATOR_ALIVE_S)
    except (psycopg.Error, TunefleetError):
        return
    coordinators = [c for c in clients if c["kind"] == "coordinator"]
    workers = [c for c in clients if c["kind"] == "worker"]
    if not coordinators and not any(w["holding"] for w in workers):
        return
    named = [f"the coordinator of run {c['run_id']}" for c in coordinators]
    for w in workers:
        holds = f", holding {w['holding']} trial{'s' if w['holding'] != 1 else ''}"
        named.append(f"worker {w['host']} pid {w['pid']}{holds if w['holding'] else ''}")
    raise TunefleetError(
        f"a run is in flight: stopping the server would cut off {'; '.join(named)}; let the "
        "run finish (or Ctrl-C its `tunefleet tune`), or stop anyway with "
        "`tunefleet db stop --force` (they reconnect once `tunefleet db start` brings it back)"
    )


def _status(args: argparse.Namespace) -> int:
    server = default_server()
    st = server.status()
    info: dict[str, object] = {
        "running": st.running,
        "data_dir": str(st.data_dir),
        "pid": st.pid,
        "port": st.port,
        "listen": st.listen,
        "url": server.local_url() if st.running else None,
    }
    info.update(_versions(server, st.running))
    if st.stale:
        info["note"] = (
            "a crashed server left its postmaster.pid behind; `tunefleet db start` recovers"
        )
    if args.json:
        print(json.dumps(info))
    else:
        for key, value in info.items():
            print(f"{key:14} {value if value is not None else '-'}")
    # Exit 3 when stopped, like `pg_ctl status`, so scripts can test it.
    return 0 if st.running else 3


def _versions(server: EmbeddedServer, running: bool) -> dict[str, object]:
    """Which PostgreSQL serves (or would serve) the data, and where its binaries come from:
    the running server's own version when it answers, else the binaries'."""
    import psycopg

    from tunefleet.db.engine import connect

    info: dict[str, object] = {"data_version": server.data_major()}
    try:
        binaries = server.binaries
    except TunefleetError as exc:
        info.update(server_version=None, binaries=None, note=str(exc))
        return info
    version = binaries.version or None
    if running:
        try:
            with connect(server.local_url(), connect_timeout=5) as conn:
                row = conn.execute("SHOW server_version").fetchone()
            version = str(row["server_version"]).split()[0] if row else version
        except (psycopg.Error, TunefleetError):
            pass  # the binaries' version stands in
    info["server_version"] = f"PostgreSQL {version}" if version else None
    info["binaries"] = str(binaries.bin_dir)
    info["binaries_from"] = binaries.origin
    return info


def _url(args: argparse.Namespace) -> int:
    server = default_server()
    if args.remote or args.host:
        print(server.remote_url(args.host))
        print(
            f"# password: PGPASSFILE={server.pgpass_path} (copy that file to the workers)",
            file=sys.stderr,
        )
    else:
        print(server.local_url())
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    from tunefleet.db.engine import connection
    from tunefleet.db.migrate import head_revision, is_known_revision, upgrade
    from tunefleet.db.resolve import current_revision

    settings = DatabaseSettings.build(args.db)
    if settings.url is None:
        server = default_server()
        server.start()
        url = server.local_url()
    else:
        url = settings.url
    with connection(url, settings) as conn:  # a one-line error if unreachable
        before = current_revision(conn)
    if before is not None and not is_known_revision(before):
        raise SchemaOutOfDate(
            f"the database schema is at revision {before}, which this tunefleet does not know "
            f"(its newest is {head_revision()}): the database is newer; upgrade tunefleet"
        )
    upgrade(url, args.revision)
    with connection(url, settings) as conn:
        rev = current_revision(conn)
    print(f"database at revision {rev} (head is {head_revision()})")
    return 0


def _roles(args: argparse.Namespace) -> int:
    from tunefleet.db.resolve import database_url
    from tunefleet.db.roles import RolesSettings, setup_roles

    db_settings = DatabaseSettings.build(args.db)
    settings = RolesSettings.build(
        prefix=args.prefix,
        pgpass=args.pgpass,
        rotate=args.rotate,
        statement_timeout_ms=db_settings.statement_timeout_ms,
        idle_in_transaction_timeout_ms=db_settings.idle_in_transaction_timeout_ms,
    )
    reports = setup_roles(database_url(db_settings), settings)
    for r in reports:
        state = "created" if r.created else "updated"
        print(f"{r.role:28} {state:8} password {r.password:11} {r.url}")
    if any(r.password == "generated" for r in reports):
        print(
            f"generated passwords written to {settings.pgpass} "
            "(mode 0600; give it to workers as PGPASSFILE)"
        )
    return 0


def _check(args: argparse.Namespace) -> int:
    """Report the revision; a database behind (or ahead of) head is an error naming the fix.

    For an explicit database this is exactly the check the coordinator and the worker run
    before they start (:func:`tunefleet.db.resolve.database_url`). The embedded server is
    checked as it is: neither started nor upgraded.
    """
    from tunefleet.db.engine import connection
    from tunefleet.db.resolve import check_at_head, current_revision, database_url

    settings = DatabaseSettings.build(args.db)
    if settings.url is not None:
        url = database_url(settings)  # raises SchemaOutOfDate naming the fix
        with connection(url, settings) as conn:
            revision = current_revision(conn)
    else:
        with connection(default_server().local_url(), settings) as conn:
            revision = check_at_head(conn)
    print(f"database at revision {revision} (head)")
    return 0
