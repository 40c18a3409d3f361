"""A problem with a wide space (about 2.6 billion points) and an analytic objective, no OpenCL: what
``coordinator_rate.py`` tunes, so the search never runs out of new configurations.

Loaded like any user problem file (``benchmarks/wide_problem.py``). A real worker can serve it
too: ``prepare`` checks the point, ``measure`` returns the analytic time at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tunefleet.devices import DeviceInfo
from tunefleet.errors import ProblemError
from tunefleet.problems.base import Outcome, Problem, Protocol
from tunefleet.space import Bool, Choice, Config, IntRange, PowerOfTwo, Space

FLOP_COUNT = 1e9
#: Where the objective is smallest.
OPTIMUM: dict[str, Any] = {
    "a": 17,
    "b": 40,
    "c": 3,
    "d": 64,
    "e": 8,
    "f": True,
    "g": "y",
    "h": 11,
}


def seconds(config: Mapping[str, Any]) -> float:
    """A separable bowl with its minimum (1 ms) at :data:`OPTIMUM`."""
    factor = (
        1.0
        + 0.01 * (config["a"] - 17) ** 2
        + 0.002 * (config["b"] - 40) ** 2
        + 0.05 * (config["c"] - 3) ** 2
        + 0.1 * (math.log2(config["d"]) - 6) ** 2
        + 0.1 * (math.log2(config["e"]) - 3) ** 2
        + (0.0 if config["f"] else 0.4)
        + {"x": 0.3, "y": 0.0, "z": 0.5, "w": 0.2}[config["g"]]
        + 0.01 * (config["h"] - 11) ** 2
    )
    return 1e-3 * factor


class Wide(Problem):
    name = "wide"
    description = "analytic objective over a wide space (coordinator benchmarks, no OpenCL)"
    needs_opencl = False

    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        if raw:
            raise ProblemError(f"wide: takes no arguments, got {sorted(raw)}")
        return {}

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of(
            [
                IntRange("a", 1, 64),
                IntRange("b", 1, 128),
                IntRange("c", 0, 15),
                PowerOfTwo("d", 1, 1024),
                PowerOfTwo("e", 1, 64),
                Bool("f"),
                Choice("g", ("x", "y", "z", "w")),
                IntRange("h", 0, 31),
            ]
        )

    def prepare(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        return self.space(args).check(config)

    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Outcome:
        t = seconds(prepared)
        return Outcome(
            state="done",
            median_s=t,
            min_s=t,
            samples_s=(t,),
            gflops=FLOP_COUNT / t / 1e9,
            flop_count=FLOP_COUNT,
            protocol=protocol.to_json(),
        )
