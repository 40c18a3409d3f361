"""Owns :class:`CoordinatorSettings`: everything one coordinator needs, resolved once.

Precedence: command-line flag, then ``TUNEFLEET_*`` environment variable, then the default
(:func:`tunefleet.settings.resolve`). What a *new run* is made of (problem, sizes, device
class, seeds) comes only from flags or the Python caller; the budget and the dispatch knobs
also have environment variables:

``TUNEFLEET_MAX_TRIALS``, ``TUNEFLEET_MAX_SECONDS``, ``TUNEFLEET_TARGET_GFLOPS``,
``TUNEFLEET_PATIENCE``, ``TUNEFLEET_QUEUE_FACTOR`` (2), ``TUNEFLEET_QUEUE_MIN`` (1),
``TUNEFLEET_POLL_S`` (0.2), ``TUNEFLEET_WORKER_ALIVE_S`` (60), ``TUNEFLEET_UNSERVED_S`` (30),
``TUNEFLEET_TRIAL_TIMEOUT_MIN_S`` (10), ``TUNEFLEET_TRIAL_TIMEOUT_MAX_S`` (600),
``TUNEFLEET_TECHNIQUE`` (comma-separated OpenTuner technique names),
``TUNEFLEET_SEARCH_SEED`` (seed of the search's random draws; unset: unseeded),
``TUNEFLEET_CONFIRM`` (3: how many of the best configurations are re-measured before the run
reports its best; 0 turns confirmation off).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunefleet.errors import UsageError
from tunefleet.settings import (
    DEFAULT_TECHNIQUE,
    MAX_CONFIRM,
    MAX_COUNT,
    WORKER_ALIVE_S,
    bounded,
    non_negative_int,
    positive_float,
    positive_int,
    resolve,
)
from tunefleet.space import Config

from .budget import Budget


def _techniques(raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    if not names:
        raise ValueError("no technique named")
    return names


def default_techniques() -> tuple[str, ...]:
    """The techniques a run searches with when none is named: ``TUNEFLEET_TECHNIQUE``, else
    the default (:data:`tunefleet.settings.DEFAULT_TECHNIQUE`)."""
    return resolve(None, "TECHNIQUE", (DEFAULT_TECHNIQUE,), _techniques)


@dataclass(frozen=True)
class CoordinatorSettings:
    """One coordinator's settings. Build with :meth:`build` (applies env vars and checks)."""

    # --- what to tune (a new run); ignored when resuming -----------------------------------
    problem: str | None = None
    #: Raw problem arguments (``--size k=v``, ``--dtype``); the problem normalises them.
    problem_args: Mapping[str, Any] = field(default_factory=dict)
    device_class: str | None = None
    name: str | None = None
    #: Measurement protocol overrides (fields of tunefleet.problems.base.Protocol).
    protocol: Mapping[str, Any] = field(default_factory=dict)
    seed_configs: tuple[Config, ...] = ()
    warm_start_from: str | None = None
    warm_start_count: int = 5
    techniques: tuple[str, ...] = ()
    #: Seed of the search's random draws (stored with the run; None: unseeded).
    search_seed: int | None = None
    # --- which run to continue -------------------------------------------------------------
    resume: int | None = None
    # --- budget (stored with the run; on resume a given value replaces the stored one) ---
    budget: Budget = field(default_factory=Budget)
    # --- dispatch ---------------------------------------------------------------------------
    depth_factor: float = 2.0
    min_depth: int = 1
    poll_s: float = 0.2
    worker_alive_s: float = WORKER_ALIVE_S
    #: A run with work and no live worker that may serve it: said at once when every live
    #: worker of its class stands aside from it, after this many seconds when none is live
    #: (workers may still be starting).
    unserved_s: float = 30.0
    heartbeat_s: float = 2.0
    trial_timeout_min_s: float = 10.0
    trial_timeout_max_s: float = 600.0
    max_attempts: int = 3
    # --- confirmation -----------------------------------------------------------------------
    #: Best configurations re-measured (fresh inputs, another worker) when the budget ends.
    confirm: int = 3

    @classmethod
    def build(
        cls,
        *,
        problem: str | None = None,
        problem_args: Mapping[str, Any] | None = None,
        device_class: str | None = None,
        name: str | None = None,
        protocol: Mapping[str, Any] | None = None,
        seed_configs: Sequence[Mapping[str, Any]] = (),
        warm_start_from: str | None = None,
        techniques: Sequence[str] | None = None,
        search_seed: int | None = None,
        resume: int | None = None,
        budget: Budget | None = None,
        depth_factor: float | None = None,
        min_depth: int | None = None,
        poll_s: float | None = None,
        worker_alive_s: float | None = None,
        unserved_s: float | None = None,
        trial_timeout_min_s: float | None = None,
        trial_timeout_max_s: float | None = None,
        confirm: int | None = None,
    ) -> CoordinatorSettings:
        if resume is None and not problem:
            raise UsageError("name a PROBLEM to tune, or --resume RUN to continue a run")
        if resume is not None and resume <= 0:
            raise UsageError(f"--resume {resume} is not a run id; use a positive integer")
        if confirm is not None and (isinstance(confirm, bool) or not 0 <= confirm <= MAX_CONFIRM):
            raise UsageError(
                f"--confirm {confirm} must be between 0 (off) and {MAX_CONFIRM} configurations"
            )
        settings = cls(
            problem=problem,
            problem_args=dict(problem_args or {}),
            device_class=device_class,
            name=name,
            protocol=dict(protocol or {}),
            seed_configs=tuple(dict(c) for c in seed_configs),
            warm_start_from=warm_start_from,
            techniques=tuple(techniques)
            if techniques
            else resolve(None, "TECHNIQUE", (), _techniques),
            search_seed=resolve(
                search_seed, "SEARCH_SEED", None, bounded(non_negative_int, MAX_COUNT)
            ),
            resume=resume,
            # Built and checked at the front door; a caller without one gets the environment's.
            budget=Budget.build() if budget is None else budget,
            # The defaults are the fields' own (one definition each).
            depth_factor=resolve(depth_factor, "QUEUE_FACTOR", cls.depth_factor, positive_float),
            min_depth=resolve(min_depth, "QUEUE_MIN", cls.min_depth, positive_int),
            poll_s=resolve(poll_s, "POLL_S", cls.poll_s, positive_float),
            worker_alive_s=resolve(
                worker_alive_s, "WORKER_ALIVE_S", cls.worker_alive_s, positive_float
            ),
            unserved_s=resolve(unserved_s, "UNSERVED_S", cls.unserved_s, positive_float),
            trial_timeout_min_s=resolve(
                trial_timeout_min_s, "TRIAL_TIMEOUT_MIN_S", cls.trial_timeout_min_s, positive_float
            ),
            trial_timeout_max_s=resolve(
                trial_timeout_max_s, "TRIAL_TIMEOUT_MAX_S", cls.trial_timeout_max_s, positive_float
            ),
            confirm=resolve(confirm, "CONFIRM", cls.confirm, _confirm_count),
        )
        if settings.trial_timeout_max_s < settings.trial_timeout_min_s:
            raise UsageError(
                "the trial timeout ceiling is below its floor; "
                "fix TUNEFLEET_TRIAL_TIMEOUT_MIN_S / TUNEFLEET_TRIAL_TIMEOUT_MAX_S"
            )
        if settings.techniques:
            from .tuner import check_techniques

            check_techniques(settings.techniques)
        return settings


def _confirm_count(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("must be a whole number of configurations (0: off)") from None
    if not 0 <= value <= MAX_CONFIRM:
        raise ValueError(f"must be between 0 and {MAX_CONFIRM}")
    return value


def parse_seed_configs(text: str) -> list[Config]:
    """``--seed-config``: a JSON object, a JSON list of objects, or a file holding either."""
    source = "--seed-config"
    raw = text.strip()
    if not raw.startswith(("{", "[")):
        path = Path(raw).expanduser()
        if not path.is_file():
            raise UsageError(
                f"--seed-config {text!r} is neither JSON nor a file; "
                "give e.g. '{\"tile\": 16}' or a path to a .json file"
            )
        source = f"seed file {str(path)!r}"
        raw = path.read_text()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source} is not valid JSON ({exc.msg} at char {exc.pos})") from None
    configs = data if isinstance(data, list) else [data]
    for i, config in enumerate(configs):
        if not isinstance(config, dict):
            raise UsageError(
                f"{source}: item {i + 1} is {type(config).__name__}, expected a JSON object "
                "mapping parameter names to values"
            )
    return configs
