"""Discontinuous-Galerkin operators: ``dg_diff`` and ``face_mass``.

Both apply a small dense operator to every element of a mesh, so they share one transform
space. ``dg_diff`` is the batched small-matrix product ``out[e,i] = sum_j D[i,j] u[e,j]``
(einsum ``ij,ej->ei``); ``face_mass`` is the DG face-mass ("lift") operator
``out[k,e,i] = sum_{f,j} lift[i,f,j] jac[f,e] u[k,f,e,j]`` (einsum ``ifj,fe,fej->ei``
applied to ``n_fields`` fields ``k`` at once; defaults: 35 volume nodes, 4 faces, 15 nodes
per face — 3D order 4 — in float64).

The space, for both:

- ``wg_i`` work-items along the output node axis ``i`` (local axis 0), each computing
  ``ceil(n_i / wg_i)`` of the ``i`` values (strided by ``wg_i``), kept in registers
  (``i_in_registers``) or computed one after the other;
- ``wg_e`` work-items along the element axis (local axis 1), each computing ``reg_e``
  elements (register blocking: every operator value loaded is used ``reg_e`` times);
- ``prefetch_u``: stage the work-group's element data in local memory (for ``face_mass`` the
  product ``jac * u``, computed once per value while staging), element index innermost so
  that work-items of consecutive elements read consecutive words, padded by one element so
  that the transposing stores do not collide in a memory bank;
- ``prefetch_op``: stage the operator in local memory, transposed so that work-items with
  consecutive ``i`` read consecutive words;
- ``unroll``: the innermost summed loop unrolled by loopy (``full``), by the OpenCL compiler
  (``hint``) or not at all;
- ``nest``: the order, outermost first, of the loops a work-item unrolls into registers
  (output nodes ``i``, face_mass's fields ``k``, elements ``e``): loopy would take it from
  a set's order; a loop not in registers orders nothing, so only the first of the nests that
  differ only there is legal;
- ``face_mass`` only, ``fields``: all fields of an element in one work-item (``ilp``: each
  operator value is reused ``n_fields`` times), one field after the other (``loop``), or one
  field per work-group row (``group``); ``stage``: what the prefetches stage in local memory
  at once, all faces (``all``) or one face at a time (``face``: a quarter of the local
  memory, so larger element tiles and more work-groups per compute unit).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from tunefleet.devices import DeviceInfo, Footprint
from tunefleet.problems.base import ArgSpec
from tunefleet.problems.footprints import flat_lanes, footprint, local_tile_bytes, thread_lanes
from tunefleet.problems.kernel import KernelProblem
from tunefleet.problems.nests import require_first
from tunefleet.space import Bool, Choice, Config, Param, PowerOfTwo, Space, require

#: Accumulator budget per work-item (bytes): 96 doubles leave room for addresses and operands
#: within 255 registers; more would spill.
MAX_ACCUMULATOR_BYTES = 768

#: The loops a work-item's tile unrolls into registers, by the letter a ``nest`` names them
#: with: output nodes (``i_reg``), face_mass's fields (``k``), elements (``te_reg``).
NEST_LOOPS = {"i": "i_reg", "k": "k", "e": "te_reg"}
#: Their orders, outermost first (orders give other kernels: te_reg outside i_reg builds
#: other code than the default's). The first of each is the nest every configuration had
#: before the nest was a parameter: the loops by name (tunefleet.problems._loopy.nest_order).
FACE_MASS_NESTS = tuple(",".join(order) for order in itertools.permutations("ike"))
DG_DIFF_NESTS = ("i,e", "e,i")
#: face_mass's default nest where its output nodes are in registers: elements outside nodes.
DEFAULT_FACE_MASS_NEST = "k,e,i"


def _thread_counts(n: int) -> tuple[int, ...]:
    """Useful numbers of work-items along an axis of length ``n``: its divisors and the
    powers of two up to 64 (those waste a few work-items but fill warps)."""
    divisors = {d for d in range(1, n + 1) if n % d == 0}
    pow2 = {2**p for p in range(7)}
    return tuple(sorted(d for d in divisors | pow2 if d <= max(n, 64)))


def _nodes_per_item(n_i: int, wg_i: int) -> int:
    """Output nodes each work-item computes: ``n_i`` strided over ``wg_i`` work-items."""
    return math.ceil(n_i / wg_i)


def _common_params(n_i: int) -> list[Param]:
    return [
        Choice("wg_i", _thread_counts(n_i)),
        PowerOfTwo("wg_e", 1, 256),
        PowerOfTwo("reg_e", 1, 8),
        Bool("i_in_registers"),
        Bool("prefetch_u"),
        Bool("prefetch_op"),
        Choice("unroll", ("hint", "full", "none")),
    ]


def _validation_elements(n_elements: int, config: Config) -> int:
    tile = config["wg_e"] * config["reg_e"]
    return min(n_elements, 2 * tile + n_elements % tile)


def _map_work(
    knl: Any, config: Config, n_i: int, *, extra_outer: tuple[str, ...] = ()
) -> tuple[Any, str]:
    """Split ``e`` and ``i`` over the work-group; returns the kernel and the inames outside a
    work-group's work (for the prefetches)."""
    import loopy as lp

    from tunefleet.problems._loopy import split_thread_axis

    tile_e = config["wg_e"] * config["reg_e"]
    knl = lp.split_iname(knl, "e", tile_e, outer_tag="g.0", inner_iname="te", outer_iname="ge")
    knl = split_thread_axis(knl, "te", threads=config["wg_e"], vec=1, lid=1, reg_tag="ilp.unr")
    reg_i = _nodes_per_item(n_i, config["wg_i"])
    i_tag = "ilp.unr" if config["i_in_registers"] and reg_i > 1 else None
    knl = lp.split_iname(
        knl,
        "i",
        config["wg_i"],
        inner_tag="l.0",
        inner_iname="i_lid",
        outer_iname="i_reg",
        outer_tag=i_tag,
    )
    outer = ",".join(("ge", *extra_outer))
    return knl, outer


