"""Connection poolers between tunefleet and PostgreSQL: what sits on the route, and what
each side does about it.

**Workers work behind any pooler.** A worker keeps no session state a pooler can break: its
device is held as a leased row (``tunefleet.take_device``), its statements are single
autocommit statements (one transaction each), it sends no SET and prepares nothing, and its
session settings travel as startup ``options`` or come from its role. Only its wake-ups
differ: ``LISTEN`` is session state, so a worker LISTENs only where its client keeps one
server connection (a direct connection, or PgBouncer ``pool_mode = session``) and otherwise
polls (with backoff and jitter). :func:`detect` tells the two apart at connect time.

**A coordinator needs a session**: it holds a session-level advisory lock on the run it
drives. Behind ``pool_mode = transaction`` or ``statement`` a second coordinator lent the
same server connection "holds" it too and drives the run at the same time, and the lock
outlives a coordinator that died; so it checks (:func:`require_session_pooling`) before it
writes anything, and refuses with one line naming the fix.

How the route is told. PostgreSQL sends each client the process id of its server process in
the startup handshake (``BackendKeyData``); a pooler sends one of its own making (PgBouncer:
random), so a session whose ``pg_backend_pid()`` differs from what the handshake said talks
to a pooler. Whether that pooler keeps the client on one server connection: the session asks
which server process serves it, a second short session asks the same, then the first asks
again. A session kept on one server connection always gets its own process back, and no
other session is ever lent it; behind a pooler in transaction or statement mode the second
session is lent the process the first just released (PgBouncer reuses its most recently
released server connection first), or the first comes back on another one. A pool busy
enough to lend both sessions other connections in between could pass one round, so the check
runs :data:`PROBE_ROUNDS` rounds; each costs a short connection to the pooler (no server
process: the pooler lends one of its own) and three one-row statements. A direct connection
costs none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from tunefleet.errors import DatabaseProblem
from tunefleet.queries.capacity import backend_pid


class PooledPerTransaction(DatabaseProblem):
    """The connection goes through a pooler that does not keep a client on one server
    connection (PgBouncer ``pool_mode = transaction`` or ``statement``)."""


#: What the coordinator keeps on its session, named in the error.
COORDINATOR_NEEDS = "the lock that lets one coordinator alone drive a run"
#: Rounds of the session check behind a pooler (see the module docstring).
PROBE_ROUNDS = 3


@dataclass(frozen=True)
class Route:
    """How a client reaches PostgreSQL: through a ``pooler`` or not, and whether that
    pooler lends server connections ``per_transaction`` (then nothing outlives a
    transaction: no LISTEN, no session lock, no SET, no prepared statement)."""

    pooler: bool
    per_transaction: bool

    @property
    def keeps_session(self) -> bool:
        """Session state (LISTEN) works on this route."""
        return not self.per_transaction

    def describe(self) -> str:
        if not self.pooler:
            return "a direct connection"
        if self.per_transaction:
            return "a connection pooler in transaction mode"
        return "a connection pooler in session mode"


DIRECT = Route(pooler=False, per_transaction=False)


def message(needs: str = COORDINATOR_NEEDS, who: str = "coordinators") -> str:
    """The one-line error: what breaks, and the setting that fixes it."""
    return (
        "the database connection goes through a connection pooler in transaction or statement "
        f"mode (two sessions were served by one server process), which breaks {needs}: set "
        "pool_mode = session for this database in PgBouncer, or connect "
        f"{who} to PostgreSQL directly (workers may stay behind the pooler)"
    )


MESSAGE = message()


def detect(
    conn: psycopg.Connection[Any], open_probe: Callable[[], psycopg.Connection[Any]]
) -> Route:
    """The route of ``conn`` (see the module docstring); ``open_probe`` opens the short
    second session of the check (closed here), only called behind a pooler."""
    if conn.info.backend_pid == backend_pid(conn):
        return DIRECT
    for _ in range(PROBE_ROUNDS):
        if not _kept_on_one_server_connection(conn, open_probe):
            return Route(pooler=True, per_transaction=True)
    return Route(pooler=True, per_transaction=False)


def _kept_on_one_server_connection(
    conn: psycopg.Connection[Any], open_probe: Callable[[], psycopg.Connection[Any]]
) -> bool:
    first = backend_pid(conn)
    probe = open_probe()
    try:
        other = backend_pid(probe)
    finally:
        probe.close()
    again = backend_pid(conn)
    return other != first and again == first


def require_session_pooling(
    conn: psycopg.Connection[Any],
    open_probe: Callable[[], psycopg.Connection[Any]],
    *,
    needs: str = COORDINATOR_NEEDS,
    who: str = "coordinators",
) -> None:
    """Raise :class:`PooledPerTransaction` (its message names ``needs``, what the caller keeps
    on its session, and ``who`` should connect directly instead) when ``conn`` is not kept on
    one server connection; ``open_probe`` opens the short second session (closed here)."""
    if not _kept_on_one_server_connection(conn, open_probe):
        raise PooledPerTransaction(message(needs, who))
