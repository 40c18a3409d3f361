"""Every built-in on a real GPU: the default configuration and a handful of others, at the
problems' default (target) sizes. Opt-in: ``pytest -m gpu tests/gpu -s`` prints GFLOP/s and
GB/s per case; skipped when no GPU OpenCL device exists. No speed is asserted (speed goes in
``benchmarks/``): each default must validate and time, the others must be ``done`` or
``invalid`` with a reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from tunefleet.problems.base import Protocol
from tunefleet.problems.registry import get_problem

pytestmark = pytest.mark.gpu

GEMM_4096 = {"n": 4096, "m": 4096, "k": 4096}

CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("gemm", GEMM_4096, None),
    ("gemm", {**GEMM_4096, "dtype": "float64"}, None),
    ("gemm", GEMM_4096, {"tile_k": 16}),
    ("gemm", GEMM_4096, {"unroll_k": "full", "tile_k": 16}),
    ("gemm", GEMM_4096, {"wg_i": 8, "reg_j": 4, "tile_k": 16, "nest": "reg_i,reg_j,vec_i,vec_j"}),
    ("gemm", GEMM_4096, {"pad_a": 0}),
    # float32's default until 2026-12-07.
    ("gemm", GEMM_4096, {"wg_i": 8, "wg_j": 32, "nest": "reg_i,reg_j,vec_i,vec_j"}),
    ("gemm", {**GEMM_4096, "dtype": "float64"}, {"pad_a": 0}),
    ("face_mass", {}, None),
    ("face_mass", {}, {"prefetch_op": False}),
    ("face_mass", {}, {"nest": "i,k,e"}),
    (
        "face_mass",
        {},
        {"wg_i": 35, "wg_e": 8, "reg_e": 1, "prefetch_u": False, "stage": "all", "nest": "i,k,e"},
    ),
    ("face_mass", {}, {"fields": "loop", "wg_e": 32, "reg_e": 1, "stage": "all", "nest": "i,k,e"}),
    ("dg_diff", {}, None),
    ("dg_diff", {}, {"prefetch_op": False}),
    ("dg_diff", {}, {"wg_i": 35, "wg_e": 8, "reg_e": 1}),
    ("transpose", {}, None),
    ("transpose", {}, {"via_local": False}),
    ("transpose", {}, {"tile_i": 64, "tile_j": 64, "wg_1": 16}),
    ("jacobi", {}, None),
    ("jacobi", {}, {"wg_j": 128, "wg_i": 2, "reg_i": 4}),
    ("axpy", {}, None),
    ("axpy", {}, {"wg": 128, "reg": 2, "chunk": 4}),
]


@pytest.fixture(scope="module")
def gpu_session() -> Any:
    pytest.importorskip("pyopencl")
    from tunefleet.worker.device import list_devices, open_session

    gpus = [d for d in list_devices() if "gpu" in d.extra.get("type", "")]
    if not gpus:
        pytest.skip("no GPU OpenCL device")
    return open_session(gpus[0])


@pytest.mark.parametrize(
    ("name", "args", "changes"),
    CASES,
    ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(CASES)],
)
def test_builtin_runs_on_the_gpu(gpu_session, name, args, changes):
    problem = get_problem(name)
    full = problem.normalise_args(args)
    config = {**problem.default_config(full), **(changes or {})}
    prepared = problem.prepare(full, config, gpu_session.info)
    outcome = problem.measure(prepared, gpu_session, Protocol())
    gflops = f"{outcome.gflops:9.1f}" if outcome.gflops else "        -"
    gbps = f"{outcome.gbps:8.1f}" if outcome.gbps else "       -"
    print(
        f"\n{name:10} {outcome.state:8} {gflops} GFLOP/s {gbps} GB/s  "
        f"{(outcome.median_s or 0) * 1e3:8.3f} ms  {full}  {changes or 'default'}  "
        f"{outcome.error or ''}"
    )
    if changes is None:
        assert outcome.state == "done", outcome.error
    else:
        assert outcome.state in ("done", "invalid")
        assert outcome.state == "done" or outcome.error
    if outcome.state == "done":
        assert len(outcome.samples_s) >= Protocol().min_launches
        assert outcome.device["fingerprint"] == gpu_session.info.fingerprint
