"""Problems without a device: arguments, spaces, rules, the registry, the protocol's arithmetic.

Nothing here needs OpenCL; one test proves the problem modules import without loopy/pyopencl.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tunefleet.devices import DeviceInfo, DeviceLimits, Footprint
from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.problems.base import Protocol
from tunefleet.problems.footprints import flat_lanes, footprint, local_tile_bytes, thread_lanes
from tunefleet.problems.kernel import KernelProblem, check_device_limits, next_batch
from tunefleet.problems.registry import get_problem, list_problems, problem_info
from tunefleet.space import Space

KERNELS = ("gemm", "dg_diff", "face_mass", "transpose", "jacobi", "axpy")
GPU = DeviceInfo(
    platform="P",
    vendor="V",
    name="Some GPU",
    driver_version="1",
    max_work_group_size=1024,
    max_work_item_sizes=(1024, 1024, 64),
    local_mem_bytes=48 * 1024,
)


@pytest.mark.parametrize("name", KERNELS)
def test_builtin_defaults_are_legal_points_of_a_json_space(name):
    problem = get_problem(name)
    assert isinstance(problem, KernelProblem) and problem.name == name
    args = problem.normalise_args({})
    space = problem.space(args)
    assert Space.from_json(space.to_json()) == space
    config = problem.default_config(args)
    assert problem.check_config(args, config) == config
    assert problem.flop_count(args) >= 0 and problem.byte_count(args) > 0
    assert space.size() > 100  # a space worth searching


def test_arguments_are_converted_and_checked_with_the_argument_named():
    gemm = get_problem("gemm")
    assert gemm.normalise_args({"n": "128", "dtype": "float64"}) == {
        "n": 128,
        "m": 2048,
        "k": 2048,
        "dtype": "float64",
    }
    with pytest.raises(ProblemError, match=r"unknown argument.*size.*its arguments are n, m, k"):
        gemm.normalise_args({"size": 3})
    with pytest.raises(ProblemError, match="dtype='float16' is not one of float32, float64"):
        gemm.normalise_args({"dtype": "float16"})
    with pytest.raises(ProblemError, match="n=0 is below its minimum 1"):
        gemm.normalise_args({"n": 0})
    with pytest.raises(ProblemError, match="k='big' is not a int"):
        gemm.normalise_args({"k": "big"})
    with pytest.raises(ProblemError, match=r"n=2.5 is not a int"):
        gemm.normalise_args({"n": 2.5})


def test_flop_and_byte_counts():
    gemm = get_problem("gemm")
    args = gemm.normalise_args({"n": 4, "m": 5, "k": 6, "dtype": "float64"})
    assert gemm.flop_count(args) == 2 * 4 * 5 * 6
    assert gemm.byte_count(args) == 8 * (4 * 6 + 6 * 5 + 4 * 5)
    fm = get_problem("face_mass")
    fargs = fm.normalise_args({"n_elements": 10})
    assert fm.flop_count(fargs) == 10 * 4 * 4 * 15 * (1 + 2 * 35)
    assert fm.byte_count(fargs) == 8 * (35 * 60 + 4 * 10 + 4 * 4 * 10 * 15 + 4 * 10 * 35)
    assert get_problem("transpose").flop_count({"n": 2, "m": 2, "dtype": "float32"}) == 0


def test_rules_without_a_device_name_the_rule():
    gemm = get_problem("gemm")
    args = gemm.normalise_args({"m": 130})
    base = gemm.default_config(args)
    with pytest.raises(InvalidConfiguration, match="register budget"):
        gemm.check_config(args, {**base, "reg_i": 16, "reg_j": 16})
    with pytest.raises(InvalidConfiguration, match="vec_j=4 must divide m=130"):
        gemm.check_config(args, base)
    with pytest.raises(InvalidConfiguration, match="vec_i=4 must divide reg_i=2"):
        gemm.check_config(gemm.normalise_args({}), {**base, "reg_i": 2})
    # A row (column) of work-items wider than the matrix writes nothing: ruled out up front.
    small = gemm.normalise_args({"n": 16, "m": 64})
    wide = {**gemm.default_config(small), "wg_i": 4, "wg_j": 32, "vec_j": 4}
    with pytest.raises(InvalidConfiguration, match=r"wg_j\*vec_j = 128 columns .* exceed m=64"):
        gemm.check_config(small, wide)
    with pytest.raises(InvalidConfiguration, match=r"wg_i\*vec_i = 32 rows .* exceed n=16"):
        gemm.check_config(small, {**wide, "wg_i": 8, "wg_j": 16})
    assert gemm.check_config(small, {**wide, "wg_j": 16})  # 64 columns: as wide as m


def test_gemm_rules_out_loopy_unrolling_huge_k_blocks():
    """loopy's code generation of ``unroll_k=full`` grows with the unrolled multiply-adds (a
    minute and more past 2,048): past MAX_UNROLLED_MADS the rule rejects it before code
    generation, naming the count and the way out; at the cap, and with ``hint``, it passes."""
    gemm = get_problem("gemm")
    args = gemm.normalise_args({"n": 4096, "m": 4096, "k": 4096})
    default = gemm.default_config(args)  # reg 8 x 8, tile_k 32: 2,048 multiply-adds
    with pytest.raises(InvalidConfiguration, match=r"unroll_k=full unrolls .* = 2048 .*hint"):
        gemm.check_config(args, {**default, "unroll_k": "full"})
    assert gemm.check_config(args, {**default, "unroll_k": "full", "tile_k": 16})  # 1,024
    assert gemm.check_config(args, {**default, "unroll_k": "hint", "tile_k": 64})
    fm = get_problem("face_mass")
    fargs = fm.normalise_args({})
    with pytest.raises(InvalidConfiguration, match="accumulators of float64"):
        fm.check_config(fargs, {**fm.default_config(fargs), "wg_i": 1, "reg_e": 8})
    with pytest.raises(InvalidConfiguration, match="accumulators of float64"):
        fm.check_config(fargs, {**fm.default_config(fargs), "fields": "ilp"})
    with pytest.raises(InvalidConfiguration, match="outside the space"):
        fm.check_config(fargs, {**fm.default_config(fargs), "wg_i": 3})


def _gemm_tile_loops(config):
    """The register tile's loops of more than one iteration, outermost first."""
    extent = {
        "reg_i": config["reg_i"] // config["vec_i"],
        "reg_j": config["reg_j"] // config["vec_j"],
        "vec_i": config["vec_i"],
        "vec_j": config["vec_j"],
    }
    return tuple(axis for axis in config["nest"].split(",") if extent[axis] > 1)


