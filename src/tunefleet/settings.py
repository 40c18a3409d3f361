"""Settings: frozen dataclasses built once at the CLI.

Precedence, everywhere: command-line flag, then the ``TUNEFLEET_*`` environment variable, then
the default. :func:`resolve` implements that rule with a parser that turns a bad environment
value into a :class:`~tunefleet.errors.UsageError` naming the variable. Each component keeps
its own settings class (``tunefleet.worker.settings``, ``tunefleet.coordinator.settings``);
the shared ones live here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tunefleet.errors import UsageError

T = TypeVar("T")

ENV_PREFIX = "TUNEFLEET_"

#: A worker whose heartbeat is older than this (seconds) counts as gone: for ``status``, the
#: dashboard, the coordinator's queue depth (its default ``--worker-alive``) and the queue.
WORKER_ALIVE_S = 60.0
#: A coordinator whose heartbeat is at most this old (seconds) still drives its run.
COORDINATOR_ALIVE_S = 30.0
#: The search a run uses unless told otherwise (``--technique``, ``TUNEFLEET_TECHNIQUE``): the
#: model-based search, which escaped the deceptive basin of held-out landscapes where the
#: neighbourhood search and Optuna's TPE sampler did not, at a few milliseconds of the
#: coordinator's CPU per evaluation (benchmarks/default_technique.py; the table in
#: docs/tuning.md), spreading half its proposals out once stalled rather than 0.8: a long GPU
#: run's last gains are each under the 1 % that counts as progress, and two such runs on one
#: H100 ended 0.94-0.98 of cuBLAS where two ModelSearch runs beside them stopped at 0.88.
#: Since 2026-12-07 it also sweeps the fastest configurations' neighbourhoods once the end of
#: the budget nears, and keeps every one-step neighbour of the five fastest among the model's
#: candidates (``ModelSearchFinish``; docs/tuning.md, "The end game").
#: Where scikit-learn does not import, a run falls back to ``NeighbourhoodSearch``
#: (:func:`tunefleet.coordinator.tuner.default_search`). Here, not in the coordinator, so
#: that the flags' help quotes this value without importing OpenTuner.
DEFAULT_TECHNIQUE = "ModelSearchFinish"


#: Most configurations one run confirms (``--confirm``; each costs one more evaluation at the
#: end of the run).
MAX_CONFIRM = 1000
#: Largest count a run stores (PostgreSQL ``integer``).
MAX_COUNT = 2**31 - 1
#: Longest budget: a year (a run with a longer one is a run without --max-time).
MAX_BUDGET_S = 366 * 24 * 3600.0


def resolve(flag: T | None, env: str, default: T, parse: Callable[[str], T]) -> T:
    """Return ``flag`` if given, else ``$TUNEFLEET_<env>`` parsed, else ``default``.

    An empty variable counts as unset. A value ``parse`` rejects (``ValueError`` or
    ``TypeError``) becomes a :class:`UsageError` naming the variable, its value and the fix.
    """
    if flag is not None:
        return flag
    name = ENV_PREFIX + env
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return parse(raw.strip())
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{name}={raw!r} is not valid: {exc}; fix or unset it") from None


def _number(raw: str, kind: Callable[[str], T], what: str) -> T:
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"must be {what}") from None


def positive_float(raw: str) -> float:
    value = _number(raw, float, "a positive number")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError("must be a positive number")
    return value


def non_negative_float(raw: str) -> float:
    value = _number(raw, float, "zero or a positive number")
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError("must be zero or a positive number")
    return value


def positive_int(raw: str) -> int:
    value = _number(raw, int, "a positive integer")
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def non_negative_int(raw: str) -> int:
    value = _number(raw, int, "zero or a positive integer")
    if value < 0:
        raise ValueError("must be zero or a positive integer")
    return value


def bounded(parse: Callable[[str], T], high: float) -> Callable[[str], T]:
    """``parse``, refusing values above ``high`` (a limit the storage or the processes set)."""

    def check(raw: str) -> T:
        value = parse(raw)
        if value > high:  # type: ignore[operator]
            limit = f"{int(high)}" if float(high).is_integer() else f"{high:g}"
            raise ValueError(f"must be at most {limit}")
        return value

    return check


def parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError("must be one of 1/0, true/false, yes/no, on/off")


def home_dir() -> Path:
    """Where tunefleet keeps its own files: ``$TUNEFLEET_HOME`` or the user data directory."""
    explicit = os.environ.get(ENV_PREFIX + "HOME")
    if explicit:
        return Path(explicit).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_data_dir("tunefleet", appauthor=False))


@dataclass(frozen=True)
class DatabaseSettings:
    """How to reach the database and how every session of ours behaves on it.

    ``url`` is ``None`` for the embedded server. The timeouts are applied to every session that
    is not the migrator: a long open transaction pins the xmin horizon and slows the queue.
    """

    url: str | None
    statement_timeout_ms: int = 30_000
    idle_in_transaction_timeout_ms: int = 60_000
    application_name: str = "tunefleet"
    #: Seconds to wait for a server to answer before "cannot connect" (libpq counts >= 2).
    connect_timeout_s: int = 10
    #: Seconds a process keeps retrying at start-up while the database is unreachable or its
    #: schema is still being migrated (0: fail at once). Batch-scheduled workers set it, so
    #: a job that starts while the server restarts does not give its GPUs back.
    wait_s: float = 0.0
    #: This process works behind any connection pooler (a worker): where a pooler refuses the
    #: startup ``options`` that carry the timeouts, connect without them (the role's own
    #: settings apply) instead of failing. A coordinator keeps the one-line error.
    behind_pooler: bool = False
    #: Seconds after which a TCP connection whose peer acknowledges nothing (a switch that
    #: died, a crashed host) is given up, so the process reconnects instead of waiting on the
    #: kernel's retransmissions (minutes, backing off) or keepalive (hours); ``None``: the
    #: system's. A worker gives its lease: after that long its claims are gone anyway.
    dead_link_s: float | None = None

    @classmethod
    def build(
        cls,
        url: str | None = None,
        *,
        statement_timeout_ms: int | None = None,
        idle_in_transaction_timeout_ms: int | None = None,
        connect_timeout_s: int | None = None,
        wait_s: float | None = None,
        application_name: str = "tunefleet",
        behind_pooler: bool = False,
        dead_link_s: float | None = None,
    ) -> DatabaseSettings:
        return cls(
            url=resolve(url, "DATABASE_URL", None, str),
            statement_timeout_ms=resolve(
                statement_timeout_ms, "STATEMENT_TIMEOUT_MS", 30_000, positive_int
            ),
            idle_in_transaction_timeout_ms=resolve(
                idle_in_transaction_timeout_ms, "IDLE_TX_TIMEOUT_MS", 60_000, positive_int
            ),
            connect_timeout_s=resolve(connect_timeout_s, "CONNECT_TIMEOUT_S", 10, positive_int),
            wait_s=resolve(wait_s, "WAIT_FOR_DB_S", 0.0, non_negative_float),
            application_name=application_name,
            behind_pooler=behind_pooler,
            dead_link_s=dead_link_s,
        )
