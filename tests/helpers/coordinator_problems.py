"""Problems for coordinator tests that the built-in synthetic one cannot play: loaded by file
path (``path.py:Class``) by the coordinator and by real worker processes alike, so this module
imports nothing but tunefleet."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tunefleet.devices import Footprint
from tunefleet.errors import InvalidConfiguration
from tunefleet.problems.base import Protocol
from tunefleet.problems.synthetic import Synthetic
from tunefleet.space import Bool, Config, IntRange, Space

_HERE = Path(__file__).resolve()
#: A six-point space: small enough for the search to run out of new configurations.
TINY = f"{_HERE}:Tiny"
#: Tiny, except that workers find one configuration invalid (unroll 5 without vector).
TINY_ONE_INVALID = f"{_HERE}:TinyOneInvalid"
#: The synthetic objective declared as needing an OpenCL device (a device class is required).
KERNEL = f"{_HERE}:Kernel"
#: The synthetic problem with a device-free rule: tiles of 64 and more are illegal.
RULED = f"{_HERE}:Ruled"
#: Kernel, whose configurations state a footprint: a work-group of ``tile`` work-items and
#: 1 KiB of local memory per unit of ``tile``.
FOOTED = f"{_HERE}:Footed"
#: Footed, whose footprint has a bug of its own (it raises).
BROKEN_FOOTPRINT = f"{_HERE}:BrokenFootprint"


class Tiny(Synthetic):
    name = "tiny"

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of([IntRange("unroll", 3, 5), Bool("vector")])

    def prepare(self, args: Mapping[str, Any], config: Any, device: Any) -> Any:
        full = {**config, "tile": 16, "order": "ikj"}
        return {"args": self.normalise_args(args), "config": full, "fault": "none"}

    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Any:
        return super().measure(prepared, session, protocol)


class TinyOneInvalid(Tiny):
    name = "tiny_one_invalid"

    def prepare(self, args: Mapping[str, Any], config: Any, device: Any) -> Any:
        if config["unroll"] == 5 and not config["vector"]:
            raise InvalidConfiguration("unroll 5 needs vector loads")
        return super().prepare(args, config, device)


class Kernel(Synthetic):
    name = "kernel"
    needs_opencl = True


class Footed(Kernel):
    name = "footed"

    def footprint(self, args: Mapping[str, Any], config: Config) -> Footprint:
        return Footprint((config["tile"], 1), 1024 * config["tile"])


class BrokenFootprint(Footed):
    name = "broken_footprint"

    def footprint(self, args: Mapping[str, Any], config: Config) -> Footprint:
        raise KeyError("local_size")


class Ruled(Synthetic):
    name = "ruled"

    def check_config(self, args: Mapping[str, Any], config: Mapping[str, Any]) -> Config:
        checked = super().check_config(args, config)
        if checked["tile"] >= 64:
            raise InvalidConfiguration(f"tile={checked['tile']} needs too much local memory")
        return checked

    def prepare(self, args: Mapping[str, Any], config: Any, device: Any) -> Any:
        self.check_config(args, config)
        return super().prepare(args, config, device)


#: Tiny, built through a disk cache keyed by less than the configuration (it ignores
#: ``vector``), as a code cache with a too-short key would be: whatever a process finds there
#: for ``unroll`` is the "kernel" it measures, with that kernel's code and time.
HIDDEN_CACHE = f"{_HERE}:HiddenCache"
#: The directory of HiddenCache's cache inside the cache home (``XDG_CACHE_HOME``).
HIDDEN_CACHE_DIR = "tunefleet-test-hidden-cache"


def hidden_cache_path(unroll: int, home: str | None = None) -> Path:
    """Where HiddenCache keeps the kernel of ``unroll`` (its whole key)."""
    import os

    root = home or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / HIDDEN_CACHE_DIR / f"unroll-{unroll}.json"


class HiddenCache(Tiny):
    name = "hidden_cache"

    def prepare(self, args: Mapping[str, Any], config: Any, device: Any) -> Any:
        import json

        prepared = super().prepare(args, config, device)
        path = hidden_cache_path(config["unroll"])
        if path.exists():
            prepared["config"] = json.loads(path.read_text())
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(prepared["config"]))
        return prepared

    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Any:
        import dataclasses
        import json

        outcome = super().measure(prepared, session, protocol)
        # The "generated code" names the configuration that was really built.
        code = "kernel for " + json.dumps(prepared["config"], sort_keys=True)
        return dataclasses.replace(outcome, code=code)
