"""The live progress line of a tuning campaign on a stream: rewritten in place on a
terminal, a plain line every few seconds otherwise (logs, CI, pipes)."""

from __future__ import annotations

import shutil
import time
from typing import TextIO


class ProgressDisplay:
    """Rewrites one line on a terminal; prints a plain line every ``every`` seconds
    otherwise (logs, CI, pipes)."""

    def __init__(self, stream: TextIO, every: float) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.every = every
        self._last: float | None = None
        self._width = 0

    def show(self, line: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            # A line longer than the terminal would wrap and "\r" could not rewrite it.
            line = line[: max(shutil.get_terminal_size().columns - 1, 20)]
            pad = max(self._width - len(line), 0)
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
            self.stream.flush()
        elif force or self._last is None or now - self._last >= self.every:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last = now

    def end(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0
