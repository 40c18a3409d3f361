"""Subcommands of ``tunefleet`` that belong to the worker."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the worker's subcommands (none yet)."""