def test_gemm_has_one_legal_nest_per_order_of_its_register_tile_loops():
    """The nest orders the register tile's loops; a loop of one iteration orders nothing, so
    of the nests that build one kernel exactly one is legal, for every register tile: n!
    legal nests for n loops, each ordering them differently; the first always among them, and
    the default's (float32's fastest, float64's the first)."""
    from tunefleet.problems.gemm import FAST_NEST_F32, NESTS

    gemm = get_problem("gemm")
    args = gemm.normalise_args({})
    assert NESTS[0] == "reg_i,reg_j,vec_i,vec_j"
    assert gemm.default_config(args)["nest"] == FAST_NEST_F32 == "reg_i,vec_i,reg_j,vec_j"
    f64 = gemm.normalise_args({"dtype": "float64"})
    assert gemm.default_config(f64)["nest"] == NESTS[0]
    base = {**gemm.default_config(args), "nest": NESTS[0]}
    assert len(set(NESTS)) == 24 and gemm.space(args).param("nest").values() == list(NESTS)
    tiles = 0
    for reg_i, reg_j, vec_i, vec_j in itertools.product(
        (1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4), (1, 2, 4)
    ):
        tile = {**base, "reg_i": reg_i, "reg_j": reg_j, "vec_i": vec_i, "vec_j": vec_j}
        try:
            gemm.check_config(args, tile)
        except InvalidConfiguration:
            continue  # a vector wider than its chunk
        tiles += 1
        legal = []
        for nest in NESTS:
            try:
                legal.append(gemm.check_config(args, {**tile, "nest": nest}))
            except InvalidConfiguration as exc:
                assert "builds the kernel of nest=" in str(exc)
        orders = {_gemm_tile_loops(c) for c in legal}
        assert len(orders) == len(legal) == math.factorial(len(_gemm_tile_loops(tile)))
    assert tiles == 9 * 9  # per dimension: reg 1, 2, 4, 8 with each vec (1, 2, 4) that divides it


