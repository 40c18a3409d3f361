"""Timing a device that shares the host's cores alone: the code-generation pool stands still.

A CPU OpenCL device (PoCL, Intel's CPU runtime) runs its kernels on the same cores as the
worker's code-generation processes; while those compile, a kernel timed there measures the
competition as much as itself (the README main job on two cores: 1.02 ms inside the run, 0.56
ms alone). While the device process holds a request, every code-generation process is
stopped with SIGSTOP, and continued with SIGCONT as soon as the device process is idle, in
the loop's ``isolate`` step, in the loop's ``finally`` and whenever a child is closed or
killed. A worker that dies hard cannot continue them, but its children's parent-death
SIGKILL ends stopped processes too, so none is left behind stopped.

Pausing, not CPU affinity: PoCL spreads a kernel over every core it may use, so a split
would time the kernel on fewer cores than ``tunefleet measure`` alone uses
(benchmarks/cpu_isolation.py measures the conditions). A GPU device's timings are not
disturbed by its own prebuilds (benchmarks/gpu_prebuild_isolation.py), so nothing is paused
there.
"""

from __future__ import annotations

from collections.abc import Iterable

from tunefleet.devices import DeviceInfo

from .supervise import Child


def shares_host_cores(device: DeviceInfo) -> bool:
    """Whether ``device`` runs its kernels on the host's CPU cores."""
    return device.on_host_cores


class Quiet:
    """Which code-generation processes this worker stopped while its device times."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._paused: list[Child] = []

    def hold(self, timing: bool, pool: Iterable[Child]) -> None:
        """Stop every process of ``pool`` while the device is ``timing`` (processes started
        since the last call included); continue them all once it is not.

        A stopped process that has left ``pool`` is continued at once, even while the device
        times: a cold build stopped while it prepared, whose kept kernel is then handed the
        device, *is* what times now, and left stopped it would hold the device forever (the
        worker waited on it, its deadline standing still, until killed)."""
        if not (self.enabled and timing):
            self.release()
            return
        pool = list(pool)
        members = {id(child) for child in pool}
        left = [child for child in self._paused if id(child) not in members]
        if left:
            self._paused = [child for child in self._paused if id(child) in members]
            for child in left:
                child.resume()
        for child in pool:
            if child.paused_at is None:
                child.pause()
                if child.paused_at is not None:
                    self._paused.append(child)

    def release(self) -> None:
        """Continue every process this stopped (unconditional: safe to call any time)."""
        paused, self._paused = self._paused, []
        for child in paused:
            child.resume()
