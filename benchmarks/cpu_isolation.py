"""Does the worker's own code generation disturb the kernel it times? CPU and GPU devices.

One fixed set of configurations of the README's GEMM space (``--size``, default
m=n=k=256; the first ``--configs`` legal ones drawn with seed 0) is prepared once, then each
configuration is timed by the measurement protocol (``Protocol()``, the defaults) under
every condition, conditions interleaved per configuration so that slow drift of the machine
falls on all of them alike:

``alone``     nothing of ours runs beside the timing
``busy``      the code-generation processes (as many as the worker's automatic sizing starts
              on this machine, or ``--procs``) generate code without a pause: loopy with its
              caches off, then (unless ``--no-prebuild``) an OpenCL build on the same device
              with the driver's caches off, as a worker's prebuilds do
``paused``    the same processes, stopped with SIGSTOP around each timing and continued with
              SIGCONT after it (what the worker does on a CPU device)
``affinity``  the same processes on one part of the cores, the timing process's threads on
              the rest (CPU devices only; skipped on one core)

Prints, per condition, the median over the configurations of median(condition) /
median(alone), and writes every figure to ``--out`` (JSON). Usage::

    python benchmarks/cpu_isolation.py                       # PoCL, the README's GEMM
    python benchmarks/cpu_isolation.py --device nvidia --size m=2048,n=2048,k=2048 \\
        --out benchmarks/published/gpu_prebuild_isolation.json
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import platform
import random
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tunefleet.agreement import noise as iqr_noise  # noqa: E402
from tunefleet.devices import DeviceInfo  # noqa: E402
from tunefleet.errors import InvalidConfiguration  # noqa: E402
from tunefleet.problems.base import Protocol  # noqa: E402
from tunefleet.problems.registry import get_problem  # noqa: E402

PUBLISHED = ROOT / "benchmarks" / "published"
CONDITIONS = ("alone", "busy", "paused", "affinity")


def _sizes(text: str) -> dict[str, int]:
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        out[key.strip()] = int(value)
    return out


def _busy_main(
    args: dict[str, Any],
    configs: list[dict[str, Any]],
    device: DeviceInfo,
    prebuild: bool,
    go: Any,
    stop: Any,
    seed: int,
) -> None:
    """A code-generation process that never rests while ``go`` is set."""
    # Real work every time: a cache hit would not compete for the cores.
    os.environ["LOOPY_NO_CACHE"] = "1"
    os.environ["PYOPENCL_NO_CACHE"] = "1"
    os.environ["CUDA_CACHE_DISABLE"] = "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    problem = get_problem("gemm")
    session = None
    if prebuild:
        from tunefleet.worker.device import open_session

        session = open_session(device)
    rng = random.Random(seed)
    while not stop.is_set():
        if not go.wait(0.2):
            continue
        config = rng.choice(configs)
        try:
            prepared = problem.prepare(args, config, device)
            if session is not None:
                problem.prebuild(prepared, session)
        except Exception:
            pass


def _prepare(args: dict[str, Any], config: dict[str, Any], device: DeviceInfo) -> Any:
    try:
        return get_problem("gemm").prepare(args, config, device)
    except InvalidConfiguration:
        return None


def _set_affinity(cpus: set[int]) -> None:
    """Every thread of this process (PoCL's included) onto ``cpus``."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="device pattern (default: the first CPU one)")
    ap.add_argument("--size", default="m=256,n=256,k=256")
    ap.add_argument("--configs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1, help="timings per configuration and condition")
    ap.add_argument("--procs", type=int, default=None, help="code-generation processes")
    ap.add_argument(
        "--prebuild",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the busy processes also build on the device (the worker's default)",
    )
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--deadline", type=float, default=480.0, help="stop timing after (s)")
    ap.add_argument("--out", type=Path, default=PUBLISHED / "cpu_isolation.json")
    opts = ap.parse_args()

    from tunefleet.worker.device import list_devices, open_session, select_device
    from tunefleet.worker.sizing import detect_resources, initial_sizing

    if opts.device is None:
        cpus = [d for d in list_devices() if "cpu" in str(d.extra.get("type", ""))]
        if not cpus:
            print("no CPU OpenCL device (install pyopencl[pocl]) and no --device", file=sys.stderr)
            return 2
        device = cpus[0]
    else:
        device = select_device(opts.device)
    on_cpu = "cpu" in str(device.extra.get("type", "")).split(",")
    cores = sorted(os.sched_getaffinity(0))
    conditions = [c for c in opts.conditions.split(",") if c]
    if not on_cpu or len(cores) < 2:
        conditions = [c for c in conditions if c != "affinity"]
    procs = opts.procs or initial_sizing(detect_resources(None, peers=1)).prepare_workers

    problem = get_problem("gemm")
    args = problem.normalise_args({**_sizes(opts.size), "dtype": "float32"})
    space = problem.space(args)
    rng = random.Random(0)
    candidates: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(20000):
        if len(candidates) >= 5 * opts.configs:
            break
        try:
            config = problem.check_config(args, space.sample(rng))
        except InvalidConfiguration:
            continue
        key = json.dumps(config, sort_keys=True)
        if key not in seen:
            seen.add(key)
            candidates.append(config)
    t0 = time.monotonic()
    timed_ones, others = candidates[: 2 * opts.configs], candidates[2 * opts.configs :]
    # Prepared in parallel (before anything is timed): the code generation is the slow part.
    with cf.ProcessPoolExecutor(len(cores), mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = [ex.submit(_prepare, args, c, device) for c in timed_ones]
        chosen = []
        for config, future in zip(timed_ones, futures, strict=True):
            prepared = future.result()
            if prepared is not None:
                chosen.append((config, prepared))
            if len(chosen) == opts.configs:
                for rest in futures:
                    rest.cancel()  # the spares were only for illegal ones
                break
    print(f"prepared {len(chosen)} configurations in {time.monotonic() - t0:.0f} s", flush=True)

    session = open_session(device)
    protocol = Protocol()
    ctx = multiprocessing.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    busy = [
        ctx.Process(
            target=_busy_main,
            args=(args, others or [c for c, _ in chosen], device, opts.prebuild, go, stop, i),
            daemon=True,
        )
        for i in range(procs)
    ]
    for p in busy:
        p.start()
    half = max(1, len(cores) // 2)
    device_cpus, pool_cpus = set(cores[:half]), set(cores[half:])
    medians: dict[str, list[list[float]]] = {c: [[] for _ in chosen] for c in conditions}
    noise: dict[str, list[float]] = {c: [] for c in conditions}
    try:
        # Warm every kernel once (its build, first-touch of its buffers) outside the figures.
        for _, prepared in chosen:
            problem.measure(prepared, session, protocol)
        for _ in range(opts.rounds):
            for i, (_config, prepared) in enumerate(chosen):
                if time.monotonic() - t0 > opts.deadline:
                    print(f"--deadline {opts.deadline:g} s reached: stopping", flush=True)
                    break
                for cond in conditions:
                    if cond == "alone":
                        go.clear()
                    else:
                        go.set()
                    if cond == "affinity":
                        _set_affinity(device_cpus)
                        for p in busy:
                            os.sched_setaffinity(p.pid, pool_cpus)
                    time.sleep(0.3)  # let the busy processes get going (or settle down)
                    paused = cond == "paused"
                    if paused:
                        for p in busy:
                            os.kill(p.pid, signal.SIGSTOP)
                    try:
                        out = problem.measure(prepared, session, protocol)
                    finally:
                        if paused:
                            for p in busy:
                                os.kill(p.pid, signal.SIGCONT)
                        if cond == "affinity":
                            _set_affinity(set(cores))
                            for p in busy:
                                os.sched_setaffinity(p.pid, set(cores))
                    if out.median_s is None:
                        raise RuntimeError(f"configuration {i} did not measure: {out.error}")
                    medians[cond][i].append(out.median_s)
                    noise[cond].append(iqr_noise(out.samples_s))
                print(f"configuration {i + 1}/{len(chosen)} timed", flush=True)
    finally:
        go.clear()
        stop.set()
        for p in busy:
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            p.join(10)
            if p.is_alive():
                p.kill()

    done = [i for i in range(len(chosen)) if all(medians[c][i] for c in conditions)]
    per_config = {c: [statistics.median(medians[c][i]) for i in done] for c in conditions}
    alone = per_config["alone"]
    rows = []
    for cond in conditions:
        ratios = [x / a for x, a in zip(per_config[cond], alone, strict=True)]
        rows.append(
            {
                "condition": cond,
                "median_ratio": statistics.median(ratios),
                "min_ratio": min(ratios),
                "max_ratio": max(ratios),
                "median_noise": statistics.median(noise[cond]),
                "ratios": ratios,
            }
        )
    print(
        f"\n{device.name} ({device.platform}), gemm {opts.size}, {len(done)} configurations, "
        f"{procs} code-generation process(es){' with prebuild' if opts.prebuild else ''}, "
        f"{len(cores)} cores"
    )
    print(f"{'condition':<10} {'median ratio':>13} {'min':>7} {'max':>7} {'IQR/median':>11}")
    for r in rows:
        print(
            f"{r['condition']:<10} {r['median_ratio']:>13.3f} {r['min_ratio']:>7.3f} "
            f"{r['max_ratio']:>7.3f} {100 * r['median_noise']:>10.1f}%"
        )
    result = {
        "benchmark": "cpu_isolation",
        "device": device.to_json(),
        "size": opts.size,
        "configs": [chosen[i][0] for i in done],
        "procs": procs,
        "prebuild": opts.prebuild,
        "rounds": opts.rounds,
        "cores": len(cores),
        "host": platform.node(),
        "python": platform.python_version(),
        "protocol": protocol.to_json(),
        "medians_s": {c: per_config[c] for c in conditions},
        "rows": rows,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