def test_gemm_rejects_a_nest_that_orders_a_loop_of_one_iteration():
    gemm = get_problem("gemm")
    args = gemm.normalise_args({})
    scalar_b = {**gemm.default_config(args), "vec_j": 1}  # no vector components of b
    with pytest.raises(
        InvalidConfiguration,
        match=r"nest=reg_i,vec_j,reg_j,vec_i builds the kernel of nest=reg_i,reg_j,vec_i,vec_j: "
        r"chunks of one of the columns \(vec_j = 1\)",
    ):
        gemm.check_config(args, {**scalar_b, "nest": "reg_i,vec_j,reg_j,vec_i"})
    assert gemm.check_config(args, {**scalar_b, "nest": "reg_i,reg_j,vec_i,vec_j"})
    one_chunk = {**gemm.default_config(args), "reg_i": 4}  # reg_i = vec_i: one chunk of rows
    with pytest.raises(InvalidConfiguration, match=r"one chunk of rows \(reg_i = vec_i = 4\)"):
        gemm.check_config(args, {**one_chunk, "nest": "reg_j,reg_i,vec_i,vec_j"})
    assert gemm.check_config(args, {**one_chunk, "nest": "reg_i,reg_j,vec_i,vec_j"})
    # Where every loop has more than one iteration, any order is a kernel of its own.
    assert gemm.check_config(args, {**gemm.default_config(args), "nest": "vec_j,vec_i,reg_j,reg_i"})


@pytest.mark.parametrize("added", [("nest",), ("pad_a",), ("nest", "pad_a")])
def test_a_gemm_configuration_from_before_a_parameter_gets_its_old_value(added):
    """Runs created before the nest (a's padding) was a parameter go on proposing
    configurations without it, and recordings hold them: they are checked (and built) with
    the value that builds the kernel they built then (the unpadded tile, whatever today's
    default pads)."""
    gemm = get_problem("gemm")
    args = gemm.normalise_args({})
    config = gemm.default_config(args)
    assert (config["nest"], config["pad_a"]) == ("reg_i,vec_i,reg_j,vec_j", 1)
    then = {**config, "nest": "reg_i,reg_j,vec_i,vec_j", "pad_a": 0}
    old = {k: v for k, v in then.items() if k not in added}
    assert gemm.check_config(args, old) == then
    # A value given is kept, and an unknown key is still an error.
    assert gemm.check_config(args, {**old, "pad_a": 1})["pad_a"] == 1
    with pytest.raises(InvalidConfiguration, match="unknown"):
        gemm.check_config(args, {**config, "order": "ikj"})


def test_the_first_equivalent_nest_puts_each_absent_loop_as_far_out_as_it_may():
    from tunefleet.problems.nests import first_equivalent

    axes = ["i", "k", "e"]
    assert first_equivalent("e,k,i", axes, []) == "e,k,i"  # every loop there: its own order
    assert first_equivalent("e,i,k", axes, ["k"]) == "k,e,i"  # k ahead of e, behind nothing
    assert first_equivalent("k,e,i", axes, ["k"]) == "k,e,i"
    assert first_equivalent("k,i,e", axes, ["k"]) == "i,k,e"
    assert first_equivalent("e,k,i", axes, ["i", "e"]) == "i,k,e"  # one loop: the first nest


