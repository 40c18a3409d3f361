"""Worker memory over a long run: resident memory of one worker process and its children
(device process, code-generation process, multiprocessing's resource tracker) as it works
through many short synthetic trials. A leak shows as growth between the checkpoints.

One ``python -m tunefleet.worker --device host`` (default settings, no verbose logging) serves
``--trials`` synthetic trials of ``--duration`` seconds, enqueued at once. Whenever the number
of finished trials passes a multiple of ``--every``, every process of the worker is sampled
from ``/proc``: ``VmRSS`` (resident now), ``Pss`` (resident, shared pages split) and ``VmHWM``
(peak resident so far).

    python benchmarks/worker_memory.py                 # 1,000 trials, samples every 100
    python benchmarks/worker_memory.py --trials 200 --every 100

Writes ``benchmarks/results/worker_memory.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tests.helpers.launch import start_worker
from tunefleet.db.engine import connect
from tunefleet.queries import bench as bq

NAME = "worker_memory"
#: Growth between the first and the last checkpoint that still counts as noise.
NOISE_MIB = 2.0
NOISE_SHARE = 0.03


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=1000, help="trials to run (default 1000)")
    p.add_argument("--every", type=int, default=100, help="sample every N trials (default 100)")
    p.add_argument(
        "--duration", type=float, default=0.001, help="seconds per trial (default 0.001)"
    )
    p.add_argument(
        "--prepare-workers", type=int, default=None, help="worker --prepare-workers (default: its)"
    )
    p.add_argument(
        "--db",
        default=None,
        help="a scratch database URL (default: a private embedded server in a temporary directory)",
    )
    p.add_argument("--out", default=None, help="JSON file or folder (default benchmarks/results)")
    return p.parse_args(argv)


def label(processes: list[dict[str, Any]], worker_pid: int) -> list[dict[str, Any]]:
    """Name each process's role. The worker starts its device process first and its
    code-generation process at the first trial, so spawned children in pid order are
    the device process, then the code-generation ones."""
    out = []
    spawned = 0
    for proc in sorted(processes, key=lambda p: p["pid"]):
        if proc["pid"] == worker_pid:
            name = "worker"
        elif "resource_tracker" in proc["cmd"]:
            name = "resource tracker"
        elif "spawn_main" in proc["cmd"]:
            name = "device process" if spawned == 0 else f"code-generation process {spawned}"
            spawned += 1
        else:
            name = proc["name"]
        out.append({"role": name, **proc})
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkpoints = list(range(args.every, args.trials + 1, args.every))
    if not checkpoints or checkpoints[-1] != args.trials:
        checkpoints.append(args.trials)
    out: dict[str, Any] = {
        "benchmark": NAME,
        "command": " ".join(["python", "benchmarks/worker_memory.py", *(argv or sys.argv[1:])]),
        "machine": h.machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "samples": [],
    }
    log_dir = Path(tempfile.mkdtemp(prefix="tunefleet-memory-"))
    started = time.monotonic()
    try:
        with h.database(args.db) as url, connect(url) as conn:
            out["postgresql"] = h.server_version(url)
            worker = start_worker(
                url,
                log_path=log_dir / "worker.log",
                drain=False,
                prepare_workers=args.prepare_workers,
                verbose=False,
            )
            try:
                runs = h.enqueue_synthetic(conn, args.trials, {"duration": args.duration}, "mem")
                todo = list(checkpoints)
                deadline = time.monotonic() + 120 + args.trials * (args.duration + 0.2)
                while todo:
                    finished = args.trials - bq.open_trials(conn, runs)
                    if finished >= todo[0]:
                        mem = h.tree_memory(worker.pid)
                        sample = {
                            "trials": finished,
                            "seconds": time.monotonic() - started,
                            "rss": mem["rss"],
                            "pss": mem["pss"],
                            "hwm": mem["hwm"],
                            "processes": label(mem["processes"], worker.pid),
                        }
                        out["samples"].append(sample)
                        print(
                            f"[{h.elapsed(started)}] {finished:6d} trials: RSS {mem['rss']:.1f} "
                            f"MiB, PSS {mem['pss']:.1f} MiB, peak {mem['hwm']:.1f} MiB over "
                            f"{mem['count']} processes",
                            flush=True,
                        )
                        while todo and finished >= todo[0]:
                            todo.pop(0)
                        continue
                    if not worker.alive:
                        raise SystemExit(f"the worker exited:\n{worker.log()[-2000:]}")
                    if time.monotonic() > deadline:
                        raise SystemExit(f"only {finished} of {args.trials} trials finished")
                    time.sleep(0.02)
                out["trials_per_second"] = args.trials / (time.monotonic() - started)
            finally:
                worker.stop()
                try:
                    worker.wait(30)
                except Exception:
                    worker.kill()
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)

    first, last = out["samples"][0], out["samples"][-1]
    growth = {k: last[k] - first[k] for k in ("rss", "pss", "hwm")}
    limit = max(NOISE_MIB, NOISE_SHARE * first["hwm"])
    out["growth_mib"] = growth
    out["noise_limit_mib"] = limit
    out["verdict"] = "flat" if growth["hwm"] <= limit and growth["rss"] <= limit else "grows"
    roles = sorted({p["role"] for s in out["samples"] for p in s["processes"]})
    headers = ["trials", "RSS MiB", "PSS MiB", "peak RSS MiB"] + [f"{r} peak" for r in roles]
    rows = []
    for s in out["samples"]:
        per_role = {r: sum(p["hwm"] for p in s["processes"] if p["role"] == r) for r in roles}
        rows.append(
            [s["trials"], h.fmt(s["rss"], 1), h.fmt(s["pss"], 1), h.fmt(s["hwm"], 1)]
            + [h.fmt(per_role[r], 1) for r in roles]
        )
    print()
    print(h.table(headers, rows))
    print(
        f"growth from {first['trials']} to {last['trials']} trials: RSS {growth['rss']:+.1f} "
        f"MiB, peak {growth['hwm']:+.1f} MiB (noise limit {limit:.1f} MiB): {out['verdict']}"
    )
    h.write_json(NAME, out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
