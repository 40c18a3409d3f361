"""Tuning on GPUs with the whole system: embedded PostgreSQL, real workers (one per GPU), the
coordinator's engine in this process, a fixed wall budget per tuning run.

Parts (``--parts``, comma list):

``gemm``       GEMM float32 n = m = k = 4096 tuned for ``--budget`` seconds by one worker on
               the first GPU; then the best configuration is timed again here (OpenCL, the
               problem's own measure path) and cuBLAS through PyTorch with TF32 off (in a child
               process), same run: ratio = best loopy GFLOP/s / cuBLAS GFLOP/s.
``face_mass``  the DG face-mass einsum float64 (the problem's default sizes), tuned twice for
               ``--budget`` seconds by one worker: pipelined (the worker's code-generation
               process prepares the next configurations while the device times the current
               one; ``--prefetch`` / ``--prepare-workers``, default the worker's) and one at a
               time (``--prefetch 0 --prepare-workers 0``: prepared in the device process right
               before timing). Best GFLOP/s, evaluations per minute of each, and the best
               kernel as a fraction of the memory roofline: its bytes moved per second over the
               device copy bandwidth measured in the same run (OpenCL buffer copy and a
               PyTorch copy, bytes read + written; the larger is the roofline).
``workers``    face-mass float64 and GEMM float32 with 1, 2, 4, ... workers (one per GPU, up to
               ``--workers``): evaluations per minute and best GFLOP/s against the number of
               GPUs.

Every tuning run gets a fresh embedded server (so no run answers another's configurations from
the cache) and starts from the problem's default configuration as its first trial, as a user
seeds a run with ``--seed-config`` (``--no-seed``: from nothing). One JSON per part
(``gpu_gemm.json``, ``gpu_face_mass.json``, ``gpu_workers.json``) is written as soon as the
part ends, to ``--out``, else ``$OUT``, else ``benchmarks/results``.
A part that fails records its error and the next one runs. Each tuning run costs about
``--budget`` plus a minute (start-up, shutdown); ``--deadline`` skips what would not finish in
time. ``--max-trials`` also ends each tuning run after that many evaluations (a smoke run that
must measure something however slow the machine is).

    python benchmarks/gpu_tuning.py --parts gemm,face_mass --budget 120
    python benchmarks/gpu_tuning.py --parts workers --workers 2 --budget 90
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tests.helpers.launch import WorkerProcess, start_worker
from tunefleet.db.engine import connect
from tunefleet.queries import bench as bq
from tunefleet.queries import search

GEMM_ARGS: dict[str, Any] = {"n": 4096, "m": 4096, "k": 4096, "dtype": "float32"}
FACE_MASS_ARGS: dict[str, Any] = {"dtype": "float64"}
#: Seconds a tuning run costs beyond its budget: server, workers, shutdown (an estimate).
RUN_OVERHEAD_S = 60.0
#: How the best GEMM configuration is timed again after tuning.
RETIME = {"warmup": 3, "min_launches": 30, "min_seconds": 1.0, "max_launches": 500}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="gemm,face_mass", help="gemm, face_mass, workers")
    p.add_argument("--budget", type=float, default=600.0, help="seconds per tuning run")
    p.add_argument("--workers", type=int, default=2, help="most workers of the workers part")
    p.add_argument("--prefetch", type=int, default=None, help="pipelined runs: worker --prefetch")
    p.add_argument(
        "--prepare-workers",
        type=int,
        default=None,
        help="pipelined runs: worker --prepare-workers",
    )
    p.add_argument("--deadline", type=float, default=None, help="seconds for the whole script")
    p.add_argument(
        "--max-trials",
        type=int,
        default=None,
        help="also end each tuning run after this many evaluations (default: only --budget)",
    )
    p.add_argument(
        "--gemm-args",
        default=None,
        help="override GEMM arguments, e.g. n=256,m=256,k=256 (default n=m=k=4096 float32)",
    )
    p.add_argument(
        "--face-mass-args",
        default=None,
        help="override face-mass arguments, e.g. n_elements=1024 (default: its defaults)",
    )
    p.add_argument(
        "--device-type",
        default="gpu",
        help="OpenCL device type to use: gpu (default) or any (e.g. a CPU device, for trying "
        "the script without a GPU)",
    )
    p.add_argument(
        "--no-seed",
        action="store_true",
        help="start the search from nothing (default: the problem's default configuration is "
        "the first trial, as a user seeds it with --seed-config)",
    )
    p.add_argument("--out", default=None, help="folder for the JSON files")
    return p.parse_args(argv)


def parse_kv(text: str | None, base: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value.strip()
    return out


class Clock:
    """The script's deadline: whether another step of ``cost`` seconds still fits."""

    def __init__(self, deadline: float | None) -> None:
        self.start = time.monotonic()
        self.deadline = deadline

    def left(self) -> float:
        if self.deadline is None:
            return float("inf")
        return self.deadline - (time.monotonic() - self.start)

    def fits(self, cost: float) -> bool:
        return cost <= self.left()

    def stamp(self) -> str:
        return f"[{time.monotonic() - self.start:7.1f}s]"


