"""The ``transpose`` problem: ``out[j,i] = a[i,j]`` — pure data movement, memory-bound.

A work-group moves a ``tile_i x tile_j`` tile with ``wg_0 x wg_1`` work-items. Staged through
local memory (``via_local``), both the global reads and the global writes are coalesced; the
local tile can be padded by one column (``pad``) so the transposed reads of it do not collide
in one memory bank. Without local memory, ``coalesce`` picks which side is coalesced: the
reads (consecutive work-items along ``j``) or the writes (along ``i``). ``unroll`` unrolls the
per-work-item loops.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tunefleet.devices import DeviceInfo, Footprint
from tunefleet.problems.base import ArgSpec
from tunefleet.problems.footprints import flat_lanes, footprint, local_tile_bytes, thread_lanes
from tunefleet.problems.kernel import KernelProblem
from tunefleet.space import Bool, Choice, Config, PowerOfTwo, Space


class Transpose(KernelProblem):
    name = "transpose"
    description = "matrix transpose out[j,i] = a[i,j] (memory-bound)"
    arguments = (
        ArgSpec("n", 8192, "rows of a", minimum=1, size=True),
        ArgSpec("m", 8192, "columns of a", minimum=1, size=True),
        ArgSpec("dtype", "float32", "element type", choices=("float32", "float64")),
    )

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of(
            [
                PowerOfTwo("tile_i", 1, 128),
                PowerOfTwo("tile_j", 1, 128),
                PowerOfTwo("wg_0", 1, 64),
                PowerOfTwo("wg_1", 1, 32),
                Bool("via_local"),
                Bool("pad"),
                Choice("coalesce", ("read", "write")),
                Bool("unroll"),
            ]
        )

    def default_config(self, args: Mapping[str, Any]) -> Config:
        return {
            "tile_i": 32,
            "tile_j": 32,
            "wg_0": 32,
            "wg_1": 8,
            "via_local": True,
            "pad": True,
            "coalesce": "read",
            "unroll": True,
        }

    def footprint(self, args: Mapping[str, Any], config: Config) -> Footprint:
        ti, tj = min(config["tile_i"], args["n"]), min(config["tile_j"], args["m"])
        w0, w1 = config["wg_0"], config["wg_1"]
        # Local axis 0 runs along the coalesced side, as in build.
        fast, slow = (ti, tj) if config["via_local"] or config["coalesce"] == "write" else (tj, ti)
        lanes = [(thread_lanes(fast, w0), thread_lanes(slow, w1))]
        local = 0
        if config["via_local"]:
            itemsize = np.dtype(args["dtype"]).itemsize
            local = local_tile_bytes([ti, tj], itemsize, pad=int(config["pad"]))
            lanes.append(flat_lanes([ti, tj], (w0, w1)))
        return footprint(lanes, local)

    def validation_args(self, args: Mapping[str, Any], config: Config) -> dict[str, Any]:
        ti, tj = config["tile_i"], config["tile_j"]
        return {
            **args,
            "n": min(args["n"], 2 * ti + args["n"] % ti),
            "m": min(args["m"], 2 * tj + args["m"] % tj),
        }

    def build(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        import loopy as lp

        from tunefleet.problems._loopy import (
            distribute_flat,
            existing,
            global_array,
            make_kernel,
            pad_innermost,
        )

        n, m, dtype = args["n"], args["m"], args["dtype"]
        ti, tj = config["tile_i"], config["tile_j"]
        w0, w1 = config["wg_0"], config["wg_1"]
        reg_tag = "unr" if config["unroll"] else None
        knl = make_kernel(
            "{[i, j]: 0 <= i < n and 0 <= j < m}",
            "out[j, i] = a[i, j]",
            [
                global_array("a", dtype, ("n", "m")),
                global_array("out", dtype, ("m", "n"), output=True),
            ],
            name="transpose",
        )
        knl = lp.fix_parameters(knl, n=n, m=m)
        knl = lp.split_iname(knl, "i", ti, outer_tag="g.1", inner_iname="ti", outer_iname="gi")
        knl = lp.split_iname(knl, "j", tj, outer_tag="g.0", inner_iname="tj", outer_iname="gj")
        # The side that is coalesced runs along local axis 0.
        fast, slow = (
            ("ti", "tj")
            if config["via_local"] or config["coalesce"] == "write"
            else (
                "tj",
                "ti",
            )
        )
        knl = lp.split_iname(
            knl,
            fast,
            w0,
            inner_tag="l.0",
            inner_iname=f"{fast}_l",
            outer_iname=f"{fast}_r",
            outer_tag=reg_tag,
        )
        knl = lp.split_iname(
            knl,
            slow,
            w1,
            inner_tag="l.1",
            inner_iname=f"{slow}_l",
            outer_iname=f"{slow}_r",
            outer_tag=reg_tag,
        )
        if config["via_local"]:
            knl = lp.add_prefetch(
                knl,
                "a",
                ["ti_l", "ti_r", "tj_l", "tj_r"],
                fetch_outer_inames="gi,gj",
                temporary_name="a_tile",
                default_tag=None,
                dim_arg_names=["fa_i", "fa_j"],
            )
            if config["pad"]:
                # One extra column: the column-wise reads of the tile hit distinct banks.
                knl = pad_innermost(knl, "a_tile")
            knl = distribute_flat(knl, existing(knl, ["fa_i", "fa_j"]), (w0, w1), "fa")
        return knl

    def make_inputs(self, args: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        a = rng.uniform(-1, 1, (args["n"], args["m"])).astype(np.dtype(args["dtype"]))
        return {"a": a}

    def reference(self, args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"out": np.ascontiguousarray(inputs["a"].T)}

    def flop_count(self, args: Mapping[str, Any]) -> float:
        return 0.0

    def byte_count(self, args: Mapping[str, Any]) -> float:
        return float(2 * args["n"] * args["m"] * np.dtype(args["dtype"]).itemsize)