@pytest.mark.parametrize(
    "name, setting, kernels",
    [
        ("face_mass", {"fields": "ilp", "reg_e": 2, "wg_i": 8}, 6),  # i, k and e in registers
        ("face_mass", {"fields": "group"}, 2),  # i and e: k is a work-group axis
        ("face_mass", {"fields": "ilp", "reg_e": 1, "wg_i": 8}, 2),  # i and k
        ("face_mass", {"fields": "group", "i_in_registers": False, "stage": "all"}, 1),
        ("dg_diff", {}, 2),
        ("dg_diff", {"reg_e": 1}, 1),
    ],
)
def test_dg_nests_one_legal_value_per_order_of_the_loops_in_registers(name, setting, kernels):
    """The DG operators' ``nest`` orders the loops a work-item unrolls into registers (output
    nodes i, face_mass's fields k, elements e); a loop not in registers orders nothing, so of
    the nests that build one kernel exactly one is legal (the rest are ruled out naming it),
    and the first, the order from before it was a parameter, is always legal. The default's
    nest is dg_diff's first and face_mass's elements outside its output nodes (faster on an
    H100 at every size measured)."""
    problem = get_problem(name)
    args = problem.normalise_args({"n_fields": 2} if name == "face_mass" else {})
    base = problem.default_config(args)
    assert problem.nests[0] == ("i,k,e" if name == "face_mass" else "i,e")
    assert base["nest"] == ("k,e,i" if name == "face_mass" else "i,e")
    assert problem.space(args).param("nest").values() == list(problem.nests)
    legal = []
    for nest in problem.nests:
        try:
            legal.append(problem.check_config(args, {**base, **setting, "nest": nest})["nest"])
        except InvalidConfiguration as exc:
            assert "builds the kernel of nest=" in str(exc), exc
    assert len(legal) == kernels
    assert problem.nests[0] in legal


@pytest.mark.parametrize("n_voldofs", [1, 4, 8, 10, 20, 35, 56, 84])
def test_the_face_mass_default_is_legal_at_every_node_count(n_voldofs):
    """The default nests elements outside output nodes where a work-item holds several
    nodes; with one node per work-item only the elements are in registers and the first
    nest is the legal one (k,e,i would be rejected as building its kernel)."""
    fm = get_problem("face_mass")
    args = fm.normalise_args({"n_voldofs": n_voldofs, "n_facedofs": min(n_voldofs, 15)})
    config = fm.default_config(args)
    assert fm.check_config(args, config) == config
    several = -(-n_voldofs // config["wg_i"]) > 1
    assert config["nest"] == ("k,e,i" if several else "i,k,e")


@pytest.mark.parametrize("name", ["face_mass", "dg_diff"])
def test_a_dg_configuration_from_before_the_nest_gets_the_nest_it_was_built_with(name):
    problem = get_problem(name)
    args = problem.normalise_args({})
    config = problem.default_config(args)
    old = {k: v for k, v in config.items() if k != "nest"}
    assert problem.check_config(args, old) == {**config, "nest": problem.nests[0]}
    with pytest.raises(InvalidConfiguration):
        problem.check_config(args, {**config, "nest": "k,j"})


def test_gemm_pads_as_local_tile_only_where_there_is_one():
    """pad_a lengthens the rows of a's local tile: legal (0 or 1 vector) with prefetch_a,
    rejected without one, naming what to set; other values are not in the space."""
    from tunefleet.problems.gemm import PAD_A

    gemm = get_problem("gemm")
    args = gemm.normalise_args({})
    base = gemm.default_config(args)
    assert gemm.space(args).param("pad_a").values() == list(PAD_A) == [0, 1]
    for dtype in ("float32", "float64"):
        typed = gemm.normalise_args({"dtype": dtype})
        assert gemm.check_config(typed, {**gemm.default_config(typed), "pad_a": 1})["pad_a"] == 1
    assert gemm.check_config(args, {**base, "pad_a": 0, "prefetch_a": False})
    with pytest.raises(
        InvalidConfiguration,
        match=r"^pad_a=1 pads a's local tile, and prefetch_a=False has none: set pad_a=0, "
        r"or prefetch_a=True$",
    ):
        gemm.check_config(args, {**base, "pad_a": 1, "prefetch_a": False})
    with pytest.raises(InvalidConfiguration, match="pad_a"):
        gemm.check_config(args, {**base, "pad_a": 2})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"i_in_registers": False}, "needs the output nodes in registers"),
        ({"wg_i": 35, "reg_e": 1}, "needs the output nodes in registers"),
        ({"i_in_registers": False, "prefetch_op": False}, "needs the output nodes in registers"),
        ({"fields": "loop"}, "fields=loop with prefetch_op and stage=face"),
        ({"fields": "loop", "prefetch_u": False}, "fields=loop with prefetch_op and stage=face"),
    ],
)
def test_face_mass_rules_out_what_loopy_cannot_schedule(change, message):
    fm = get_problem("face_mass")
    args = fm.normalise_args({})
    # The first nest, legal whichever loops the change takes out of registers.
    base = {**fm.default_config(args), "nest": fm.nests[0]}
    with pytest.raises(InvalidConfiguration, match=message):
        fm.check_config(args, {**base, **change})
    # The same shapes staging everything at once, or staging nothing, stay legal.
    fm.check_config(args, {**base, **change, "stage": "all"})
    unstaged = {"prefetch_u": False, "prefetch_op": False}
    fm.check_config(args, {**base, **change, **unstaged})


