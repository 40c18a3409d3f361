"""The one exception hierarchy of tunefleet.

Everything the user can cause or fix raises a subclass of :class:`TunefleetError` with a
message that names the bad thing and what to do. The CLI (``tunefleet.cli``) is the boundary
that turns these into one line on stderr and a non-zero exit; library code never prints.
"""

from __future__ import annotations


class TunefleetError(Exception):
    """Base class: a problem the user can understand and fix. ``str()`` is the one-line message."""

    exit_code = 1


class UsageError(TunefleetError):
    """Bad input on the command line or in a settings variable."""

    exit_code = 2


class DatabaseProblem(TunefleetError):
    """Something about the database: cannot connect, wrong schema version, server failure.
    (Not ``DatabaseError``: that is psycopg's, and both are caught side by side.)

    ``transient`` says whether waiting may fix it without the user doing anything (a server
    that is starting, a schema another process is migrating), as opposed to a wrong password
    or database name, which no amount of waiting fixes.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class DatabaseUnavailable(DatabaseProblem):
    """The database cannot be reached (bad DSN, server down, authentication failed)."""


class SchemaOutOfDate(DatabaseProblem):
    """The database is not at the migration head this code expects."""


class EmbeddedServerError(DatabaseProblem):
    """The embedded PostgreSQL server could not be initialised, started or stopped."""


class ProblemError(TunefleetError):
    """An unknown problem, bad problem arguments, or a malformed user problem/space."""


class InvalidConfiguration(TunefleetError):
    """A point of a parameter space that cannot be built or gives wrong answers.

    Raised by kernel builders for illegal points; the worker records the trial as ``invalid``
    with this message, and the search learns it as an infinitely slow point.
    """


class DeviceError(TunefleetError):
    """No usable OpenCL device, or the device is already in use by another worker."""


class StandingAside(TunefleetError):
    """A worker whose environment cannot run the problem of any run that has work (it stands
    aside from every one): it exits with this reason rather than wait for nothing."""


class RunError(TunefleetError):
    """A run that does not exist, is already driven by another coordinator, or cannot resume."""


class TuneInterrupted(TunefleetError):
    """A tuning campaign that ended stopped rather than finished: Ctrl-C (or SIGTERM,
    SIGHUP), ``KeyboardInterrupt`` raised by a progress callback, or a stop from outside.
    The run is ``stopped`` and resumable: ``tunefleet.tune(resume=run_id)`` or
    ``tunefleet tune --resume RUN`` continues it."""

    exit_code = 130

    def __init__(self, run_id: int, message: str | None = None) -> None:
        super().__init__(
            message
            or f"run {run_id} stopped; continue it with tunefleet.tune(resume={run_id}) "
            f"or `tunefleet tune --resume {run_id}`"
        )
        self.run_id = run_id


class ArchiveError(TunefleetError):
    """A foreign results archive (a feinsum SQLite file) that cannot be read or written."""


def first_line(what: object, empty: str | None = None) -> str:
    """The first non-blank line of ``str(what)``, stripped: how an exception (or a stored
    error text) is told in one line. Blank text gives ``empty`` when given, else the type's
    name (an exception that says nothing is still told by its class)."""
    for line in str(what).splitlines():
        if line.strip():
            return line.strip()
    return empty if empty is not None else type(what).__name__
