"""A real Slurm for the cluster tests: Debian's ``slurm-wlm`` daemons started for one test
session, with a private MUNGE daemon (its own key and socket), the controller on the database
host's address and one ``slurmd`` per node of a :mod:`tests.helpers.netns` network (each in the
node's network and under its host name, so two nodes on one machine are two Slurm nodes).

Configured for a container: no cgroup plugins (``proctrack/linuxproc``, ``task/none``), CPUs as
the consumable resource (``select/cons_tres``), no accounting. Clients (``sbatch``,
``scancel``, ...) find this cluster through ``SLURM_CONF`` in :meth:`SlurmCluster.env`.

:func:`unavailable` says why a cluster cannot be started here (not installed, no root, no
network namespaces); :func:`slurm_cluster` raises :class:`SlurmUnavailable`, with the daemons'
last log lines, when the daemons do not come up: tests skip on either.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import netns
from tests.helpers.ports import free_port

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
#: Job states after which a job runs nothing any more.
FINISHED = {
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE",
}  # fmt: skip


class SlurmUnavailable(RuntimeError):
    pass


def _find(program: str) -> str | None:
    for directory in ("", "/usr/sbin/", "/usr/bin/"):
        path = shutil.which(program) if not directory else directory + program
        if path and os.access(path, os.X_OK):
            return path
    return None


def unavailable() -> str | None:
    missing = [p for p in PROGRAMS if _find(p) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing: apt-get install slurm-wlm)"
    return netns.unavailable()


@dataclass
class SlurmCluster:
    directory: Path
    conf: Path
    nodes: list[str]
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(
        self, *argv: str, env: Mapping[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    def sbatch(
        self,
        script: Path,
        *options: str,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> int:
        """Submit ``script`` as a user would; the job's id."""
        proc = subprocess.run(
            [_program("sbatch"), "--parsable", *options, str(script)],
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            check=False,
        )
        if proc.returncode != 0:
            raise AssertionError(f"sbatch {' '.join(options)} {script}: {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (empty once the controller forgot the job)."""
        proc = self.run(_program("scontrol"), "show", "job", "-o", str(job_id))
        if proc.returncode != 0:
            return {}
        fields: dict[str, str] = {}
        for item in proc.stdout.split():
            key, _, value = item.partition("=")
            fields.setdefault(key, value)
        return fields

    def state(self, job_id: int) -> str | None:
        return self.job(job_id).get("JobState")

    def scancel(self, job_id: int, *options: str) -> None:
        proc = self.run(_program("scancel"), *options, str(job_id))
        if proc.returncode != 0:
            raise AssertionError(f"scancel {job_id}: {proc.stderr.strip()}")

    def scontrol(self, *args: str) -> str:
        proc = self.run(_program("scontrol"), *args)
        if proc.returncode != 0:
            raise AssertionError(f"scontrol {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def wait_finished(self, job_id: int, timeout: float) -> str:
        """Wait until the job runs nothing any more; its final state."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state(job_id) or "GONE"
            if state in FINISHED or state == "GONE":
                return state
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {job_id} still {state} after {timeout:g} s\n{self.logs()}"
                )
            time.sleep(0.2)

    def cancel_all(self, timeout: float = 90) -> None:
        """Cancel every job of the cluster (a test's leftovers) and wait until none runs."""
        self.run(_program("scancel"), "--full", "--user", "root")
        deadline = time.monotonic() + timeout
        # squeue lists the jobs still pending, running or completing.
        while self.run(_program("squeue"), "-h", "-o", "%T").stdout.strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)

    def logs(self, tail: int = 30) -> str:
        out = []
        for path in sorted((self.directory / "log").glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()
            out.append(f"--- {path.name}\n" + "\n".join(lines[-tail:]))
        return "\n".join(out)

    def close(self) -> None:
        self.cancel_all()
        for name in sorted(self.daemons, key=lambda n: n == "munged"):  # munged last
            proc = self.daemons[name]
            if proc.poll() is None:
                proc.terminate()
        for proc in self.daemons.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _program(name: str) -> str:
    path = _find(name)
    if path is None:
        raise SlurmUnavailable(f"{name} is not installed")
    return path


def _write_conf(
    directory: Path, controller: str, address: str, port: int, nodes: Sequence[netns.Node]
) -> Path:
    cpus = len(os.sched_getaffinity(0))
    lines = [
        f"ClusterName=tf{os.getpid()}",
        f"SlurmctldHost={controller}({address})",
        f"SlurmctldPort={port}",
        # Each node has its own network namespace, hence its own port numbers.
        "SlurmdPort=6818",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={directory / 'munge' / 'munge.socket'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={directory / 'state'}",
        f"SlurmdSpoolDir={directory / 'spool'}/%n",
        f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
        f"SlurmdPidFile={directory}/slurmd-%n.pid",
        f"SlurmctldLogFile={directory / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={directory / 'log'}/slurmd-%n.log",
        # A container: no cgroups to track or bind processes with.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        # A loaded test machine must not make a node look dead.
        "SlurmdTimeout=300",
        "MessageTimeout=30",
        # Finished jobs stay visible (their final state) for the test's checks.
        "MinJobAge=600",
        "KillWait=30",
    ]
    for node in nodes:
        lines.append(f"NodeName={node.name} NodeAddr={node.address} CPUs={cpus} State=UNKNOWN")
    names = ",".join(n.name for n in nodes)
    lines.append(f"PartitionName=test Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    conf = directory / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _wait(what: str, ready: object, timeout: float, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        for name, proc in cluster.daemons.items():
            if proc.poll() is not None:
                raise SlurmUnavailable(
                    f"{name} exited with {proc.returncode} while waiting for {what}\n"
                    f"{cluster.logs()}"
                )
        if time.monotonic() > deadline:
            raise SlurmUnavailable(f"timed out waiting for {what}\n{cluster.logs()}")
        time.sleep(0.2)


@contextlib.contextmanager
def slurm_cluster(
    directory: Path, gateway: str, nodes: Sequence[netns.Node], timeout: float = 90
) -> Iterator[SlurmCluster]:
    """MUNGE, the controller on ``gateway`` and a ``slurmd`` on each of ``nodes``, until the
    block ends (jobs cancelled, daemons stopped)."""
    reason = unavailable()
    if reason:
        raise SlurmUnavailable(reason)
    for sub in ("munge", "state", "spool", "log"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    # MUNGE insists on a private key and a socket directory others may enter.
    (directory / "munge").chmod(0o755)
    key = directory / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o400)
    controller = socket.gethostname().split(".")[0]
    conf = _write_conf(directory, controller, gateway, free_port(), nodes)
    cluster = SlurmCluster(directory, conf, [n.name for n in nodes])
    log = directory / "log"
    try:
        munge = directory / "munge"
        munged = [
            _program("munged"), "--foreground", "--force",
            f"--socket={munge / 'munge.socket'}", f"--key-file={key}",
            f"--log-file={log / 'munged.log'}", f"--pid-file={munge / 'munged.pid'}",
            f"--seed-file={munge / 'munged.seed'}",
        ]  # fmt: skip
        cluster.daemons["munged"] = _daemon(munged, log / "munged.out", cluster.env())
        _wait("munged", (munge / "munge.socket").exists, timeout, cluster)
        cluster.daemons["slurmctld"] = _daemon(
            [_program("slurmctld"), "-D", "-f", str(conf)], log / "slurmctld.out", cluster.env()
        )

        def controller_up() -> bool:
            return "UP" in cluster.run(_program("scontrol"), "ping").stdout

        _wait("slurmctld", controller_up, timeout, cluster)
        for node in nodes:
            cluster.daemons[f"slurmd-{node.name}"] = _daemon(
                node.argv([_program("slurmd"), "-D", "-f", str(conf)]),
                log / f"slurmd-{node.name}.out",
                cluster.env(),
            )

        def nodes_idle() -> bool:
            out = cluster.run(_program("sinfo"), "-h", "-N", "-o", "%N %t").stdout.split()
            states = dict(zip(out[::2], out[1::2], strict=False))
            return all(states.get(n.name) == "idle" for n in nodes)

        _wait("the nodes to be idle", nodes_idle, timeout, cluster)
        yield cluster
    finally:
        cluster.close()


def _daemon(argv: Sequence[str], out: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    with open(out, "ab") as log:
        return subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
