"""The ``axpy`` problem: the in-place update ``u[i] += alpha * v[i]`` — ``u`` is read and
written, so its starting contents matter. ``make_inputs`` gives them; validation launches once
from them, and timing restores ``u`` before every launch (a device-to-device copy outside the
kernel's profiling event), so every launch does the same work (see
``tunefleet.problems.kernel``). Memory-bound.

A work-group of ``wg`` work-items covers ``wg * reg * chunk`` elements: each work-item updates
``reg`` chunks of ``chunk`` contiguous elements, chunks strided by ``wg * chunk``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tunefleet.devices import DeviceInfo, Footprint
from tunefleet.problems.base import ArgSpec
from tunefleet.problems.footprints import footprint, thread_lanes
from tunefleet.problems.kernel import KernelProblem
from tunefleet.space import Choice, Config, PowerOfTwo, Space


class Axpy(KernelProblem):
    name = "axpy"
    description = "in-place update u[i] += alpha * v[i] (u is read and written; memory-bound)"
    arguments = (
        ArgSpec("n", 1 << 24, "length of u and v", minimum=1, size=True),
        ArgSpec("alpha", 0.5, "the factor of v"),
        ArgSpec("dtype", "float32", "element type", choices=("float32", "float64")),
    )

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of(
            [
                PowerOfTwo("wg", 1, 1024),
                PowerOfTwo("reg", 1, 8),
                Choice("chunk", (1, 2, 4)),
            ]
        )

    def default_config(self, args: Mapping[str, Any]) -> Config:
        return {"wg": 256, "reg": 1, "chunk": 1}

    def footprint(self, args: Mapping[str, Any], config: Config) -> Footprint:
        wg, chunk = config["wg"], config["chunk"]
        block = min(wg * config["reg"] * chunk, args["n"])
        return footprint([(thread_lanes(block, wg, chunk), 1)], 0)

    def validation_args(self, args: Mapping[str, Any], config: Config) -> dict[str, Any]:
        block = config["wg"] * config["reg"] * config["chunk"]
        return {**args, "n": min(args["n"], 2 * block + args["n"] % block)}

    def build(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        import loopy as lp

        from tunefleet.problems._loopy import global_array, make_kernel, split_thread_axis

        dtype = np.dtype(args["dtype"])
        wg, reg, chunk = config["wg"], config["reg"], config["chunk"]
        u = global_array("u", dtype, ("n",), output=True)
        knl = make_kernel(
            "{[i]: 0 <= i < n}",
            "u[i] = u[i] + alpha * v[i]",
            [
                u.copy(is_input=True),  # read and written: updated in place
                global_array("v", dtype, ("n",)),
                lp.ValueArg("alpha", dtype),
            ],
            name="axpy",
        )
        # A scalar of the element type, so float32 kernels stay in float32 arithmetic.
        knl = lp.fix_parameters(knl, n=args["n"], alpha=dtype.type(args["alpha"]))
        knl = lp.split_iname(
            knl, "i", wg * reg * chunk, outer_tag="g.0", inner_iname="ti", outer_iname="gi"
        )
        return split_thread_axis(knl, "ti", threads=wg, vec=chunk, lid=0, reg_tag="unr")

    def make_inputs(self, args: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        dtype = np.dtype(args["dtype"])
        return {
            "u": rng.uniform(-1, 1, args["n"]).astype(dtype),  # u's starting contents
            "v": rng.uniform(-1, 1, args["n"]).astype(dtype),
        }

    def reference(self, args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
        alpha = float(np.dtype(args["dtype"]).type(args["alpha"]))
        return {"u": inputs["u"].astype(np.float64) + alpha * inputs["v"].astype(np.float64)}

    def flop_count(self, args: Mapping[str, Any]) -> float:
        return 2.0 * args["n"]

    def byte_count(self, args: Mapping[str, Any]) -> float:
        return 3.0 * args["n"] * np.dtype(args["dtype"]).itemsize
