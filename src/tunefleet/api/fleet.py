"""The machine-local side of a tuning campaign: which device class a run targets, the
``tunefleet worker`` processes started here for it, and the clean-up after a stop.

Shared by :func:`tunefleet.tune` and the ``tunefleet tune`` command (which is built on it).
Workers run in their own session: a terminal's Ctrl-C reaches only the tuning process, which
then signals each worker exactly once (a second signal would make a worker abort without
handing its trials back). Should that process be killed outright, its workers get SIGUSR1
from the kernel (parent-death signal) and stop gracefully.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunefleet.errors import DeviceError, UsageError
from tunefleet.processes import die_with_parent
from tunefleet.settings import DatabaseSettings
from tunefleet.vocabulary import RunState

#: How long the search waits for its local workers to register before it starts anyway (a
#: worker registers once it has found its device, before it opens it).
WORKERS_UP_S = 30.0
#: How long local workers get to exit once a run ended by its time budget (the run handed
#: their trials back, so they only drop them and leave) before they are killed: the budget
#: bounds the campaign, so a worker mid-compile or mid-timing must not hold it up.
BUDGET_STOP_S = 3.0


# --- planning -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerPlan:
    """Which device class the run targets and the ``--device`` of each local worker."""

    device_class: str
    devices: tuple[str, ...]
    description: str


def plan_workers(needs_opencl: bool, workers: int | None, pattern: str | None) -> WorkerPlan:
    """Decide the run's device class and the local workers; raise a one-line error when the
    machine cannot serve the request."""
    from tunefleet.devices import ANY_DEVICE_CLASS, device_class_of

    if workers is not None and workers < 0:
        raise UsageError(f"--workers {workers}: give 0 or more workers")
    if not needs_opencl:
        if pattern not in (None, "host"):
            raise UsageError(
                f"--device {pattern!r}: this problem needs no OpenCL and runs on the host "
                "pseudo-device; drop --device"
            )
        n = 1 if workers is None else workers
        where = "host pseudo-device" if n else f"remote workers of class {ANY_DEVICE_CLASS}"
        return WorkerPlan(ANY_DEVICE_CLASS, ("host",) * n, where)

    if workers == 0:
        if not pattern:
            raise UsageError(
                "--workers 0 needs --device-class CLASS, the device class the remote workers serve "
                "(`tunefleet devices` on a worker machine shows it, e.g. nvidia-h200)"
            )
        try:
            matches = _matching_devices(pattern)
        except DeviceError:
            matches = []  # a login node without OpenCL: the pattern is the class itself
        cls = matches[0].device_class if matches else device_class_of(pattern)
        return WorkerPlan(cls, (), f"remote workers of class {cls}")

    matches = _matching_devices(pattern)
    cls = matches[0].device_class
    same = [d for d in matches if d.device_class == cls]
    n = len(same) if workers is None else workers
    if n > len(same):
        raise UsageError(
            f"--workers {n}: this machine has {len(same)} device(s) of class {cls} and a device "
            "takes one worker (two would corrupt each other's timings); use --workers "
            f"{len(same)} and start more workers on other machines with `tunefleet worker`"
        )
    chosen = same[:n]
    names = ", ".join(f"{d.index}: {d.name}" for d in chosen)
    return WorkerPlan(cls, tuple(str(d.index) for d in chosen), names)


def _matching_devices(pattern: str | None) -> list[Any]:
    from tunefleet.worker.device import matching_devices

    return matching_devices(
        pattern, no_device_hint="or run the search only (--workers 0 --device-class CLASS)"
    )


# --- local worker processes ---------------------------------------------------------------


@dataclass
class LocalWorkers:
    """The worker processes this command started, with their log files."""

    url: str
    log_dir: Path
    procs: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def start(self, devices: tuple[str, ...], extra: list[str]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # The workers share this machine's cores: each sizes its code generation for its part
        # from the start, before the others have registered in the database.
        env = {**os.environ, "TUNEFLEET_WORKER_PEERS": str(max(len(devices), 1))}
        # A handful of workers on one machine: no herd to fear, and a worker whose device
        # waits (the end of a run's search) claims the confirmations the moment they are
        # queued rather than at its next backed-off poll (seconds on a two-core laptop).
        env.setdefault("TUNEFLEET_WORKER_LISTEN", "1")
        for i, device in enumerate(devices):
            log = self.log_dir / f"worker-{i}.log"
            cmd = [sys.executable, "-m", "tunefleet", "worker", "--db", self.url]
            cmd += ["--device", device, *extra]
            with open(log, "ab") as fh:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # the terminal's Ctrl-C is ours to forward, once
                    preexec_fn=functools.partial(_die_with_parent, os.getpid()),
                )
            self.procs.append((proc, log))

    def wait_registered(
        self, conn: Any, timeout_s: float, give_up: Callable[[], bool] = lambda: False
    ) -> bool:
        """Wait until every local worker has registered, so the search sizes its first
        queue for all of them rather than for whichever came up first; stop early when one
        exits or ``give_up()`` says so. Returns whether all registered."""
        from tunefleet.queries import report

        host = socket.gethostname()
        pids = {proc.pid for proc, _ in self.procs}
        deadline = time.monotonic() + timeout_s
        while True:
            seen = {w["pid"] for w in report.fleet(conn) if w["host"] == host}
            if pids <= seen:
                return True
            if time.monotonic() > deadline or give_up() or self.exited():
                return False
            time.sleep(0.1)

    def exited(self) -> list[tuple[int, Path]]:
        """Workers that ended on their own: (exit status, log file)."""
        return [(p.returncode, log) for p, log in self.procs if p.poll() is not None]

    def stop(self, timeout: float = 30.0) -> None:
        """One SIGTERM each (graceful: finish or hand back held trials), then wait; SIGKILL
        what is still there after ``timeout`` (its leases expire and the reaper requeues)."""
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc, _ in self.procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _die_with_parent(parent_pid: int) -> None:
    """In the worker child before exec: get SIGUSR1 (the worker's graceful stop that never
    escalates) when this process dies without stopping it, e.g. SIGKILLed; not SIGTERM,
    whose second delivery aborts a worker."""
    die_with_parent(parent_pid, signal.SIGUSR1, exit_code=1)


def last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def coordinator_db(settings: DatabaseSettings, url: str) -> DatabaseSettings:
    """The in-process coordinator's database settings: the user's (every timeout, the connect
    timeout included) on the resolved URL, under the coordinator's name."""
    return dataclasses.replace(settings, url=url, application_name="tunefleet-coordinator")


def cancel_leftovers(url: str, db: DatabaseSettings, run_id: int) -> None:
    """Trials the stopped workers handed back after the search ended go to ``cancelled``
    (a stopped or finished run keeps no pending work; a resume re-asks the search)."""
    from tunefleet.db.engine import connect
    from tunefleet.queries import search

    with connect(url, db) as conn:
        run = search.get_run(conn, run_id)
        if run is not None and run["state"] != RunState.RUNNING:
            search.cancel_pending(conn, run_id)


def resume_plan(
    needs_opencl: bool, workers: int | None, pattern: str | None, run: dict[str, Any]
) -> WorkerPlan:
    """Workers for a resumed run: they must serve the class the run targets."""
    cls = run["device_class"]
    if workers == 0:
        return WorkerPlan(cls, (), f"remote workers of class {cls}")
    plan = plan_workers(needs_opencl, workers, pattern)
    if plan.device_class != cls:
        raise DeviceError(
            f"run {run['id']} targets device class {cls}, but the local device is "
            f"{plan.device_class}; resume it where such a device is, or with --workers 0"
        )
    return plan
