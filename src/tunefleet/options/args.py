"""Problem arguments on the command line: ``--size``, ``--dtype`` and ``--arg``, both ways.

``--size n=256`` (repeatable, or comma-separated ``n=256,m=128``) and ``--arg key=value`` put
``key: value`` into the raw arguments handed to the problem's ``normalise_args``; ``--dtype``
sets ``dtype``. Values are read as JSON when they parse (numbers, booleans, lists), else kept
as strings. This is the one parser of problem arguments: every command that takes a problem
(``tune``, ``coordinator``, ``measure``) reads them through it, so ``--size n=256,k=64`` is two
sizes everywhere. A size is a positive integer of at most :data:`MAX_SIZE` (loopy kernels
index with 32-bit integers); no value may be NaN or infinite, and an integer ``--arg`` beyond
:data:`MAX_JSON_INT` (where JSON numbers stop being exact) is refused.
:func:`command_line_args` renders stored arguments back into flags, so the
reproduce command printed by ``tunefleet best`` round-trips exactly.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from tunefleet.errors import ProblemError, UsageError

#: Largest ``--size``: loopy's generated kernels index with 32-bit integers.
MAX_SIZE = 2**31 - 1
#: Largest integer ``--arg`` value: beyond it a JSON number is no longer exact.
MAX_JSON_INT = 2**53


def add_problem_flags(parser: argparse.ArgumentParser) -> None:
    """``--size``, ``--dtype`` and ``--arg`` on a command that takes a problem."""
    parser.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="NAME=N",
        help="a problem size, e.g. --size n=256 (repeat or comma-separate: n=256,k=64)",
    )
    parser.add_argument("--dtype", default=None, help="element type, e.g. float32 or float64")
    parser.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other problem argument (value read as JSON when it parses)",
    )


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _finite(value: Any) -> bool:
    """No NaN or infinity anywhere in a parsed value (JSON lists and objects included)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _too_big(value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) > MAX_JSON_INT
    if isinstance(value, list):
        return any(_too_big(v) for v in value)
    if isinstance(value, dict):
        return any(_too_big(v) for v in value.values())
    return False


def _pairs(items: Sequence[str], flag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        # Only --size splits on commas: an --arg value may be a JSON list.
        parts = item.split(",") if flag == "--size" else [item]
        for part in parts:
            key, sep, raw = part.partition("=")
            key = key.strip()
            if not sep or not key or not raw.strip():
                raise UsageError(
                    f"{flag} {item!r} is not NAME=VALUE; write e.g. "
                    + ("--size n=256" if flag == "--size" else "--arg seed=3")
                )
            value = _value(raw.strip())
            if flag == "--size" and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise UsageError(
                    f"--size {key}={raw.strip()!r} is not a positive integer; write e.g. "
                    f"--size {key}=256"
                )
            if flag == "--size" and value > MAX_SIZE:
                raise UsageError(
                    f"--size {key}={value} is above the limit {MAX_SIZE} (kernels index with "
                    "32-bit integers); use a smaller size"
                )
            if not _finite(value):
                raise UsageError(
                    f"{flag} {key}={raw.strip()!r} is not a finite number; give a number"
                )
            if _too_big(value):
                raise UsageError(
                    f"{flag} {key}={raw.strip()!r} has an integer above the limit "
                    f"{MAX_JSON_INT} (2^53, where JSON numbers stop being exact)"
                )
            out[key] = value
    return out


def raw_problem_args(args: argparse.Namespace) -> dict[str, Any]:
    """The raw problem arguments from ``--size``/``--dtype``/``--arg``."""
    raw = _pairs(args.arg, "--arg")
    raw.update(_pairs(args.size, "--size"))
    if args.dtype is not None:
        raw["dtype"] = args.dtype
    return raw


def command_line_args(
    problem_args: Mapping[str, Any], sizes: Collection[str] | None = None
) -> list[str]:
    """Stored (normalised) arguments back as flags: ``dtype`` as ``--dtype``, the problem's
    sizes (``sizes``: the names its arguments mark as sizes) as ``--size``, everything else
    as ``--arg KEY=JSON``. Without ``sizes`` (a problem that cannot be loaded here) every
    integer that ``--size`` accepts is taken for a size."""
    out: list[str] = []
    for key, value in sorted(problem_args.items()):
        if key == "dtype" and isinstance(value, str):
            out += ["--dtype", value]
        elif _is_size(value) and (sizes is None or key in sizes):
            out += ["--size", f"{key}={value}"]
        else:
            text = value if isinstance(value, str) and _value(value) == value else None
            out += ["--arg", f"{key}={text if text is not None else json.dumps(value)}"]
    return out


def problem_sizes(problem: str) -> frozenset[str] | None:
    """The names of a built-in problem's size arguments; None for any other problem (a user
    problem: its code is not run just to print a command line, and may live on the workers
    only)."""
    from tunefleet.problems.registry import builtin_names, get_problem

    if problem not in builtin_names():
        return None
    try:
        specs = get_problem(problem).arguments
    except ProblemError:  # a built-in whose dependencies are missing here
        return None
    return frozenset(spec.name for spec in specs if spec.size)


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_SIZE


def shell_join(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)
