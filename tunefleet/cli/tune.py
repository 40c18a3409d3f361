"""``tunefleet tune``: one command that runs a whole tuning campaign on this machine."""

from __future__ import annotations

import argparse

from tunefleet.cli.args import add_problem_flags
from tunefleet.cli.db import add_db_flag
from tunefleet.errors import RunError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("tune", help="tune a problem here: coordinator plus local workers")
    p.add_argument("problem", metavar="PROBLEM", help="built-in name, path.py or module:attr")
    add_problem_flags(p)
    add_db_flag(p)
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    raise RunError("tune is not wired yet")
