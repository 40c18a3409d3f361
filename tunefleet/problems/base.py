"""The problem contract, the measurement protocol and the cache key.

A problem is a parameter space plus what a worker needs to evaluate one configuration:

- ``normalise_args(raw)``: validate and complete user arguments (sizes, dtype); raises
  :class:`~tunefleet.errors.ProblemError` with a one-line message naming the bad argument.
- ``space(args)``: the :class:`~tunefleet.space.Space` to search.
- kernel problems (``needs_opencl = True``) also provide the loopy builder, deterministic
  inputs, a NumPy reference and flop/byte counts (see ``tunefleet.problems.kernel``);
  the synthetic problem evaluates without OpenCL.

Everything here is importable without loopy or OpenCL.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from tunefleet.devices import DeviceInfo
from tunefleet.space import Config, Space, canonical_json


@dataclass(frozen=True)
class Protocol:
    """How a configuration is timed. Stored with every measurement and part of the cache key,
    so numbers measured under different protocols are never mixed up.

    Timing: ``warmup`` untimed launches, then rounds of launches timed with OpenCL profiling
    events until at least ``min_launches`` launches and ``min_seconds`` of kernel time (at
    most ``max_launches``). The reported statistic is the median; the minimum is kept too.
    """

    warmup: int = 2
    min_launches: int = 5
    min_seconds: float = 0.2
    max_launches: int = 200
    statistic: str = "median"
    seed: int = 0
    version: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Protocol:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Outcome:
    """What one evaluation produced. ``state`` is ``done`` or ``invalid`` (the worker's
    supervisor produces ``failed`` and ``timed_out`` itself)."""

    state: str
    median_s: float | None = None
    min_s: float | None = None
    samples_s: tuple[float, ...] = ()
    gflops: float | None = None
    gbps: float | None = None
    flop_count: float | None = None
    byte_count: float | None = None
    compile_s: float | None = None
    validation: dict[str, Any] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    code: str | None = None
    error: str | None = None


class Problem(ABC):
    """Base class of every problem (built-in or user-written)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: False for problems that evaluate without an OpenCL device (the synthetic one).
    needs_opencl: ClassVar[bool] = True

    @abstractmethod
    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Validated, complete problem arguments (defaults filled in)."""

    @abstractmethod
    def space(self, args: Mapping[str, Any]) -> Space:
        """The parameter space for these arguments."""

    def default_config(self, args: Mapping[str, Any]) -> Config:
        return self.space(args).default()

    # --- evaluation: called by the worker -------------------------------------------------
    @abstractmethod
    def prepare(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        """CPU-only work for one configuration (loopy code generation), run in the worker's
        process pool ahead of timing. Returns something picklable for :meth:`measure`.
        Raises :class:`~tunefleet.errors.InvalidConfiguration` for illegal points."""

    @abstractmethod
    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Outcome:
        """Validate and time a prepared configuration on the device, in the worker's
        supervised device process. ``session`` is the worker's open device session (OpenCL
        context and profiling queue), ``None`` for problems with ``needs_opencl = False``.
        Returns an :class:`Outcome` (``done`` or ``invalid``); may raise
        :class:`~tunefleet.errors.InvalidConfiguration`."""


def cache_key(
    problem: str, args: Mapping[str, Any], device_class: str, protocol: Mapping[str, Any]
) -> str:
    """Runs with equal keys measure interchangeable numbers: same problem, arguments,
    device class and protocol."""
    payload = canonical_json(
        {
            "problem": problem,
            "args": dict(args),
            "device_class": device_class,
            "protocol": dict(protocol),
        }
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]
