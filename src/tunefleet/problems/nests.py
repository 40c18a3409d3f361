"""Owns the rule that makes a loop nest a parameter without duplicate kernels: which nest, of
those a space lists, stands for all the nests that build one kernel.

A problem whose register tile has several loops unrolled into registers (loopy's ``ilp``
tags) orders them by a ``nest`` parameter (outermost first), since loopy otherwise takes the
order from a Python set. A loop that is not there in a configuration (one iteration, or not
unrolled) orders nothing, so nests differing only in where it stands build one kernel; only
the first of them in the space's order is searched (the problem's rules reject the others).
No loopy here: the coordinator applies the rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tunefleet.space import require


def first_equivalent(nest: str, axes: Sequence[str], absent: Sequence[str]) -> str:
    """The first nest, in the order of the permutations of ``axes``, that builds the kernel
    ``nest`` builds: the loops present in the same order, each absent one as far out as that
    allows (ahead of every loop after it in ``axes``). ``nest`` and the result are written
    ``a,b,c``."""
    rank = {axis: i for i, axis in enumerate(axes)}
    looped = [axis for axis in nest.split(",") if axis not in absent]
    free = sorted(absent, key=rank.__getitem__)
    out = []
    while looped or free:
        if free and (not looped or rank[free[0]] < rank[looped[0]]):
            out.append(free.pop(0))
        else:
            out.append(looped.pop(0))
    return ",".join(out)


def require_first(nest: str, axes: Sequence[str], absent: Mapping[str, str], what: str) -> None:
    """The rule: ``nest`` must be :func:`first_equivalent`'s nest, else the configuration is
    ruled out naming the nest that builds its kernel and why each absent loop is absent
    (``absent``: loop -> why); ``what`` says what an absent loop is (``a loop of one
    iteration``)."""
    first = first_equivalent(nest, axes, list(absent))
    require(
        nest == first,
        f"nest={nest} builds the kernel of nest={first}: "
        + "; ".join(absent.values())
        + f", and {what} orders nothing (only the first of such nests, "
        "in the order of the values, is searched)",
    )
