"""GEMM configurations alone, side by side: the default, the previous default, the best found
so far, and variants of them with and without issue 50's transformation (``pad_a``: a's local
tile a vector longer per row, so the fetch's transposing stores spread over the banks). Prints
each one's time and its ratio to the default (and to cuBLAS, where PyTorch is installed), and
writes the numbers as JSON. ``--problem face_mass`` times face-mass's default against its
previous default the same way (``--args`` then face-mass's arguments).

Each configuration is measured by ``tunefleet measure --json`` (a fresh process: code
generation, build, validation, the default protocol), ``--repeats`` times, round-robin over the
list so drift spreads evenly; the table shows the median of a configuration's medians, the
spread of those medians, and the sha256 of its generated code (one per configuration).

    python benchmarks/gemm_variants.py                       # 4096^3 float32, first GPU
    python benchmarks/gemm_variants.py --repeats 5 --out gemm_variants_h100.json
    python benchmarks/gemm_variants.py --configs mine.json   # a list of configurations
    python benchmarks/gemm_variants.py --problem face_mass --repeats 3
    python benchmarks/gemm_variants.py --quick               # a smoke run on any device

``--configs`` is a JSON list whose items are either ``{"name": ..., "config": {...}}`` or a
plain (partial) configuration; either is applied over the default configuration of
``--args``. ``--device`` picks the OpenCL device (default: the first GPU, else the first
device). ``--quick`` times four variants at n = m = k = 256, once each, with a short protocol.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import fmt, machine, table, write_json

#: The best configuration found by a 300 s search on an H100 before a's tile was padded
#: (3.04 ms alone at 4096^3 float32, the default then 3.16-3.28 ms): over the default, these
#: changes (b not staged, so ``pad_a`` applies to a's tile only).
BEST_H100 = {
    "reg_i": 16, "reg_j": 4, "tile_k": 64, "wg_i": 4, "wg_j": 64, "prefetch_b": False,
    "nest": "reg_i,reg_j,vec_i,vec_j",
}  # fmt: skip
UNPADDED = {"pad_a": 0}
#: float32's default until 2026-12-07 over today's (8 x 32 work-items, the first nest).
PREVIOUS_DEFAULT = {"wg_i": 8, "wg_j": 32, "nest": "reg_i,reg_j,vec_i,vec_j"}

#: The variants timed by default: (name, changes over the default configuration, whose a tile
#: is padded). benchmarks/published/gemm_variants_h100.json timed an earlier list, when the
#: default was unpadded, 8 x 32 work-items in the first nest (and a work-group of 3/4 of wg_i
#: work-items was a parameter: 1.45-2.2x slower, since removed).
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("default", {}),
    ("unpadded", UNPADDED),
    ("previous default", PREVIOUS_DEFAULT),
    ("first nest", {"nest": "reg_i,reg_j,vec_i,vec_j"}),
    ("tile_k16", {"tile_k": 16}),
    ("best", BEST_H100),
    ("best unpadded", {**BEST_H100, **UNPADDED}),
    # b staged again (a k-block of 32 fits 48 KiB) once a's stores are conflict-free.
    ("best prefetch_b k32", {**BEST_H100, "prefetch_b": True, "tile_k": 32}),
]
QUICK_VARIANTS = ["default", "unpadded", "previous default", "best"]
#: face-mass's (``--problem face_mass``): the default and the default until 2026-12-07.
FACE_MASS_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("default", {}),
    ("previous default", {"nest": "i,k,e"}),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--problem", default="gemm", choices=("gemm", "face_mass"))
    p.add_argument(
        "--args",
        default=None,
        help='the problem\'s arguments, a JSON object (gemm: {"n": 4096, "m": 4096, "k": 4096, '
        '"dtype": "float32"}; face_mass: its defaults)',
    )
    p.add_argument("--configs", default=None, help="a JSON file: a list of configurations")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per configuration")
    p.add_argument("--device", default="", help="device pattern (default: a GPU, else any)")
    p.add_argument("--no-cublas", action="store_true", help="skip cuBLAS (PyTorch) timing")
    p.add_argument("--quick", action="store_true", help="smoke run: n = m = k = 256, 4 variants")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def variants(args: argparse.Namespace, default: dict[str, Any]) -> list[dict[str, Any]]:
    """Each variant's name, its changes over the default and its whole configuration."""
    if args.configs:
        items = json.loads(Path(args.configs).read_text())
        named = [
            (item["name"], item["config"]) if "config" in item else (json.dumps(item), item)
            for item in items
        ]
    elif args.problem == "face_mass":
        named = FACE_MASS_VARIANTS
    else:
        named = [(n, c) for n, c in VARIANTS if not args.quick or n in QUICK_VARIANTS]
    out = []
    for name, change in named:
        changed = {k: v for k, v in change.items() if default.get(k) != v}
        out.append({"name": name, "changes": changed, "config": {**default, **change}})
    return out


