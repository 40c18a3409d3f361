"""``die_with_parent``: a child that must not outlive its parent; ``process_age_s``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its new parent has not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_parent_already_gone_ends_the_child_with_the_code() -> None:
    code = (
        "import signal\n"
        "from tunefleet.processes import die_with_parent\n"
        "die_with_parent(1, signal.SIGKILL, 7)\n"  # our parent is not pid 1
        "print('outlived')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (7, "")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_the_child_gets_the_signal_when_its_parent_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    # The parent starts the child, which asks for SIGKILL on the parent's death and waits.
    child = (
        "import os, signal, sys, time\n"
        "from tunefleet.processes import die_with_parent\n"
        "die_with_parent(int(sys.argv[1]), signal.SIGKILL, 3)\n"
        "open(sys.argv[2], 'w').write(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    parent = (
        "import os, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid()), sys.argv[2]])\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent, child, str(pid_file)], env=ENV)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child_pid = int(pid_file.read_text())
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 60
        while not _gone(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(child_pid), "the child outlived its parent"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid_file.exists() and pid_file.read_text() and not _gone(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), 9)  # a failed run leaves no orphan behind


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_a_process_knows_its_age_and_it_grows():
    from tunefleet.processes import process_age_s

    first = process_age_s()
    assert first > 0  # this interpreter started and imported pytest a while ago
    assert process_age_s() >= first


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_the_start_on_the_monotonic_clock_stays_put_and_lies_in_the_past():
    import time

    from tunefleet.processes import started_monotonic

    first = started_monotonic()
    assert first < time.monotonic()
    # Read again, the start moves by /proc's resolution (clock ticks, 1/100 s on Linux),
    # not by the time that passed: a budget counted from it does not drift.
    assert abs(started_monotonic() - first) < 0.1