def say(clock: Clock, *parts: Any) -> None:
    print(clock.stamp(), *parts, flush=True)


# --- devices ----------------------------------------------------------------------------------
def find_devices(kind: str) -> list[Any]:
    from tunefleet.worker.device import list_devices

    devices = list_devices()
    if kind == "any":
        return devices
    return [d for d in devices if kind in d.extra.get("type", "")]


# --- one tuning run ---------------------------------------------------------------------------
def tune(
    clock: Clock,
    label: str,
    problem: str,
    problem_args: dict[str, Any],
    devices: list[Any],
    budget: float,
    *,
    prefetch: int | None = None,
    prepare_workers: int | None = None,
    seed_default: bool = True,
    max_trials: int | None = None,
) -> dict[str, Any]:
    """Tune ``problem`` for ``budget`` seconds with one worker per device, each run on a
    fresh embedded server. Returns the numbers, or what is known and ``error``."""
    from tunefleet.coordinator.budget import Budget
    from tunefleet.coordinator.create import create_run
    from tunefleet.coordinator.engine import Coordinator
    from tunefleet.coordinator.settings import CoordinatorSettings
    from tunefleet.problems.registry import get_problem

    log_dir = Path(tempfile.mkdtemp(prefix=f"tunefleet-gpu-{label}-"))
    out: dict[str, Any] = {
        "label": label,
        "problem": problem,
        "args": problem_args,
        "workers": len(devices),
        "devices": [f"{d.index}: {d.name}" for d in devices],
        "budget_s": budget,
        "max_trials": max_trials,
        "prefetch": prefetch,
        "prepare_workers": prepare_workers,
    }
    seeds = []
    if seed_default:
        prob = get_problem(problem)
        seeds = [prob.default_config(prob.normalise_args(problem_args))]
        out["seed"] = seeds[0]
    fleet: list[WorkerProcess] = []
    try:
        with h.database(None) as url:
            started = time.monotonic()
            for i, device in enumerate(devices):
                fleet.append(
                    start_worker(
                        url,
                        log_path=log_dir / f"worker-{i}.log",
                        device=str(device.index),
                        drain=False,
                        prefetch=prefetch,
                        prepare_workers=prepare_workers,
                    )
                )
            wait_ready(fleet, 300)
            out["workers_ready_s"] = time.monotonic() - started
            say(clock, f"{label}: {len(fleet)} worker(s) ready; tuning for {budget:g} s")
            # A worker holds 1 + prefetch trials, and the coordinator keeps at least that many
            # queued per live worker (worker.capacity). One more per worker, as the published
            # runs had, so a trial is waiting the moment the device finishes one.
            depth = None if not prefetch or prefetch <= 1 else float(prefetch + 2)
            out["depth_factor"] = depth
            settings = CoordinatorSettings.build(
                problem=problem,
                problem_args=problem_args,
                device_class=devices[0].device_class,
                name=label,
                budget=Budget.build(max_seconds=budget, max_trials=max_trials),
                depth_factor=depth,
                seed_configs=seeds,
                # Evaluations per minute of the search, comparable with the published runs:
                # the confirmation after the budget would add its evaluations to the wall time.
                confirm=0,
            )
            last = [0.0]

            def progress(p: Any) -> None:
                if time.monotonic() - last[0] >= 15:
                    last[0] = time.monotonic()
                    best = f"{p.best_gflops:.1f} GFLOP/s" if p.best_gflops else "no result yet"
                    say(
                        clock,
                        f"{label}: {p.finished} evaluated ({p.failed} failed), "
                        f"{p.in_flight} in flight, best {best}",
                    )

            t0 = time.monotonic()
            run_id = create_run(settings, url)
            result = Coordinator(settings, url).run(run_id, progress_callback=progress)
            wall = time.monotonic() - t0
            stop_fleet(fleet)
            with connect(url) as conn:
                states = bq.state_counts(conn, [run_id])
                rows = bq.measurements(conn, [run_id])
                best = search.best_of_run(conn, run_id)
                failures = bq.failure_reasons(conn, [run_id])
            compile_s = [float(r["compile_s"]) for r in rows if r["compile_s"] is not None]
            out.update(
                {
                    "run_id": run_id,
                    "stop_reason": result.stop_reason,
                    "tuning_wall_s": wall,
                    "evaluations": result.trials,
                    "evaluations_per_minute": result.trials / (wall / 60.0),
                    "states": states,
                    "best_config": best.config if best else None,
                    "best_median_s": best.median_s if best else None,
                    "best_gflops": best.gflops if best else None,
                    "best_gbps": best.gbps if best else None,
                    "byte_count": rows[0]["byte_count"] if rows else None,
                    "seed_gflops": next(
                        (r["gflops"] for r in rows if seeds and r["config"] == seeds[0]), None
                    ),
                    "compile_s": h.summary(compile_s),
                    "failures": [{**f, "error": f["error"][:300]} for f in failures[:10]],
                    "top5": [
                        {k: r[k] for k in ("config", "median_s", "gflops", "gbps")}
                        for r in rows[:5]
                    ],
                }
            )
            say(
                clock,
                f"{label}: {result.trials} evaluations in {wall:.0f} s "
                f"({out['evaluations_per_minute']:.1f}/min), best "
                f"{out['best_gflops'] or 0:.1f} GFLOP/s",
            )
    except Exception as exc:
        out["error"] = repr(exc)
        out["traceback"] = traceback.format_exc()[-3000:]
        out["worker_logs"] = {w.log_path.name: w.log()[-3000:] for w in fleet}
        say(clock, f"{label}: failed: {exc!r}")
    finally:
        for w in fleet:
            if w.alive:
                w.kill()
        shutil.rmtree(log_dir, ignore_errors=True)
    return out


