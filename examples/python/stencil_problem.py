"""A problem of one's own: a Problem subclass in a module of its own, so that the workers
(separate processes, maybe on other machines) can import it by its file's path.

This one needs no OpenCL: it "measures" an analytic time with a known optimum
(block=32, unroll=2), so the example runs anywhere in seconds. A real problem builds and
times a kernel in prepare/measure (see docs/problems.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tunefleet import ArgSpec, Outcome, Problem
from tunefleet.problems.base import normalise_with_specs
from tunefleet.space import IntRange, PowerOfTwo, Space


class Stencil(Problem):
    name = "stencil"
    description = "an analytic stand-in for a blocked stencil"
    needs_opencl = False
    arguments = (ArgSpec("n", 4096, "grid points", size=True, minimum=1),)

    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return normalise_with_specs(self.name, self.arguments, raw)

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of([PowerOfTwo("block", 4, 256), IntRange("unroll", 1, 4)])

    def prepare(self, args: Mapping[str, Any], config: Any, device: Any) -> Any:
        return (int(args["n"]), int(config["block"]), int(config["unroll"]))

    def measure(self, prepared: Any, session: Any, protocol: Any) -> Outcome:
        n, block, unroll = prepared
        t = n * 1e-9 * (1 + 0.2 * (math.log2(block) - 5) ** 2 + 0.1 * (unroll - 2) ** 2)
        return Outcome(state="done", median_s=t, min_s=t, samples_s=(t, t, t))
