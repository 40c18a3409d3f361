"""Ceilings and a short search over the built-in kernel problems on one GPU.

Measures, in one go:

- the vendor ceilings: cuBLAS SGEMM and DGEMM (through PyTorch, TF32 off) at n = 4096, and the
  device copy bandwidth (PyTorch and OpenCL buffer copies, bytes read + written);
- every built-in's default configuration at its target size;
- a short search over ``gemm`` (float32, n = 4096) and ``face_mass`` (defaults): hand-picked
  configurations first, then random legal ones, each through the real
  ``prepare`` (in a process pool, overlapping with timing) and ``measure`` path.

Prints a table and writes ``gpu_kernels.json`` (and the best kernels' OpenCL sources) to the
output folder. Usage::

    python benchmarks/gpu_kernels.py --out results/ [--deadline 420] [--random 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tunefleet.errors import InvalidConfiguration  # noqa: E402
from tunefleet.problems.base import Protocol  # noqa: E402
from tunefleet.problems.registry import get_problem  # noqa: E402

GEMM_ARGS = {"n": 4096, "m": 4096, "k": 4096, "dtype": "float32"}


def _gemm(
    wi: int,
    wj: int,
    ri: int,
    rj: int,
    vi: int,
    vj: int,
    tk: int,
    unroll: str = "hint",
    pa: bool = True,
    pb: bool = True,
) -> dict[str, Any]:
    return {
        "wg_i": wi,
        "wg_j": wj,
        "reg_i": ri,
        "reg_j": rj,
        "vec_i": vi,
        "vec_j": vj,
        "tile_k": tk,
        "prefetch_a": pa,
        "prefetch_b": pb,
        "unroll_k": unroll,
    }


GEMM_PICKS = [
    _gemm(16, 16, 8, 8, 4, 4, 16),
    _gemm(16, 16, 8, 8, 4, 4, 32),
    _gemm(16, 16, 4, 8, 4, 4, 16),
    _gemm(8, 32, 16, 4, 4, 4, 8),
    _gemm(16, 16, 8, 8, 4, 4, 8),
    _gemm(16, 16, 8, 8, 4, 4, 32, "none"),
    _gemm(16, 8, 8, 8, 4, 4, 32),
]
#: Measured again with freshly allocated inputs: is the speed a property of the kernel?
GEMM_REPEATS = GEMM_PICKS[:2]


def _fm(
    wi: int,
    we: int,
    re: int,
    *,
    regs: bool = True,
    pu: bool = True,
    po: bool = True,
    unroll: str = "hint",
    fields: str = "ilp",
    stage: str = "all",
) -> dict[str, Any]:
    return {
        "wg_i": wi,
        "wg_e": we,
        "reg_e": re,
        "i_in_registers": regs,
        "prefetch_u": pu,
        "prefetch_op": po,
        "unroll": unroll,
        "fields": fields,
        "stage": stage,
    }


def _face_mass_grid() -> list[dict[str, Any]]:
    """Staging one face at a time: larger element tiles fit in local memory."""
    out = []
    for wi in (5, 7, 35):
        for fields in ("ilp", "group", "loop"):
            for we in (16, 32, 64):
                for re in (1, 2, 4):
                    out.append(_fm(wi, we, re, fields=fields, stage="face"))
    out += [_fm(8, we, re, fields="group", stage="face") for we in (16, 32, 64) for re in (2, 4)]
    # Eight elements per work-item: each staged operator value feeds more multiply-adds, which
    # is what float64 needs once the local-memory loads, not DRAM, are the limit.
    out += [
        _fm(wi, we, 8, fields=fields, stage="face", po=po)
        for wi in (5, 7)
        for fields in ("group", "loop")
        for we in (8, 16, 32)
        for po in (True, False)
    ]
    return out


FACE_MASS_PICKS = [
    _fm(5, 32, 2, fields="group"),
    _fm(7, 32, 2, fields="group"),
    _fm(5, 32, 2, fields="loop"),
    *_face_mass_grid(),
]


def vendor_ceilings() -> dict[str, Any]:
    """cuBLAS and copy bandwidth through PyTorch, in a child process (keeps CUDA and OpenCL
    state apart)."""
    code = r"""