def test_validation_sizes_are_small_and_keep_the_remainder():
    gemm = get_problem("gemm")
    args = gemm.normalise_args({"n": 4100, "m": 4096, "k": 4097})
    config = {
        **gemm.default_config(args),
        "wg_i": 16,
        "wg_j": 16,
        "reg_i": 8,
        "reg_j": 8,
        "tile_k": 8,
    }
    small = gemm.validation_args(args, config)
    assert small == {"n": 256 + 4100 % 128, "m": 256, "k": 16 + 1, "dtype": "float32"}
    fm = get_problem("face_mass")
    fargs = fm.normalise_args({"n_elements": 1000})
    fconfig = {**fm.default_config(fargs), "wg_e": 8, "reg_e": 2}
    assert fm.validation_args(fargs, fconfig)["n_elements"] == 32 + 1000 % 16
    jacobi = get_problem("jacobi")
    jargs = jacobi.normalise_args({"n": 1000, "m": 3})
    # Two tiles of the interior plus its remainder, and the two boundary lines.
    assert jacobi.validation_args(jargs, jacobi.default_config(jargs)) == {
        **jargs,
        "n": 2 * 16 + 998 % 16 + 2,
        "m": 3,
    }
    axpy = get_problem("axpy")
    aargs = axpy.normalise_args({"n": 10_000})
    config = {"wg": 64, "reg": 2, "chunk": 4}
    assert axpy.validation_args(aargs, config)["n"] == 2 * 512 + 10_000 % 512


def test_device_limits_are_checked_against_the_device_info():
    check_device_limits((32, 32), 48 * 1024, GPU)
    with pytest.raises(InvalidConfiguration, match=r"2048 work-items \(64, 32\) exceeds.*1024"):
        check_device_limits((64, 32), 0, GPU)
    with pytest.raises(InvalidConfiguration, match=r"size 128 along axis 2 exceeds.*64"):
        check_device_limits((1, 1, 128), 0, GPU)
    with pytest.raises(InvalidConfiguration, match="needs 49153 bytes of local memory"):
        check_device_limits((1,), 48 * 1024 + 1, GPU)
    unknown = dataclasses.replace(
        GPU, max_work_group_size=None, local_mem_bytes=None, max_work_item_sizes=()
    )
    check_device_limits((4096,), 10**9, unknown)  # unknown limits are not guessed


