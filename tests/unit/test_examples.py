"""The cluster launchers in examples/: syntax, shellcheck, and their mechanics.

The Slurm script runs under a stand-in ``srun`` that starts the tasks the way Slurm would
(one process per task with ``SLURM_LOCALID`` set); the ssh launcher runs with a stand-in
``ssh`` that executes the remote script on this machine. A stand-in ``tunefleet`` records how
each worker was started and behaves like a worker on SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.launch import process_alive

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "examples" / "slurm" / "tunefleet-workers.sbatch"
FLEET = ROOT / "examples" / "ssh" / "tunefleet-fleet.sh"
SCRIPTS = [SLURM, FLEET]
DSN = "postgresql://tunefleet_worker@head:5432/tunefleet?sslmode=verify-full&sslrootcert=/x/ca.crt"

# A worker stand-in: records argv and the environment it needs, waits for SIGTERM, exits 0.
# The record appears whole (renamed into place) and only once SIGTERM is handled, so a test
# that sees it never reads half of it or stops a worker that cannot yet say it stopped.
FAKE_TUNEFLEET = """#!/usr/bin/env bash
out="$FAKE_RECORD_DIR/worker-$$.txt"
trap 'echo "terminated gracefully" >> "$out"; exit 0' TERM
{ echo "argv: $*"; echo "dsn: $TUNEFLEET_DATABASE_URL"; echo "pgpass: $PGPASSFILE";
  echo "localid: ${SLURM_LOCALID:-}"; echo "wait: ${TUNEFLEET_WAIT_FOR_DB_S:-}"; } > "$out.part"
mv "$out.part" "$out"
if [[ " $* " == *" --drain "* ]]; then exit 0; fi
while true; do sleep 0.1; done
"""

# srun stand-in: --ntasks-per-node=N ... CMD... runs CMD N times with SLURM_LOCALID=i.
FAKE_SRUN = """#!/usr/bin/env bash
echo "srun $*" >> "$FAKE_RECORD_DIR/srun.txt"
n=1
while [[ "$1" == --* ]]; do
    case "$1" in --ntasks-per-node=*) n="${1#*=}";; esac
    shift
