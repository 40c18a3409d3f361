"""The ``synthetic`` problem: an analytic objective with a known optimum, no OpenCL.

It lets the queue, the workers and the search be tested and benchmarked anywhere. Each
evaluation really takes ``duration`` seconds (sleeping in the worker's device process, as a
kernel would keep it busy) and "measures" the analytic time below.

Space (8 x 8 x 2 x 4 = 512 points)::

    tile    PowerOfTwo 1..128    vector  Bool
    unroll  IntRange 1..8        order   Choice "ijk" | "ikj" | "jik" | "jki"

Objective, in seconds::

    t = 1 ms * (1 + 0.15 (log2(tile) - 4)^2 + 0.05 (unroll - 4)^2
                  + (0 if vector else 0.5) + ORDER_PENALTY[order])

The unique optimum is ``tile=16, unroll=4, vector=True, order="ikj"`` with ``t = 1 ms``
(:data:`OPTIMUM`, :data:`OPTIMUM_SECONDS`). With ``noise > 0`` each sample is perturbed by a
relative amount in ``[0, noise)``, so the median stays ordered like the objective for small
noise; the perturbations depend on the configuration and the protocol's input seed, so a
re-measurement with fresh inputs draws other samples.

Luck: with ``lucky_rate > 0`` that fraction of the configurations (deterministic per
configuration hash and ``seed``, like the faults) is *lucky*: measured with the protocol's
default inputs (input seed 0, as every search trial is) it reports ``luck`` times the
optimum's time — faster than the optimum, the tuner's favourite — while re-measured with
any other input seed (a confirmation's fresh inputs) it reports its true objective. It
models a measurement that was fast once by chance (a quiet moment, a lucky allocation).

Problem arguments (all optional):

``duration``         seconds each measurement really takes (default 0.01, at most 3600)
``prepare_duration`` seconds each preparation (the code-generation step) takes (default 0,
                     at most 3600)
``invalid_rate``     fraction of configurations rejected as invalid when prepared
``fail_rate``        fraction whose evaluator crashes (the process kills itself with SIGSEGV)
``hang_rate``        fraction whose evaluator never returns
``fault_phase``      ``measure`` (default) or ``prepare``: where crashes and hangs happen
``noise``            relative noise of the samples (default 0)
``lucky_rate``       fraction of configurations that measure fast once (default 0)
``luck``             a lucky measurement's time as a fraction of the optimum's (default 0.5)
``seed``             selects which configurations are faulty or lucky (default 0)
``depends_on``       the parameters the objective depends on (a list of names, or one string
                     of comma-separated names); the others' terms are left out, so they do
                     not change the time at all (default: every parameter, the objective
                     above). For checking that an analysis finds the parameters that matter.
``invalid_values``   ``{"name": [values]}``: a configuration with any of these values is
                     invalid (rejected when prepared, like an illegal kernel), before
                     ``invalid_rate`` is drawn (default: none)

The last two are optional and, when absent, absent from the normalised arguments too (so
runs made without them keep their cache keys).

Faults are deterministic per configuration hash and seed, like a real configuration that
always kills the driver: one uniform number ``u`` per configuration picks the fault, with
``[0, invalid_rate)`` invalid, then ``fail_rate``, then ``hang_rate``; the three rates must sum
to at most 1.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import signal
import statistics
import time
from collections.abc import Collection, Mapping
from typing import Any

from tunefleet.devices import DeviceInfo
from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.problems.base import Outcome, Problem, Protocol
from tunefleet.space import (
    Bool,
    Choice,
    Config,
    IntRange,
    PowerOfTwo,
    Space,
    canonical_json,
    config_hash,
)
from tunefleet.vocabulary import TrialState

OPTIMUM: dict[str, Any] = {"tile": 16, "unroll": 4, "vector": True, "order": "ikj"}
OPTIMUM_SECONDS = 1e-3
ORDER_PENALTY = {"ijk": 0.8, "ikj": 0.0, "jik": 0.6, "jki": 1.2}
#: Nominal work of one "launch", so GFLOP/s can be reported like for a kernel.
FLOP_COUNT = 2e6

DEFAULTS: dict[str, Any] = {
    "duration": 0.01,
    "prepare_duration": 0.0,
    "invalid_rate": 0.0,
    "fail_rate": 0.0,
    "hang_rate": 0.0,
    "fault_phase": "measure",
    "noise": 0.0,
    "lucky_rate": 0.0,
    "luck": 0.5,
    "seed": 0,
}
FAULTS = ("none", "invalid", "fail", "hang")
#: Longest ``duration`` / ``prepare_duration`` accepted, in seconds.
MAX_DURATION_S = 3600.0


#: The parameters of the space, in order (``depends_on`` names a subset).
PARAMETERS = ("tile", "unroll", "vector", "order")
#: Optional arguments: absent from the normalised arguments unless given.
OPTIONAL = ("depends_on", "invalid_values")


def objective(config: Mapping[str, Any], depends_on: Collection[str] = PARAMETERS) -> float:
    """The analytic time of a configuration, in seconds (minimum :data:`OPTIMUM_SECONDS`),
    with the terms of the parameters in ``depends_on`` only."""
    terms = {
        "tile": lambda: 0.15 * (math.log2(int(config["tile"])) - 4) ** 2,
        "unroll": lambda: 0.05 * (int(config["unroll"]) - 4) ** 2,
        "vector": lambda: 0.0 if config["vector"] else 0.5,
        "order": lambda: ORDER_PENALTY[str(config["order"])],
    }
    factor = 1.0 + sum(terms[name]() for name in PARAMETERS if name in depends_on)
    return OPTIMUM_SECONDS * factor


def invalid_by_value(args: Mapping[str, Any], config: Mapping[str, Any]) -> str | None:
    """The ``name=value`` of ``invalid_values`` this configuration has, or ``None``."""
    for name, values in (args.get("invalid_values") or {}).items():
        if any(canonical_json(config.get(name)) == canonical_json(v) for v in values):
            return f"{name}={canonical_json(config.get(name))}"
    return None


def fault_of(args: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """Which fault (one of :data:`FAULTS`) this configuration has under these arguments."""
    digest = hashlib.sha256(f"{args['seed']}:{config_hash(config)}".encode()).hexdigest()
    u = int(digest[:13], 16) / float(16**13)
    edge = 0.0
    for name, rate in (
        ("invalid", args["invalid_rate"]),
        ("fail", args["fail_rate"]),
        ("hang", args["hang_rate"]),
    ):
        edge += float(rate)
        if u < edge:
            return name
    return "none"


def is_lucky(args: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """Whether this configuration measures fast once under these arguments (see Luck)."""
    digest = hashlib.sha256(f"lucky:{args['seed']}:{config_hash(config)}".encode()).hexdigest()
    return int(digest[:13], 16) / float(16**13) < float(args["lucky_rate"])


def _crash() -> None:
    """Die like a segfaulting driver, without leaving a core file behind."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    os.kill(os.getpid(), signal.SIGSEGV)
    os._exit(139)  # pragma: no cover - only if SIGSEGV is somehow caught


