"""Prove that the process-level tests are stable: run them N times under added CPU load.

    python tests/stability.py                       # 20 runs of tests/acceptance, load = cores
    python tests/stability.py --runs 3 --load 2     # a quick check
    python tests/stability.py --runs 5 -- tests/acceptance/test_worker_processes.py -k signal

Each run is one ``pytest`` session over the selected tests (default ``tests/acceptance``: the
worker and coordinator processes, the chaos run, the benchmark smoke tests) while ``--load``
busy-loop processes keep every core busy (default: one per core), so the tests meet the
scheduling delays of a shared or slow machine. Every run gets its own seed, printed and
recorded: it orders the tests (``TUNEFLEET_TEST_SHUFFLE``, see ``tests/conftest.py``), picks
the chaos schedule (``TUNEFLEET_CHAOS_SEED``) and sets ``PYTHONHASHSEED``. Replay one run with
``--seed SEED --runs 1``.

At the end: a table of the runs, a tally of the tests that failed (with the seeds of the runs
they failed in), and a JSON file (``--out``) with all of it. The output of a failed run is kept
in ``--log-dir``. Exit status 0 only when every run passed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SELECTION = ["tests/acceptance"]
BUSY_LOOP = "while True:\n    pass\n"


@dataclass
class Failure:
    test: str
    kind: str  # failure | error
    message: str


@dataclass
class Run:
    index: int
    seed: int
    returncode: int
    seconds: float
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    failures: list[Failure] = field(default_factory=list)
    log: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.failures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Arguments after -- go to pytest instead of the default selection "
        f"({' '.join(DEFAULT_SELECTION)}); pytest runs in the checkout's root, so give paths "
        "relative to it.",
    )
    p.add_argument("--runs", type=int, default=20, help="pytest sessions to run (default 20)")
    p.add_argument(
        "--load",
        type=int,
        default=os.cpu_count() or 1,
        help="busy-loop processes kept running meanwhile (default: one per core; 0 = none)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the first run; run i gets SEED + i (default: a random one, printed)",
    )
    p.add_argument(
        "--run-timeout",
        type=float,
        default=1800.0,
        help="seconds one pytest session may take before it counts as failed (default 1800)",
    )
    p.add_argument(
        "--out", default="stability.json", help="JSON file to write (default stability.json)"
    )
    p.add_argument(
        "--log-dir",
        default="stability-logs",
        help="folder for the output of failed runs (default stability-logs)",
    )
    p.add_argument("pytest_args", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs {args.runs}: use a positive number")
    if args.load < 0:
        p.error(f"--load {args.load}: use zero or a positive number")
    if args.run_timeout <= 0:
        p.error(f"--run-timeout {args.run_timeout:g}: use a positive number of seconds")
    return args


@contextlib.contextmanager
def cpu_load(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` busy-loop processes for the duration of the block (killed on the way out)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL)
        for _ in range(n)
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def read_junit(path: Path) -> tuple[dict[str, int], list[Failure]]:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures: list[Failure] = []
    if not path.exists():
        return counts, failures
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        test = f"{classname.replace('.', '/')}.py::{name}" if classname else name
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "errors"
                message = (child.get("message") or child.text or "").strip()
                first = message.splitlines()[0] if message else ""
                failures.append(Failure(test, child.tag, first[:300]))
                break
            if child.tag == "skipped":
                outcome = "skipped"
        counts[outcome] += 1
    return counts, failures


def run_once(index: int, seed: int, args: argparse.Namespace, scratch: Path) -> Run:
    junit = scratch / f"run-{index}.xml"
    selection = args.pytest_args or DEFAULT_SELECTION
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        *selection,
    ]
    env = dict(os.environ)
    env.update(
        {
            "PYTHONHASHSEED": str(seed),
            "TUNEFLEET_TEST_SHUFFLE": str(seed),
            "TUNEFLEET_CHAOS_SEED": str(seed),
            "PYTHONUNBUFFERED": "1",
            # The tests start `tunefleet` and `python` by name: this interpreter's first.
            "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        }
    )
    started = time.monotonic()
    # Its own process group, so a session past its time goes with every process it started.
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        raw, _ = proc.communicate(timeout=args.run_timeout)
        code, output = proc.returncode, raw.decode(errors="replace")
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raw, _ = proc.communicate()
        code = -signal.SIGKILL
        output = (
            raw.decode(errors="replace") + f"\n(stability: killed after {args.run_timeout:g} s)\n"
        )
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    seconds = time.monotonic() - started
    counts, failures = read_junit(junit)
    run = Run(index, seed, code, seconds, **counts, failures=failures)
    if code != 0 and not failures:
        # Killed, crashed or interrupted before junit could name a test: still a failure.
        run.failures.append(Failure("(session)", "error", f"pytest exited with status {code}"))
    if not run.ok:
        log_dir = Path(args.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"run-{index}-seed-{seed}.log"
        log.write_text(output)
        run.log = str(log)
    return run


def table(runs: list[Run]) -> str:
    head = "| run | seed | result | passed | failed | errors | skipped | seconds |"
    rule = "|----:|-----:|:-------|-------:|-------:|-------:|--------:|--------:|"
    rows = [
        f"| {r.index} | {r.seed} | {'ok' if r.ok else 'FAIL'} | {r.passed} | {r.failed} "
        f"| {r.errors} | {r.skipped} | {r.seconds:.0f} |"
        for r in runs
    ]
    return "\n".join([head, rule, *rows])


def tally(runs: list[Run]) -> dict[str, list[int]]:
    """Failed test id -> the seeds of the runs it failed in."""
    out: dict[str, list[int]] = {}
    for r in runs:
        for f in r.failures:
            out.setdefault(f.test, []).append(r.seed)
    return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**9)
    selection = args.pytest_args or DEFAULT_SELECTION
    print(
        f"stability: {args.runs} run(s) of pytest {shlex.join(selection)} with {args.load} "
        f"busy-loop process(es) on {os.cpu_count()} core(s); seeds {base}..{base + args.runs - 1}",
        flush=True,
    )
    # A SIGTERM ends the runs like Ctrl-C does: the load and the session in flight go too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    runs: list[Run] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tunefleet-stability-") as tmp, cpu_load(args.load):
        scratch = Path(tmp)
        for i in range(args.runs):
            run = run_once(i + 1, base + i, args, scratch)
            runs.append(run)
            status = "ok" if run.ok else f"FAILED ({len(run.failures)}; log {run.log})"
            print(
                f"run {run.index}/{args.runs} seed {run.seed}: {run.passed} passed, "
                f"{run.failed} failed, {run.errors} errors in {run.seconds:.0f} s: {status}",
                flush=True,
            )
            for f in run.failures:
                print(f"    {f.kind}: {f.test} (seed {run.seed}): {f.message}", flush=True)
    total = time.monotonic() - started
    failed = tally(runs)
    print()
    print(table(runs))
    print()
    good = sum(r.ok for r in runs)
    print(f"{good}/{len(runs)} runs passed in {total / 60:.1f} min")
    if failed:
        print()
        print("| test | failed runs | seeds |")
        print("|:-----|------------:|:------|")
        for test, seeds in failed.items():
            print(f"| {test} | {len(seeds)} | {', '.join(map(str, seeds))} |")
    data = {
        "selection": selection,
        "runs_asked": args.runs,
        "load": args.load,
        "cores": os.cpu_count(),
        "first_seed": base,
        "python": sys.version.split()[0],
        "seconds": total,
        "passed_runs": good,
        "runs": [asdict(r) | {"ok": r.ok} for r in runs],
        "failed_tests": failed,
    }
    out = Path(args.out)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if good == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
