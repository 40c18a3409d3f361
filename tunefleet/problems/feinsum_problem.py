"""The ``feinsum`` problem: tune an unchanged feinsum transform-space module for a batched
einsum across the fleet.

Arguments (``--arg KEY=VALUE`` / ``--size K=N`` / ``--dtype`` on the command line):

``space``            ``feinsum:NAME.py`` (a module shipped with feinsum) or ``PATH.py``
``einsum``           ``SUBSCRIPTS`` such as ``ifj,fe,fej->ei`` with one-letter sizes
                     (``--size i=35,f=4,j=15``; an index without a size is a long dimension),
                     ``batch`` (einsums in the batch, default 1), ``operands`` (``L,J,v*``:
                     ``*`` makes one operand per einsum) and ``dtype`` (default float64);
                     or a JSON object in feinsum's archive form (what ``tunefleet feinsum
                     list ARCHIVE`` prints), which is also the stored form
``long_dim_length``  length of every long dimension when timing (default 100000, feinsum's)

The coordinator derives the space statically (:mod:`tunefleet.feinsum_support.static_space`):
no feinsum, loopy or OpenCL there. Workers need feinsum (Python >= 3.12): they build the
einsum with feinsum, apply the module's ``transform`` with the configuration and time the
kernel (:mod:`tunefleet.feinsum_support.runtime`).

Runs whose protocol statistic is ``feinsum-wall-mean`` (the protocol of imported archives,
:data:`~tunefleet.feinsum_support.archive.FEINSUM_PROTOCOL`) are timed with feinsum's own
``timeit`` and share cache keys with imported archive rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from tunefleet.devices import DeviceInfo
from tunefleet.errors import ProblemError
from tunefleet.feinsum_support import archive
from tunefleet.feinsum_support.einsum_spec import EinsumSpec, parse_einsum
from tunefleet.feinsum_support.spaces import normalise_space, space_path
from tunefleet.feinsum_support.static_space import space_from_file
from tunefleet.problems.base import Outcome, Problem, Protocol
from tunefleet.space import Config, Space


class FeinsumProblem(Problem):
    name: ClassVar[str] = "feinsum"
    description: ClassVar[str] = (
        "a feinsum transform-space module (space=feinsum:NAME.py or PATH.py) applied to a "
        "batched einsum (einsum=SUBSCRIPTS with --size, batch, operands, dtype)"
    )
    needs_opencl: ClassVar[bool] = True

    def __init__(self) -> None:
        self._spaces: dict[tuple[str, float, str], Space] = {}

    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        spec, used = parse_einsum(raw)
        space = normalise_space(raw.get("space"))
        long = raw.get("long_dim_length", archive.DEFAULT_LONG_DIM_LENGTH)
        if isinstance(long, bool) or not isinstance(long, int) or long <= 0:
            raise ProblemError(f"long_dim_length={long!r} is not a positive integer")
        unknown = sorted(set(raw) - used - {"space", "long_dim_length"})
        if unknown:
            raise ProblemError(
                f"feinsum does not take argument(s) {', '.join(unknown)}; it takes space, "
                "einsum, one-letter index sizes, batch, operands, dtype and long_dim_length"
            )
        return archive.problem_args(spec, space, long)

    @staticmethod
    def einsum(args: Mapping[str, Any]) -> EinsumSpec:
        return EinsumSpec.from_json(args["einsum"])

    def space(self, args: Mapping[str, Any]) -> Space:
        path = space_path(str(args["space"]))
        spec = self.einsum(args)
        key = (str(path), _mtime(path), repr(spec))
        if key not in self._spaces:
            self._spaces[key] = space_from_file(path, spec)
        return self._spaces[key]

    def prepare(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        from tunefleet.feinsum_support import runtime

        return runtime.prepare(args, config, device)

    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Outcome:
        from tunefleet.feinsum_support import runtime

        return runtime.measure(prepared, session, protocol)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
