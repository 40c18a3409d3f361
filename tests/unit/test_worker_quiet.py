"""The code-generation pool stands still while a CPU device times (real processes)."""

from __future__ import annotations

import multiprocessing.connection
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunefleet.devices import HOST_DEVICE, DeviceInfo
from tunefleet.problems.synthetic import OPTIMUM
from tunefleet.worker.quiet import Quiet, shares_host_cores
from tunefleet.worker.supervise import Child, Measure, Prepare

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _state(pid: int) -> str:
    """The process's state letter (T: stopped, Z: zombie), or '-' when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "-"
    return stat.rsplit(")", 1)[1].split()[0]


def _until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _device(kind: str) -> DeviceInfo:
    return DeviceInfo("p", "v", "n", "1", extra={"type": kind})


def test_cpu_devices_share_the_host_cores_gpus_and_the_host_device_do_not() -> None:
    assert shares_host_cores(_device("cpu"))
    assert not shares_host_cores(_device("gpu"))
    assert not shares_host_cores(HOST_DEVICE)


def _reply(child: Child, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    reply = child.poll()
    while reply is None:
        assert time.monotonic() < deadline, f"{child.name} never answered"
        multiprocessing.connection.wait(child.waitables(), timeout=0.5)
        reply = child.poll()
    return reply


def test_paused_while_timing_continued_after_and_its_deadline_waits() -> None:
    child = Child("codegen")
    # 2 s: the preparation must still be running when the test stops the child, however
    # late on a loaded machine this thread gets to it.
    args = {"prepare_duration": 2.0}
    try:
        warm = child.call(Prepare("synthetic", {}, dict(OPTIMUM), HOST_DEVICE), 60)
        assert warm.kind == "ok"
        quiet = Quiet(True)
        child.submit(Prepare("synthetic", args, dict(OPTIMUM), HOST_DEVICE), timeout_s=5.0)
        first_deadline = child.deadline
        assert first_deadline is not None
        quiet.hold(True, [child])
        _until(lambda: _state(child.proc.pid) == "T", "the child was not stopped")
        # Past the request's own deadline while stopped: no timeout is called.
        _until(lambda: time.monotonic() > first_deadline + 0.2, "clock", timeout=30)
        assert child.poll() is None and child.alive
        quiet.hold(False, [child])
        _until(lambda: _state(child.proc.pid) != "T", "the child stayed stopped")
        assert child.deadline is not None and child.deadline > first_deadline
        assert _reply(child).kind == "ok"
    finally:
        child.close()


def test_a_cold_build_stopped_while_it_prepared_runs_once_it_is_handed_the_device() -> None:
    """The hang CI found (a worker on PoCL, its confirmation never timed): a cold build was
    stopped while it prepared, its reply already sent; the device then went to it, so it left
    the processes to stop and became the one timing; left stopped, it held the device for
    ever and every other process waited behind it."""
    cold, codegen = Child("cold build"), Child("codegen")
    try:
        assert codegen.call(Prepare("synthetic", {}, dict(OPTIMUM), HOST_DEVICE), 60).kind == "ok"
        args = {"prepare_duration": 1.0}
        cold.submit(Prepare("synthetic", args, dict(OPTIMUM), HOST_DEVICE, keep=True), 60)
        # Armed (its STARTED read) and finished, its reply unread: then the device times
        # something else and both stop.
        _until(lambda: cold.poll() is None and cold.armed, "the cold build did not start")
        _until(lambda: cold.conn.poll(0), "the cold build did not finish preparing")
        quiet = Quiet(True)
        quiet.hold(True, [codegen, cold])
        _until(lambda: _state(cold.proc.pid) == "T", "the cold build was not stopped")
        prepared = _reply(cold)  # read while it stands still, as the loop's collect does
        assert prepared.kind == "ok"
        # The device is free; the cold build gets it: it times, the pool stands still.
        cold.submit(
            Measure("synthetic", args, dict(OPTIMUM), HOST_DEVICE, {}, kept=True, cold=True), 5.0
        )
        sent_at = time.monotonic()
        quiet.hold(True, [codegen])
        # The pool still waits for the device. SIGSTOP takes effect when the kernel next
        # schedules the process, a moment later on loaded cores: wait for it, not assume it
        # (a pool wrongly continued here sits in its pipe read, never in state T).
        _until(lambda: _state(codegen.proc.pid) == "T", "the pool was continued")
        _until(lambda: _state(cold.proc.pid) != "T", "the cold build that times stayed stopped")
        # Its deadline counts from when the request was sent, not from when it was stopped.
        assert cold.deadline is not None and cold.deadline <= sent_at + 5.0 + 1.0
        assert _reply(cold).kind == "ok"
        quiet.hold(False, [codegen])
        _until(lambda: _state(codegen.proc.pid) != "T", "the pool stayed stopped")
    finally:
        cold.close()
        codegen.close()


def test_disabled_never_stops_and_release_continues_everything() -> None:
    child = Child("codegen")
    try:
        child.start()
        Quiet(True).hold(True, [child])  # still starting: not armed, so never stopped
        assert child.paused_at is None
        assert child.call(Prepare("synthetic", {}, dict(OPTIMUM), HOST_DEVICE), 60).kind == "ok"
        Quiet(False).hold(True, [child])
        assert child.paused_at is None and _state(child.proc.pid) != "T"
        quiet = Quiet(True)
        quiet.hold(True, [child])
        _until(lambda: _state(child.proc.pid) == "T", "the child was not stopped")
        quiet.release()
        _until(lambda: _state(child.proc.pid) != "T", "the child stayed stopped")
        quiet.hold(True, [child])
        pid = child.proc.pid
        child.close()  # closing a stopped child still ends it
        _until(lambda: _state(pid) in ("-", "Z"), "a closed stopped child lingered")
    finally:
        child.close()


def test_a_stopped_child_dies_with_its_worker(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    parent = (
        "import sys, time\n"
        "from tunefleet.worker.quiet import Quiet\n"
        "from tunefleet.devices import HOST_DEVICE\n"
        "from tunefleet.problems.synthetic import OPTIMUM\n"
        "from tunefleet.worker.supervise import Child, Prepare\n"
        "if __name__ == '__main__':\n"
        "    c = Child('codegen')\n"
        "    assert c.call(Prepare('synthetic', {}, dict(OPTIMUM), HOST_DEVICE), 60).kind == 'ok'\n"
        "    Quiet(True).hold(True, [c])\n"
        "    open(sys.argv[1], 'w').write(str(c.proc.pid))\n"
        "    time.sleep(600)\n"
    )
    script = tmp_path / "parent.py"
    script.write_text(parent)
    proc = subprocess.Popen([sys.executable, str(script), str(pid_file)], env=ENV)
    child_pid = 0
    try:
        _until(lambda: pid_file.exists() and pid_file.read_text() != "", "no child started")
        child_pid = int(pid_file.read_text())
        _until(lambda: _state(child_pid) == "T", "the child was not stopped")
        proc.kill()  # no finally runs: the kernel's parent-death SIGKILL must end it
        proc.wait(30)
        _until(lambda: _state(child_pid) in ("-", "Z"), "a stopped child outlived its worker")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child_pid and _state(child_pid) not in ("-", "Z"):
            os.kill(child_pid, 9)
