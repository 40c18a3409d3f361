"""The good regions that the dense recordings were measured on (benchmarks/inputs/regions.py):
each is its built-in problem narrowed, with the same rules and the same kernels."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tunefleet.coordinator.grid import configurations
from tunefleet.devices import DeviceInfo
from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.problems.kernel import KernelProblem
from tunefleet.problems.registry import get_problem
from tunefleet.recording import load
from tunefleet.space import Choice, PowerOfTwo, config_hash

REGIONS = Path(__file__).resolve().parents[2] / "benchmarks" / "inputs" / "regions.py"
#: Region class, the built-in it narrows, and the arguments its recording was measured at.
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("GemmRegion", "gemm", {"n": 4096, "m": 4096, "k": 4096, "dtype": "float32"}),
    ("FaceMassRegion", "face_mass", {}),
    ("TransposeRegion", "transpose", {}),
]


def region(name: str) -> Any:
    return get_problem(f"{REGIONS}:{name}")


def _allowed(problem: Any, args: Any, config: dict[str, Any]) -> bool:
    try:
        problem.check_config(dict(args), config)
    except InvalidConfiguration:
        return False
    return True


@pytest.mark.parametrize(("name", "builtin", "raw"), CASES)
def test_a_region_is_its_problem_narrowed_around_the_default(name, builtin, raw):
    narrow, full = region(name), get_problem(builtin)
    args = full.normalise_args(raw)
    small, big = narrow.space(args), full.space(args)
    assert small.names() == big.names()
    assert 100 < small.size() < big.size()
    for param in small:
        assert set(map(repr, param.values())) <= set(map(repr, big.param(param.name).values()))
        # A narrowed power-of-two range is still one: the searches see its order.
        if isinstance(big.param(param.name), PowerOfTwo) and len(param.values()) > 1:
            assert isinstance(param, PowerOfTwo), param
    default = full.default_config(args)
    assert narrow.default_config(args) == default
    assert narrow.check_config(args, default) == full.check_config(args, default)
    # Outside the region is outside its space, and a rule of the built-in still applies.
    outside = next(p for p in small if len(p.values()) < len(big.param(p.name).values()))
    other = next(v for v in big.param(outside.name).values() if v not in outside.values())
    with pytest.raises(InvalidConfiguration):
        narrow.check_config(args, {**default, outside.name: other})


def test_the_gemm_region_keeps_the_rules_of_gemm():
    narrow = region("GemmRegion")
    args = narrow.normalise_args({"n": 4096, "m": 4096, "k": 4096, "dtype": "float32"})
    config = {**narrow.default_config(args), "reg_i": 4, "vec_i": 4}
    # reg_i = vec_i leaves one chunk of rows: of two nests that differ only in where that
    # loop stands, only the first (in gemm's order of nests) is a configuration.
    with pytest.raises(InvalidConfiguration, match="one iteration"):
        narrow.check_config(args, {**config, "nest": "vec_i,reg_i,reg_j,vec_j"})
    kept = narrow.check_config(args, {**config, "nest": "reg_i,vec_i,reg_j,vec_j"})
    assert kept["nest"] == "reg_i,vec_i,reg_j,vec_j"


def test_a_region_builds_the_builtins_kernel_byte_for_byte():
    narrow, full = region("GemmRegion"), get_problem("gemm")
    args = full.normalise_args({"n": 64, "m": 64, "k": 16})
    device = DeviceInfo("none", "none", "no device", "0")
    config = full.check_config(args, {**full.default_config(args), "wg_i": 4, "wg_j": 8})
    ours = KernelProblem._build(narrow, args, narrow.check_config(args, config), device)
    theirs = KernelProblem._build(full, args, config, device)
    assert ours.source == theirs.source and "__kernel" in ours.source


def test_a_region_that_leaves_its_space_says_which_parameter():
    module = sys.modules[type(region("GemmRegion")).__module__]
    space = get_problem("gemm").space(get_problem("gemm").normalise_args({}))
    with pytest.raises(ProblemError, match="unknown parameter 'wg_x'"):
        module.narrowed(space, {"wg_x": (1,)})
    with pytest.raises(ProblemError, match=r"'tile_k'.*leaves its space"):
        module.narrowed(space, {"tile_k": (32, 48)})
    with pytest.raises(ProblemError, match=r"'pad_a'.*leaves its space"):
        module.narrowed(space, {"pad_a": (True,)})  # exact, as the space is: True is not 1
    kept = module.narrowed(space, {"wg_i": (2, 8), "unroll_k": ("none",)})
    # 2 and 8 are not a contiguous power-of-two range: a choice of the two.
    assert isinstance(kept.param("wg_i"), Choice) and kept.param("wg_i").values() == [2, 8]
    assert kept.param("unroll_k").values() == ["none"]


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("GemmRegion", "recording_gemm_region_h100.json.gz"),
        ("FaceMassRegion", "recording_face_mass_region_h100.json.gz"),
        ("TransposeRegion", "recording_transpose_region_h100.json.gz"),
    ],
)
def test_a_published_dense_recording_holds_every_configuration_of_its_region(name, file):
    """What makes a recording dense: a replay of it answers every evaluation with the
    configuration's own measurement, never a neighbour's."""
    rec = load(REGIONS.parents[1] / "published" / file)
    narrow = region(name)
    assert rec.space == narrow.space(narrow.normalise_args(dict(rec.problem_args)))
    hashes = {config_hash(row.config) for row in rec.rows}
    assert len(hashes) == len(rec.rows) == rec.space.size()
    timed = [row for row in rec.rows if row.median_s is not None]
    assert len(timed) > 1000 and all(row.state == "done" for row in timed)
    # No configuration the rules reject has a time: the region's rules are gemm's own.
    allowed = {
        config_hash(c) for c in configurations(rec.space) if _allowed(narrow, rec.problem_args, c)
    }
    assert {config_hash(r.config) for r in timed} <= allowed
