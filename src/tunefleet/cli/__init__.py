"""The ``tunefleet`` command: one argparse tree, and the boundary where errors become one line.

Each area registers its own subcommands (``register(subparsers)``) and sets ``func`` on its
parsers; settings dataclasses are built inside those functions from the parsed flags.
Every :class:`~tunefleet.errors.TunefleetError` that escapes becomes ``tunefleet: error: ...``
on stderr and the error's exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from tunefleet.errors import TunefleetError
from tunefleet.version import __version__

# Modules that add subcommands, in the order they appear in --help.
_COMMAND_MODULES = (
    "tunefleet.cli.front",
    "tunefleet.cli.db",
    "tunefleet.cli.feinsum",
    "tunefleet.cli.dashboard",
    "tunefleet.cli.importance",
    "tunefleet.worker.cli",
    "tunefleet.coordinator.cli",
    "tunefleet.coordinator.replay_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tunefleet",
        description="Distributed autotuning of loopy (OpenCL) kernels through PostgreSQL.",
    )
    parser.add_argument("--version", action="version", version=f"tunefleet {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (repeat for debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        # Flag values are checked as they are parsed (tunefleet.options.flags): a value out of
        # range is a one-line UsageError like every other mistake.
        args = parser.parse_args(argv)
    except TunefleetError as exc:
        print(f"tunefleet: error: {exc}", file=sys.stderr)
        return exc.exit_code
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code = int(func(args) or 0)
        _say_started_server()
        return code
    except TunefleetError as exc:
        print(f"tunefleet: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tunefleet: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `tunefleet export 1 | head`: the reader left; say nothing more.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _say_started_server() -> None:
    """The embedded server a command started outlives it: say so, once, on stderr, after
    everything the command printed (an error stays the one line it is)."""
    # A command that never resolved a database started no server (and `--help` stays fast).
    resolve = sys.modules.get("tunefleet.db.resolve")
    data_dir = None if resolve is None else resolve.started_embedded()
    if data_dir is not None:
        print(
            f"tunefleet: note: started the embedded database server (data: {data_dir}); it "
            "keeps running after this command: stop it with `tunefleet db stop`",
            file=sys.stderr,
        )


if __name__ == "__main__":
    sys.exit(main())