def _element_tile(args: Mapping[str, Any], config: Config) -> int:
    """Elements a work-group computes, clipped to the mesh."""
    return min(config["wg_e"] * config["reg_e"], args["n_elements"])


def _compute_lanes(n_i: int, tile_e: int, config: Config) -> tuple[int, int]:
    """Work-items of :func:`_map_work`'s loops: output nodes (axis 0), elements (axis 1)."""
    return (thread_lanes(n_i, config["wg_i"]), thread_lanes(tile_e, config["wg_e"]))


class _DGOperator(KernelProblem):
    """What both DG operators share: validation on a few element tiles, the register
    budget of the accumulators a work-item holds, and the nest of the loops unrolled into
    registers."""

    #: The ``nest`` parameter's values, the first the nest from before it was a parameter.
    nests: tuple[str, ...] = ()
    #: The argument giving the output nodes per element (the ``i`` axis).
    nodes_arg = ""

    def check_config(self, args: Mapping[str, Any], config: Mapping[str, Any]) -> Config:
        # A configuration from before the nest was a parameter (a run created then proposes
        # them still, a recording holds them) builds the kernel it built then.
        if isinstance(config, Mapping):
            config = {"nest": self.nests[0], **config}
        return super().check_config(args, config)

    def _absent_loops(self, args: Mapping[str, Any], config: Config) -> dict[str, str]:
        """The nest's loops this configuration does not unroll into registers, each with
        why (they order nothing)."""
        out = {}
        if not config["i_in_registers"]:
            out["i"] = "the output nodes are not in registers (i_in_registers=false)"
        elif _nodes_per_item(args[self.nodes_arg], config["wg_i"]) == 1:
            out["i"] = "one output node per work-item"
        if config["reg_e"] == 1:
            out["e"] = "one element per work-item (reg_e=1)"
        return out

    def _require_first_nest(self, args: Mapping[str, Any], config: Config) -> None:
        require_first(
            config["nest"],
            self.nests[0].split(","),
            self._absent_loops(args, config),
            "a loop not in registers",
        )

    def _order_loops(self, knl: Any, args: Mapping[str, Any], config: Config) -> Any:
        """Prioritise the loops unrolled into registers in the configuration's nest."""
        import loopy as lp

        absent = self._absent_loops(args, config)
        nest = [NEST_LOOPS[a] for a in config["nest"].split(",") if a not in absent]
        return lp.prioritize_loops(knl, ",".join(nest)) if len(nest) > 1 else knl

    def validation_args(self, args: Mapping[str, Any], config: Config) -> dict[str, Any]:
        return {**args, "n_elements": _validation_elements(args["n_elements"], config)}

    @staticmethod
    def _require_register_budget(accumulators: int, dtype: str, fix: str) -> None:
        require(
            accumulators * np.dtype(dtype).itemsize <= MAX_ACCUMULATOR_BYTES,
            f"{accumulators} accumulators of {dtype} per work-item exceed the register budget "
            f"of {MAX_ACCUMULATOR_BYTES} bytes ({fix})",
        )


