"""Good regions of the built-in GPU problems: sub-boxes small enough to record densely.

Each class is the built-in problem (same arguments, rules and kernels, byte for byte) with
its space narrowed to the values around the fastest kernels found so far on H100s and H200s
(docs/tuning.md), so that ``benchmarks/record_space.py`` with ``--phase grid:SECONDS`` can
measure every configuration of the region and a replay answers each proposal with its own
measurement, not a neighbour's. A narrowed parameter keeps its kind (a power-of-two range
stays one), so the searches see the same kind of space they see in a real run; the default
configuration of each problem lies inside its region.

    python benchmarks/record_space.py benchmarks/inputs/regions.py:GemmRegion \\
        --size m=4096,n=4096,k=4096 --dtype float32 --phase grid:520 \\
        --tune-flag=--device --tune-flag=gpu --out recording_gemm_region_h100.json.gz
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tunefleet.errors import ProblemError
from tunefleet.problems.dg import FaceMass
from tunefleet.problems.gemm import Gemm
from tunefleet.problems.transpose import Transpose
from tunefleet.space import Choice, Param, PowerOfTwo, Space


def narrowed(space: Space, keep: Mapping[str, Sequence[Any]]) -> Space:
    """``space`` with each parameter named in ``keep`` limited to those values (in the
    parameter's own order); a contiguous power-of-two range stays a power-of-two range."""
    unknown = sorted(set(keep) - set(space.names()))
    if unknown:
        raise ProblemError(f"region names unknown parameter {unknown[0]!r}")
    params: list[Param] = []
    for param in space:
        if param.name not in keep:
            params.append(param)
            continue
        # By repr, as the space's membership is exact: True is not 1.
        wanted = set(map(repr, keep[param.name]))
        values = [v for v in param.values() if repr(v) in wanted]
        if len(values) != len(wanted):
            raise ProblemError(f"region of {param.name!r}: {keep[param.name]!r} leaves its space")
        if (
            isinstance(param, PowerOfTwo)
            and values == PowerOfTwo(param.name, values[0], values[-1]).values()
        ):
            params.append(PowerOfTwo(param.name, values[0], values[-1]))
        else:
            params.append(Choice(param.name, tuple(values)))
    return Space.of(params)


class _Region:
    """A built-in problem whose space is narrowed to ``region`` (put first in the bases)."""

    region: Mapping[str, Sequence[Any]] = {}

    def space(self, args: Mapping[str, Any]) -> Space:
        return narrowed(super().space(args), self.region)  # type: ignore[misc]


class GemmRegion(_Region, Gemm):
    """GEMM float32 around the 16x16 and 8x32 work-groups of 8x8 register tiles."""

    name = "gemm_region"
    description = "gemm narrowed to its good region (benchmarks/inputs/regions.py)"
    region: Mapping[str, Sequence[Any]] = {
        "wg_i": (4, 8, 16, 32),
        "wg_j": (8, 16, 32),
        "reg_i": (4, 8, 16),
        "reg_j": (4, 8),
        "vec_i": (2, 4),
        "vec_j": (2, 4),
        "tile_k": (16, 32),
        "prefetch_a": (True,),
        "prefetch_b": (True,),
        "unroll_k": ("hint",),
        "nest": (
            "reg_i,reg_j,vec_i,vec_j",
            "reg_i,vec_i,reg_j,vec_j",
            "vec_i,reg_i,reg_j,vec_j",
            "reg_i,vec_i,vec_j,reg_j",
        ),
        "pad_a": (1,),
    }


class FaceMassRegion(_Region, FaceMass):
    """DG face-mass float64 with the outputs' nodes in registers and u staged."""

    name = "face_mass_region"
    description = "face_mass narrowed to its good region (benchmarks/inputs/regions.py)"
    region: Mapping[str, Sequence[Any]] = {
        "wg_i": (4, 5, 7, 8),
        "wg_e": (16, 32, 64),
        "reg_e": (1, 2, 4, 8),
        "i_in_registers": (True,),
        "prefetch_u": (True,),
        "unroll": ("hint", "full"),
    }


class TransposeRegion(_Region, Transpose):
    """Transpose float32 with tiles of 16 to 128 and work-groups 16 to 64 wide, unrolled."""

    name = "transpose_region"
    description = "transpose narrowed to its good region (benchmarks/inputs/regions.py)"
    region: Mapping[str, Sequence[Any]] = {
        "tile_i": (16, 32, 64),
        "tile_j": (16, 32, 64, 128),
        "wg_0": (16, 32, 64),
        "wg_1": (1, 2, 4, 8, 16),
        "unroll": (True,),
    }