done
pids=()
for ((i = 0; i < n; i++)); do SLURM_LOCALID=$i "$@" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
"""

# ssh stand-in: records its argv, drops the host and runs the rest here.
FAKE_SSH = """#!/usr/bin/env bash
echo "ssh $*" >> "$FAKE_RECORD_DIR/ssh.txt"
shift
exec "$@"
"""


def _write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def fakes(tmp_path: Path) -> dict[str, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "record"
    record.mkdir()
    _write_exe(bin_dir / "tunefleet", FAKE_TUNEFLEET)
    _write_exe(bin_dir / "srun", FAKE_SRUN)
    _write_exe(bin_dir / "fake-ssh", FAKE_SSH)
    pgpass = tmp_path / "workers.pgpass"
    pgpass.write_text("*:*:tunefleet:tunefleet_worker:secret\n")
    pgpass.chmod(0o600)
    return {"bin": bin_dir, "record": record, "pgpass": pgpass, "tmp": tmp_path}


def _records(record: Path) -> list[str]:
    return sorted(p.read_text() for p in record.glob("worker-*.txt"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_with_bash_n(script):
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert os.access(script, os.X_OK)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_pass_shellcheck(script):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian package: shellcheck)")
    out = subprocess.run(["shellcheck", "-x", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_slurm_script_starts_one_worker_per_gpu_by_local_rank(fakes):
    text = SLURM.read_text()
    assert "#SBATCH --ntasks-per-node=4" in text and "#SBATCH --gres=gpu:4" in text
    env = {
        "PATH": f"{fakes['bin']}:{os.environ['PATH']}",
        "HOME": str(fakes["tmp"]),
        "FAKE_RECORD_DIR": str(fakes["record"]),
        "TUNEFLEET_DATABASE_URL": DSN,
        "PGPASSFILE": str(fakes["pgpass"]),
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_JOB_ID": "42",
    }
    out = subprocess.run(["bash", str(SLURM)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    records = _records(fakes["record"])
    assert len(records) == 4
    devices = sorted(r.split("argv: worker --device ")[1].split()[0] for r in records)
    assert devices == ["0", "1", "2", "3"]
    assert all("--drain" in r and f"dsn: {DSN}" in r for r in records)
    assert all(f"pgpass: {fakes['pgpass']}" in r for r in records)
    # A job that starts while the database restarts waits for it rather than exiting.
    assert all("wait: 300\n" in r for r in records)
    srun = (fakes["record"] / "srun.txt").read_text()
    assert "--ntasks-per-node=4" in srun and "--gpu-bind=none" in srun
    assert DSN not in srun  # the DSN travels in the environment


def test_slurm_script_serves_the_named_device_on_cpu_nodes(fakes):
    """TUNEFLEET_WORKER_DEVICE replaces the local rank: every task serves that device."""
    env = {
        "PATH": f"{fakes['bin']}:{os.environ['PATH']}",
        "HOME": str(fakes["tmp"]),
        "FAKE_RECORD_DIR": str(fakes["record"]),
        "TUNEFLEET_DATABASE_URL": DSN,
        "PGPASSFILE": str(fakes["pgpass"]),
        "SLURM_NTASKS_PER_NODE": "2",
        "TUNEFLEET_WORKER_DEVICE": "host",
    }
    out = subprocess.run(["bash", str(SLURM)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    records = _records(fakes["record"])
    assert [r.split("argv: worker --device ")[1].split()[0] for r in records] == ["host"] * 2


@pytest.mark.parametrize(
    ("env_update", "message"),
    [
        ({"TUNEFLEET_DATABASE_URL": ""}, "set TUNEFLEET_DATABASE_URL"),
        ({"PGPASSFILE": "/nonexistent/pgpass"}, "no readable pgpass file"),
    ],
)
def test_slurm_script_refuses_to_start_without_dsn_or_pgpass(fakes, env_update, message):
    env = {
        "PATH": f"{fakes['bin']}:{os.environ['PATH']}",
        "HOME": str(fakes["tmp"]),
        "FAKE_RECORD_DIR": str(fakes["record"]),
        "TUNEFLEET_DATABASE_URL": DSN,
        "PGPASSFILE": str(fakes["pgpass"]),
        **env_update,
    }
    out = subprocess.run(["bash", str(SLURM)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert message in out.stderr
    assert _records(fakes["record"]) == []


def _fleet(fakes: dict[str, Path], action: str, hostfile: Path, **extra: str):
    remote_env = fakes["tmp"] / "remote-env.sh"
    remote_env.write_text(f'export PATH="{fakes["bin"]}:$PATH"\n')
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(fakes["tmp"]),
        "FAKE_RECORD_DIR": str(fakes["record"]),
        "TUNEFLEET_DATABASE_URL": DSN,
        "TUNEFLEET_SSH": str(fakes["bin"] / "fake-ssh"),
        "TUNEFLEET_REMOTE_ENV": str(remote_env),
        "TUNEFLEET_PGPASSFILE": str(fakes["pgpass"]),
        "TUNEFLEET_LOG_DIR": str(fakes["tmp"] / "fleet"),
        "TUNEFLEET_STOP_WAIT": "20",
        **extra,
    }
    return subprocess.run(
        ["bash", str(FLEET), action, str(hostfile)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_ssh_launcher_starts_reports_and_stops_workers(fakes):
    hostfile = fakes["tmp"] / "hosts"
    hostfile.write_text("# the GPU nodes\nnode-a 2\n")
    log_dir = fakes["tmp"] / "fleet"
    started = _fleet(fakes, "start", hostfile)
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout.count("started (pid") == 2
        pids = sorted(int(p.read_text()) for p in log_dir.glob("worker-*.pid"))
        assert len(pids) == 2
        assert _wait_for(lambda: len(_records(fakes["record"])) == 2)
        records = _records(fakes["record"])
        assert sorted(r.split("--device ")[1].split()[0] for r in records) == ["0", "1"]
        assert all(f"dsn: {DSN}" in r and f"pgpass: {fakes['pgpass']}" in r for r in records)
        assert all("wait: 300\n" in r for r in records)
        # Neither the DSN nor the pgpass path is on the ssh command line.
        ssh_lines = (fakes["record"] / "ssh.txt").read_text()
        assert "node-a bash -s" in ssh_lines and DSN not in ssh_lines

        again = _fleet(fakes, "start", hostfile)
        assert again.stdout.count("already running") == 2
        assert sorted(int(p.read_text()) for p in log_dir.glob("worker-*.pid")) == pids

        status = _fleet(fakes, "status", hostfile)
        assert status.returncode == 0 and status.stdout.count("running (pid") == 2
    finally:
        stopped = _fleet(fakes, "stop", hostfile)
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in stopped.stdout
    for pid in pids:
        assert not process_alive(pid)
    assert list(log_dir.glob("worker-*.pid")) == []
    assert all("terminated gracefully" in r for r in _records(fakes["record"]))
    assert sorted(p.name for p in log_dir.glob("worker-*.log")) == ["worker-0.log", "worker-1.log"]


def test_ssh_launcher_never_takes_a_stale_pid_file_for_a_worker(fakes):
    # A pid file left by a worker that died unseen (kill -9, a reboot) now names another
    # process of the same user: status must not report it, start must start a worker in its
    # place, and stop must not send it SIGTERM.
    hostfile = fakes["tmp"] / "hosts"
    hostfile.write_text("node-a 1\n")
    log_dir = fakes["tmp"] / "fleet"
    log_dir.mkdir()
    bystander = subprocess.Popen(["sleep", "120"])
    try:
        (log_dir / "worker-0.pid").write_text(f"{bystander.pid}\n")
        status = _fleet(fakes, "status", hostfile)
        assert status.returncode == 0, status.stderr
        assert "worker 0 stopped" in status.stdout

        started = _fleet(fakes, "start", hostfile)
        try:
            assert started.returncode == 0, started.stderr
            assert "worker 0 started (pid" in started.stdout
            worker = int((log_dir / "worker-0.pid").read_text())
            assert worker != bystander.pid
            assert _wait_for(lambda: len(_records(fakes["record"])) == 1)
        finally:
            stopped = _fleet(fakes, "stop", hostfile)
        assert stopped.returncode == 0, stopped.stderr
        assert not process_alive(worker)
        assert "terminated gracefully" in _records(fakes["record"])[0]

        # Stop with only the stale file left: the bystander lives, the file goes.
        (log_dir / "worker-0.pid").write_text(f"{bystander.pid}\n")
        stopped = _fleet(fakes, "stop", hostfile)
        assert stopped.returncode == 0, stopped.stderr
        assert bystander.poll() is None, "stop sent SIGTERM to a process that is no worker"
        assert list(log_dir.glob("worker-*.pid")) == []
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize(
    ("hosts", "env", "message", "code"),
    [
        ("node-a four\n", {}, "GPU count 'four' is not a positive number", 2),
        ("node-a 1\n", {"TUNEFLEET_DATABASE_URL": ""}, "set TUNEFLEET_DATABASE_URL", 1),
    ],
)
def test_ssh_launcher_bad_input(fakes, hosts, env, message, code):
    hostfile = fakes["tmp"] / "hosts"
    hostfile.write_text(hosts)
    out = _fleet(fakes, "start", hostfile, **env)
    assert out.returncode == code
    assert message in out.stderr
    assert _records(fakes["record"]) == []


def test_ssh_launcher_usage(fakes):
    out = subprocess.run(["bash", str(FLEET), "restart"], capture_output=True, text=True)
    assert out.returncode == 2 and "usage:" in out.stderr
