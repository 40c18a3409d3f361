"""Prove the README's test command from fresh clones: quiet runs, and runs with every core busy.

    python tests/fresh_clones.py --quiet 5 --loaded 3          # one after another, here
    python tests/fresh_clones.py --quiet 5 --loaded 3 --slots 8 --cores-per-slot 2

Each run clones this checkout's ``HEAD`` into a new folder, makes a virtual environment with
this interpreter, and runs the README's two steps there: ``pip install -e '.[test]'`` and
``python -m pytest -q`` (with a JUnit file added, to count the tests). A *loaded* run keeps
one busy-loop process per core of its slot running meanwhile.

``--slots N --cores-per-slot C`` runs N clones at a time, each pinned to its own C CPUs (and
its busy loops to the same CPUs): on a machine with many cores, every slot is a small machine
of C cores. Without ``--slots`` the runs take turns on the whole machine. ``--pip-args``
passes options to the install (``--no-index --find-links WHEELS`` where no package index can
be reached).

Prints a table of the runs (install and test times, counts, the failed tests) and writes a JSON
file (``--out``); the output of a failed run is kept in ``--log-dir``. Exit status 0 only when
every run passed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.stability import BUSY_LOOP, Failure, read_junit

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class CloneRun:
    index: int
    kind: str  # quiet | loaded
    cpus: list[int] | None
    commit: str
    returncode: int = -1
    install_s: float = 0.0
    test_s: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    log: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.failures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quiet", type=int, default=5, help="runs with nothing else (default 5)")
    p.add_argument("--loaded", type=int, default=3, help="runs with every core busy (default 3)")
    p.add_argument("--slots", type=int, default=0, help="clones at a time, each on its own CPUs")
    p.add_argument("--cores-per-slot", type=int, default=2, help="CPUs of a slot (default 2)")
    p.add_argument("--pip-args", default="", help="extra options for the install, one string")
    p.add_argument("--run-timeout", type=float, default=3600.0, help="seconds per run's tests")
    p.add_argument("--out", default="fresh_clones.json", help="JSON file to write")
    p.add_argument("--log-dir", default="fresh-clone-logs", help="output of failed runs")
    args = p.parse_args(argv)
    if args.quiet < 0 or args.loaded < 0 or args.quiet + args.loaded == 0:
        p.error(f"--quiet {args.quiet} --loaded {args.loaded}: ask for at least one run")
    if args.slots < 0 or args.cores_per_slot < 1:
        p.error(
            f"--slots {args.slots} --cores-per-slot {args.cores_per_slot}: use positive numbers"
        )
    if args.slots:
        have = sorted(os.sched_getaffinity(0))
        if args.slots * args.cores_per_slot > len(have):
            p.error(
                f"--slots {args.slots} x --cores-per-slot {args.cores_per_slot} needs "
                f"{args.slots * args.cores_per_slot} CPUs; this process may use {len(have)}"
            )
    return args


def _pinned(cpus: list[int] | None):  # type: ignore[no-untyped-def]
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def one_run(run: CloneRun, args: argparse.Namespace, scratch: Path) -> CloneRun:
    folder = scratch / f"clone-{run.index}"
    log: list[str] = []

    def step(argv: list[str], cwd: Path, timeout: float) -> int:
        log.append(f"$ {shlex.join(argv)}")
        # Its own process group: past its time, it goes with every process it started (the
        # test sessions' servers and workers too).
        proc = subprocess.Popen(
            argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, preexec_fn=_pinned(run.cpus), start_new_session=True,
            env={**os.environ, "PATH": f"{folder / '.venv' / 'bin'}{os.pathsep}"
                 f"{os.environ.get('PATH', '')}", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            log.append(out.decode(errors="replace"))
            log.append(f"(fresh_clones: killed after {timeout:g} s)")
            return -signal.SIGKILL
        log.append(out.decode(errors="replace"))
        return proc.returncode

    started = time.monotonic()
    code = step(["git", "clone", "--quiet", str(ROOT), str(folder)], scratch, 300)
    if code == 0:
        code = step([sys.executable, "-m", "venv", ".venv"], folder, 300)
    python = str(folder / ".venv" / "bin" / "python")
    if code == 0:
        extra = shlex.split(args.pip_args)
        code = step([python, "-m", "pip", "install", "-q", *extra, "-e", ".[test]"], folder, 1800)
    run.install_s = time.monotonic() - started
    if code == 0:
        busy = []
        if run.kind == "loaded":
            n = len(run.cpus) if run.cpus else (os.cpu_count() or 1)
            busy = [
                subprocess.Popen(
                    [sys.executable, "-c", BUSY_LOOP],
                    stdin=subprocess.DEVNULL,
                    preexec_fn=_pinned(run.cpus),
                )
                for _ in range(n)
            ]
        t0 = time.monotonic()
        junit = folder / "junit.xml"
        try:
            code = step(
                [python, "-m", "pytest", "-q", f"--junitxml={junit}"], folder, args.run_timeout
            )
        finally:
            for proc in busy:
                proc.kill()
                proc.wait()
        run.test_s = time.monotonic() - t0
        run.counts, run.failures = read_junit(junit)
    run.returncode = code
    if not run.ok:
        logs = Path(args.log_dir)
        logs.mkdir(parents=True, exist_ok=True)
        path = logs / f"clone-{run.index}-{run.kind}.log"
        path.write_text("\n".join(log))
        run.log = str(path)
    shutil.rmtree(folder, ignore_errors=True)
    return run


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    kinds = ["quiet"] * args.quiet + ["loaded"] * args.loaded
    cpus = sorted(os.sched_getaffinity(0))
    width = args.cores_per_slot

    def slot_cpus(i: int) -> list[int] | None:
        if not args.slots:
            return None
        slot = i % args.slots
        return cpus[slot * width : (slot + 1) * width]

    runs = [CloneRun(i + 1, kind, slot_cpus(i), commit) for i, kind in enumerate(kinds)]
    where = (
        f"{args.slots} at a time, {width} CPUs each" if args.slots else "one at a time, all CPUs"
    )
    print(f"{len(runs)} fresh clones of {commit} ({where}): {args.quiet} quiet, "
          f"{args.loaded} loaded", flush=True)  # fmt: skip
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tunefleet-fresh-") as tmp:
        with ThreadPoolExecutor(max_workers=args.slots or 1) as pool:
            for run in pool.map(lambda r: one_run(r, args, Path(tmp)), runs):
                c = run.counts
                print(
                    f"clone {run.index} ({run.kind}): {'ok' if run.ok else 'FAILED'}, "
                    f"{c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
                    f"{c.get('errors', 0)} errors in {run.test_s:.0f} s "
                    f"(install {run.install_s:.0f} s)" + (f"; log {run.log}" if run.log else ""),
                    flush=True,
                )
    print()
    print(
        "| clone | kind | CPUs | result | passed | failed | errors | skipped | install s"
        " | tests s |"
    )
    print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        c = r.counts
        print(
            f"| {r.index} | {r.kind} | {','.join(map(str, r.cpus)) if r.cpus else 'all'} | "
            f"{'ok' if r.ok else 'FAILED'} | {c.get('passed', 0)} | {c.get('failed', 0)} | "
            f"{c.get('errors', 0)} | {c.get('skipped', 0)} | {r.install_s:.0f} | {r.test_s:.0f} |"
        )
    for r in runs:
        for f in r.failures:
            print(f"clone {r.index} ({r.kind}): {f.kind} {f.test}: {f.message}")
    passed = sum(r.ok for r in runs)
    print(f"\n{passed}/{len(runs)} runs passed in {(time.monotonic() - started) / 60:.1f} min")
    Path(args.out).write_text(
        json.dumps(
            {
                "commit": commit,
                "python": sys.version.split()[0],
                "cpus": len(cpus),
                "slots": args.slots,
                "cores_per_slot": width if args.slots else None,
                "runs": [asdict(r) | {"ok": r.ok} for r in runs],
                "passed_runs": passed,
            },
            indent=2,
        )
    )
    return 0 if passed == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
