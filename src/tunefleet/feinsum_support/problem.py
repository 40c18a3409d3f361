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

Without ``einsum`` and ``space`` the problem is :data:`DEMO`, feinsum's face-mass example.

The coordinator derives the space statically (:mod:`tunefleet.feinsum_support.static_space`):
no feinsum, loopy or OpenCL there. Workers need feinsum (Python >= 3.12): it builds and
transforms the kernel (:mod:`tunefleet.feinsum_support.runtime`), and the
:class:`~tunefleet.problems.kernel.KernelProblem` machinery validates it against NumPy at a
long dimension of 100 (feinsum's validation size) and times it with the run's protocol. Runs
whose protocol statistic is ``feinsum-wall-mean`` are timed with feinsum's own ``timeit``
instead, and share cache keys with imported archive rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tunefleet.devices import DeviceInfo
from tunefleet.errors import DeviceError, ProblemError
from tunefleet.feinsum_support import archive
from tunefleet.feinsum_support.einsum_spec import EinsumSpec, parse_einsum
from tunefleet.feinsum_support.spaces import normalise_space, space_path
from tunefleet.feinsum_support.static_space import space_from_file
from tunefleet.problems.base import ArgSpec, Outcome, Protocol
from tunefleet.problems.kernel import KernelProblem, PreparedKernel, software_versions
from tunefleet.space import Config, Space

#: Without ``einsum`` and ``space``: feinsum's face-mass example, 4 fields of a 3-D DG
#: discretisation of order 4 (35 volume nodes, 4 faces of 15 nodes), with its newest space.
DEMO: dict[str, Any] = {
    "space": "feinsum:ifj_fe_fej_to_ei_v3.py",
    "einsum": "ifj,fe,fej->ei",
    "i": 35,
    "f": 4,
    "j": 15,
    "batch": 4,
    "operands": "L,J,v*",
}


class FeinsumProblem(KernelProblem):
    name: ClassVar[str] = "feinsum"
    description: ClassVar[str] = (
        "a feinsum transform-space module applied to a batched einsum (needs feinsum on the "
        "workers)"
    )
    needs_opencl: ClassVar[bool] = True
    #: For ``tunefleet problems``; :meth:`normalise_args` reads them itself (one-letter index
    #: sizes come on top).
    arguments: ClassVar[tuple[ArgSpec, ...]] = (
        ArgSpec("space", DEMO["space"], "feinsum:NAME.py (shipped with feinsum) or PATH.py"),
        ArgSpec(
            "einsum",
            DEMO["einsum"],
            "subscripts, or feinsum's archive JSON; one-letter "
            "arguments are index sizes (an index without one is a long dimension)",
        ),
        ArgSpec("batch", 1, "einsums in the batch", minimum=1),
        ArgSpec("operands", "", "operand names, e.g. L,J,v* (* = one per einsum)"),
        ArgSpec("dtype", "float64", "element type of every operand"),
        ArgSpec("long_dim_length", archive.DEFAULT_LONG_DIM_LENGTH, "long dimensions' length"),
    )

    def __init__(self) -> None:
        self._spaces: dict[tuple[str, float, str], Space] = {}

    # --- arguments and space: no feinsum needed -------------------------------------------
    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        if "einsum" not in raw and "space" not in raw:
            raw = {**DEMO, **raw}
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

    def byte_count(self, args: Mapping[str, Any]) -> float:
        from tunefleet.feinsum_support import runtime

        return runtime.byte_count(args)

    def validation_args(self, args: Mapping[str, Any], config: Config) -> dict[str, Any]:
        from tunefleet.feinsum_support.runtime import VALIDATION_LONG_DIM

        long = min(int(args["long_dim_length"]), VALIDATION_LONG_DIM)
        return {**args, "long_dim_length": long}

    # --- the science: on workers, with feinsum ---------------------------------------------
    def build(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        from tunefleet.feinsum_support import runtime

        return runtime.build_kernel(args, config)

    def make_inputs(self, args: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        from tunefleet.feinsum_support import runtime

        return runtime.make_inputs(args, rng)

    def reference(self, args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
        from tunefleet.feinsum_support import runtime

        return runtime.reference(args, inputs)

    def flop_count(self, args: Mapping[str, Any]) -> float:
        from tunefleet.feinsum_support import runtime

        return runtime.flop_count(args)

    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Outcome:
        from tunefleet.feinsum_support import runtime

        if not isinstance(prepared, PreparedKernel):
            raise TypeError(f"feinsum.measure needs a PreparedKernel, got {type(prepared)}")
        if session is None:
            raise DeviceError("the feinsum problem needs an OpenCL device, not the host")
        args, config = prepared.args, prepared.config
        extra = {**runtime.feinsum_versions(), archive.FACT_KEY: runtime.fact(args, session.info)}
        if protocol.statistic == archive.FEINSUM_STATISTIC:
            base = {
                "protocol": protocol.to_json(),
                "versions": {**software_versions(session), **extra},
                "device": session.info.to_json(),
                "code": prepared.target.source,
                "flop_count": self.flop_count(args),
                "byte_count": self.byte_count(args),
            }
            return runtime.measure_with_feinsum(args, config, session, base)
        outcome = super().measure(prepared, session, protocol)
        return dataclasses.replace(outcome, versions={**outcome.versions, **extra})


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
