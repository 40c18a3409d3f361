"""A database connection that comes back: the worker's one session with PostgreSQL.

A worker keeps one connection (claims, completions, the reaper, its heartbeats, wake-ups),
shared by its main loop and its heartbeat thread. When the database goes away (restart,
failover, network), a :class:`Link` closes the broken connection and reconnects on demand
with exponential backoff; ``on_connect`` re-establishes what the new session needs (LISTEN
while the worker waits for work) on every new connection. A lost connection is not retried
here: callers decide what a lost statement means (a claim that may have committed is
recovered by its lease; a completion is re-sent, and the fence tells whether it still
counts).

**One session, two threads.** A call holds the link from its first statement to its last (a
connection runs one statement at a time); a call marked ``urgent`` (the heartbeat's) goes
before every call still waiting, so a beat waits for at most the one call in flight, never
behind a queue of them. The link keeps no session state a transaction pooler breaks: no SET
(the session settings travel as startup ``options``, dropped where a pooler refuses them:
the role's own settings then apply), and no prepared statements
(``prepare_threshold = None``: behind PgBouncer's transaction pooling a prepared statement
would live on a server connection the next statement may not get).

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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
        on_call_done: Callable[[], None] | None = None,
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
        #: Called after every call (the worker's main loop counts them as progress).
        self.on_call_done = on_call_done
        self._cond = threading.Condition()
        self._holder: threading.Thread | None = None
        self._depth = 0
        self._urgent = 0

    @contextmanager
    def held(self, urgent: bool = False) -> Iterator[None]:
        """Hold the link for a call (re-entrant in one thread). An ``urgent`` holder goes
        before the callers still waiting; it waits only for the call in flight."""
        me = threading.current_thread()
        with self._cond:
            if self._holder is me:
                self._depth += 1
            else:
                if urgent:
                    self._urgent += 1
                try:
                    while self._holder is not None or (not urgent and self._urgent):
                        self._cond.wait()
                finally:
                    if urgent:
                        self._urgent -= 1
                self._holder, self._depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._holder = None
                    self._cond.notify_all()

    @property
    def up(self) -> bool:
        return self.conn is not None and not self.conn.closed

    def get(self) -> psycopg.Connection[Any] | None:
        """The open connection, or a new one if the backoff allows; ``None`` while down.
        Errors raised by ``on_connect`` other than connection errors propagate (they are
        fatal)."""
        with self.held():
            return self._get()

    def ready(self) -> bool:
        """Whether the connection is open, or a new one opened now (the backoff allowing)."""
        try:
            return self.get() is not None
        except DatabaseUnavailable:
            return False

    def _get(self) -> psycopg.Connection[Any] | None:
        if self.conn is not None and not self.conn.closed:
            return self.conn
        if time.monotonic() < self.next_try:
            return None
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = self._connect()
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

    def _connect(self) -> psycopg.Connection[Any]:
        """A new connection, never with prepared statements (see the module docstring)."""
        conn = connect(self.url, self.settings, connect_timeout=5)
        conn.prepare_threshold = None
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
        connection, up to ``statement_tries`` times in all, then :class:`StatementAborted`.
        The link is held for the whole call (see :meth:`held`; ``urgent`` for the
        heartbeat)."""
        urgent = bool(kwargs.pop("urgent", False))
        with self.held(urgent):
            try:
                return self._run(fn, *args, **kwargs)
            finally:
                if self.on_call_done is not None:
                    self.on_call_done()

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        conn = self._get()
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

    def notifies(self) -> list[str]:
        """The payloads of the notifications that arrived (psycopg also keeps those that
        came during other statements), without waiting; none while down."""
        with self.held():
            conn = self.conn
            if conn is None or conn.closed:
                return []
            try:
                return [n.payload for n in conn.notifies(timeout=0.0)]
            except CONNECTION_ERRORS as exc:
                self.broken(exc)
                return []

    def broken(self, exc: BaseException) -> None:
        """Forget a connection that failed; reconnect later."""
        with self.held():
            self._broken(exc)

    def _broken(self, exc: BaseException) -> None:
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
        with self.held():
            self._close()

    def _close(self) -> None:
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
