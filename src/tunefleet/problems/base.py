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

from tunefleet.agreement import NOISY
from tunefleet.devices import DeviceInfo, Footprint
from tunefleet.errors import ProblemError
from tunefleet.space import Config, Space, canonical_json

#: How a measurement's headline time comes from its samples: the median or the minimum of the
#: event-timed launches, or ``feinsum-wall-mean``: feinsum's own timing (its wall-clock mean per
#: launch, with its own warm-up and launch counts), which only the feinsum problem offers.
STATISTICS = ("median", "min", "feinsum-wall-mean")


#: A measurement's protocol records ``cold_build: true`` when it was built and timed in a fresh
#: process whose caches shared nothing with any other evaluation (a confirmation): the claim
#: asks for it, the worker does it. A fact about the measurement, not a setting of
#: :class:`Protocol` (whose fields are part of every cache key).
COLD_KEY = "cold_build"


@dataclass(frozen=True)
class Protocol:
    """How a configuration is timed. Stored with every measurement and part of the cache key,
    so numbers measured under different protocols are never mixed up.

    Timing: ``warmup`` untimed launches (default 3), then rounds of launches, each timed with
    its own OpenCL profiling event (kernel start to kernel end, no host overhead), until at
    least ``min_launches`` launches (default 10) *and* ``min_seconds`` of summed kernel time
    (default 0.2 s) are collected, but never more than ``max_launches`` (default 200; the cap
    wins for very short kernels). When the samples are then still noisy (their inter-quartile
    range over their median exceeds ``noise_limit``, default 5 %: :mod:`tunefleet.agreement`),
    rounds go on, each as long as all before it, until they are not or ``max_launches`` is
    reached; a measurement that ends noisy is flagged so in the views. Every sample is kept;
    the reported statistic is the median, and the minimum is kept too. Inputs come from a
    NumPy generator seeded with ``seed`` (default 0), so every worker times the same numbers.

    Why these defaults: three warm-ups cover lazy module loading and clock ramp-up on GPUs;
    ten samples make the median robust to one slow launch; 0.2 s bounds the timing cost of
    one evaluation well below its build cost while averaging over clock and thermal noise.
    """

    warmup: int = 3
    min_launches: int = 10
    min_seconds: float = 0.2
    max_launches: int = 200
    statistic: str = "median"
    seed: int = 0
    #: Inter-quartile range over median above which more samples are taken (0: never).
    noise_limit: float = NOISY
    #: 2: rounds go on while the samples are noisier than ``noise_limit``.
    version: int = 2

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.min_launches < 1 or self.max_launches < self.min_launches:
            raise ProblemError(
                f"bad protocol: warmup={self.warmup}, min_launches={self.min_launches}, "
                f"max_launches={self.max_launches} (need warmup >= 0 and "
                "1 <= min_launches <= max_launches)"
            )
        if not 0 <= self.noise_limit < 10:
            raise ProblemError(
                f"bad protocol: noise_limit={self.noise_limit} (an inter-quartile range over "
                "median: use 0 <= noise_limit < 10, 0 to never take more samples)"
            )
        if self.min_seconds < 0:
            raise ProblemError(f"bad protocol: min_seconds={self.min_seconds} is negative")
        if self.statistic not in STATISTICS:
            raise ProblemError(
                f"bad protocol statistic {self.statistic!r}; use one of {', '.join(STATISTICS)}"
            )

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
    #: The device that measured (``DeviceInfo.to_json()``: platform, vendor, name, driver,
    #: compute units, memory, fingerprint); empty for problems that need no device.
    device: dict[str, Any] = field(default_factory=dict)
    #: Everything else worth keeping: code-generation and build seconds, launch geometry,
    #: local memory, validation size, the reason details of an invalid verdict.
    details: dict[str, Any] = field(default_factory=dict)
    #: Where the evaluation's seconds went, by :class:`~tunefleet.timeline.Phase` name
    #: (``timing``, ``validation``, ``build``, ...): the worker's timeline of the trial.
    #: A problem that reports none has its whole evaluation shown as ``device_other``.
    phases: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ArgSpec:
    """One problem argument: its name, default (whose type is the argument's type), a
    one-line help, and optionally the allowed choices and integer bounds. ``size`` marks a
    problem size (an extent of its arrays): command lines print it as ``--size``, every
    other argument as ``--arg`` (``--dtype`` for ``dtype``)."""

    name: str
    default: Any
    help: str = ""
    choices: tuple[Any, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    size: bool = False

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "default": self.default, "help": self.help}
        if self.choices:
            data["choices"] = list(self.choices)
        if self.minimum is not None:
            data["minimum"] = self.minimum
        if self.maximum is not None:
            data["maximum"] = self.maximum
        if self.size:
            data["size"] = True
        return data

    def convert(self, problem: str, value: Any) -> Any:
        """``value`` as this argument's type (strings from a command line are parsed), or
        ProblemError naming the argument and what it accepts."""
        kind = type(self.default)
        try:
            if kind is int:
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError(value)
                out: Any = int(value)
            elif kind is float:
                out = float(value)
            elif kind is bool:
                if isinstance(value, str):
                    if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                        raise ValueError(value)
                    out = value.lower() in ("true", "1", "yes")
                else:
                    out = bool(value)
            else:
                out = str(value)
        except (TypeError, ValueError):
            raise ProblemError(
                f"problem {problem}: argument {self.name}={value!r} is not a {kind.__name__}"
            ) from None
        if self.choices and out not in self.choices:
            raise ProblemError(
                f"problem {problem}: argument {self.name}={out!r} is not one of "
                f"{', '.join(map(str, self.choices))}"
            )
        if self.minimum is not None and out < self.minimum:
            raise ProblemError(
                f"problem {problem}: argument {self.name}={out} is below its minimum {self.minimum}"
            )
        if self.maximum is not None and out > self.maximum:
            raise ProblemError(
                f"problem {problem}: argument {self.name}={out} is above its maximum {self.maximum}"
            )
        return out