def one(
    args: argparse.Namespace,
    problem_args: dict[str, Any],
    config: dict[str, Any],
    protocol: dict[str, Any],
) -> dict[str, Any]:
    """``config`` timed alone by ``tunefleet measure --json`` (the command a run prints to
    reproduce its best): its state, times, device and the sha256 of its generated code."""
    from tunefleet.options.args import command_line_args, problem_sizes

    command = [sys.executable, "-m", "tunefleet", "measure", args.problem]
    command += command_line_args(problem_args, problem_sizes(args.problem))
    command += ["--config", json.dumps(config), "--protocol", json.dumps(protocol), "--json"]
    command += ["--device", args.device] if args.device else []
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=900, check=False, stdin=subprocess.DEVNULL
    )
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        error = (proc.stderr or proc.stdout).strip()
        state = "invalid" if "configuration is invalid" in error else "error"
        return {"state": state, "error": error[-1500:]}
    keep = ("state", "error", "median_s", "min_s", "gflops", "device")
    return {**{k: out.get(k) for k in keep}, "sha256": out.get("source_sha256")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.problem != "gemm":
        args.no_cublas = True
    if args.quick:
        quick = {"n": 256, "m": 256, "k": 256, "dtype": "float32"}
        args.args = json.dumps(quick if args.problem == "gemm" else {"n_elements": 512})
        args.repeats = 1
        args.no_cublas = True
    if args.args is None:
        gemm_4096 = {"n": 4096, "m": 4096, "k": 4096, "dtype": "float32"}
        args.args = json.dumps(gemm_4096 if args.problem == "gemm" else {})
    from tunefleet.problems.base import Protocol
    from tunefleet.problems.registry import get_problem

    problem = get_problem(args.problem)
    full = problem.normalise_args(json.loads(args.args))
    default = problem.default_config(full)
    protocol = (
        Protocol(warmup=1, min_launches=3, min_seconds=0.0, max_launches=5)
        if args.quick
        else Protocol()
    ).to_json()
    entries = variants(args, default)
    data: dict[str, Any] = {
        "machine": machine(),
        "problem": args.problem,
        "problem_args": full,
        "protocol": protocol,
        "repeats": args.repeats,
        "variants": entries,
    }
    for entry in entries:
        entry["runs"] = []
    for repeat in range(args.repeats):
        for entry in entries:
            result = one(args, full, entry["config"], protocol)
            entry["runs"].append(result)
            print(
                f"[{repeat + 1}/{args.repeats}] {entry['name']}: {result['state']} "
                + (f"{1e3 * result['median_s']:.3f} ms" if result.get("median_s") else "")
                + (f" {result['error'][:200]}" if result.get("error") else ""),
                flush=True,
            )
            write_json("gemm_variants", data, args.out)
    if not args.no_cublas:
        from gpu_tuning import torch_numbers

        data["cublas"] = torch_numbers({"gemm": full})
    cublas_s = (data.get("cublas") or {}).get("cublas_median_s")
    for entry in entries:
        medians = [r["median_s"] for r in entry["runs"] if r.get("median_s")]
        entry["median_s"] = statistics.median(medians) if medians else None
        entry["spread"] = max(medians) / min(medians) - 1 if len(medians) > 1 else None
        entry["sources"] = sorted({r["sha256"] for r in entry["runs"] if r.get("sha256")})
    base = entries[0]["median_s"] if entries and entries[0]["name"] == "default" else None
    rows = []
    for entry in entries:
        t = entry["median_s"]
        entry["over_default"] = t / base if t and base else None
        entry["of_cublas"] = cublas_s / t if t and cublas_s else None
        states = sorted({r["state"] for r in entry["runs"]})
        rows.append(
            [
                entry["name"],
                ",".join(states),
                fmt(1e3 * t, 3) if t else "-",
                fmt(100 * entry["spread"], 1) if entry["spread"] is not None else "-",
                fmt(entry["over_default"]),
                fmt(entry["of_cublas"]),
                ",".join(s[:10] for s in entry["sources"]) or "-",
            ]
        )
    print(
        table(
            ["variant", "state", "median ms", "spread %", "time/default", "of cuBLAS", "code"],
            rows,
        )
    )
    if cublas_s:
        print(f"cuBLAS {1e3 * cublas_s:.3f} ms ({data['cublas'].get('gpu')})")
    for entry in entries:
        errors = {r["error"][:300] for r in entry["runs"] if r.get("error")}
        for error in errors:
            print(f"{entry['name']}: {error}")
        print(f"{entry['name']}: {json.dumps(entry['changes'], sort_keys=True)}")
    write_json("gemm_variants", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
