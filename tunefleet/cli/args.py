"""Problem arguments on the command line: ``--size``, ``--dtype`` and ``--arg``, both ways.

``--size n=256`` (repeatable, or comma-separated ``n=256,m=128``) and ``--arg key=value`` put
``key: value`` into the raw arguments handed to the problem's ``normalise_args``; ``--dtype``
sets ``dtype``. Values are read as JSON when they parse (numbers, booleans, lists), else kept
as strings. :func:`command_line_args` renders stored arguments back into flags, so the
reproduce command printed by ``tunefleet best`` round-trips exactly.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from tunefleet.errors import UsageError


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
            out[key] = value
    return out


def raw_problem_args(args: argparse.Namespace) -> dict[str, Any]:
    """The raw problem arguments from ``--size``/``--dtype``/``--arg``."""
    raw = _pairs(args.arg, "--arg")
    raw.update(_pairs(args.size, "--size"))
    if args.dtype is not None:
        raw["dtype"] = args.dtype
    return raw


def command_line_args(problem_args: Mapping[str, Any]) -> list[str]:
    """Stored (normalised) arguments back as flags: ints as ``--size``, ``dtype`` as
    ``--dtype``, everything else as ``--arg KEY=JSON``."""
    out: list[str] = []
    for key, value in sorted(problem_args.items()):
        if key == "dtype" and isinstance(value, str):
            out += ["--dtype", value]
        elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out += ["--size", f"{key}={value}"]
        else:
            text = value if isinstance(value, str) and _value(value) == value else None
            out += ["--arg", f"{key}={text if text is not None else json.dumps(value)}"]
    return out


def shell_join(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)