def test_the_limits_of_a_device_class_are_the_loosest_any_of_its_devices_registered():
    h100 = GPU.to_json()
    assert DeviceLimits.loosest([h100]) == DeviceLimits(49152, 1024, (1024, 1024, 64))
    assert DeviceLimits.loosest([]) is None
    # Per limit the largest: a registration can loosen what is ruled out, never tighten it.
    tight = {**h100, "local_mem_bytes": 1024, "max_work_group_size": 64}
    loose = {**h100, "local_mem_bytes": 65536, "max_work_item_sizes": [2048, 1024, 64, 8]}
    assert DeviceLimits.loosest([tight, h100]) == DeviceLimits(49152, 1024, (1024, 1024, 64))
    assert DeviceLimits.loosest([loose, tight]) == DeviceLimits(65536, 1024, (2048, 1024, 64))
    # A limit missing, or not a positive integer, in any registration is not known at all.
    for bad in (None, "49152", -1, 0, True, 1.5):
        garbled = {**h100, "local_mem_bytes": bad, "max_work_item_sizes": [1024, bad]}
        limits = DeviceLimits.loosest([garbled, h100])
        assert limits == DeviceLimits(None, 1024, ()), bad
    assert DeviceLimits.loosest([{}, h100]) == DeviceLimits()
    assert DeviceLimits.loosest([{"max_work_item_sizes": "1024"}]) == DeviceLimits()


def test_a_footprint_is_judged_against_limits_with_the_workers_words():
    limits = DeviceLimits.of(GPU)
    assert limits.exceeded_by(Footprint((32, 32), 48 * 1024)) is None
    over = limits.exceeded_by(Footprint((64, 32), 0))
    assert over == "work-group of 2048 work-items (64, 32) exceeds the device's maximum of 1024"
    assert "needs 49153 bytes of local memory; the device has 49152" == limits.exceeded_by(
        Footprint((1,), 48 * 1024 + 1)
    )
    assert DeviceLimits().exceeded_by(Footprint((4096, 4096), 10**12)) is None
    assert limits.exceeded_by(None) is None  # a problem that cannot tell its footprint


def test_footprint_arithmetic_clips_tiles_and_pads_like_the_loopy_helpers():
    # A loop shorter than its work-items leaves the rest idle and unasked for.
    assert thread_lanes(35, 64) == 35 and thread_lanes(128, 16, vec=4) == 16
    assert thread_lanes(100, 32, vec=4) == 25
    assert flat_lanes([15, 40], (16, 128)) == (16, 38)
    assert flat_lanes([], (16, 128)) == (1, 1)
    # Axes of one vanish; the padding goes on the innermost of at least two.
    assert local_tile_bytes([1, 1, 15, 128], 8, pad=1) == 15 * 129 * 8
    assert local_tile_bytes([1, 10, 1], 8, pad=1) == 10 * 8
    assert local_tile_bytes([4, 15, 35], 8) == 4 * 15 * 35 * 8
    assert footprint([(35, 16), (64, 1)], 0) == Footprint((64, 16), 0)


def test_next_batch_follows_the_protocol():
    p = Protocol(warmup=0, min_launches=5, min_seconds=1.0, max_launches=50)
    assert next_batch([], p) == 5
    assert next_batch([0.125] * 5, p) == 3  # 0.625 s so far: three more reach 1 s
    assert next_batch([0.125] * 8, p) == 0
    assert next_batch([1e-6] * 5, p) == 45  # capped by max_launches
    assert next_batch([1e-6] * 50, p) == 0
    assert next_batch([2.0] * 3, p) == 2  # min_launches still applies
    assert next_batch([0.0] * 5, p) == 45  # a zero-time clock: run to the cap


def test_noisy_samples_take_more_launches_up_to_the_cap():
    p = Protocol(warmup=0, min_launches=5, min_seconds=0.0, max_launches=12)
    quiet, noisy = [1.0, 1.01, 0.99, 1.0, 1.0], [1.0, 1.5, 0.7, 1.2, 2.0]
    assert next_batch(quiet, p) == 0
    assert next_batch(noisy, p) == 5  # as many again
    assert next_batch(noisy * 2, p) == 2  # then up to max_launches
    assert next_batch(noisy * 2 + [1.0, 1.0], p) == 0  # still noisy: the cap wins
    assert next_batch(noisy, replace(p, noise_limit=0.0)) == 0  # 0: never
    assert next_batch(noisy, replace(p, noise_limit=1.0)) == 0  # under a looser limit


