"""A database connection that comes back: the worker's links to PostgreSQL.

The worker keeps two connections: the main one (claims, completions, the reaper, LISTEN and
the session-level device lock) and the heartbeat thread's own. When the database goes away
(restart, failover, network), a :class:`Link` closes the broken connection and reconnects on
demand with exponential backoff; ``on_connect`` re-establishes session state (LISTEN, the
device lock) on every new connection. A lost connection is not retried here: callers decide
what a lost statement means (a claim that may have committed is recovered by its lease; a
completion is re-sent, and the fence tells whether it still counts).

A statement the database *aborted* on a healthy connection (``DeadlockDetected``,
``SerializationFailure``: PostgreSQL rolled back the whole transaction, so nothing of it was
written) is different: the connection is kept and the call is made again at once, a few
times with the shared backoff. If it keeps being aborted, :class:`StatementAborted` (a
:class:`DatabaseDown`) tells the caller to try on a later turn, as after an outage: a lease
that could not be extended expires and is requeued, a release not made leaves the leases to
expire, a completion is re-sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from tunefleet.backoff import (
    RECONNECT_FIRST_S,
    RECONNECT_MAX_S,
    STATEMENT_RETRY_FIRST_S,
    STATEMENT_RETRY_MAX_S,
    STATEMENT_TRIES,
    Backoff,
)
from tunefleet.db.engine import connect
from tunefleet.errors import DatabaseUnavailable, first_line
from tunefleet.settings import DatabaseSettings

log = logging.getLogger("tunefleet.worker")

#: The database aborted the transaction (deadlock, serialization failure); the connection is
#: fine and the same call may simply be made again. psycopg raises them as OperationalError
#: (not as subclasses of TransactionRollback), so they are named and told apart first.
ABORTED_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    psycopg.errors.TransactionRollback,
)

#: Exceptions that mean "this connection is unusable", as opposed to a bug in a statement.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    DatabaseUnavailable,
)


class DatabaseDown(Exception):
    """Raised by :meth:`Link.run` while the database cannot be reached (retry later)."""


class StatementAborted(DatabaseDown):
    """Raised by :meth:`Link.run` when the database aborted the call's transaction on every
    try (a deadlock or serialization failure each time): nothing of it was written, the
    connection is kept; try again later."""


class Link:
    def __init__(
        self,
        url: str,
        settings: DatabaseSettings,
        name: str,
        *,
        on_connect: Callable[[psycopg.Connection[Any]], None] | None = None,
        max_backoff_s: float = RECONNECT_MAX_S,
        statement_tries: int = STATEMENT_TRIES,
    ) -> None:
        if statement_tries < 1:
            raise ValueError(f"statement_tries must be at least 1, got {statement_tries}")
        self.url = url
        self.settings = settings
        self.name = name
        self.on_connect = on_connect
        self.conn: psycopg.Connection[Any] | None = None
        self.backoff = Backoff(RECONNECT_FIRST_S, max_backoff_s)
        self.next_try = 0.0
        self.down_since: float | None = None
        self.last_error = ""
        self.statement_tries = statement_tries
        #: Calls made again after the database aborted them, since the link was made.
        self.retried = 0

    @property
    def up(self) -> bool:
        return self.conn is not None and not self.conn.closed

    def get(self) -> psycopg.Connection[Any] | None:
        """The open connection, or a new one if the backoff allows; ``None`` while down.
        Errors raised by ``on_connect`` other than connection errors propagate (they are
        fatal, e.g. the device lock is taken by somebody else)."""
        if self.conn is not None and not self.conn.closed:
            return self.conn
        if time.monotonic() < self.next_try:
            return None
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = connect(self.url, self.settings, connect_timeout=5)
            if self.on_connect is not None:
                self.on_connect(conn)
        except CONNECTION_ERRORS as exc:
            if conn is not None:
                conn.close()
            self._schedule(exc)
            return None
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        if self.down_since is not None:
            log.warning(
                "%s connection: database reachable again after %.1f s",
                self.name,
                time.monotonic() - self.down_since,
            )
        self.conn, self.down_since = conn, None
        self.backoff.reset()
        return conn

    def connect_now(self) -> psycopg.Connection[Any]:
        """Connect at once or raise the reason (used at start-up)."""
        self.next_try = 0.0
        conn = self.get()
        if conn is None:
            raise DatabaseUnavailable(
                f"cannot reach the database for the {self.name} connection: {self.last_error}"
            )
        return conn

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(conn, *args, **kwargs)``; a lost connection becomes :class:`DatabaseDown`
        (the link then reconnects with backoff on a later call). A call whose transaction the
        database aborted (deadlock, serialization failure) is made again on the same
        connection, up to ``statement_tries`` times in all, then :class:`StatementAborted`."""
        conn = self.get()
        if conn is None:
            raise DatabaseDown(self.last_error)
        name = getattr(fn, "__name__", "statement")
        pause = Backoff(STATEMENT_RETRY_FIRST_S, STATEMENT_RETRY_MAX_S)
        started = time.perf_counter()
        try:
            for tried in range(1, self.statement_tries + 1):
                try:
                    return fn(conn, *args, **kwargs)
                except ABORTED_ERRORS as exc:
                    if conn.broken or conn.closed:
                        self.broken(exc)
                        raise DatabaseDown(self.last_error) from exc
                    reason = first_line(exc)
                    if tried == self.statement_tries:
                        log.warning(
                            "%s connection: %s aborted by the database %d times in a row (%s); "
                            "left for a later turn, connection kept",
                            self.name,
                            name,
                            tried,
                            reason,
                        )
                        raise StatementAborted(
                            f"{name} was aborted by the database {tried} times in a row: {reason}"
                        ) from exc
                    wait_s = pause.next()
                    log.info(
                        "%s connection: %s aborted (%s); trying again in %.2f s",
                        self.name,
                        name,
                        reason,
                        wait_s,
                    )
                    self.retried += 1
                    time.sleep(wait_s)
                except CONNECTION_ERRORS as exc:
                    self.broken(exc)
                    raise DatabaseDown(self.last_error) from exc
            raise AssertionError("unreachable: the last try returns or raises")
        finally:
            # Statement latency at debug level (-vv): what benchmarks/fleet_scaling.py reads.
            log.debug(
                "%s connection: %s took %.3f ms",
                self.name,
                name,
                (time.perf_counter() - started) * 1e3,
            )

    def broken(self, exc: BaseException) -> None:
        """Forget a connection that failed; reconnect later."""
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None
        self._schedule(exc)

    def wait_s(self) -> float | None:
        """Seconds until the next reconnect attempt, when down."""
        if self.up:
            return None
        return max(self.next_try - time.monotonic(), 0.0)

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None

    def _schedule(self, exc: BaseException) -> None:
        self.last_error = first_line(exc)
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = now
            log.warning("%s connection lost: %s; reconnecting", self.name, self.last_error)
        self.next_try = now + self.backoff.next()
