"""Loopy transformation helpers shared by the built-in problems.

Every function imports loopy itself, so this module imports (and its names can be looked up)
on machines without loopy; only calling a helper needs it.

**One kernel per configuration, whatever the hash seed.** Loopy 2025.2 takes two orders from
iterating Python sets of iname names, whose order follows the process's string-hash seed: the
nest of ILP loops (its scheduler tries them innermost, one set member after the other; loop
priorities do not reach them) and the axes it adds to a temporary written inside ILP or
vector loops (a reduction's accumulator, privatised per ILP iteration). One configuration
then built to several kernels, 1.27-1.40x apart in speed on an H200. :func:`preprocess` and
:func:`linearize` fix both orders from the kernel itself (:func:`nest_order`): the kernel's
loop priorities where they order those inames (``lp.prioritize_loops``; a problem makes the
nest a parameter that way), then the names. Nothing of tunefleet's code generation depends on
the hash seed (tests/integration/test_kernel_problems.py builds every built-in under five).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

_log = logging.getLogger(__name__)

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


def pad_rows(knl: Any, temporary: str, pad: int) -> Any:
    """Lengthen the innermost axis of a local temporary that is not a vector axis by ``pad``
    unused elements of it (vectors, where a vector axis follows): the axes outside it then
    stride by a number of banks that spreads a transposing fetch's stores over the banks.
    Unlike :func:`pad_innermost`, a vector-typed temporary (``float4 a_tile[...]``) keeps its
    vectors whole and aligned. ``pad = 0`` leaves the kernel as it is."""
    import loopy as lp
    from loopy.kernel.array import VectorArrayDimTag

    if pad == 0:
        return knl
    kernel = knl.default_entrypoint
    tv = kernel.temporary_variables[temporary]
    shape = [int(s) for s in tv.shape]
    is_vec = [isinstance(tag, VectorArrayDimTag) for tag in tv.dim_tags]
    plain = [axis for axis in range(len(shape)) if not is_vec[axis]]
    if any(is_vec[: len(plain)]):
        raise ValueError(f"{temporary}: pad_rows needs its vector axis innermost")
    if len(plain) < 2:
        return knl
    storage = list(shape)
    storage[plain[-1]] += pad
    # Strides in scalars: the vector axis is contiguous; the others nest outward in order.
    stride = math.prod(shape[len(plain) :])
    strides: dict[int, int] = {}
    for axis in reversed(plain):
        strides[axis] = stride
        stride *= storage[axis]
    tags = ",".join(
        "vec" if is_vec[axis] else f"stride:{strides[axis]}" for axis in range(len(shape))
    )
    knl = lp.tag_array_axes(knl, temporary, tags)
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


def nest_order(kernel: Any, inames: Iterable[str]) -> list[str]:
    """``inames`` outermost first: as the kernel's loop priorities order them (every chain of
    ``kernel.loop_priority``, restricted to ``inames``), the rest by name. LoopyError when the
    priorities contradict each other."""
    from loopy.diagnostic import LoopyError

    names = set(inames)
    inner: dict[str, set[str]] = {name: set() for name in names}
    for chain in kernel.loop_priority:
        present = [name for name in chain if name in names]
        for outer, nested in itertools.pairwise(present):
            inner[outer].add(nested)
    waiting = {name: 0 for name in names}
    for nested in inner.values():
        for name in nested:
            waiting[name] += 1
    ready = [name for name, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        name = heapq.heappop(ready)
        order.append(name)
        for nested in inner[name]:
            waiting[nested] -= 1
            if waiting[nested] == 0:
                heapq.heappush(ready, nested)
    if len(order) != len(names):
        raise LoopyError(f"the loop priorities of {', '.join(sorted(names))} form a cycle")
    return order


def _ilp_and_vec_inames(kernel: Any) -> tuple[set[str], set[str]]:
    from loopy.kernel.data import IlpBaseTag, VectorizeTag, filter_iname_tags_by_type

    ilp = {
        n for n, iname in kernel.inames.items() if filter_iname_tags_by_type(iname.tags, IlpBaseTag)
    }
    vec = {
        n
        for n, iname in kernel.inames.items()
        if filter_iname_tags_by_type(iname.tags, VectorizeTag)
    }
    return ilp, vec


def _privatize_in_nest_order(kernel: Any) -> Any:
    """What loopy's ``realize_ilp`` does (a temporary written inside ILP or vector loops it
    does not index by gets an axis per such loop, decided by its first writer), with the axes
    in :func:`nest_order` (vector loops last, as loopy nests them) instead of a set's order:
    one loop at a time, each call appending its axis."""
    import loopy as lp

    ilp, vec = _ilp_and_vec_inames(kernel)
    if not ilp | vec:
        return kernel
    writers = kernel.writer_map()
    axes_of: dict[str, frozenset[str]] = {}
    for name in sorted(kernel.temporary_variables):
        for insn_id in sorted(writers.get(name, ())):
            insn = kernel.id_to_insn[insn_id]
            axes = (insn.within_inames & (ilp | vec)) - insn.write_dependency_names()
            if axes:
                axes_of[name] = frozenset(axes)
            break  # loopy's own pass, which runs next, checks the other writers
    for name, axes in axes_of.items():
        for iname in nest_order(kernel, axes & ilp) + nest_order(kernel, axes & vec):
            kernel = lp.privatize_temporaries_with_inames(kernel, iname, only_var_names={name})
    return kernel


def preprocess(t_unit: Any) -> Any:
    """``lp.preprocess_kernel`` with the privatised axes in nest order: the steps it takes
    before it privatises (the same, in its order: callables, types, substitutions, default
    dependencies, reductions), then :func:`_privatize_in_nest_order`, then loopy's own
    preprocessing, whose privatisation then finds nothing left to do."""
    import loopy as lp
    from loopy.kernel import KernelState
    from loopy.kernel.creation import apply_single_writer_dependency_heuristic
    from loopy.transform.realize_reduction import realize_reduction
    from loopy.transform.subst import expand_subst
    from loopy.translation_unit import for_each_kernel, resolve_callables

    if t_unit.state >= KernelState.PREPROCESSED:
        return t_unit
    t_unit = resolve_callables(t_unit)
    t_unit = lp.infer_unknown_types(t_unit, expect_completion=False)
    t_unit = expand_subst(t_unit)
    t_unit = apply_single_writer_dependency_heuristic(t_unit)
    t_unit = realize_reduction(t_unit, unknown_types_ok=False)
    t_unit = for_each_kernel(_privatize_in_nest_order)(t_unit)
    return lp.preprocess_kernel(t_unit)


def _nest_ilp_loops(kernel: Any) -> Any:
    """The linearised ``kernel`` with every perfectly nested run of ILP loops (entered one
    after the other, left together) reordered into :func:`nest_order`. Loopy enters such
    loops innermost, in a set's order; their iterations are independent (that is what ILP
    means), so any order is a legal interchange. A run that is not all in nest order after
    that (an instruction between its loops' leaves) is logged: its order may follow the hash
    seed."""
    from loopy.schedule import EnterLoop, LeaveLoop

    ilp, _ = _ilp_and_vec_inames(kernel)
    items = list(kernel.linearization)
    changed = False
    start = 0
    while start < len(items):
        end = start
        while end < len(items) and isinstance(items[end], EnterLoop) and items[end].iname in ilp:
            end += 1
        if end - start > 1:
            leave = _leave_of(items, end)
            # The innermost loops of the run that are left together right after its body; an
            # outer one left later (an instruction between the leaves) keeps its place.
            size = end - start
            while size > 1 and not _left_together(items, leave, items[end - size : end]):
                size -= 1
            if size > 1:
                inner = [item.iname for item in items[end - size : end]]
                order = nest_order(kernel, inner)
                if order != inner:
                    items[end - size : end] = [EnterLoop(iname=name) for name in order]
                    items[leave : leave + size] = [LeaveLoop(iname=n) for n in order[::-1]]
                    changed = True
            run = [item.iname for item in items[start:end]]
            if run != nest_order(kernel, run):
                _log.warning(
                    "%s: loopy nested the ILP loops %s in an order tunefleet did not fix; "
                    "its code may depend on the hash seed",
                    kernel.name,
                    ", ".join(run),
                )
        start = max(end, start + 1)
    return kernel.copy(linearization=items) if changed else kernel


def _left_together(items: list[Any], leave: int, entered: list[Any]) -> bool:
    """The loops ``entered`` (outermost first) are left at ``leave`` and right after it."""
    from loopy.schedule import LeaveLoop

    left = items[leave : leave + len(entered)]
    return all(isinstance(item, LeaveLoop) for item in left) and [item.iname for item in left] == [
        item.iname for item in reversed(entered)
    ]


def _leave_of(items: list[Any], body: int) -> int:
    """The position of the LeaveLoop of the loop entered just before ``items[body]``."""
    from loopy.schedule import EnterLoop, LeaveLoop

    depth = 0
    for pos in range(body, len(items)):
        if isinstance(items[pos], EnterLoop):
            depth += 1
        elif isinstance(items[pos], LeaveLoop):
            if depth == 0:
                return pos
            depth -= 1
    raise ValueError("a loop of the linearisation is never left")


def linearize(t_unit: Any) -> Any:
    """``lp.linearize`` without loopy's interactive scheduler debugger (which waits for a key
    press when no schedule exists: a worker must never block on its terminal), with every
    perfectly nested run of ILP loops in :func:`nest_order`. A kernel without a schedule raises
    LoopyError."""
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
            clbl = clbl.copy(subkernel=_nest_ilp_loops(scheduled))
        callables[name] = clbl
    return t_unit.copy(callables_table=constantdict(callables))