def test_protocol_round_trips_and_rejects_nonsense():
    p = Protocol(warmup=1, min_launches=2, min_seconds=0.5, max_launches=9, seed=3)
    assert Protocol.from_json(p.to_json()) == p
    assert Protocol.from_json({**p.to_json(), "future_field": 1}) == p
    for bad in (
        {"min_launches": 0},
        {"max_launches": 1, "min_launches": 2},
        {"warmup": -1},
        {"min_seconds": -1.0},
        {"statistic": "mean"},
        {"noise_limit": -0.1},
    ):
        with pytest.raises(ProblemError, match="protocol"):
            Protocol(**bad)  # type: ignore[arg-type]


def test_compare_reports_wrong_numbers_and_nans():
    gemm = get_problem("gemm")
    assert isinstance(gemm, KernelProblem)
    want = {"c": np.ones((2, 3))}
    ok = gemm.compare(want, {"c": np.ones(6, dtype=np.float32) + 1e-6})
    assert ok["passed"] and ok["outputs"]["c"]["tolerance"] == 1e-4
    bad = gemm.compare(want, {"c": np.full(6, 1.01, dtype=np.float32)})
    assert not bad["passed"] and "wrong numbers (max error 0.01" in bad["reason"]
    nan = np.ones(6)
    nan[2] = np.nan
    verdict = gemm.compare(want, {"c": nan})
    assert not verdict["passed"] and "1 of 6 outputs are NaN" in verdict["reason"]
    assert gemm.compare({"x": np.arange(3)}, {"x": np.arange(3)})["passed"]
    assert not gemm.compare({"x": np.arange(3)}, {"x": np.arange(3) + 1})["passed"]


def test_compare_checks_every_element_unless_the_reference_is_nan():
    gemm = get_problem("gemm")
    assert isinstance(gemm, KernelProblem)
    # No NaN in the reference: every element is checked, as always.
    full = gemm.compare({"c": np.ones((2, 3))}, {"c": np.ones(6)})
    assert full["outputs"]["c"] == {
        "tolerance": 1e-10,
        "dtype": "float64",
        "checked": 6,
        "elements": 6,
        "max_rel_error": 0.0,
    }
    want = np.array([[np.nan, 1.0, np.nan], [2.0, 3.0, np.nan]])
    # Unchecked elements may hold anything, NaN or a wrong number; the error is scaled by the
    # checked reference values only.
    have = np.array([[np.nan, 1.0, 7.0], [2.0, 3.0 + 3e-5, np.inf]], dtype=np.float32)
    ok = gemm.compare({"c": want}, {"c": have})
    assert ok["passed"], ok["reason"]
    assert ok["outputs"]["c"]["checked"] == 3 and ok["outputs"]["c"]["elements"] == 6
    assert ok["outputs"]["c"]["max_rel_error"] == pytest.approx(1e-5, rel=1e-2)
    # NaN where the reference has a number is still caught, and so is a wrong number.
    unwritten = have.copy()
    unwritten[1, 0] = np.nan
    verdict = gemm.compare({"c": want}, {"c": unwritten})
    assert not verdict["passed"]
    assert verdict["reason"] == (
        "c: 1 of 3 checked outputs are NaN or infinite (not written, or a wrong computation)"
    )
    assert verdict["outputs"]["c"]["checked"] == 3
    wrong = have.copy()
    wrong[0, 1] = 1.5
    verdict = gemm.compare({"c": want}, {"c": wrong})
    assert not verdict["passed"] and "c: wrong numbers (max error 0.167" in verdict["reason"]
    # An integer output has no NaN: every element is checked.
    assert gemm.compare({"x": np.arange(3)}, {"x": np.arange(3)})["outputs"]["x"]["checked"] == 3


def test_registry_lists_builtins_with_arguments():
    infos = {info.name: info for info in list_problems()}
    assert set(KERNELS) <= set(infos)
    gemm = infos["gemm"]
    assert gemm.error is None and gemm.needs_opencl and gemm.space_size
    assert {a["name"]: a["default"] for a in gemm.args} == {
        "n": 2048,
        "m": 2048,
        "k": 2048,
        "dtype": "float32",
    }
    assert all(a["help"] for a in gemm.args)
    assert "ifj,fe,fej->ei" in infos["face_mass"].description
    assert infos["face_mass"].to_json()["args"][0]["name"] == "n_elements"
    # The two examples of partial writes and in-place updates, with small spaces.
    assert "only the interior" in infos["jacobi"].description
    assert infos["jacobi"].space_size == 8 * 5 * 4 * 2
    assert "in-place update u[i] += alpha * v[i]" in infos["axpy"].description
    assert infos["axpy"].space_size == 11 * 4 * 3


