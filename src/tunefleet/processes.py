"""Child processes that must not outlive their parent, and how old this process is."""

from __future__ import annotations

import os
import signal
import time

#: prctl(2) option: the signal the calling process gets when its parent thread exits.
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: signal.Signals, exit_code: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies, and exit with
    ``exit_code`` at once if the parent is already gone (it died before the request took
    effect). Called in the child, first thing (before ``exec`` for a subprocess).

    Linux sends the parent-death signal once per exiting *thread* of the parent, so ``sig``
    must be one whose repeats are harmless (SIGUSR1, a graceful stop; or SIGKILL). Elsewhere
    prctl does not exist and this only checks the parent.
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(exit_code)


def process_age_s() -> float:
    """Seconds since this process was started (exec'd), from Linux's ``/proc`` (its start
    in clock ticks since boot, against the system's uptime), so that a time budget can count
    the interpreter's own start-up and imports too; 0 where that cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            # The command name (field 2) may hold spaces and parentheses: split after it.
            fields = fh.read().rsplit(b")", 1)[1].split()
        with open("/proc/uptime", "rb") as fh:
            uptime = float(fh.read().split()[0])
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - started)


def started_monotonic() -> float:
    """This process's start on ``time.monotonic()``'s clock (:func:`process_age_s` ago):
    where a command's time budget starts, so that it bounds the whole command."""
    return time.monotonic() - process_age_s()
