"""Start worker processes from Python: what tests and benchmarks use to run a local fleet.

    from tests.helpers.launch import running_workers

    with running_workers(db_url, 4, drain=True, lease_s=2) as fleet:
        codes = [w.wait(60) for w in fleet]

Each worker is a real ``python -m tunefleet.worker`` process (its own UUID, device process,
heartbeat), logging to a file (``WorkerProcess.log()``), so nothing blocks on a full pipe. The
package root is put on ``PYTHONPATH``, so the workers run the same code as the caller.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class WorkerProcess:
    popen: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str]

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Exit status (raises ``subprocess.TimeoutExpired`` after ``timeout``)."""
        return self.popen.wait(timeout)

    def send(self, sig: int) -> None:
        if self.alive:
            os.kill(self.popen.pid, sig)

    def stop(self) -> None:
        """Graceful stop: finish the trial being timed, release the others, exit 0."""
        self.send(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: the worker vanishes; its leases expire and its trials are requeued."""
        self.send(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def worker_argv(
    db_url: str,
    *,
    device: str = "host",
    drain: bool = True,
    max_trials: int | None = None,
    lease_s: float | None = None,
    timeout_s: float | None = None,
    prefetch: int | None = None,
    prepare_workers: int | None = None,
    poll_s: float | None = None,
    stand_aside_after: int | None = None,
    listen: bool = False,
    verbose: bool = True,
    extra: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The command line of one worker."""
    argv = [python, "-m", "tunefleet.worker", "--db", db_url, "--device", device]
    if drain:
        argv.append("--drain")
    if listen:
        argv.append("--listen")
    for flag, value in (
        ("--max-trials", max_trials),
        ("--lease", lease_s),
        ("--timeout", timeout_s),
        ("--prefetch", prefetch),
        ("--prepare-workers", prepare_workers),
        ("--poll", poll_s),
        ("--stand-aside-after", stand_aside_after),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if verbose:
        argv.append("-v")
    return [*argv, *extra]


def start_worker(
    db_url: str,
    *,
    log_path: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    **options: object,
) -> WorkerProcess:
    """Start one worker process; ``options`` are :func:`worker_argv`'s keywords."""
    argv = worker_argv(db_url, **options)  # type: ignore[arg-type]
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="tunefleet-worker-", suffix=".log")
        os.close(fd)
        log_path = name
    path = Path(log_path)
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_ROOT), full_env.get("PYTHONPATH", "")) if p
    )
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    with open(path, "ab") as out:
        popen = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env
        )
    return WorkerProcess(popen, path, argv)


def start_workers(
    db_url: str,
    n: int,
    *,
    log_dir: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    **options: object,
) -> list[WorkerProcess]:
    """Start ``n`` workers; their logs go to ``log_dir/worker-<i>.log``."""
    directory = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp("-tunefleet"))
    directory.mkdir(parents=True, exist_ok=True)
    return [
        start_worker(db_url, log_path=directory / f"worker-{i}.log", env=env, **options)
        for i in range(n)
    ]


@contextlib.contextmanager
def running_workers(db_url: str, n: int, **kwargs: object) -> Iterator[list[WorkerProcess]]:
    """Start ``n`` workers and make sure none outlives the block (SIGKILL on the way out)."""
    fleet = start_workers(db_url, n, **kwargs)  # type: ignore[arg-type]
    try:
        yield fleet
    finally:
        for w in fleet:
            if w.alive:
                w.kill()


def wait_all(workers: Sequence[WorkerProcess], timeout: float) -> list[int]:
    """Wait for every worker to exit; return their exit statuses."""
    import time

    deadline = time.monotonic() + timeout
    return [w.wait(max(deadline - time.monotonic(), 0.01)) for w in workers]


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie (exited, not yet reaped by its parent, which for
    a daemon may be a container's init that never reaps) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The command name in parentheses may hold spaces; the state follows its closing one.
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