def _hang() -> None:
    while True:
        time.sleep(3600)


class Synthetic(Problem):
    name = "synthetic"
    description = "analytic objective with a known optimum (tests and benchmarks, no OpenCL)"
    needs_opencl = False

    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(raw) - set(DEFAULTS) - set(OPTIONAL))
        if unknown:
            raise ProblemError(
                f"synthetic: unknown argument(s) {unknown}; known are "
                f"{sorted([*DEFAULTS, *OPTIONAL])}"
            )
        args = {**DEFAULTS, **raw}
        if "depends_on" in args:
            args["depends_on"] = _depends_on(args["depends_on"])
        if "invalid_values" in args:
            args["invalid_values"] = _invalid_values(args["invalid_values"])
        for key in ("duration", "prepare_duration"):
            # An hour: past it an evaluation would outlive any worker's timeout anyway.
            args[key] = _number(key, args[key], low=0.0, high=MAX_DURATION_S)
        args["noise"] = _number("noise", args["noise"], low=0.0)
        for key in ("invalid_rate", "fail_rate", "hang_rate", "lucky_rate"):
            args[key] = _number(key, args[key], low=0.0, high=1.0)
        args["luck"] = _number("luck", args["luck"], low=0.0)
        if not args["luck"] > 0:
            raise ProblemError(f"synthetic: luck={args['luck']!r} must be > 0")
        total = args["invalid_rate"] + args["fail_rate"] + args["hang_rate"]
        if total > 1.0 + 1e-12:
            raise ProblemError(
                f"synthetic: invalid_rate + fail_rate + hang_rate = {total:g} exceeds 1"
            )
        if args["fault_phase"] not in ("measure", "prepare"):
            raise ProblemError(
                f"synthetic: fault_phase={args['fault_phase']!r}; use 'measure' or 'prepare'"
            )
        if isinstance(args["seed"], bool) or not isinstance(args["seed"], int):
            raise ProblemError(f"synthetic: seed={args['seed']!r} must be an integer")
        return args

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of(
            [
                PowerOfTwo("tile", 1, 128),
                IntRange("unroll", 1, 8),
                Bool("vector"),
                Choice("order", tuple(ORDER_PENALTY)),
            ]
        )

    def prepare(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        args = self.normalise_args(args)
        config = self.space(args).check(config)
        fault = fault_of(args, config)
        if args["prepare_duration"]:
            time.sleep(args["prepare_duration"])
        rule = invalid_by_value(args, config)
        if rule is not None:
            raise InvalidConfiguration(f"synthetic: {rule} is invalid (invalid_values)")
        if fault == "invalid":
            raise InvalidConfiguration(
                f"synthetic: configuration {config_hash(config)} is invalid by construction "
                f"(invalid_rate={args['invalid_rate']:g}, seed={args['seed']})"
            )
        if args["fault_phase"] == "prepare":
            _inject(fault)
        return {"args": args, "config": config, "fault": fault}

    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Outcome:
        args, config, fault = prepared["args"], prepared["config"], prepared["fault"]
        started = time.perf_counter()
        if args["duration"]:
            time.sleep(args["duration"])  # stands for the timed launches
        timing_s = time.perf_counter() - started
        if args["fault_phase"] == "measure":
            _inject(fault)
        base = objective(config, args.get("depends_on", PARAMETERS))
        if protocol.seed == 0 and is_lucky(args, config):
            base = args["luck"] * OPTIMUM_SECONDS
        draw = f"{args['seed']}:{config_hash(config)}"
        rng = random.Random(draw if protocol.seed == 0 else f"{draw}:{protocol.seed}")
        launches = max(int(protocol.min_launches), 1)
        samples = tuple(base * (1.0 + args["noise"] * rng.random()) for _ in range(launches))
        median = statistics.median(samples)
        from tunefleet.version import __version__

        return Outcome(
            state=TrialState.DONE,
            median_s=median,
            min_s=min(samples),
            samples_s=samples,
            gflops=FLOP_COUNT / median / 1e9,
            flop_count=FLOP_COUNT,
            compile_s=0.0,
            validation={"passed": True, "reference": "analytic"},
            protocol=protocol.to_json(),
            versions={"tunefleet": __version__, "synthetic": 1},
            code=None,
            error=None,
            phases={"timing": timing_s},
        )


def _inject(fault: str) -> None:
    if fault == "fail":
        _crash()
    elif fault == "hang":
        _hang()


def _depends_on(value: Any) -> list[str]:
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ProblemError(
            f"synthetic: depends_on={value!r} must be a list of parameter names "
            f"(of {', '.join(PARAMETERS)})"
        )
    names = [n.strip() for n in names if n.strip()]
    bad = sorted(set(names) - set(PARAMETERS))
    if bad:
        raise ProblemError(
            f"synthetic: depends_on names {bad}, not parameters; they are {', '.join(PARAMETERS)}"
        )
    return [n for n in PARAMETERS if n in names]


def _invalid_values(value: Any) -> dict[str, list[Any]]:
    if not isinstance(value, Mapping) or not all(
        isinstance(v, list | tuple) for v in value.values()
    ):
        raise ProblemError(
            f"synthetic: invalid_values={value!r} must map parameter names to lists of values"
        )
    bad = sorted(set(value) - set(PARAMETERS))
    if bad:
        raise ProblemError(
            f"synthetic: invalid_values names {bad}, not parameters; they are "
            f"{', '.join(PARAMETERS)}"
        )
    return {str(k): list(v) for k, v in value.items()}


def _number(key: str, value: Any, *, low: float, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProblemError(f"synthetic: {key}={value!r} must be a number")
    if value < low or (high is not None and value > high):
        bounds = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
        raise ProblemError(f"synthetic: {key}={value!r} must be {bounds}")
    return float(value)