USER_PROBLEM = """
from tunefleet.problems.base import ArgSpec, Outcome, Problem, normalise_with_specs
from tunefleet.space import IntRange, Space


class Quadratic(Problem):
    name = "quadratic"
    description = "a user problem"
    needs_opencl = False
    arguments = (ArgSpec("center", 3, "where the minimum is"),)

    def normalise_args(self, raw):
        return normalise_with_specs(self.name, self.arguments, raw)

    def space(self, args):
        return Space.of([IntRange("x", 0, 10)])

    def prepare(self, args, config, device):
        return (config["x"] - args["center"]) ** 2

    def measure(self, prepared, session, protocol):
        return Outcome(state="done", median_s=1.0 + prepared)
"""


def test_user_problem_from_a_file_and_module_attr(tmp_path, monkeypatch):
    path = tmp_path / "my_problem.py"
    path.write_text(USER_PROBLEM)
    problem = get_problem(str(path))
    assert problem.name == "quadratic"
    assert problem.prepare({"center": 3}, {"x": 5}, GPU) == 4
    assert get_problem(f"{path}:Quadratic").name == "quadratic"
    info = problem_info(str(path))
    assert info.args == ({"name": "center", "default": 3, "help": "where the minimum is"},)
    assert info.space_size == 11 and not info.needs_opencl
    monkeypatch.syspath_prepend(str(tmp_path))
    assert get_problem("my_problem:Quadratic").name == "quadratic"


def test_registry_errors_name_the_fix(tmp_path):
    with pytest.raises(ProblemError, match=r"unknown problem 'nope'; built-ins are .*gemm"):
        get_problem("nope")
    with pytest.raises(ProblemError, match="does not exist"):
        get_problem(str(tmp_path / "missing.py"))
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ProblemError, match=r"failed to import.*boom"):
        get_problem(str(broken))
    two = tmp_path / "two.py"
    two.write_text(USER_PROBLEM + USER_PROBLEM.replace("Quadratic", "Other"))
    with pytest.raises(ProblemError, match="defines 2 Problem classes"):
        get_problem(str(two))
    with pytest.raises(ProblemError, match="no attribute 'Missing'"):
        get_problem(f"{two}:Missing")
    with pytest.raises(ProblemError, match="cannot load problem 'no_such_module:X'"):
        get_problem("no_such_module:X")


def test_problem_modules_import_without_loopy_or_pyopencl():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["loopy"] = None
        sys.modules["pyopencl"] = None
        sys.modules["islpy"] = None
        from tunefleet.problems.registry import get_problem
        for name in ("gemm", "dg_diff", "face_mass", "transpose", "jacobi", "axpy"):
            p = get_problem(name)
            args = p.normalise_args({})
            p.check_config(args, p.default_config(args))
            p.space(args).to_json()
        print("ok")
        """
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


@pytest.mark.parametrize("size", [8, 16, 32, 64, 128, 256, 1000, 4096])
def test_the_gemm_default_obeys_its_own_rules_at_every_size(size):
    gemm = get_problem("gemm")
    args = gemm.normalise_args({"n": size, "m": size, "k": size})
    config = gemm.default_config(args)
    assert gemm.check_config(args, config) == config
    assert (config["wg_i"], config["wg_j"]) == (min(16, size // 4),) * 2
    f64 = gemm.normalise_args({"n": size, "m": size, "k": size, "dtype": "float64"})
    config = gemm.default_config(f64)
    assert gemm.check_config(f64, config) == config
    wide = size >= 256
    assert (config["wg_i"], config["wg_j"]) == ((8, 32) if wide else (min(16, size // 4),) * 2)
