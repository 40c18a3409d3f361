"""Subcommands of ``tunefleet`` that belong to the coordinator."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the coordinator's subcommands (none yet)."""
