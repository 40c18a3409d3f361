"""Cold builds: a confirmation's evaluation in a fresh process of its own, whose caches share
nothing with this worker's code-generation and device processes (or any other cold build), so
that a cache answering with another kernel's code cannot confirm its own mistake.

A cold build is two requests to its one-shot child, so that only the second holds the device:

1. ``Prepare(keep=True)``: the child opens the device itself, generates the code, builds it
   and readies the measurement (inputs, reference) with caches of its own, and keeps the
   result. This runs beside the device's other work, like any code generation (and, on a
   CPU device, stands still while the device times, as the code-generation processes do).
2. ``Measure(kept=True)``: once the device is free, the child times what it kept.

After its reply the child is closed and its cache directory removed.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Collection
from dataclasses import dataclass

from .supervise import Child, cold_environment

#: Cold builds prepared at once by one worker (each a fresh process with its own imports and
#: caches, a core's work): a run confirms a handful of configurations. Beside the search's
#: trials a worker prepares one per :data:`CORES_PER_COLD` cores; the cores of its idle
#: code-generation processes (the search is over, or waits on the coordinator) take more.
COLD_AT_ONCE = 4
CORES_PER_COLD = 4.0


def at_once(cores: float, idle_codegen: int = 0) -> int:
    """How many cold builds a worker with ``cores`` cores prepares at once while
    ``idle_codegen`` of its code-generation processes have nothing to do (on two cores at the
    end of a run: two at once, not one after the other)."""
    return min(COLD_AT_ONCE, max(1, int(cores // CORES_PER_COLD)) + max(0, idle_codegen))


@dataclass
class _Cold:
    child: Child
    cache_dir: str
    #: The child holds the device (its Measure is in flight).
    timing: bool = False


class ColdBuilds:
    """The cold builds in progress, by trial id."""

    def __init__(self) -> None:
        self._active: dict[int, _Cold] = {}

    def __len__(self) -> int:
        return len(self._active)

    def start(self, trial_id: int) -> Child:
        """A fresh child with caches of its own for ``trial_id``."""
        cache_dir = tempfile.mkdtemp(prefix="tunefleet-cold-")
        child = Child(f"cold build {trial_id}", cold_environment(cache_dir))
        self._active[trial_id] = _Cold(child, cache_dir)
        return child

    def child(self, trial_id: int) -> Child | None:
        cold = self._active.get(trial_id)
        return None if cold is None else cold.child

    def timing(self, trial_id: int) -> None:
        """``trial_id``'s child now times on the device."""
        self._active[trial_id].timing = True

    @property
    def holds_device(self) -> bool:
        """A cold build times on the device now."""
        return any(c.timing and c.child.busy for c in self._active.values())

    def children(self) -> list[Child]:
        return [c.child for c in self._active.values()]

    def preparing(self) -> list[Child]:
        """The children that generate code and build now (not timing)."""
        return [c.child for c in self._active.values() if not c.timing]

    def sweep(self, wanted: Collection[int]) -> None:
        """End the cold builds of trials no longer in ``wanted`` (finished, sent, dropped,
        released): close the child (killed if still busy) and remove its caches."""
        for trial_id in [t for t in self._active if t not in wanted]:
            self._end(trial_id)

    def close(self) -> None:
        for trial_id in list(self._active):
            self._end(trial_id)

    def kill(self) -> None:
        for cold in self._active.values():
            cold.child.kill()

    def _end(self, trial_id: int) -> None:
        cold = self._active.pop(trial_id)
        cold.child.close()
        shutil.rmtree(cold.cache_dir, ignore_errors=True)
