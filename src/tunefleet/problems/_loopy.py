"""Loopy transformation helpers shared by the built-in problems.

Every function imports loopy itself, so this module imports (and its names can be looked up)
on machines without loopy; only calling a helper needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: Loopy language version of every built-in kernel.
LANG_VERSION = (2018, 2)

UNROLL_TAGS = {"full": "unr", "hint": "unr_hint", "none": None}


def make_kernel(domain: str, instructions: str, args: list[Any], name: str) -> Any:
    """``lp.make_kernel`` with the settings every built-in uses."""
    import loopy as lp

    return lp.make_kernel(
        domain,
        instructions,
        [*args, ...],
        name=name,
        lang_version=LANG_VERSION,
        # ILP inames make loopy use its v1 scheduler (expected, not news); a group or register
        # index of extent one vanishes from the output index and looks like a write race.
        silenced_warnings=["v1_scheduler_fallback", "write_race(insn)"],
    )


def global_array(name: str, dtype: Any, shape: tuple[int | str, ...], output: bool = False) -> Any:
    import loopy as lp

    return lp.GlobalArg(name, np.dtype(dtype), shape=shape, is_output=output, is_input=not output)


def tag_unroll(knl: Any, iname: str, mode: str) -> Any:
    """Tag ``iname`` by an unroll choice: ``full`` (loopy unrolls), ``hint`` (the OpenCL
    compiler is asked to), ``none``."""
    import loopy as lp

    tag = UNROLL_TAGS[mode]
    return lp.tag_inames(knl, {iname: tag}) if tag else knl


def split_thread_axis(
    knl: Any,
    iname: str,
    *,
    threads: int,
    vec: int,
    lid: int,
    reg_tag: str | None,
    vec_tag: str | None = "ilp.unr",
) -> Any:
    """Map ``iname`` (the extent one work-group covers) to ``threads`` work-items along local
    axis ``lid``, each owning chunks of ``vec`` contiguous values, chunks strided by
    ``threads * vec``: ``iname = (reg * threads + lid) * vec + vec_index``. Produces
    ``{iname}_lid``, ``{iname}_reg`` (tagged ``reg_tag``) and, for ``vec > 1``,
    ``{iname}_vec`` (tagged ``vec_tag``)."""
    import loopy as lp

    rest = iname
    if vec > 1:
        knl = lp.split_iname(
            knl,
            iname,
            vec,
            inner_iname=f"{iname}_vec",
            outer_iname=f"{iname}_rest",
            inner_tag=vec_tag,
        )
        rest = f"{iname}_rest"
    return lp.split_iname(
        knl,
        rest,
        threads,
        inner_iname=f"{iname}_lid",
        outer_iname=f"{iname}_reg",
        inner_tag=f"l.{lid}",
        outer_tag=reg_tag,
    )


def distribute_flat(
    knl: Any, inames: Sequence[str], local_sizes: tuple[int, int], prefix: str
) -> Any:
    """Spread a fetch loop nest over the whole work-group: join ``inames`` (outermost first,
    so the last one varies fastest and consecutive work-items touch consecutive addresses)
    into one index, then split it over local axis 0, local axis 1 and a sequential loop."""
    import loopy as lp

    flat = f"{prefix}_flat"
    if not inames:  # a single value: every work-item stores it, harmlessly
        return knl
    if len(inames) > 1:
        knl = lp.join_inames(knl, list(inames), flat)
    else:
        knl = lp.rename_iname(knl, inames[0], flat)
    l0, l1 = local_sizes
    knl = lp.split_iname(
        knl, flat, l0, inner_tag="l.0", inner_iname=f"{prefix}_l0", outer_iname=f"{prefix}_r"
    )
    return lp.split_iname(
        knl,
        f"{prefix}_r",
        l1,
        inner_tag="l.1",
        inner_iname=f"{prefix}_l1",
        outer_iname=f"{prefix}_loop",
    )


def vector_view(knl: Any, array: str, ndim: int, count: int) -> Any:
    """View the last axis of the ``ndim``-dimensional ``array`` as vectors of ``count``
    (OpenCL ``float4`` and friends): the axis is split and the new innermost axis becomes a
    vector axis. Accesses whose innermost index runs over a ``vec``/unrolled iname become
    vector loads, stores or component accesses (``.s0``)."""
    import loopy as lp

    knl = lp.split_array_axis(knl, array, ndim - 1, count)
    tags = ",".join(["c"] * ndim + ["vec"])
    return lp.tag_array_axes(knl, array, tags)


def existing(knl: Any, names: Sequence[str]) -> list[str]:
    """The ``names`` that are inames of the kernel (loopy drops axes of extent one)."""
    inames = knl.default_entrypoint.all_inames()
    return [n for n in names if n in inames]


def indexing(knl: Any, var: str, names: Sequence[str]) -> list[str]:
    """The ``names`` that occur in an index of an access to ``var`` (a blocking iname of
    extent one vanishes from indices after simplification; sweeping it is an error)."""
    from loopy.symbolic import WalkMapper, get_dependencies

    found: set[str] = set()

    class _Collect(WalkMapper):  # type: ignore[misc]
        def map_subscript(self, expr: Any, *args: Any, **kwargs: Any) -> None:
            if getattr(expr.aggregate, "name", None) == var:
                found.update(get_dependencies(expr.index))
            super().map_subscript(expr, *args, **kwargs)

    collect = _Collect()
    for insn in knl.default_entrypoint.instructions:
        expression = getattr(insn, "expression", None)
        if expression is not None:
            collect(expression)
    return [n for n in names if n in found]


def pad_innermost(knl: Any, temporary: str, pad: int = 1) -> Any:
    """Lengthen the innermost axis of a local temporary by ``pad`` unused elements, so that
    stores along its other axes (a transposing fetch) hit distinct memory banks."""
    import loopy as lp

    kernel = knl.default_entrypoint
    tv = kernel.temporary_variables[temporary]
    shape = [int(s) for s in tv.shape]
    if len(shape) < 2:
        return knl
    storage = [*shape[:-1], shape[-1] + pad]
    strides = [1] * len(storage)
    for axis in range(len(storage) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * storage[axis + 1]
    knl = lp.tag_array_axes(knl, temporary, ",".join(f"stride:{s}" for s in strides))
    kernel = knl.default_entrypoint
    tv = kernel.temporary_variables[temporary]
    return knl.with_kernel(
        kernel.copy(
            temporary_variables={
                **kernel.temporary_variables,
                temporary: tv.copy(storage_shape=tuple(storage)),
            }
        )
    )


def linearize(t_unit: Any) -> Any:
    """``lp.linearize`` without loopy's interactive scheduler debugger (which waits for a key
    press when no schedule exists: a worker must never block on its terminal). A kernel without
    a schedule raises LoopyError."""
    import loopy as lp
    from constantdict import constantdict
    from loopy.check import pre_schedule_checks
    from loopy.diagnostic import LoopyError
    from loopy.kernel.function_interface import CallableKernel
    from loopy.schedule import (
        MinRecursionLimitForScheduling,
        generate_loop_schedules,
        schedule_cache,
    )

    pre_schedule_checks(t_unit)
    callables = {}
    for name, clbl in t_unit.callables_table.items():
        if isinstance(clbl, CallableKernel) and clbl.subkernel.linearization is None:
            kernel = clbl.subkernel
            key = (kernel, t_unit.callables_table)
            try:
                scheduled = schedule_cache[key] if lp.CACHING_ENABLED else None
            except KeyError:
                scheduled = None
            if scheduled is None:
                with MinRecursionLimitForScheduling(kernel):
                    schedules = generate_loop_schedules(
                        kernel, t_unit.callables_table, debug_args={"interactive": False}
                    )
                    try:
                        scheduled = next(iter(schedules))
                    except RuntimeError as exc:
                        raise LoopyError(f"no schedule exists: {exc}") from None
                    finally:
                        del schedules
                if lp.CACHING_ENABLED:
                    schedule_cache.store_if_not_present(key, scheduled)
            clbl = clbl.copy(subkernel=scheduled)
        callables[name] = clbl
    return t_unit.copy(callables_table=constantdict(callables))
