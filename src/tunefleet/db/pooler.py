"""Connection poolers between tunefleet and PostgreSQL: which mode works, and a cheap check.

A worker keeps session state on its main connection for its whole life: ``LISTEN`` (its
wake-ups) and the session-level advisory lock on its device. PgBouncer's **session** mode
keeps each client on one server connection until the client disconnects, so both work (and
a dead worker's lock goes when its server connection is reset). **Transaction** and
**statement** modes lend the server connection to another client after every transaction:
notifications then go to whichever client holds that server connection at the moment, and a
device lock stays with the server connection — a second worker lent it holds the "same"
lock too (advisory locks are re-entrant within a session), and a dead worker's lock never
goes away. Neither breaks loudly, so a worker checks at connect time. A coordinator holds a
session-level advisory lock on the run it drives: behind such a pooler a second coordinator
lent the same server connection "holds" it too and drives the run at the same time, and the
lock outlives a coordinator that died; it checks the same way before it writes anything.

The check: the session asks which server process serves it (``pg_backend_pid()``), a second
short session asks the same, then the first asks again. A session kept on one server
connection always gets its own process back, and no other session can ever be lent it;
behind a pooler in transaction or statement mode the second session is lent the process the
first just released (PgBouncer reuses its most recently released server connection first),
or the first comes back on another one. So the check never refuses a direct connection or
session pooling, and catches transaction pooling unless the pool is busy enough to lend both
sessions other connections in between, which start-up (one worker, two statements) makes
rare. Cost: one short connection and three one-row statements per connect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from tunefleet.errors import DatabaseProblem
from tunefleet.queries.capacity import backend_pid


class PooledPerTransaction(DatabaseProblem):
    """The connection goes through a pooler that does not keep a client on one server
    connection (PgBouncer ``pool_mode = transaction`` or ``statement``)."""


#: What each side keeps on its session, named in the error.
WORKER_NEEDS = "LISTEN wake-ups and the device lock"
COORDINATOR_NEEDS = "the lock that lets one coordinator alone drive a run"


def message(needs: str = WORKER_NEEDS, who: str = "workers") -> str:
    """The one-line error: what breaks, and the setting that fixes it."""
    return (
        "the database connection goes through a connection pooler in transaction or statement "
        f"mode (two sessions were served by one server process), which breaks {needs}: set "
        "pool_mode = session for this database in PgBouncer, or connect "
        f"{who} to PostgreSQL directly"
    )


MESSAGE = message()


def require_session_pooling(
    conn: psycopg.Connection[Any],
    open_probe: Callable[[], psycopg.Connection[Any]],
    *,
    needs: str = WORKER_NEEDS,
    who: str = "workers",
) -> None:
    """Raise :class:`PooledPerTransaction` (its message names ``needs``, what the caller keeps
    on its session, and ``who`` should connect directly instead) when ``conn`` is not kept on
    one server connection; ``open_probe`` opens the short second session (closed here)."""
    first = backend_pid(conn)
    probe = open_probe()
    try:
        other = backend_pid(probe)
    finally:
        probe.close()
    again = backend_pid(conn)
    if other == first or again != first:
        raise PooledPerTransaction(message(needs, who))