def wait_ready(fleet: list[WorkerProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all("waiting for work" in w.log() for w in fleet):
        for w in fleet:
            if not w.alive:
                raise RuntimeError(f"a worker exited at start-up: {w.log()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not ready after {timeout:.0f} s")
        time.sleep(0.5)


def stop_fleet(fleet: list[WorkerProcess], grace: float = 20.0) -> None:
    """SIGTERM (the trial being timed finishes), then SIGKILL after ``grace`` seconds."""
    for w in fleet:
        w.stop()
    deadline = time.monotonic() + grace
    for w in fleet:
        try:
            w.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            w.kill()


# --- measurements outside the fleet -------------------------------------------------------------
def retime(problem: str, args: dict[str, Any], config: dict[str, Any], device: Any) -> Any:
    """Time one configuration here, through the problem's own prepare and measure."""
    from tunefleet.problems.base import Protocol
    from tunefleet.problems.registry import get_problem
    from tunefleet.worker.device import open_session

    prob = get_problem(problem)
    prepared = prob.prepare(args, config, device)
    session = open_session(device)
    return prob.measure(prepared, session, Protocol.from_json({**Protocol().to_json(), **RETIME}))


TORCH_CODE = r"""
import json, sys, torch
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
def median_time(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(); fn(); end.record(); end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]
task = json.loads(sys.argv[1])
if "gemm" in task:
    n, m, k = task["gemm"]["n"], task["gemm"]["m"], task["gemm"]["k"]
    dt = getattr(torch, task["gemm"]["dtype"])
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, k, device="cuda", dtype=dt, generator=g)
    b = torch.randn(k, m, device="cuda", dtype=dt, generator=g)
    c = torch.empty(n, m, device="cuda", dtype=dt)
    t = median_time(lambda: torch.mm(a, b, out=c), 50)
    out["cublas_median_s"] = t
    out["cublas_gflops"] = 2.0 * n * m * k / t / 1e9
if "copy_bytes" in task:
    count = task["copy_bytes"] // 8
    src = torch.rand(count, device="cuda", dtype=torch.float64)
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), 30)
    out["torch_copy_gbps"] = 2.0 * count * 8 / t / 1e9
print("RESULT " + json.dumps(out))
"""


def torch_numbers(task: dict[str, Any]) -> dict[str, Any]:
    """cuBLAS and copy timings through PyTorch, in a child process (CUDA state stays out of
    this process, which holds OpenCL)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", TORCH_CODE, json.dumps(task)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": repr(exc)}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    return {"error": (proc.stderr or proc.stdout).strip()[-1500:] or f"exit {proc.returncode}"}


def opencl_copy_gbps(device: Any, nbytes: int) -> float:
    """Device-to-device buffer copy bandwidth (bytes read + written), median of 10."""
    import pyopencl as cl

    from tunefleet.worker.device import open_session

    session = open_session(device)
    assert session is not None
    src = cl.Buffer(session.context, cl.mem_flags.READ_WRITE, nbytes)
    dst = cl.Buffer(session.context, cl.mem_flags.READ_WRITE, nbytes)
    cl.enqueue_fill_buffer(session.queue, src, b"\x01\x02\x03\x04", 0, nbytes).wait()
    times = []
    for i in range(13):
        event = cl.enqueue_copy(session.queue, dst, src)
        event.wait()
        if i >= 3:
            times.append((event.profile.end - event.profile.start) * 1e-9)
    src.release()
    dst.release()
    return 2.0 * nbytes / h.quantile(times, 0.5) / 1e9


# --- the parts --------------------------------------------------------------------------------
def part_gemm(clock: Clock, args: argparse.Namespace, devices: list[Any]) -> dict[str, Any]:
    gemm_args = parse_kv(args.gemm_args, GEMM_ARGS)
    out: dict[str, Any] = {"part": "gemm"}
    out["tuning"] = tune(
        clock,
        "gemm",
        "gemm",
        gemm_args,
        devices[:1],
        args.budget,
        seed_default=not args.no_seed,
        max_trials=args.max_trials,
    )
    config = out["tuning"].get("best_config")
    if config is None:
        out["error"] = out["tuning"].get("error") or "no configuration was measured"
        return out
    from tunefleet.problems.registry import get_problem

    full_args = get_problem("gemm").normalise_args(gemm_args)
    say(clock, "gemm: timing the best configuration again and cuBLAS")
    outcome = retime("gemm", full_args, config, devices[0])
    out["best_retimed"] = {
        "state": outcome.state,
        "median_s": outcome.median_s,
        "gflops": outcome.gflops,
        "launches": len(outcome.samples_s),
        "error": outcome.error,
    }
    out["cublas"] = torch_numbers({"gemm": full_args})
    loopy = outcome.gflops
    cublas = out["cublas"].get("cublas_gflops")
    out["ratio_to_cublas"] = loopy / cublas if loopy and cublas else None
    if cublas:
        say(
            clock,
            f"gemm: best {loopy or 0:.0f} GFLOP/s, cuBLAS {cublas:.0f} GFLOP/s, ratio "
            f"{out['ratio_to_cublas'] or 0:.3f}",
        )
    else:
        say(clock, f"gemm: best {loopy or 0:.0f} GFLOP/s; cuBLAS unavailable ({out['cublas']})")
    return out


def part_face_mass(clock: Clock, args: argparse.Namespace, devices: list[Any]) -> dict[str, Any]:
    fm_args = parse_kv(args.face_mass_args, FACE_MASS_ARGS)
    out: dict[str, Any] = {"part": "face_mass"}
    out["pipelined"] = tune(
        clock,
        "face_mass-pipelined",
        "face_mass",
        fm_args,
        devices[:1],
        args.budget,
        prefetch=args.prefetch,
        prepare_workers=args.prepare_workers,
        seed_default=not args.no_seed,
        max_trials=args.max_trials,
    )
    if clock.fits(args.budget + RUN_OVERHEAD_S):
        out["one_at_a_time"] = tune(
            clock,
            "face_mass-one-at-a-time",
            "face_mass",
            fm_args,
            devices[:1],
            args.budget,
            prefetch=0,
            prepare_workers=0,
            seed_default=not args.no_seed,
            max_trials=args.max_trials,
        )
    else:
        out["one_at_a_time"] = {"skipped": "deadline"}
    pipe, single = out["pipelined"], out["one_at_a_time"]
    if single.get("evaluations_per_minute"):
        out["pipelined_speedup"] = pipe["evaluations_per_minute"] / single["evaluations_per_minute"]
    say(clock, "face_mass: measuring the copy bandwidth")
    nbytes = 1 << 30
    bandwidth: dict[str, Any] = {"bytes_per_copy": nbytes}
    try:
        bandwidth["opencl_copy_gbps"] = opencl_copy_gbps(devices[0], nbytes)
    except Exception as exc:  # the roofline still comes from PyTorch
        bandwidth["opencl_error"] = repr(exc)
    bandwidth.update(torch_numbers({"copy_bytes": nbytes}))
    out["copy_bandwidth"] = bandwidth
    peaks = [bandwidth.get("opencl_copy_gbps"), bandwidth.get("torch_copy_gbps")]
    roof = max((p for p in peaks if p), default=None)
    best = max(
        (r for r in (pipe, single) if r.get("best_gbps")),
        key=lambda r: r["best_gbps"],
        default=None,
    )
    if roof and best:
        out["roofline_gbps"] = roof
        out["best_gbps"] = best["best_gbps"]
        out["roofline_fraction"] = best["best_gbps"] / roof
    say(
        clock,
        f"face_mass: speedup {out.get('pipelined_speedup') or 0:.2f}x, roofline fraction "
        f"{out.get('roofline_fraction') or 0:.3f}",
    )
    return out


def part_workers(clock: Clock, args: argparse.Namespace, devices: list[Any]) -> dict[str, Any]:
    most = min(args.workers, len(devices))
    counts = [n for n in (1, 2, 4, 8, 16, 32) if n <= most]
    out: dict[str, Any] = {"part": "workers", "gpus_found": len(devices), "runs": []}
    problems = [
        ("face_mass", parse_kv(args.face_mass_args, FACE_MASS_ARGS)),
        ("gemm", parse_kv(args.gemm_args, GEMM_ARGS)),
    ]
    for problem, problem_args in problems:
        for n in counts:
            if not clock.fits(args.budget + RUN_OVERHEAD_S):
                out["runs"].append({"problem": problem, "workers": n, "skipped": "deadline"})
                continue
            out["runs"].append(
                tune(
                    clock,
                    f"{problem}-x{n}",
                    problem,
                    problem_args,
                    devices[:n],
                    args.budget,
                    seed_default=not args.no_seed,
                    max_trials=args.max_trials,
                )
            )
        one = next(
            (r for r in out["runs"] if r.get("problem") == problem and r.get("workers") == 1),
            None,
        )
        for r in out["runs"]:
            if r.get("problem") == problem and one and one.get("evaluations_per_minute"):
                if r.get("evaluations_per_minute"):
                    r["speedup_vs_1"] = r["evaluations_per_minute"] / one["evaluations_per_minute"]
    return out


PARTS: dict[str, Callable[[Clock, argparse.Namespace, list[Any]], dict[str, Any]]] = {
    "gemm": part_gemm,
    "face_mass": part_face_mass,
    "workers": part_workers,
}
#: Tuning runs each part makes (for the time estimate).
RUNS = {"gemm": 1, "face_mass": 2}


def summary_rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for res in results:
        runs = []
        if res.get("part") == "gemm":
            runs = [res.get("tuning", {})]
        elif res.get("part") == "face_mass":
            runs = [res.get("pipelined", {}), res.get("one_at_a_time", {})]
        elif res.get("part") == "workers":
            runs = res.get("runs", [])
        for r in runs:
            rows.append(
                [
                    r.get("label", r.get("problem", "?")),
                    r.get("workers", "-"),
                    h.fmt(r.get("tuning_wall_s"), 0),
                    r.get("evaluations", "-"),
                    h.fmt(r.get("evaluations_per_minute"), 1),
                    h.fmt(r.get("best_gflops"), 1),
                    h.fmt(r.get("best_gbps"), 1),
                    r.get("error") or r.get("skipped") or "",
                ]
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clock = Clock(args.deadline)
    out_dir = Path(args.out or os.environ.get("OUT") or h.RESULTS_DIR)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"unknown part(s) {unknown}; choose from {sorted(PARTS)}")
    devices = find_devices(args.device_type)
    if not devices:
        raise SystemExit(f"no OpenCL device of type {args.device_type!r} found")
    n_workers_runs = 2 * len([n for n in (1, 2, 4, 8, 16, 32) if n <= args.workers])
    runs = sum(RUNS.get(p, n_workers_runs) for p in parts)
    estimate = runs * (args.budget + RUN_OVERHEAD_S) + 60
    say(
        clock,
        f"devices: {[f'{d.index}: {d.name}' for d in devices]}; parts {parts}; {runs} tuning "
        f"run(s) of {args.budget:g} s; about {estimate / 60:.0f} min in all",
    )
    machine = h.machine()
    results = []
    for part in parts:
        cost = RUNS.get(part, 1) * (args.budget + RUN_OVERHEAD_S)
        result: dict[str, Any] = {"part": part}
        if not clock.fits(cost):
            result["skipped"] = f"deadline: {clock.left():.0f} s left, the part needs ~{cost:.0f}"
        else:
            try:
                result = PARTS[part](clock, args, devices)
            except Exception as exc:
                result["error"] = repr(exc)
                result["traceback"] = traceback.format_exc()[-4000:]
                say(clock, f"{part}: failed: {exc!r}")
        result.update(
            {
                "benchmark": f"gpu_{part}",
                "command": " ".join(
                    ["python", "benchmarks/gpu_tuning.py", *(argv or sys.argv[1:])]
                ),
                "machine": machine,
                "settings": {k: v for k, v in vars(args).items() if k != "out"},
            }
        )
        h.write_json(f"gpu_{part}", result, out_dir)
        results.append(result)
    print()
    print(
        h.table(
            ["run", "workers", "wall s", "evaluations", "per minute", "best GFLOP/s",
             "best GB/s", "note"],
            summary_rows(results),
        )
    )  # fmt: skip
    for res in results:
        if res.get("ratio_to_cublas") is not None:
            print(f"gemm: best / cuBLAS (TF32 off) = {res['ratio_to_cublas']:.3f}")
        if res.get("roofline_fraction") is not None:
            print(
                f"face_mass: best {res['best_gbps']:.0f} GB/s = {res['roofline_fraction']:.3f} "
                f"of the {res['roofline_gbps']:.0f} GB/s copy roofline; pipelined / one at a "
                f"time = {res.get('pipelined_speedup') or 0:.2f}x evaluations per minute"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
