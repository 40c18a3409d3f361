"""Creating a run: :func:`create_run` and every check it makes before anything is written
(the problem, its arguments and space, the measurement protocol, the seeds, the device class,
a warm start), plus what any coordinator checks on a connection before it writes to a run.

The run's techniques are stored with it (``run.search``): those named, else the grid when
every valid configuration fits the trial budget (:func:`.grid.automatic_choice`, its reason
stored as ``choice``), else none (the coordinator's default technique).

User problems are arbitrary code: what they raise becomes a one-line
:class:`~tunefleet.errors.ProblemError` naming the problem and the method to fix, never a
traceback. Nothing here imports pyopencl or loopy (problem modules keep those inside their
builders).
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Mapping
from typing import Any

import psycopg

from tunefleet.db import pooler
from tunefleet.db.engine import connect
from tunefleet.devices import ANY_DEVICE_CLASS
from tunefleet.errors import (
    InvalidConfiguration,
    ProblemError,
    TunefleetError,
    UsageError,
    first_line,
)
from tunefleet.problems.base import Problem, Protocol, cache_key
from tunefleet.queries import search as q
from tunefleet.settings import DatabaseSettings
from tunefleet.space import Config, Space, config_hash
from tunefleet.vocabulary import TrialSource

from . import grid
from .enqueue import NewTrial, enqueue
from .mapping import SpaceMapping
from .settings import CoordinatorSettings

_log = logging.getLogger(__name__)


def coordinator_db_settings(db_url: str) -> DatabaseSettings:
    """The database settings of a coordinator given only a URL."""
    return DatabaseSettings(url=db_url, application_name="tunefleet-coordinator")


def require_session_pooling(
    conn: psycopg.Connection[Any], db_url: str, db_settings: DatabaseSettings
) -> None:
    """Refuse a connection pooler that does not keep one server session per client.

    The run's lock is session state: behind a pooler that lends the server connection to
    others between transactions two coordinators could both hold it, so this refuses that
    before anything is written (the worker checks the same at connect)."""
    pooler.require_session_pooling(
        conn,
        lambda: connect(db_url, db_settings, connect_timeout=5),
        needs=pooler.COORDINATOR_NEEDS,
        who="coordinators",
    )


def create_run(
    settings: CoordinatorSettings, db_url: str, db_settings: DatabaseSettings | None = None
) -> int:
    """Validate the problem, arguments, protocol and seeds, store a new run and enqueue its
    seed configurations (answering cached ones from the database). Returns the run id.

    Every check happens before anything is written: bad input raises a
    :class:`~tunefleet.errors.TunefleetError` naming the bad thing and leaves no run behind.
    Does not import pyopencl or loopy (problem modules keep those inside their builders)."""
    from tunefleet.problems.registry import get_problem

    if not settings.problem:
        raise UsageError("name a PROBLEM to create a run for")
    problem = get_problem(settings.problem)
    args, space = _args_and_space(problem, settings.problem, settings.problem_args)
    SpaceMapping(space)  # a space the search cannot represent fails here, not mid-run
    protocol = _protocol(settings.protocol)
    techniques, choice = _search(settings, problem, args, space)
    seeds = [
        _checked_seed(problem, args, config, i) for i, config in enumerate(settings.seed_configs)
    ]

    db_settings = db_settings or coordinator_db_settings(db_url)
    with connect(db_url, db_settings) as conn:
        require_session_pooling(conn, db_url, db_settings)
        device_class = settings.device_class or _default_device_class(
            conn, problem.needs_opencl, settings
        )
        if settings.warm_start_from:
            seeds += _warm_start_seeds(conn, settings, settings.problem, args, space)
        key = cache_key(settings.problem, args, device_class, protocol)
        search = {
            "techniques": list(techniques),
            # Why the run searches its whole space though no technique was named (or None).
            "choice": choice,
            "search_seed": settings.search_seed,
            "depth_factor": settings.depth_factor,
            "min_depth": settings.min_depth,
            "seeds": len(seeds),
            "warm_start_from": settings.warm_start_from,
        }
        with conn.transaction():  # the run and its seeds, or nothing
            run_id = q.insert_run(
                conn,
                name=settings.name,
                problem=settings.problem,
                problem_args=args,
                space=space.to_json(),
                device_class=device_class,
                protocol=protocol,
                cache_key=key,
                search=search,
                max_trials=settings.budget.max_trials,
                max_seconds=settings.budget.max_seconds,
                target_gflops=settings.budget.target_gflops,
                patience=settings.budget.patience,
            )
            enqueue(
                conn,
                run_id,
                device_class,
                key,
                {config_hash(c): NewTrial(c, TrialSource.SEED) for c in seeds},
                timeout_s=None,  # nothing measured yet: the workers' own default
                max_attempts=settings.max_attempts,
            )
    _log.info("created run %d (%s, class %s, %d seeds)", run_id, key, device_class, len(seeds))
    return run_id


def _args_and_space(
    problem: Problem, spec: str, raw_args: Mapping[str, Any]
) -> tuple[dict[str, Any], Space]:
    """Run the problem's own code that a run is made of. User problems are arbitrary code:
    an exception they raise, or a space that is not a :class:`Space`, becomes a one-line
    ProblemError naming the problem and the method to fix (not a traceback)."""
    try:
        args = problem.normalise_args(raw_args)
    except TunefleetError:
        raise
    except Exception as exc:
        raise ProblemError(f"problem {spec!r}: normalise_args raised {raised(exc)}") from None
    try:
        space = problem.space(args)
    except TunefleetError:
        raise
    except Exception as exc:
        raise ProblemError(
            f"problem {spec!r}: space() raised {raised(exc)}; fix its space definition"
        ) from None
    if not isinstance(space, Space):
        raise ProblemError(
            f"problem {spec!r}: space() returned a {type(space).__name__}, not a Space; "
            "build it with Space.of([...]) from tunefleet.space"
        )
    return args, space


def _protocol(overrides: Mapping[str, Any]) -> dict[str, Any]:
    base = Protocol().to_json()
    unknown = sorted(set(overrides) - set(base))
    if unknown:
        raise UsageError(
            f"unknown measurement protocol setting {unknown[0]!r}; use one of {sorted(base)}"
        )
    return Protocol.from_json({**base, **overrides}).to_json()


def _search(
    settings: CoordinatorSettings, problem: Problem, args: Mapping[str, Any], space: Space
) -> tuple[tuple[str, ...], str | None]:
    """The run's techniques and, when the grid was picked for it, why (:mod:`.grid`)."""
    if settings.techniques:
        if grid.GRID in settings.techniques:
            grid.check_size(space.size())
        return settings.techniques, None

    def allowed(config: Config) -> bool:
        try:
            problem.check_config(args, config)
        except InvalidConfiguration:
            return False
        except Exception:  # a user problem's own bug: the workers judge such points
            return True
        return True

    choice = grid.automatic_choice(space, settings.budget.max_trials, allowed)
    if choice is None:
        return (), None
    _log.info("%s", choice)
    return (grid.GRID,), choice


