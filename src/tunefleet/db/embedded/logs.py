"""What PostgreSQL and its programs said, read back for one-line errors: the first complaint
the server wrote to its log since an offset, and the last lines of a program's output."""

from __future__ import annotations

from pathlib import Path


def file_size(path: Path) -> int:
    """The size of ``path`` (0 when it is missing): where a log's next lines will start."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def last_lines(text: str | None, count: int = 2) -> str:
    """The last ``count`` non-blank lines of a program's output, on one line."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return " | ".join(lines[-count:]) or "no output"


def log_reason(log: Path, offset: int) -> str | None:
    """The first FATAL/PANIC/ERROR line the server wrote to its log since ``offset``."""
    try:
        with open(log, errors="replace") as fh:
            fh.seek(offset)
            new = fh.read()
    except OSError:
        return None
    lines = new.splitlines()
    # "could not bind" is logged (LOG level) just before the FATAL that only says no socket.
    for marker in ("could not bind", "FATAL:", "PANIC:", "ERROR:"):
        for line in lines:
            if marker in line:
                start = line.index(marker)
                if marker == "could not bind":
                    start = line.rfind(":", 0, start) + 1
                return " ".join(line[start:].split())
    return None
