"""Owns the timeline of one evaluation: the phases a trial's wall time is split into (a worker
builds each attempt's from the moments it saw: :mod:`tunefleet.worker.timeline`), and the one
definition of the device's *timing share* that ``status``, the dashboard, the Python API and
the benchmarks quote.

A worker stores one timeline per attempt (``attempt.timeline``, migration 0015_timeline): the
seconds of each phase below, from the moment its claim returned to the moment it sends the
result. The phases cover that span without gaps or overlap, so they add up to the attempt's
wall time (``ended_at - claimed_at``, on the database's clock) but for the two statements'
own latency; the ``timeline`` view shows the remainder as ``untracked_s``, and the wait in the
queue before the claim as ``queued_s``.

What happens where (a worker with code-generation processes; without them the device process
prepares, and ``codegen`` is its share of the device span)::

    claim -> wait_codegen -> codegen, prebuild, (ready), handoff -> wait_device
          -> [device process] setup, build, validation, timing, reference, check
          -> handoff -> report

Only ``timing`` is what the device is for; everything else on the device process's span
(``setup``, ``build``, ``validation``, ``reference``, ``check``, ``device_other``) is time the
device could have spent timing the next kernel.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any


class Phase(StrEnum):
    """One phase of an evaluation, in the order a trial meets them."""

    #: Claimed, waiting for a free code-generation process.
    WAIT_CODEGEN = "wait_codegen"
    #: Loopy code generation (target and validation sizes).
    CODEGEN = "codegen"
    #: The OpenCL build in the code-generation process (so the device's is a cache hit).
    PREBUILD = "prebuild"
    #: A cold build readying its measurement in its own process (inputs, reference, the
    #: comparison kernels) before it takes the device.
    READY = "ready"
    #: Moving work between processes: sending the request and the prepared kernel, the
    #: reply back, a child's start-up.
    HANDOFF = "handoff"
    #: Prepared, waiting for the device (another kernel is being timed).
    WAIT_DEVICE = "wait_device"
    #: Device process: receiving the kernel, inputs and working arrays.
    SETUP = "setup"
    #: Device process: the OpenCL build (a driver-cache hit after a prebuild).
    BUILD = "build"
    #: Device process: the launch at the small validation size and its comparison.
    VALIDATION = "validation"
    #: Device process: the timed launches (warm-up included).
    TIMING = "timing"
    #: Device process: computing (or waiting for) the reference at the target size.
    REFERENCE = "reference"
    #: Device process: the checks after timing (outputs at the target size, inputs intact).
    CHECK = "check"
    #: Device process time no other phase names (all of it for a problem that reports no
    #: phases of its own).
    DEVICE_OTHER = "device_other"
    #: The result in hand until the completion is sent (writing earlier results, the
    #: fault policy's wait).
    REPORT = "report"


#: Phases a problem's ``measure`` may report itself (``Outcome.phases``).
DEVICE_PHASES: tuple[Phase, ...] = (
    Phase.CODEGEN,
    Phase.SETUP,
    Phase.BUILD,
    Phase.VALIDATION,
    Phase.TIMING,
    Phase.REFERENCE,
    Phase.CHECK,
)

#: The device process's work other than timing: what ``status`` and the benchmarks count as
#: the device's other work (the rest of its window beside timing is idle).
DEVICE_WORK: tuple[Phase, ...] = (
    Phase.SETUP,
    Phase.BUILD,
    Phase.VALIDATION,
    Phase.REFERENCE,
    Phase.CHECK,
    Phase.DEVICE_OTHER,
)

#: Largest number of seconds one phase may claim (a week): a worker sending more is wrong.
MAX_PHASE_S = 7 * 86400.0


def clean(phases: Mapping[str, Any], allowed: Iterable[Phase] | None = None) -> dict[str, float]:
    """Known phases (of ``allowed``, default all) with finite, non-negative seconds;
    anything else a problem reported is dropped: a timeline is a report, never a reason to
    fail a trial."""
    out: dict[str, float] = {}
    known = {p.value for p in (Phase if allowed is None else allowed)}
    for key, value in phases.items():
        if key not in known or isinstance(value, bool):
            continue
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(seconds) and seconds >= 0:
            out[key] = out.get(key, 0.0) + min(seconds, MAX_PHASE_S)
    return out


def timing_share(timing_s: float, window_s: float) -> float | None:
    """The device's timing share: seconds spent timing kernels over the wall it was
    serving (``None`` for an empty window)."""
    if window_s <= 0:
        return None
    return min(1.0, max(0.0, timing_s / window_s))


def share_text(share: float | None) -> str:
    """A timing share as every report writes it: ``63% timing``."""
    return "-" if share is None else f"{100 * share:.0f}% timing"