def _checked_seed(
    problem: Problem, args: Mapping[str, Any], config: Mapping[str, Any], index: int
) -> Config:
    try:
        return problem.check_config(args, config)
    except InvalidConfiguration as exc:
        raise UsageError(f"seed configuration {index + 1}: {exc}") from None
    except TunefleetError:
        raise
    except Exception as exc:  # a user problem's own bug
        raise ProblemError(f"problem check_config raised {raised(exc)}") from None


def _default_device_class(
    conn: psycopg.Connection[Any], needs_opencl: bool, settings: CoordinatorSettings
) -> str:
    if not needs_opencl:
        return ANY_DEVICE_CLASS
    classes = q.live_worker_classes(conn, settings.worker_alive_s)
    if len(classes) == 1:
        return classes[0]
    serving = f"live workers serve {', '.join(classes)}" if classes else "no live workers yet"
    raise UsageError(
        f"problem {settings.problem!r} is timed on OpenCL devices: name the device class with "
        f"--device-class ({serving}; a class is the device name as a slug, e.g. nvidia-h200)"
    )


def _warm_start_seeds(
    conn: psycopg.Connection[Any],
    settings: CoordinatorSettings,
    problem: str,
    args: Mapping[str, Any],
    space: Space,
) -> list[Config]:
    source = settings.warm_start_from or ""
    rows = q.warm_start_configs(conn, problem, args, source, settings.warm_start_count)
    seeds = []
    for row in rows:
        try:
            seeds.append(space.check(row.config))
        except InvalidConfiguration:
            continue  # measured under an older space definition
    if not seeds:
        known = q.measured_device_classes(conn, problem, args)
        choices = f"classes with results: {', '.join(known)}" if known else "none has results"
        raise UsageError(
            f"--warm-start-from {source!r}: no measurements of {problem!r} with these "
            f"arguments on that device class ({choices})"
        )
    return seeds


def raised(exc: BaseException) -> str:
    """How an exception of a user's problem is told in one line: its type, its first line
    (:func:`~tunefleet.errors.first_line`) and where it was raised, ``Type: message (at
    file:line)``, so that the problem's author finds the line to fix."""
    text = first_line(exc, "")
    out = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        out += f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})"
    return out
