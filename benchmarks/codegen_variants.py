"""One configuration, one kernel, whatever the hash seed? Loopy 2025.2 took the nest of ILP
loops and the axes of privatised accumulators from iterating Python sets, so processes with
different hash seeds built different kernels for one configuration (GEMM: 3-4 sources per
configuration under seeds 0-3, the slowest 1.27-1.40x the fastest on an H200,
``benchmarks/published/codegen_variants_h200.json``). tunefleet's code generation now fixes
those orders (``tunefleet.problems._loopy``); this checks it on a device, and times each
seed's kernel.

For each configuration and each ``--seeds`` value, a fresh process with that
``PYTHONHASHSEED`` (and caches of its own, so no variant answers for another) generates the
code, validates and times it, and prints the sha256 of the code and its median time. The
table shows, per configuration, each seed's median and code hash, the number of distinct
sources (1 now) and the slowest seed over the fastest (the between-process noise now).

    python benchmarks/codegen_variants.py --problem gemm \\
        --args '{"m": 4096, "n": 4096, "k": 4096, "dtype": "float32"}' \\
        --configs configs.json --seeds 0 1 2 3 --out codegen_variants.json

``--configs`` is a JSON list of configurations (default: the problem's default
configuration); ``--device`` picks the OpenCL device (default: the first GPU, else the first
device).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import fmt, machine, table, write_json

CHILD = r"""
import hashlib, json, sys
from tunefleet.problems.base import Protocol
from tunefleet.problems.registry import get_problem
from tunefleet.worker.device import open_session, select_device

problem_name, args_json, config_json, pattern = sys.argv[1:5]
problem = get_problem(problem_name)
args = problem.normalise_args(json.loads(args_json))
config = problem.check_config(args, json.loads(config_json))
device = select_device(pattern or None)
session = open_session(device)
prepared = problem.prepare(args, config, device)
outcome = problem.measure(prepared, session, Protocol())
print("RESULT " + json.dumps({
    "state": outcome.state, "error": outcome.error, "median_s": outcome.median_s,
    "gflops": outcome.gflops,
    "sha256": hashlib.sha256(prepared.target.source.encode()).hexdigest(),
}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--problem", default="gemm")
    p.add_argument("--args", default="{}", help="problem arguments, a JSON object")
    p.add_argument("--configs", default=None, help="a JSON file: a list of configurations")
    p.add_argument("--seeds", nargs="+", default=["0", "1", "2", "3"])
    p.add_argument("--device", default="", help="device pattern (default: a GPU, else any)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def one(args: argparse.Namespace, config: dict[str, Any], seed: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tunefleet-variant-") as home:
        env = {**os.environ, "PYTHONHASHSEED": seed, "XDG_CACHE_HOME": home}
        env["POCL_CACHE_DIR"] = os.path.join(home, "pocl")
        env["CUDA_CACHE_PATH"] = os.path.join(home, "nv")
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, args.problem, args.args, json.dumps(config), args.device],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {"seed": seed, **json.loads(line[len("RESULT ") :])}
    return {"seed": seed, "state": "error", "error": (proc.stderr or proc.stdout)[-1500:]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tunefleet.problems.registry import get_problem

    problem = get_problem(args.problem)
    full = problem.normalise_args(json.loads(args.args))
    configs = (
        json.loads(Path(args.configs).read_text())
        if args.configs
        else [problem.default_config(full)]
    )
    data: dict[str, Any] = {
        "machine": machine(),
        "problem": args.problem,
        "problem_args": full,
        "seeds": args.seeds,
        "configs": [],
    }
    rows = []
    for config in configs:
        variants = [one(args, config, seed) for seed in args.seeds]
        times = [v["median_s"] for v in variants if v.get("median_s")]
        entry = {
            "config": config,
            "variants": variants,
            "distinct_sources": len({v.get("sha256") for v in variants if v.get("sha256")}),
            "slowest_over_fastest": max(times) / min(times) if times else None,
        }
        data["configs"].append(entry)
        write_json("codegen_variants", data, args.out)
        for v in variants:
            rows.append(
                [
                    json.dumps(config, sort_keys=True)[:60],
                    v["seed"],
                    (v.get("sha256") or "-")[:12],
                    fmt(1e3 * v["median_s"], 3) if v.get("median_s") else v.get("state"),
                    fmt(v.get("gflops"), 0),
                ]
            )
        rows.append(["", "", f"{entry['distinct_sources']} sources", "", ""])
    print(table(["config", "seed", "code sha256", "median ms", "GFLOP/s"], rows))
    for entry in data["configs"]:
        print(
            f"{entry['distinct_sources']} sources, slowest/fastest "
            f"{fmt(entry['slowest_over_fastest'])}: {json.dumps(entry['config'], sort_keys=True)}"
        )
    write_json("codegen_variants", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
