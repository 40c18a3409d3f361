"""Owns a run's budget as the front doors are given it: the one value (:class:`Budget`) they
build and hand to everything below them, and the one check of its ranges (:func:`checked`),
spelled as each door spells the fields (flags of ``tune``/``coordinator``, keywords of
``tunefleet.tune``). The arithmetic of a time budget is the coordinator's
(:mod:`tunefleet.coordinator.budget`); this module sits below it so the command-line flags
can check a budget without reaching up into the coordinator."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tunefleet.errors import UsageError
from tunefleet.settings import MAX_BUDGET_S, MAX_COUNT, resolve

#: How each front door spells the budget's fields: command-line flags (``tune``,
#: ``coordinator``) and the keywords of ``tunefleet.tune``; below the doors, only the fields.
FLAGS: Mapping[str, str] = {
    "max_trials": "--max-trials",
    "max_seconds": "--max-time",
    "target_gflops": "--target",
    "patience": "--patience",
}
KEYWORDS: Mapping[str, str] = {
    "max_trials": "max_trials",
    "max_seconds": "max_time",
    "target_gflops": "target_gflops",
    "patience": "patience",
}
#: ``$TUNEFLEET_<name>`` of each field, read when neither flag nor keyword gives it.
ENVIRONMENT: Mapping[str, str] = {
    "max_trials": "MAX_TRIALS",
    "max_seconds": "MAX_SECONDS",
    "target_gflops": "TARGET_GFLOPS",
    "patience": "PATIENCE",
}
#: Each field's largest value (what PostgreSQL's ``integer`` holds; a year; any real GPU)
#: and whether it is a whole number. The smallest is 1, or just above 0 for the others.
LIMITS: Mapping[str, tuple[float, bool]] = {
    "max_trials": (MAX_COUNT, True),
    "max_seconds": (MAX_BUDGET_S, False),
    "target_gflops": (1e12, False),
    "patience": (MAX_COUNT, True),
}


def _num(x: float) -> str:
    return f"{int(x)}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def checked(
    field: str, value: Any, spelling: Mapping[str, str] = FLAGS, text: str | None = None
) -> Any:
    """``value`` of budget ``field`` as a number, or None: the one range check of a budget.
    UsageError, naming the field as ``spelling`` writes it (a flag: ``--max-time 0: ...``; a
    keyword: ``max_time=0: ...``), when it is out of range; ``text`` is the value as typed."""
    if value is None:
        return None
    name = spelling[field]
    high, whole = LIMITS[field]
    flag = name.startswith("-")
    if whole:
        try:
            number = None if isinstance(value, bool) else operator.index(value)
        except TypeError:
            number = None
        if number is None:
            if flag:
                raise UsageError(
                    f"{name} {text or value!r} is not a whole number; write e.g. {name} 20"
                )
            raise UsageError(f"{name}={value!r} is not a whole number; give e.g. {name}=20")
        if 1 <= number <= high:
            return number
        if not flag:
            raise UsageError(f"{name}={number}: give a whole number from 1 to {_num(high)}")
        if number < 1:
            raise UsageError(f"{name} {number}: use at least 1")
        raise UsageError(f"{name} {number} is above the limit {_num(high)}; use a smaller number")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        if flag:
            raise UsageError(f"{name} {text or value!r} is not a number; write e.g. {name} 60")
        raise UsageError(f"{name}={value!r} is not a number; give e.g. {name}=60")
    real = float(value)
    if math.isfinite(real) and 0 < real <= high:
        return real
    if not flag:
        raise UsageError(f"{name}={value!r}: give a positive finite number, at most {_num(high)}")
    if not math.isfinite(real):
        shown = text.strip() if text is not None else f"{real:g}"
        raise UsageError(f"{name} {shown}: use a finite number, at most {_num(high)}")
    if real <= 0:
        raise UsageError(f"{name} {real:g}: use a positive number")
    raise UsageError(f"{name} {real:g} is above the limit {_num(high)}; use a smaller number")


def _from_environment(field: str) -> Any:
    """``$TUNEFLEET_<field>`` checked as the flags are, or None when unset."""

    def parse(raw: str) -> Any:
        try:
            number: Any = int(raw) if LIMITS[field][1] else float(raw)
        except ValueError:
            raise ValueError("must be a number") from None
        try:
            return checked(field, number, KEYWORDS, raw)
        except UsageError:
            high, whole = LIMITS[field]
            kind = "a whole number from 1 to" if whole else "a positive finite number, at most"
            raise ValueError(f"must be {kind} {_num(high)}") from None

    return resolve(None, ENVIRONMENT[field], None, parse)


@dataclass(frozen=True)
class Budget:
    """A run's budget: when its search ends. ``max_trials``: search trials that finished
    (whatever their verdict, cache answers included; the best's re-measurements are extra);
    ``max_seconds``: wall time from the command's start, the confirmation included;
    ``target_gflops``: a best this fast; ``patience``: this many finished trials in a row
    without a better time. None: no such limit. Stored with the run; a resume's given value
    replaces the stored one. Built once at a front door (:meth:`build`)."""

    max_trials: int | None = None
    max_seconds: float | None = None
    target_gflops: float | None = None
    patience: int | None = None

    @classmethod
    def build(
        cls,
        *,
        max_trials: Any = None,
        max_seconds: Any = None,
        target_gflops: Any = None,
        patience: Any = None,
        spelling: Mapping[str, str] = FLAGS,
    ) -> Budget:
        """The budget a front door was given, each field checked (:func:`checked`, errors
        spelled as that door spells them), else ``$TUNEFLEET_<NAME>``, else no limit."""
        given = {
            "max_trials": max_trials,
            "max_seconds": max_seconds,
            "target_gflops": target_gflops,
            "patience": patience,
        }
        return cls(
            **{
                f: _from_environment(f) if v is None else checked(f, v, spelling)
                for f, v in given.items()
            }
        )