def normalise_with_specs(
    problem: str, specs: tuple[ArgSpec, ...], raw: Mapping[str, Any]
) -> dict[str, Any]:
    """Validate ``raw`` against ``specs``: unknown names and bad values raise ProblemError
    naming the argument; missing ones get their defaults. Returns a new dict in spec order."""
    known = {spec.name: spec for spec in specs}
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise ProblemError(
            f"problem {problem}: unknown argument(s) {', '.join(unknown)}; "
            f"its arguments are {', '.join(known) or '(none)'}"
        )
    return {
        spec.name: spec.convert(problem, raw[spec.name]) if spec.name in raw else spec.default
        for spec in specs
    }


class Problem(ABC):
    """Base class of every problem (built-in or user-written)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: False for problems that evaluate without an OpenCL device (the synthetic one).
    needs_opencl: ClassVar[bool] = True
    #: The arguments, for ``tunefleet problems`` and :func:`normalise_with_specs`.
    arguments: ClassVar[tuple[ArgSpec, ...]] = ()

    @abstractmethod
    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Validated, complete problem arguments (defaults filled in)."""

    @abstractmethod
    def space(self, args: Mapping[str, Any]) -> Space:
        """The parameter space for these arguments."""

    def default_config(self, args: Mapping[str, Any]) -> Config:
        return self.space(args).default()

    def check_config(self, args: Mapping[str, Any], config: Mapping[str, Any]) -> Config:
        """The configuration normalised, or InvalidConfiguration when it is outside the space
        or breaks a rule that needs no device (divisibility, register budget). Cheap: the
        coordinator may call it to skip points a worker would reject anyway."""
        return self.space(args).check(config)

    def footprint(self, args: Mapping[str, Any], config: Config) -> Footprint | None:
        """The work-group and local memory of ``config``'s kernel at ``args``, worked out
        without loopy, or ``None`` (the default) when the problem cannot say. The coordinator
        rules out configurations whose footprint exceeds the limits of its run's devices, so
        no worker builds a kernel the device must refuse: it must be exactly what the built
        kernel asks for (a test compares it with loopy's on sampled configurations)."""
        return None

    # --- evaluation: called by the worker -------------------------------------------------
    @abstractmethod
    def prepare(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        """CPU-only work for one configuration (loopy code generation), run in the worker's
        process pool ahead of timing. Returns something picklable for :meth:`measure`.
        Raises :class:`~tunefleet.errors.InvalidConfiguration` for illegal points."""

    def prebuild(self, prepared: Any, session: Any) -> Any:
        """Optional, in a code-generation process with its own session on the same device:
        compile ``prepared`` for the device ahead of :meth:`measure`, so that OpenCL's build
        caches (the driver's, PoCL's, pyopencl's) answer the device process's build at once.
        Returns what :meth:`measure` gets: ``prepared`` itself, or a copy that records the
        time the build took (so compile times, and the timeouts derived from them, still
        count it). Failures are left for :meth:`measure` to report. The default does
        nothing."""
        return prepared

    def ready(self, prepared: Any, session: Any, protocol: Protocol) -> None:  # noqa: B027
        """Ready what :meth:`measure` of ``prepared`` with ``protocol`` will need, before the
        device is this process's (a cold build prepares while another process times): by
        default nothing."""

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
