"""Old spellings of commands and flags that still work for one release: each prints one line
saying what to write instead, then does what the new spelling does. CHANGELOG.md lists them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

Command = Callable[[argparse.Namespace], int]


def notice(old: str, new: str) -> None:
    """The one line an old spelling prints (stderr, so scripts reading stdout see no change)."""
    print(
        f"tunefleet: note: `{old}` is deprecated and goes in the next release; use `{new}`",
        file=sys.stderr,
        flush=True,
    )


def alias(old: str, new: str, func: Command) -> Command:
    """``func`` behind an old command spelling: the notice, then the command itself."""

    def run(args: argparse.Namespace) -> int:
        notice(old, new)
        return func(args)

    return run
