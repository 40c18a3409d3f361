"""Owns the arithmetic behind the built-in problems' :meth:`~.base.Problem.footprint`: the
work-group and local memory a configuration's kernel asks for, worked out without loopy.

Loopy sizes a work-group by the longest loop along each local axis (over every loop mapped to
it: the compute's and each fetch's), and a loop's extent by its iteration domain, so a tile
larger than the matrix is clipped to it. A local tile's axes of extent one vanish, and the
padding of :func:`~._loopy.pad_innermost` lengthens its innermost remaining axis when at least
two remain. Each function here mirrors one helper of :mod:`._loopy`; the built-ins' footprints
are checked against loopy's own numbers (tests/integration/test_kernel_problems.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from tunefleet.devices import Footprint


def thread_lanes(extent: int, threads: int, vec: int = 1) -> int:
    """Work-items along the local axis of ``split_thread_axis`` (or of one ``split_iname``
    tagged ``l.*``) over a loop of ``extent``: at most ``threads``, fewer on a short loop."""
    return min(threads, math.ceil(extent / vec))


def flat_lanes(extents: Sequence[int], local_sizes: tuple[int, int]) -> tuple[int, int]:
    """Work-items along local axes 0 and 1 of ``distribute_flat`` over loops of ``extents``."""
    if not extents:
        return (1, 1)
    total = math.prod(extents)
    l0, l1 = local_sizes
    return (min(l0, total), min(l1, math.ceil(total / l0)))


def local_tile_bytes(extents: Iterable[int], itemsize: int, pad: int = 0) -> int:
    """Bytes of a local tile whose storage axes have ``extents`` (outermost first), its
    innermost remaining axis lengthened by ``pad`` elements (:func:`~._loopy.pad_innermost`)."""
    axes = [e for e in extents if e != 1]
    if pad and len(axes) >= 2:
        axes[-1] += pad
    return math.prod(axes) * itemsize


def footprint(lanes: Iterable[tuple[int, int]], local_mem_bytes: int) -> Footprint:
    """A work-group of the longest of ``lanes`` (local axis 0, axis 1) along each axis."""
    pairs = list(lanes)
    return Footprint(
        (max(p[0] for p in pairs), max(p[1] for p in pairs)),
        local_mem_bytes,
    )
