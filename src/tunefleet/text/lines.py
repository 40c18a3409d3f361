"""Owns writing a whole line to a stream, the one way progress and notices are written.

``print(line, file=stream)`` writes the line and its newline in two calls. A second Ctrl-C or
TERM raises KeyboardInterrupt between any two calls, and the command's last word,
``tunefleet: interrupted``, then lands on the end of the unfinished line (a coordinator's
progress line under a test that signals it twice). One call, then a flush, leaves every line
whole whenever the signal comes.
"""

from __future__ import annotations

from typing import TextIO


def write_line(line: str, stream: TextIO) -> None:
    """Write ``line`` and its newline in one call, then flush."""
    stream.write(line + "\n")
    stream.flush()
