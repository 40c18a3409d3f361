"""The ``jacobi`` problem: one 5-point Jacobi sweep on an ``n x m`` grid, written to the
interior only: ``out[i,j] = (u[i-1,j] + u[i+1,j] + u[i,j-1] + u[i,j+1]) / 4`` for
``1 <= i < n-1``, ``1 <= j < m-1``. The boundary of ``out`` is never written, as in stencils,
halo exchanges and boundary kernels; the reference holds NaN there, so those elements are not
checked (see ``tunefleet.problems.kernel``). Memory-bound.

A work-group of ``wg_i x wg_j`` work-items covers ``wg_i * reg_i`` rows and ``wg_j`` columns;
each work-item computes ``reg_i`` rows strided by ``wg_i`` (consecutive work-items along local
axis 0 touch consecutive columns), their loop unrolled or not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tunefleet.devices import DeviceInfo, Footprint
from tunefleet.problems.base import ArgSpec
from tunefleet.problems.footprints import footprint, thread_lanes
from tunefleet.problems.kernel import KernelProblem
from tunefleet.space import Bool, Config, PowerOfTwo, Space


class Jacobi(KernelProblem):
    name = "jacobi"
    description = (
        "5-point Jacobi sweep writing only the interior of out (the boundary is left "
        "unwritten and unchecked; memory-bound)"
    )
    arguments = (
        ArgSpec("n", 4096, "rows of the grid", minimum=3, size=True),
        ArgSpec("m", 4096, "columns of the grid", minimum=3, size=True),
        ArgSpec("dtype", "float32", "element type", choices=("float32", "float64")),
    )

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of(
            [
                PowerOfTwo("wg_j", 1, 128),
                PowerOfTwo("wg_i", 1, 16),
                PowerOfTwo("reg_i", 1, 8),
                Bool("unroll"),
            ]
        )

    def default_config(self, args: Mapping[str, Any]) -> Config:
        return {"wg_j": 32, "wg_i": 8, "reg_i": 2, "unroll": True}

    def footprint(self, args: Mapping[str, Any], config: Config) -> Footprint:
        # The interior's rows and columns: the boundary lines are not computed.
        rows = min(config["wg_i"] * config["reg_i"], args["n"] - 2)
        lanes = (thread_lanes(args["m"] - 2, config["wg_j"]), thread_lanes(rows, config["wg_i"]))
        return footprint([lanes], 0)

    def validation_args(self, args: Mapping[str, Any], config: Config) -> dict[str, Any]:
        # Two tiles of the interior plus the target's remainder, and the two boundary lines.
        rows, cols = config["wg_i"] * config["reg_i"], config["wg_j"]
        return {
            **args,
            "n": min(args["n"], 2 * rows + (args["n"] - 2) % rows + 2),
            "m": min(args["m"], 2 * cols + (args["m"] - 2) % cols + 2),
        }

    def build(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        import loopy as lp

        from tunefleet.problems._loopy import global_array, make_kernel, split_thread_axis

        n, m, dtype = args["n"], args["m"], args["dtype"]
        wg_i, reg_i = config["wg_i"], config["reg_i"]
        knl = make_kernel(
            "{[i, j]: 1 <= i < n - 1 and 1 <= j < m - 1}",
            "out[i, j] = (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]) / 4",
            [
                global_array("u", dtype, ("n", "m")),
                global_array("out", dtype, ("n", "m"), output=True),
            ],
            name="jacobi",
        )
        knl = lp.fix_parameters(knl, n=n, m=m)
        knl = lp.split_iname(
            knl, "i", wg_i * reg_i, outer_tag="g.1", inner_iname="ti", outer_iname="gi"
        )
        knl = split_thread_axis(
            knl, "ti", threads=wg_i, vec=1, lid=1, reg_tag="unr" if config["unroll"] else None
        )
        return lp.split_iname(
            knl, "j", config["wg_j"], outer_tag="g.0", inner_tag="l.0", inner_iname="tj"
        )

    def make_inputs(self, args: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        u = rng.uniform(-1, 1, (args["n"], args["m"])).astype(np.dtype(args["dtype"]))
        return {"u": u}

    def reference(self, args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
        u = inputs["u"].astype(np.float64)
        out = np.full(u.shape, np.nan)  # the boundary: not written, not checked
        out[1:-1, 1:-1] = (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:]) / 4
        return {"out": out}

    def flop_count(self, args: Mapping[str, Any]) -> float:
        return 4.0 * (args["n"] - 2) * (args["m"] - 2)

    def byte_count(self, args: Mapping[str, Any]) -> float:
        n, m = args["n"], args["m"]
        return float((n * m + (n - 2) * (m - 2)) * np.dtype(args["dtype"]).itemsize)