class DGDiff(_DGOperator):
    name = "dg_diff"
    description = "batched small-matrix operator out[e,i] = sum_j D[i,j] u[e,j] (ij,ej->ei)"
    arguments = (
        ArgSpec("n_elements", 262144, "number of elements", minimum=1, size=True),
        ArgSpec(
            "n_dofs", 35, "nodes per element (35: 3D order 4)", minimum=1, maximum=512, size=True
        ),
        ArgSpec("dtype", "float64", "element type", choices=("float32", "float64")),
    )

    nests = DG_DIFF_NESTS
    nodes_arg = "n_dofs"

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of([*_common_params(args["n_dofs"]), Choice("nest", self.nests)])

    def default_config(self, args: Mapping[str, Any]) -> Config:
        # The fastest of a short search on an H200 (1.87 TB/s, 8.2 TFLOP/s in float64).
        return {
            "wg_i": next(d for d in (5, 7, 8) if d in _thread_counts(args["n_dofs"])),
            "wg_e": 32,
            "reg_e": 2,
            "i_in_registers": True,
            "prefetch_u": True,
            "prefetch_op": True,
            "unroll": "hint",
            "nest": self.nests[0],
        }

    def config_rules(self, args: Mapping[str, Any], config: Config) -> None:
        acc = config["reg_e"] * (
            _nodes_per_item(args["n_dofs"], config["wg_i"]) if config["i_in_registers"] else 1
        )
        self._require_register_budget(
            acc, args["dtype"], "lower reg_e, raise wg_i, or i_in_registers=false"
        )
        self._require_first_nest(args, config)

    def footprint(self, args: Mapping[str, Any], config: Config) -> Footprint:
        itemsize = np.dtype(args["dtype"]).itemsize
        nd = args["n_dofs"]
        te, groups = _element_tile(args, config), (config["wg_i"], config["wg_e"])
        lanes = [_compute_lanes(nd, te, config)]
        local = 0
        if config["prefetch_u"]:
            local += local_tile_bytes([nd, te], itemsize, pad=1)
            lanes.append(flat_lanes([te, nd], groups))
        if config["prefetch_op"]:
            local += local_tile_bytes([nd, nd], itemsize)
            lanes.append(flat_lanes([nd, nd], groups))
        return footprint(lanes, local)

    def build(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        import loopy as lp

        from tunefleet.problems._loopy import (
            distribute_flat,
            existing,
            global_array,
            make_kernel,
            pad_innermost,
            tag_unroll,
        )

        nel, nd, dtype = args["n_elements"], args["n_dofs"], args["dtype"]
        knl = make_kernel(
            "{[e, i, j]: 0 <= e < nel and 0 <= i < nd and 0 <= j < nd}",
            "out[e, i] = sum(j, diff[i, j] * u[e, j])",
            [
                global_array("diff", dtype, ("nd", "nd")),
                global_array("u", dtype, ("nel", "nd")),
                global_array("out", dtype, ("nel", "nd"), output=True),
            ],
            name="dg_diff",
        )
        knl = lp.fix_parameters(knl, nel=nel, nd=nd)
        knl, outer = _map_work(knl, config, nd)
        knl = self._order_loops(knl, args, config)
        lsizes = (config["wg_i"], config["wg_e"])
        if config["prefetch_u"]:
            knl = lp.extract_subst(knl, "u_elem", "u[eq, jq]", parameters="eq, jq")
            knl = lp.precompute(
                knl,
                "u_elem",
                sweep_inames=["te_reg", "te_lid", "j"],
                storage_axes=["jq", "eq"],
                precompute_outer_inames=outer,
                precompute_inames=["fu_j", "fu_e"],
                temporary_name="u_tile",
                temporary_address_space=lp.AddressSpace.LOCAL,
                default_tag=None,
            )
            knl = pad_innermost(knl, "u_tile")
            # Node fastest: consecutive work-items read consecutive words of u.
            knl = distribute_flat(knl, existing(knl, ["fu_e", "fu_j"]), lsizes, "fu")
        if config["prefetch_op"]:
            knl = lp.extract_subst(knl, "d_elem", "diff[ii, jj]", parameters="ii, jj")
            knl = lp.precompute(
                knl,
                "d_elem",
                sweep_inames=["i_reg", "i_lid", "j"],
                storage_axes=["jj", "ii"],
                precompute_outer_inames=outer,
                precompute_inames=["fd_j", "fd_i"],
                temporary_name="d_tile",
                temporary_address_space=lp.AddressSpace.LOCAL,
                default_tag=None,
            )
            knl = distribute_flat(knl, existing(knl, ["fd_i", "fd_j"]), lsizes, "fd")
        return tag_unroll(knl, "j", config["unroll"])

    def make_inputs(self, args: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        dtype = np.dtype(args["dtype"])
        nd = args["n_dofs"]
        return {
            "diff": rng.uniform(-1, 1, (nd, nd)).astype(dtype),
            "u": rng.uniform(-1, 1, (args["n_elements"], nd)).astype(dtype),
        }

    def reference(self, args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
        d = inputs["diff"].astype(np.float64)
        u = inputs["u"].astype(np.float64)
        return {"out": u @ d.T}

    def flop_count(self, args: Mapping[str, Any]) -> float:
        return 2.0 * args["n_elements"] * args["n_dofs"] ** 2

    def byte_count(self, args: Mapping[str, Any]) -> float:
        nel, nd = args["n_elements"], args["n_dofs"]
        return float(np.dtype(args["dtype"]).itemsize * (2 * nel * nd + nd * nd))


class FaceMass(_DGOperator):
    name = "face_mass"
    description = (
        "DG face-mass (lift) out[k,e,i] = sum_fj lift[i,f,j] jac[f,e] u[k,f,e,j] "
        "(ifj,fe,fej->ei over n_fields fields)"
    )
    arguments = (
        ArgSpec("n_elements", 131072, "number of elements", minimum=1, size=True),
        ArgSpec("n_fields", 4, "fields the operator is applied to at once", minimum=1),
        ArgSpec("n_voldofs", 35, "volume nodes per element (35: 3D order 4)", minimum=1, size=True),
        ArgSpec("n_faces", 4, "faces per element", minimum=1, size=True),
        ArgSpec("n_facedofs", 15, "nodes per face (15: 3D order 4)", minimum=1, size=True),
        ArgSpec("dtype", "float64", "element type", choices=("float32", "float64")),
    )

    nests = FACE_MASS_NESTS
    nodes_arg = "n_voldofs"

    def _absent_loops(self, args: Mapping[str, Any], config: Config) -> dict[str, str]:
        out = super()._absent_loops(args, config)
        if config["fields"] != "ilp":
            out["k"] = f"the fields are not in registers (fields={config['fields']})"
        elif args["n_fields"] == 1:
            out["k"] = "one field (n_fields=1)"
        return {a: out[a] for a in self.nests[0].split(",") if a in out}

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of(
            [
                *_common_params(args["n_voldofs"]),
                Choice("fields", ("ilp", "loop", "group")),
                Choice("stage", ("all", "face")),
                Choice("nest", self.nests),
            ]
        )

    def default_config(self, args: Mapping[str, Any]) -> Config:
        # The fastest of a short search on an H200 (2.06 TB/s, 11.4 TFLOP/s in float64), with
        # the elements' loop outside the output nodes' (nest k,e,i; fields=group leaves k out
        # of registers): on an H100 that nest ran 1.02-1.36x faster than i,k,e at six sizes
        # and both element types, 0.202 against 0.261 ms at the defaults, the fastest of the
        # whole region recorded there (docs/problems.md). With one output node per work-item
        # only e is in registers, and the nest from before it was a parameter is the legal one.
        wg_i = next(d for d in (5, 7, 8) if d in _thread_counts(args["n_voldofs"]))
        several_nodes = _nodes_per_item(args["n_voldofs"], wg_i) > 1
        return {
            "wg_i": wg_i,
            "wg_e": 32,
            "reg_e": 4,
            "i_in_registers": True,
            "prefetch_u": True,
            "prefetch_op": True,
            "unroll": "hint",
            "fields": "group",
            # One face at a time needs several output nodes per work-item (see config_rules).
            "stage": "face" if several_nodes else "all",
            "nest": DEFAULT_FACE_MASS_NEST if several_nodes else self.nests[0],
        }

    def config_rules(self, args: Mapping[str, Any], config: Config) -> None:
        nodes = _nodes_per_item(args["n_voldofs"], config["wg_i"])
        acc = config["reg_e"] * (nodes if config["i_in_registers"] else 1)
        if config["fields"] == "ilp":
            acc *= args["n_fields"]
        self._require_register_budget(
            acc, args["dtype"], "lower reg_e, raise wg_i, i_in_registers=false or fields=loop"
        )
        # Two shapes loopy never schedules when faces are staged one at a time (checked on
        # 312 configurations here and 94 on an H200, no exception either way): rejecting them
        # here saves a worker the code generation that ends in "no schedule".
        if config["stage"] == "face" and (config["prefetch_u"] or config["prefetch_op"]):
            require(
                config["i_in_registers"] and nodes > 1,
                "stage=face with a prefetch needs the output nodes in registers "
                "(i_in_registers=true and wg_i < n_voldofs): loopy finds no schedule otherwise; "
                "use stage=all or drop the prefetches",
            )
            require(
                not (config["fields"] == "loop" and config["prefetch_op"]),
                "fields=loop with prefetch_op and stage=face has no schedule (the operator "
                "tile would be staged again inside the field loop); use fields=group or ilp, "
                "or stage=all",
            )
        self._require_first_nest(args, config)

    def footprint(self, args: Mapping[str, Any], config: Config) -> Footprint:
        itemsize = np.dtype(args["dtype"]).itemsize
        nv, nfd = args["n_voldofs"], args["n_facedofs"]
        te, groups = _element_tile(args, config), (config["wg_i"], config["wg_e"])
        # The fields and faces a prefetch stages at once (the others' axes vanish).
        fields = args["n_fields"] if config["fields"] == "ilp" else 1
        faces = args["n_faces"] if config["stage"] == "all" else 1
        lanes = [_compute_lanes(nv, te, config)]
        local = 0
        if config["prefetch_u"]:
            local += local_tile_bytes([fields, faces, nfd, te], itemsize, pad=1)
            lanes.append(flat_lanes([fields, faces, te, nfd], groups))
        if config["prefetch_op"]:
            local += local_tile_bytes([faces, nfd, nv], itemsize)
            lanes.append(flat_lanes([nv, faces, nfd], groups))
        return footprint(lanes, local)

    def build(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        import loopy as lp

        from tunefleet.problems._loopy import (
            distribute_flat,
            existing,
            global_array,
            make_kernel,
            pad_innermost,
            tag_unroll,
        )

        nel, nk = args["n_elements"], args["n_fields"]
        nv, nf, nfd = args["n_voldofs"], args["n_faces"], args["n_facedofs"]
        dtype = args["dtype"]
        knl = make_kernel(
            "{[k, e, i, f, j]: 0 <= k < nk and 0 <= e < nel and 0 <= i < nv "
            "and 0 <= f < nf and 0 <= j < nfd}",
            """
            ju(kq, fq, eq, jq) := jac[fq, eq] * u[kq, fq, eq, jq]
            out[k, e, i] = sum([f, j], lift[i, f, j] * ju(k, f, e, j))
            """,
            [
                global_array("lift", dtype, ("nv", "nf", "nfd")),
                global_array("jac", dtype, ("nf", "nel")),
                global_array("u", dtype, ("nk", "nf", "nel", "nfd")),
                global_array("out", dtype, ("nk", "nel", "nv"), output=True),
            ],
            name="face_mass",
        )
        knl = lp.fix_parameters(knl, nel=nel, nk=nk, nv=nv, nf=nf, nfd=nfd)
        fields = config["fields"]
        if fields == "ilp":
            knl = lp.tag_inames(knl, {"k": "ilp.unr"})
        elif fields == "group":
            knl = lp.tag_inames(knl, {"k": "g.1"})
        knl, outer = _map_work(knl, config, nv, extra_outer=("k",) if fields != "ilp" else ())
        knl = self._order_loops(knl, args, config)
        lsizes = (config["wg_i"], config["wg_e"])
        # Staging one face at a time keeps a quarter of the data in local memory: larger
        # element tiles, more work-groups per compute unit, one barrier pair per face.
        per_face = config["stage"] == "face"
        face_sweep = [] if per_face else ["f"]
        if per_face:
            outer = f"{outer},f"
        if config["prefetch_u"]:
            # The field axis has extent one (and vanishes) unless all fields are swept; so
            # does the face axis when faces are staged one at a time.
            knl = lp.precompute(
                knl,
                "ju",
                sweep_inames=[
                    *(["k"] if fields == "ilp" else []),
                    "te_reg",
                    "te_lid",
                    *face_sweep,
                    "j",
                ],
                storage_axes=["kq", "fq", "jq", "eq"],
                precompute_outer_inames=outer,
                precompute_inames=["fu_k", "fu_f", "fu_j", "fu_e"],
                temporary_name="ju_tile",
                temporary_address_space=lp.AddressSpace.LOCAL,
                default_tag=None,
            )
            knl = pad_innermost(knl, "ju_tile")
            # (field, face, element, node) with node fastest: the order of u in memory.
            knl = distribute_flat(
                knl, existing(knl, ["fu_k", "fu_f", "fu_e", "fu_j"]), lsizes, "fu"
            )
        if config["prefetch_op"]:
            knl = lp.extract_subst(
                knl, "lift_elem", "lift[iq, fq2, jq2]", parameters="iq, fq2, jq2"
            )
            knl = lp.precompute(
                knl,
                "lift_elem",
                sweep_inames=["i_reg", "i_lid", *face_sweep, "j"],
                storage_axes=["fq2", "jq2", "iq"],
                precompute_outer_inames=",".join(
                    ["ge", *(["k"] if fields == "group" else []), *(["f"] if per_face else [])]
                ),
                precompute_inames=["fl_f", "fl_j", "fl_i"],
                temporary_name="lift_tile",
                temporary_address_space=lp.AddressSpace.LOCAL,
                default_tag=None,
            )
            knl = distribute_flat(knl, existing(knl, ["fl_i", "fl_f", "fl_j"]), lsizes, "fl")
        # Faces outside, face nodes inside: the unrolled loop is the innermost one.
        knl = lp.prioritize_loops(knl, "f,j")
        return tag_unroll(knl, "j", config["unroll"])

    def make_inputs(self, args: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        dtype = np.dtype(args["dtype"])
        nel, nk = args["n_elements"], args["n_fields"]
        nv, nf, nfd = args["n_voldofs"], args["n_faces"], args["n_facedofs"]
        return {
            "lift": rng.uniform(-1, 1, (nv, nf, nfd)).astype(dtype),
            "jac": rng.uniform(0.5, 1.5, (nf, nel)).astype(dtype),
            "u": rng.uniform(-1, 1, (nk, nf, nel, nfd)).astype(dtype),
        }

    def reference(self, args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
        lift = inputs["lift"].astype(np.float64)
        jac = inputs["jac"].astype(np.float64)
        u = inputs["u"].astype(np.float64)
        return {"out": np.einsum("ifj,fe,kfej->kei", lift, jac, u, optimize=True)}

    def flop_count(self, args: Mapping[str, Any]) -> float:
        # jac * u once per face node, then a multiply-add per operator entry.
        face_values = args["n_elements"] * args["n_fields"] * args["n_faces"] * args["n_facedofs"]
        return float(face_values * (1 + 2 * args["n_voldofs"]))

    def byte_count(self, args: Mapping[str, Any]) -> float:
        nel, nk = args["n_elements"], args["n_fields"]
        nv, nf, nfd = args["n_voldofs"], args["n_faces"], args["n_facedofs"]
        words = nv * nf * nfd + nf * nel + nk * nf * nel * nfd + nk * nel * nv
        return float(np.dtype(args["dtype"]).itemsize * words)
