"""The ``gemm`` problem: dense matrix product ``c[i,j] = sum_k a[i,k] b[k,j]`` (einsum
``ik,kj->ij``, row-major, float32 or float64).

The space is the classic register-blocked GEMM: a work-group of ``wg_i x wg_j`` work-items
computes a ``(wg_i*reg_i) x (wg_j*reg_j)`` tile of ``c``; each work-item keeps its
``reg_i x reg_j`` outputs in registers, in chunks of ``vec_i`` (``vec_j``) contiguous rows
(columns) strided across the tile. The ``k`` loop is blocked by ``tile_k``; each block of ``a``
and ``b`` can be staged in local memory (``prefetch_a``/``prefetch_b``), ``a`` transposed to
``k``-major so that a work-item reads its rows as vectors; ``vec_j > 1`` makes ``b``, its local
tile and ``c`` OpenCL vector types (``float4`` loads and stores). The inner ``k`` loop is
unrolled by loopy (``full``), by the OpenCL compiler (``hint``), or not at all.

A work-item's register tile is four unrolled ILP loops, one per parameter that sets its
extent: its chunks of rows (``reg_i / vec_i`` of them) and of columns (``reg_j / vec_j``), and
the rows (``vec_i``) and columns (``vec_j``) of a chunk. Their ``nest``, outermost first,
orders the multiply-adds of each ``k`` (and the accumulators' layout); it is searched, since
the orders run at different speeds (1.27-1.40x apart on an H200). The float32 default nests
each chunk's rows, then its columns, b's components innermost (``reg_i,vec_i,reg_j,vec_j``:
the fastest of the region recorded on an H100); float64's rows, columns, then the vector
components.

``pad_a`` lengthens each row of a's k-major local tile by one vector, so the fetch's
transposing stores (one ``k`` per work-item, rows a multiple of 32 banks apart) spread over
the banks (docs/problems.md, "GEMM's transformations"); ``pad_a = 0`` builds the kernel the
default configuration built before it, byte for byte.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from tunefleet.devices import DeviceInfo, Footprint
from tunefleet.problems.base import ArgSpec
from tunefleet.problems.footprints import flat_lanes, footprint, thread_lanes
from tunefleet.problems.kernel import KernelProblem
from tunefleet.problems.nests import require_first
from tunefleet.space import Bool, Choice, Config, PowerOfTwo, Space, require

#: Accumulator budget per work-item: more would spill registers on every GPU we know.
MAX_ACCUMULATOR_BYTES = 512
#: Multiply-adds of one k-block (``reg_i * reg_j * tile_k``) that loopy may unroll
#: (``unroll_k=full``). Its code generation grows with them: about 9 s at 1,024 on a laptop
#: core, 60-140 s at 2,048-4,096 on an H100 node, a whole README run's worth of one core; and
#: among 1,715 H100/H200 trials of 4096³ GEMMs no such configuration came within 11 % of the
#: best (3.58 ms against 3.21 ms), nor on PoCL. ``unroll_k=hint`` asks the OpenCL compiler to
#: unroll the same loop.
MAX_UNROLLED_MADS = 1024

#: The register tile's loops by the parameter that sets each one's extent: chunks of rows,
#: chunks of columns, rows and columns of a chunk.
NEST_AXES = {"reg_i": "ti_reg", "reg_j": "tj_reg", "vec_i": "ti_vec", "vec_j": "tj_vec"}
#: Every order of them, outermost first, written ``reg_i,reg_j,vec_i,vec_j``. The first is the
#: nest the default configuration had when a fixed hash seed chose it, before the nest was a
#: parameter (its code, the same then and now, is the one
#: benchmarks/published/reproduce_gemm_h200.json timed), float64's default still.
NESTS = tuple(",".join(order) for order in itertools.permutations(NEST_AXES))

#: The float32 default's nest: the rows (chunks, then a chunk's rows), then the columns
#: (chunks, then b's vector components); 1.11x faster than the first nest at n = 4096 on an
#: H100 with the default's tile.
FAST_NEST_F32 = "reg_i,vec_i,reg_j,vec_j"

#: Unused elements (vectors of ``vec_i``, where a's tile is vector-typed) after each row of
#: a's k-major local tile. The fetch transposes: consecutive work-items store consecutive k,
#: rows ``wg_i*reg_i`` values apart, for power-of-two tiles of 32 rows or more a multiple of
#: 32 banks (every store of a warp in one bank); one more vector spreads them over the banks.
PAD_A = (0, 1)

#: Parameters added after configurations were recorded, with the value that builds the
#: kernel those configurations built (check_config fills them in).
ADDED_DEFAULTS = {"nest": NESTS[0], "pad_a": 0}


class Gemm(KernelProblem):
    name = "gemm"
    description = "dense matrix product c = a @ b (einsum ik,kj->ij), register-blocked tiles"
    arguments = (
        ArgSpec("n", 2048, "rows of a and c", minimum=1, size=True),
        ArgSpec("m", 2048, "columns of b and c", minimum=1, size=True),
        ArgSpec("k", 2048, "columns of a, rows of b (the summed index)", minimum=1, size=True),
        ArgSpec("dtype", "float32", "element type", choices=("float32", "float64")),
    )

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of(
            [
                PowerOfTwo("wg_i", 1, 32),
                PowerOfTwo("wg_j", 1, 64),
                PowerOfTwo("reg_i", 1, 16),
                PowerOfTwo("reg_j", 1, 16),
                Choice("vec_i", (1, 2, 4)),
                Choice("vec_j", (1, 2, 4)),
                Choice("tile_k", (4, 8, 16, 32, 64)),
                Bool("prefetch_a"),
                Bool("prefetch_b"),
                Choice("unroll_k", ("hint", "full", "none")),
                Choice("nest", NESTS),
                Choice("pad_a", PAD_A),
            ]
        )

    def check_config(self, args: Mapping[str, Any], config: Mapping[str, Any]) -> Config:
        # A configuration from before the nest (a's padding, the work-group's scale) was a
        # parameter (a run created then proposes them still, a recording holds them) gets the
        # value that builds the kernel it built then (ADDED_DEFAULTS): the default nest,
        # unpadded, unscaled.
        if isinstance(config, Mapping):
            config = {**ADDED_DEFAULTS, **config}
        return super().check_config(args, config)

    def default_config(self, args: Mapping[str, Any]) -> Config:
        # float32: the fastest kernel of the GEMM region recorded whole on an H100 (n = 4096,
        # 2.80 ms, 0.96 of cuBLAS; benchmarks/published/recording_gemm_region_h100.json.gz),
        # which default runs found there and on an H200. Alone on that H100 it ran 1.09-1.17x
        # faster than the previous default (below) at n = 1,024-8,192 and k = 1,024, and no
        # slower on PoCL at n = 256 and 512 (docs/problems.md). float64: the previous default,
        # the best of a 300 s search on an H200 (reproduce_gemm_h200.json); on the H100 16 x 16
        # work-items ran 1.13x slower in FAST_NEST_F32 and 1.05x faster in the first nest, one
        # process each, too little to change it on. A k-block of 32 would overflow 48 KiB of
        # local memory in float64, so it blocks by 16.
        # Below 256 columns a 16 x 16 work-group, and on small matrices no wider a row (column)
        # of work-items than the matrix (the rule in config_rules). a's local tile padded
        # (pad_a): 3.11 ms against 3.28 ms unpadded on an H100 (gemm_variants_h100.json).
        n, m = args.get("n", 2048), args.get("m", 2048)
        float32 = args.get("dtype", "float32") == "float32"
        wg_i, wg_j = (8, 32) if m >= 256 and not float32 else (16, 16)
        return {
            "wg_i": _at_most(wg_i, n // 4),
            "wg_j": _at_most(wg_j, m // 4),
            "reg_i": 8,
            "reg_j": 8,
            "vec_i": 4,
            "vec_j": 4,
            "tile_k": 32 if float32 else 16,
            "prefetch_a": True,
            "prefetch_b": True,
            "unroll_k": "hint",
            "nest": FAST_NEST_F32 if float32 else NESTS[0],
            "pad_a": 1,
        }

    def config_rules(self, args: Mapping[str, Any], config: Config) -> None:
        itemsize = np.dtype(args["dtype"]).itemsize
        acc = config["reg_i"] * config["reg_j"]
        require(
            acc * itemsize <= MAX_ACCUMULATOR_BYTES,
            f"reg_i*reg_j = {acc} accumulators of {args['dtype']} per work-item exceed the "
            f"register budget of {MAX_ACCUMULATOR_BYTES} bytes",
        )
        mads = acc * config["tile_k"]
        require(
            config["unroll_k"] != "full" or mads <= MAX_UNROLLED_MADS,
            f"unroll_k=full unrolls reg_i*reg_j*tile_k = {mads} multiply-adds in loopy's code "
            f"generation (minutes above {MAX_UNROLLED_MADS}); use unroll_k=hint (the OpenCL "
            "compiler unrolls the same loop) or a smaller tile",
        )
        require(
            config["reg_i"] % config["vec_i"] == 0,
            f"vec_i={config['vec_i']} must divide reg_i={config['reg_i']}",
        )
        require(
            config["reg_j"] % config["vec_j"] == 0,
            f"vec_j={config['vec_j']} must divide reg_j={config['reg_j']}",
        )
        require(
            args["m"] % config["vec_j"] == 0,
            f"vec_j={config['vec_j']} must divide m={args['m']} (b and c are vector-typed)",
        )
        # A row of work-items wider than the matrix: loopy's guards then skip every store (the
        # kernel wrote nothing at m = 64 with wg_j = 32, vec_j = 4 on PoCL).
        require(
            config["wg_j"] * config["vec_j"] <= args["m"],
            f"wg_j*vec_j = {config['wg_j'] * config['vec_j']} columns per row of work-items "
            f"exceed m={args['m']}",
        )
        require(
            config["wg_i"] * config["vec_i"] <= args["n"],
            f"wg_i*vec_i = {config['wg_i'] * config['vec_i']} rows per column of work-items "
            f"exceed n={args['n']}",
        )
        require(
            config["pad_a"] == 0 or config["prefetch_a"],
            f"pad_a={config['pad_a']} pads a's local tile, and prefetch_a=False has none: "
            "set pad_a=0, or prefetch_a=True",
        )
        # A loop of one iteration (vec_i = 1, or reg_i = vec_i: one chunk) orders nothing, so
        # nests that differ only in where it stands build one kernel: only the first of them,
        # in NESTS' order, is a configuration of its own.
        require_first(
            config["nest"], list(NEST_AXES), _single_iterations(config), "a loop of one iteration"
        )

    def footprint(self, args: Mapping[str, Any], config: Config) -> Footprint:
        itemsize = np.dtype(args["dtype"]).itemsize
        vec_i, vec_j = config["vec_i"], config["vec_j"]
        # A work-group's tile, clipped to the matrix (tunefleet.problems.footprints).
        ti = min(config["wg_i"] * config["reg_i"], args["n"])
        tj = min(config["wg_j"] * config["reg_j"], args["m"])
        tk = min(config["tile_k"], args["k"])
        groups = (config["wg_j"], config["wg_i"])
        lanes = [(thread_lanes(tj, config["wg_j"], vec_j), thread_lanes(ti, config["wg_i"], vec_i))]
        local = 0
        if config["prefetch_a"]:
            # k-major, rows of vec_i-vectors, each row pad_a vectors longer (pad_rows: where
            # the tile keeps two axes besides the vectors'; one of extent one vanishes).
            rows = math.ceil(ti / vec_i)
            padded = rows + config["pad_a"] if tk > 1 and (vec_i > 1 or rows > 1) else rows
            local += tk * padded * vec_i * itemsize
            lanes.append(flat_lanes([rows, tk], groups))
        if config["prefetch_b"]:
            local += tk * tj * itemsize
            lanes.append(flat_lanes([tk, math.ceil(tj / vec_j)], groups))
        return footprint(lanes, local)

    def validation_args(self, args: Mapping[str, Any], config: Config) -> dict[str, Any]:
        # Two tiles plus the same remainder as the target: the same code paths, small sizes.
        ti = config["wg_i"] * config["reg_i"]
        tj = config["wg_j"] * config["reg_j"]
        tk = config["tile_k"]
        return {
            **args,
            "n": min(args["n"], 2 * ti + args["n"] % ti),
            "m": min(args["m"], 2 * tj + args["m"] % tj),
            "k": min(args["k"], 2 * tk + args["k"] % tk),
        }

    def build(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        import loopy as lp

        from tunefleet.problems._loopy import (
            distribute_flat,
            existing,
            global_array,
            indexing,
            make_kernel,
            pad_rows,
            split_thread_axis,
            tag_unroll,
            vector_view,
        )

        n, m, k, dtype = args["n"], args["m"], args["k"], args["dtype"]
        wg_i, wg_j = config["wg_i"], config["wg_j"]
        vec_i, vec_j, tk = config["vec_i"], config["vec_j"], config["tile_k"]
        ti, tj = wg_i * config["reg_i"], wg_j * config["reg_j"]

        knl = make_kernel(
            "{[i, j, kk]: 0 <= i < n and 0 <= j < m and 0 <= kk < l}",
            "c[i, j] = sum(kk, a[i, kk] * b[kk, j])",
            [
                global_array("a", dtype, ("n", "l")),
                global_array("b", dtype, ("l", "m")),
                global_array("c", dtype, ("n", "m"), output=True),
            ],
            name="gemm",
        )
        knl = lp.fix_parameters(knl, n=n, m=m, l=k)
        knl = lp.split_iname(knl, "i", ti, outer_tag="g.1", inner_iname="ti", outer_iname="gi")
        knl = lp.split_iname(knl, "j", tj, outer_tag="g.0", inner_iname="tj", outer_iname="gj")
        knl = lp.split_iname(knl, "kk", tk, inner_iname="kt", outer_iname="kb")
        knl = split_thread_axis(knl, "ti", threads=wg_i, vec=vec_i, lid=1, reg_tag="ilp.unr")
        knl = split_thread_axis(knl, "tj", threads=wg_j, vec=vec_j, lid=0, reg_tag="ilp.unr")
        i_sweep = ["ti_reg", "ti_lid"] + (["ti_vec"] if vec_i > 1 else [])
        j_sweep = ["tj_reg", "tj_lid"] + (["tj_vec"] if vec_j > 1 else [])
        outer = "gi,gj,kb"

        if vec_j > 1:
            knl = vector_view(knl, "b", 2, vec_j)
            knl = vector_view(knl, "c", 2, vec_j)
        if config["prefetch_a"]:
            # Stored k-major, so a work-item's rows of one k are contiguous (vector reads).
            a_sweep = indexing(knl, "a", [*i_sweep, "kt"])
            knl = lp.extract_subst(knl, "a_elem", "a[ii, kq]", parameters="ii, kq")
            knl = lp.precompute(
                knl,
                "a_elem",
                sweep_inames=a_sweep,
                storage_axes=["kq", "ii"],
                precompute_outer_inames=outer,
                precompute_inames=["fa_k", "fa_i"],
                temporary_name="a_tile",
                temporary_address_space=lp.AddressSpace.LOCAL,
                default_tag=None,
            )
            fetch = ["fa_i", "fa_k"]
            if vec_i > 1:
                knl = vector_view(knl, "a_tile", 2, vec_i)
                knl = lp.split_iname(
                    knl, "fa_i", vec_i, inner_iname="fa_iv", outer_iname="fa_ic", inner_tag="unr"
                )
                fetch = ["fa_ic", "fa_k"]
            # Rows of the tile (one k each) a vector longer: the fetch's stores, one k per
            # work-item, then fall in distinct banks (pad_a = 0: all in one, on 32 banks).
            knl = pad_rows(knl, "a_tile", config["pad_a"])
            # k fastest: consecutive work-items read consecutive addresses of a row of a.
            knl = distribute_flat(knl, existing(knl, fetch), (wg_j, wg_i), "fa")
        if config["prefetch_b"]:
            names = ["fb_k", "fb_j"] + (["fb_v"] if vec_j > 1 else [])
            knl = lp.add_prefetch(
                knl,
                "b",
                indexing(knl, "b", [*j_sweep, "kt"]),
                fetch_outer_inames=outer,
                temporary_name="b_tile",
                default_tag=None,
                dim_arg_names=names,
            )
            if vec_j > 1:
                knl = lp.tag_array_axes(knl, "b_tile", "c,c,vec")
                knl = lp.tag_inames(knl, {"fb_v": "vec"})
            knl = distribute_flat(knl, existing(knl, ["fb_k", "fb_j"]), (wg_j, wg_i), "fb")
        # Loopy ignores priorities of ILP loops; tunefleet's code generation nests them (and
        # lays out their accumulators) by them (tunefleet.problems._loopy.nest_order).
        nest = existing(knl, [NEST_AXES[axis] for axis in config["nest"].split(",")])
        if len(nest) > 1:
            knl = lp.prioritize_loops(knl, ",".join(nest))
        return tag_unroll(knl, "kt", config["unroll_k"])

    def make_inputs(self, args: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        dtype = np.dtype(args["dtype"])
        return {
            "a": rng.uniform(-1, 1, (args["n"], args["k"])).astype(dtype),
            "b": rng.uniform(-1, 1, (args["k"], args["m"])).astype(dtype),
        }

    def reference(self, args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"c": inputs["a"].astype(np.float64) @ inputs["b"].astype(np.float64)}

    def flop_count(self, args: Mapping[str, Any]) -> float:
        return 2.0 * args["n"] * args["m"] * args["k"]

    def byte_count(self, args: Mapping[str, Any]) -> float:
        n, m, k = args["n"], args["m"], args["k"]
        return float(np.dtype(args["dtype"]).itemsize * (n * k + k * m + n * m))


def _single_iterations(config: Mapping[str, Any]) -> dict[str, str]:
    """The register tile's loops of one iteration, in NEST_AXES order, each with why."""
    out = {}
    for d, what in (("i", "rows"), ("j", "columns")):
        reg, vec = config[f"reg_{d}"], config[f"vec_{d}"]
        if reg == vec:
            out[f"reg_{d}"] = f"one chunk of {what} (reg_{d} = vec_{d} = {reg})"
        if vec == 1:
            out[f"vec_{d}"] = f"chunks of one of the {what} (vec_{d} = 1)"
    return {axis: out[axis] for axis in NEST_AXES if axis in out}


def _at_most(value: int, limit: int) -> int:
    """``value``, halved until it is at most ``limit`` (a power of two, at least 1)."""
    while value > 1 and value > limit:
        value //= 2
    return value