import json, torch
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
def bench(fn, reps):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    return times[len(times) // 2]
n = 4096
for dt, name in ((torch.float32, "sgemm"), (torch.float64, "dgemm")):
    a = torch.randn(n, n, device="cuda", dtype=dt); b = torch.randn(n, n, device="cuda", dtype=dt)
    c = torch.empty(n, n, device="cuda", dtype=dt)
    t = bench(lambda: torch.matmul(a, b, out=c), 20)
    out[name + "_4096_gflops"] = 2 * n**3 / t / 1e9
nbytes = 2 * 1024**3
src = torch.empty(nbytes // 4, device="cuda", dtype=torch.float32).uniform_()
dst = torch.empty_like(src)
t = bench(lambda: dst.copy_(src), 20)
out["copy_gbps"] = 2 * nbytes / t / 1e9
print("JSON" + json.dumps(out))
"""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=180
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": repr(exc)}
    for line in proc.stdout.splitlines():
        if line.startswith("JSON"):
            return dict(json.loads(line[4:]))
    return {"error": (proc.stderr or proc.stdout)[-2000:]}


def opencl_copy_gbps(session: Any) -> float:
    import pyopencl as cl

    nbytes = 2 * 1024**3
    src = cl.Buffer(session.context, cl.mem_flags.READ_WRITE, nbytes)
    dst = cl.Buffer(session.context, cl.mem_flags.READ_WRITE, nbytes)
    cl.enqueue_fill_buffer(session.queue, src, b"\x01\x00\x00\x00", 0, nbytes).wait()
    times = []
    for i in range(13):
        evt = cl.enqueue_copy(session.queue, dst, src)
        evt.wait()
        if i >= 3:
            times.append((evt.profile.end - evt.profile.start) * 1e-9)
    times.sort()
    return 2 * nbytes / times[len(times) // 2] / 1e9


def _prepare(spec: str, args: dict[str, Any], config: dict[str, Any], device: Any) -> Any:
    problem = get_problem(spec)
    try:
        return "ok", problem.prepare(args, config, device)
    except InvalidConfiguration as exc:
        return "invalid", str(exc)


def random_configs(spec: str, args: dict[str, Any], count: int, seed: int) -> list[dict[str, Any]]:
    problem = get_problem(spec)
    space = problem.space(args)
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for _ in range(2000):
        if len(out) >= count:
            break
        cfg = space.sample(rng)
        try:
            problem.check_config(args, cfg)
        except InvalidConfiguration:
            continue
        out.append(cfg)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results")))
    parser.add_argument("--deadline", type=float, default=420.0, help="seconds for everything")
    parser.add_argument("--random", type=int, default=8, help="random configs per search")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--skip-vendor", action="store_true")
    parser.add_argument("--small", action="store_true", help="tiny sizes: a smoke test on a CPU")
    parser.add_argument(
        "--only", default=None, help="comma-separated problems to measure (default: all)"
    )
    opts = parser.parse_args()
    sizes: dict[str, dict[str, Any]] = {
        "gemm": dict(GEMM_ARGS),
        "face_mass": {},
        "dg_diff": {},
        "transpose": {},
    }
    if opts.small:
        sizes = {
            "gemm": {**GEMM_ARGS, "n": 256, "m": 256, "k": 64},
            "face_mass": {"n_elements": 200},
            "dg_diff": {"n_elements": 300},
            "transpose": {"n": 300, "m": 200},
        }
    start = time.monotonic()
    opts.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"vendor": {}, "defaults": [], "search": [], "repeat": []}

    def save() -> None:
        (opts.out / "gpu_kernels.json").write_text(json.dumps(results, indent=1, default=str))

    if not opts.skip_vendor:
        results["vendor"] = vendor_ceilings()
        print("vendor:", json.dumps(results["vendor"]), flush=True)
        save()

    from tunefleet.worker.device import open_session, select_device

    device = select_device(None)
    session = open_session(device)
    results["device"] = device.to_json()
    results["vendor"]["opencl_copy_gbps"] = opencl_copy_gbps(session)
    print(
        "device:",
        device.name,
        device.driver_version,
        "local mem",
        device.local_mem_bytes,
        "| OpenCL copy GB/s:",
        round(results["vendor"]["opencl_copy_gbps"], 1),
        flush=True,
    )
    save()

    jobs: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = []
    args_of = {spec: get_problem(spec).normalise_args(sizes[spec]) for spec in sizes}
    for spec, args in args_of.items():
        jobs.append(("defaults", spec, args, get_problem(spec).default_config(args)))
    gemm64 = {**args_of["gemm"], "dtype": "float64"}
    jobs.append(("defaults", "gemm", gemm64, get_problem("gemm").default_config(gemm64)))
    jobs += [("search", "gemm", args_of["gemm"], c) for c in GEMM_PICKS]
    jobs += [("repeat", "gemm", args_of["gemm"], c) for _ in range(2) for c in GEMM_REPEATS]
    jobs += [("search", "face_mass", args_of["face_mass"], c) for c in FACE_MASS_PICKS]
    dg = args_of["dg_diff"]
    jobs += [
        ("search", "dg_diff", dg, {**get_problem("dg_diff").default_config(dg), **change})
        for change in (
            {"wg_e": 32, "reg_e": 1},
            {"wg_i": 1, "wg_e": 64, "reg_e": 1},
            {"wg_i": 1, "wg_e": 128, "reg_e": 2},
            {"wg_i": 5, "wg_e": 32},
            {"wg_i": 35, "wg_e": 8, "reg_e": 2},
            {"prefetch_op": False},
            {"wg_i": 1, "wg_e": 128, "reg_e": 1, "prefetch_u": False},
        )
    ]
    for spec, count, seed in (
        ("gemm", opts.random, 1),
        ("face_mass", opts.random, 2),
        ("dg_diff", opts.random, 3),
        ("transpose", opts.random, 4),
    ):
        jobs += [
            ("search", spec, args_of[spec], c)
            for c in random_configs(spec, args_of[spec], count, seed)
        ]

    if opts.only:
        wanted = set(opts.only.split(","))
        jobs = [job for job in jobs if job[1] in wanted]
    protocol = Protocol()
    pool = cf.ProcessPoolExecutor(opts.workers, mp_context=multiprocessing.get_context("spawn"))
    futures = [pool.submit(_prepare, spec, args, cfg, device) for _, spec, args, cfg in jobs]
    print(
        f"{'kind':8} {'problem':10} {'state':8} {'median ms':>10} {'GFLOP/s':>9} {'GB/s':>8} "
        f"{'compile s':>9}  config / reason",
        flush=True,
    )
    for (kind, spec, args, cfg), fut in zip(jobs, futures, strict=True):
        left = opts.deadline - (time.monotonic() - start)
        row: dict[str, Any] = {"problem": spec, "args": args, "config": cfg}
        if left <= 0:
            row.update(state="skipped", error="deadline")
        else:
            try:
                status, prepared = fut.result(timeout=min(left, 120))
            except cf.TimeoutError:
                status, prepared = "failed", "code generation took too long"
            except Exception as exc:  # a bug: record it, keep going
                status, prepared = "failed", f"prepare raised {exc!r}"
            if status != "ok":
                row.update(state=status, error=prepared)
            else:
                if kind == "repeat":  # fresh input buffers: other addresses, same values
                    from tunefleet.problems import kernel

                    kernel._DEVICE_INPUTS.clear()
                try:
                    outcome = get_problem(spec).measure(prepared, session, protocol)
                    row.update(
                        state=outcome.state,
                        error=outcome.error,
                        median_s=outcome.median_s,
                        min_s=outcome.min_s,
                        gflops=outcome.gflops,
                        gbps=outcome.gbps,
                        compile_s=outcome.compile_s,
                        launches=len(outcome.samples_s),
                        validation=outcome.validation,
                        details=outcome.details,
                        code=outcome.code,
                    )
                except Exception as exc:
                    row.update(state="failed", error=f"measure raised {exc!r}")
        results[kind].append(row)
        ms = f"{row['median_s'] * 1e3:10.3f}" if row.get("median_s") else " " * 10
        gf = f"{row['gflops']:9.0f}" if row.get("gflops") else " " * 9
        gb = f"{row['gbps']:8.0f}" if row.get("gbps") else " " * 8
        cs = f"{row['compile_s']:9.2f}" if row.get("compile_s") else " " * 9
        what = (
            json.dumps(cfg) if row["state"] == "done" else f"{json.dumps(cfg)} {row.get('error')}"
        )
        print(f"{kind:8} {spec:10} {row['state']:8} {ms} {gf} {gb} {cs}  {what[:400]}", flush=True)
        save()
    pool.shutdown(wait=False, cancel_futures=True)

    summary: dict[str, Any] = {}
    for spec, metric in (("gemm", "gflops"), ("face_mass", "gbps")):
        done = [
            r
            for r in results["search"] + results["defaults"] + results["repeat"]
            if r["problem"] == spec
            and r["state"] == "done"
            and r["args"].get("dtype") == ("float32" if spec == "gemm" else "float64")
        ]
        if done:
            best = max(done, key=lambda r: r[metric])
            summary[spec] = {"best_" + metric: best[metric], "config": best["config"]}
            (opts.out / f"best_{spec}.cl").write_text(best.get("code") or "")
    vendor = results["vendor"]
    if "gemm" in summary and vendor.get("sgemm_4096_gflops"):
        summary["gemm"]["ratio_to_cublas"] = (
            summary["gemm"]["best_gflops"] / vendor["sgemm_4096_gflops"]
        )
    if "face_mass" in summary:
        for key in ("copy_gbps", "opencl_copy_gbps"):
            if vendor.get(key):
                summary["face_mass"]["ratio_to_" + key] = (
                    summary["face_mass"]["best_gbps"] / vendor[key]
                )
    results["summary"] = summary
    for row in results["search"] + results["defaults"] + results["repeat"]:
        row.pop("code", None)
    save()
    print("summary:", json.dumps(summary, indent=1), flush=True)
    print(f"total {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
