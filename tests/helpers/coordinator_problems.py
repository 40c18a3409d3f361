"""Problems for coordinator tests that the built-in synthetic one cannot play: loaded by file
path (``path.py:Class``) by the coordinator and by real worker processes alike, so this module
imports nothing but tunefleet."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tunefleet.problems.base import Protocol
from tunefleet.problems.synthetic import Synthetic
from tunefleet.space import Bool, IntRange, Space

_HERE = Path(__file__).resolve()
#: A six-point space: small enough for the search to run out of new configurations.
TINY = f"{_HERE}:Tiny"
#: The synthetic objective declared as needing an OpenCL device (a device class is required).
KERNEL = f"{_HERE}:Kernel"


class Tiny(Synthetic):
    name = "tiny"

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of([IntRange("unroll", 3, 5), Bool("vector")])

    def prepare(self, args: Mapping[str, Any], config: Any, device: Any) -> Any:
        full = {**config, "tile": 16, "order": "ikj"}
        return {"args": self.normalise_args(args), "config": full, "fault": "none"}

    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Any:
        return super().measure(prepared, session, protocol)


class Kernel(Synthetic):
    name = "kernel"
    needs_opencl = True
