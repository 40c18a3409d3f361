"""Kernel problems: the generic evaluation of a loopy kernel, and the measurement protocol.

A :class:`KernelProblem` supplies the science — arguments, a space, a loopy builder, inputs, a
NumPy reference, flop and byte counts — and inherits how a configuration is evaluated:

**prepare** (CPU only, in the worker's process pool): check the configuration, build the loopy
translation unit at the target size, check it against the device's limits (work-group size per
axis and in total, local memory), linearise it and generate its OpenCL code; and the same at a
small validation size only where the reference at the target size is too costly
(:meth:`KernelProblem.target_reference_affordable`). Returns a picklable
:class:`PreparedKernel`: the OpenCL C of each kernel with its parameters in signature order,
sizes and arrays, no loopy objects. A configuration builds to one kernel in every process,
whatever its hash seed: the orders loopy would take from iterating sets (ILP loop nests,
privatised accumulators' axes) are fixed from the kernel (:mod:`tunefleet.problems._loopy`).
**prebuild** (also in the pool, on its own session of the same device) compiles that source
and hands over the driver's binary, so the device process loads it instead of compiling.

**measure** (in the worker's device process, on an open ``DeviceSession``; it never imports
loopy):

1. Build the OpenCL program from the generated source with pyopencl and bind the arrays by the
   kernel's parameter names (``compile_s`` = loopy code generation in prepare + OpenCL
   builds). A build error is an ``invalid`` outcome with the build log. What is timed is the
   configuration's own code by construction; the measurement records its sha256
   (``details["source_sha256"]``).
2. Validate: deterministic inputs, outputs pre-filled with NaN (so elements a kernel forgets
   to write are caught) unless the problem gives their starting contents, one launch, its
   outputs compared with the NumPy reference (computed in float64) by the scaled max-norm
   error ``max|out - ref| / max|ref|``. At the target size wherever its reference is
   affordable: the inputs and the reference are made once per size and input seed (the
   reference in a thread beside the device's work, on a device that is not the host's
   cores) and kept on the device, and the comparison is a reduction there. Else at the small
   size, on the host. Tolerances per dtype (:data:`TOLERANCES`): float32 1e-4, float64
   1e-10, complex64 1e-4, complex128 1e-10; integers must match exactly. Wrong numbers, NaN or
   infinity give ``invalid`` with the output's name, the error and the tolerance, before
   any timing. **Unchecked elements:** where the reference holds NaN, the element is not
   checked (the kernel may leave it unwritten); every other element is. The verdict records,
   per output, how many elements were checked.
3. Time at the target size with OpenCL profiling events (see :class:`~tunefleet.problems.base
   .Protocol`): warm-up launches, then rounds until at least ``min_launches`` launches and
   ``min_seconds`` of kernel time, at most ``max_launches``. Every sample is kept; the
   outcome reports median and minimum, GFLOP/s and GB/s from the median, compile time, the
   protocol, software versions and the device.
4. Check where it was timed: the inputs, which the worker keeps on the device from one
   configuration to the next, must still equal their pristine device copies bit for bit (a
   kernel that wrote into one, out of bounds, is ``invalid``, and the next configuration gets
   fresh inputs), and the outputs of the last timed launch (they start as NaN) are compared
   with the reference at the target size as in validation: a kernel that skips work or reads
   stale data only after its first launch is ``invalid`` "at the target size". Where that
   reference is too costly (:data:`TARGET_REFERENCE_MAX_FLOP`, and the validation checked
   every element) every output must at least be finite.

Each phase's seconds go to the outcome's ``phases`` (:mod:`tunefleet.timeline`).

**Starting contents.** ``make_inputs`` may also return an array for an output: its starting
contents (instead of NaN). An argument the kernel reads and writes (loopy infers it, or the
problem declares ``is_input=True, is_output=True``) is updated in place and must get its
starting contents there. Validation launches once from those contents. Before every timed or
warm-up launch, in-place arguments are restored from a pristine device copy with a
device-to-device copy enqueued ahead of the kernel on the same in-order queue: the kernel's
profiling event starts after the copy ends, so samples time the kernel alone, and every launch
does the same work from the same numbers (an accumulation would otherwise grow, overflow or
change its data-dependent cost launch after launch). Outputs the kernel only writes are not
restored: a kernel that never reads them writes the same values on every launch. The
measurement's protocol names the restored arguments (``restored_before_each_launch``).

Launch errors (too many resources for the work-group, invalid work-group size) are ``invalid``;
if the OpenCL context does not survive the error, :class:`~tunefleet.errors.DeviceError` is
raised so the worker replaces its device process (the trial then counts as ``failed``).
Errors in a problem's own code propagate (the worker records them as ``failed``).

A configuration must compile to exactly one device kernel (it is timed with that kernel's
event). Nothing here imports loopy or pyopencl at module level.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import logging
import math
import re
import statistics
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunefleet import agreement
from tunefleet.devices import DeviceInfo, DeviceLimits, Footprint
from tunefleet.errors import DeviceError, InvalidConfiguration, first_line
from tunefleet.problems.base import Outcome, Problem, Protocol, normalise_with_specs
from tunefleet.space import Config, Space, canonical_json
from tunefleet.timeline import Phase
from tunefleet.vocabulary import TrialState

#: Largest allowed scaled max-norm error ``max|out - ref| / max|ref|`` per dtype. float32
#: leaves room for reordered sums of a few thousand terms; a wrong index gives errors of
#: order one. Integer outputs must be exact.
TOLERANCES: dict[str, float] = {
    "float32": 1e-4,
    "float64": 1e-10,
    "complex64": 1e-4,
    "complex128": 1e-10,
}

_MAX_REASON = 4000
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArrayInfo:
    """A kernel array argument as the launcher needs it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    is_output: bool
    #: Read by the kernel as well: with ``is_output``, an argument updated in place.
    is_input: bool = False


@dataclass(frozen=True)
class BuiltKernel:
    """One generated kernel at one size: what the device process needs to run it."""

    #: Problem arguments at this size.
    args: dict[str, Any]
    #: The kernel's name in ``source``.
    entrypoint: str
    #: Generated OpenCL C: exactly what the device builds and launches.
    source: str
    #: The kernel's parameters in the order of its signature (each an array of ``arrays``).
    parameters: tuple[str, ...]
    arrays: tuple[ArrayInfo, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    local_mem_bytes: int
    codegen_s: float
    #: The program ``source`` compiled by a prebuild (the driver's binary, PTX on NVIDIA),
    #: and the fingerprint of the device it was compiled for: the device process loads it
    #: instead of compiling (:class:`_Launcher`).
    binary: bytes | None = None
    binary_device: str | None = None


@dataclass(frozen=True)
class PreparedKernel:
    """What :meth:`KernelProblem.prepare` returns (picklable)."""

    problem: str
    args: dict[str, Any]
    config: Config
    target: BuiltKernel
    #: The kernel at the small validation size; ``None`` when the configuration is validated
    #: at the target size (its reference is affordable, :meth:`KernelProblem.
    #: target_reference_affordable`, or the validation size is the target size).
    validation: BuiltKernel | None
    prepare_s: float
    #: OpenCL build time spent by :meth:`KernelProblem.prebuild` in the code-generation
    #: process; counted in ``compile_s``, since the device process's build is then a cache hit.
    prebuild_s: float = 0.0


class KernelProblem(Problem):
    """Base of problems whose configurations are loopy kernels run through OpenCL.

    Subclasses set ``name``, ``description``, ``arguments`` and implement :meth:`space`,
    :meth:`build`, :meth:`make_inputs`, :meth:`reference`, :meth:`flop_count` and
    :meth:`byte_count`; they may override :meth:`check_args`, :meth:`config_rules`,
    :meth:`validation_args`, :meth:`default_config` and :meth:`tolerance`.
    """

    needs_opencl = True

    # --- arguments and space ---------------------------------------------------------------
    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        args = normalise_with_specs(self.name, self.arguments, raw)
        self.check_args(args)
        return args

    def check_args(self, args: dict[str, Any]) -> None:
        """Rules across arguments; raise ProblemError naming the bad one."""

    @abstractmethod
    def space(self, args: Mapping[str, Any]) -> Space: ...

    def config_rules(self, args: Mapping[str, Any], config: Config) -> None:
        """Rules that make a point of the box illegal without looking at a device; raise
        InvalidConfiguration (use :func:`tunefleet.space.require`)."""

    def check_config(self, args: Mapping[str, Any], config: Mapping[str, Any]) -> Config:
        checked = self._space_of(args).check(config)
        self.config_rules(args, checked)
        return checked

    def _space_of(self, args: Mapping[str, Any]) -> Space:
        """The space of ``args``, kept for the next call with the same arguments: the
        coordinator (and a replay) checks every proposal, and building the space and its
        parameters' value sets anew was most of a check's time."""
        try:
            key = canonical_json(dict(args))
        except (TypeError, ValueError):
            return self.space(args)
        kept: tuple[str, Space] | None = getattr(self, "_kept_space", None)
        if kept is None or kept[0] != key:
            kept = (key, self.space(args))
            self._kept_space = kept
        return kept[1]

    # --- the science -----------------------------------------------------------------------
    @abstractmethod
    def build(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        """The loopy translation unit for ``config`` with every size fixed (use
        ``lp.fix_parameters``). Raise InvalidConfiguration for illegal points; loopy and isl
        errors raised here are turned into InvalidConfiguration too."""

    @abstractmethod
    def make_inputs(self, args: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        """Input arrays by kernel argument name, in their natural (NumPy) shapes; a kernel
        may view an array in another C-order shape of the same size (split axes). An array
        under an output's name gives that output's starting contents (instead of NaN); an
        argument the kernel reads and writes (in place) must have one."""

    @abstractmethod
    def reference(self, args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The expected output arrays by kernel argument name (compute in float64), after
        one launch from the starting contents. NaN marks an element that is not checked
        (the kernel may leave it unwritten)."""

    @abstractmethod
    def flop_count(self, args: Mapping[str, Any]) -> float:
        """Floating-point operations of one launch (0 for pure data movement)."""

    @abstractmethod
    def byte_count(self, args: Mapping[str, Any]) -> float:
        """Bytes one launch must move to and from global memory at least."""

    def validation_args(self, args: Mapping[str, Any], config: Config) -> dict[str, Any]:
        """Arguments of the small validation run (default: the target arguments)."""
        return dict(args)

    def tolerance(self, dtype: np.dtype[Any]) -> float:
        if dtype.kind in "iub":
            return 0.0
        return TOLERANCES[dtype.name]

    # --- prepare: CPU only -------------------------------------------------------------------
    def prepare(self, args: Mapping[str, Any], config: Config, device: DeviceInfo) -> Any:
        t0 = time.perf_counter()
        full = self.normalise_args(args)
        checked = self.check_config(full, config)
        target = self._build(full, checked, device)
        validation = None
        if not self.target_reference_affordable(full):
            vargs = self.normalise_args(self.validation_args(full, checked))
            validation = None if vargs == full else self._build(vargs, checked, device)
        return PreparedKernel(
            problem=self.name,
            args=full,
            config=checked,
            target=target,
            validation=validation,
            prepare_s=time.perf_counter() - t0,
        )

    def _build(self, args: dict[str, Any], config: Config, device: DeviceInfo) -> BuiltKernel:
        import islpy as isl
        import loopy as lp
        from loopy.diagnostic import LoopyError

        from tunefleet.problems._loopy import linearize, preprocess

        t0 = time.perf_counter()
        try:
            tu = self.build(args, config, device)
            (entry,) = tuple(tu.entrypoints)
            tu = preprocess(tu)
            # Device limits first: they are cheap to check and save scheduling and codegen.
            knl = tu[entry]
            gexprs, lexprs = knl.get_grid_size_upper_bounds_as_exprs(tu.callables_table)
            groups = tuple(_as_int(x, "number of work-groups") for x in gexprs) or (1,)
            local = tuple(_as_int(x, "work-group size") for x in lexprs) or (1,)
            local_mem = _local_mem_bytes(knl)
            check_device_limits(local, local_mem, device)
            tu = linearize(tu)
            codegen = lp.generate_code_v2(tu)
        except (LoopyError, isl.Error) as exc:
            raise InvalidConfiguration(
                "loopy cannot build this configuration: "
                f"{type(exc).__name__}: {first_line(exc)[:500]}"
            ) from None
        if len(codegen.device_programs) != 1:
            raise InvalidConfiguration(
                f"the configuration compiles to {len(codegen.device_programs)} device kernels "
                "(a global barrier?); tunefleet times exactly one"
            )
        knl = tu[entry]
        arrays = tuple(_array_info(a) for a in knl.args if isinstance(a, lp.ArrayArg))
        source = codegen.device_code()
        parameters = kernel_parameters(source, entry)
        unknown = [name for name in parameters if name not in {a.name for a in arrays}]
        if unknown:
            raise InvalidConfiguration(
                f"kernel argument(s) {', '.join(unknown)} of {entry} are not arrays; tunefleet "
                "launches kernels whose every size is fixed (lp.fix_parameters) and whose "
                "arguments are arrays"
            )
        nd = max(len(groups), len(local))
        groups = groups + (1,) * (nd - len(groups))
        local = local + (1,) * (nd - len(local))
        return BuiltKernel(
            args=args,
            entrypoint=entry,
            source=source,
            parameters=parameters,
            arrays=arrays,
            global_size=tuple(g * ls for g, ls in zip(groups, local, strict=True)),
            local_size=local,
            local_mem_bytes=local_mem,
            codegen_s=time.perf_counter() - t0,
        )

    def prebuild(self, prepared: Any, session: Any) -> Any:
        """Compile each kernel here and hand the device process the driver's binary (it
        loads it; a failed build is measure's to report)."""
        if not isinstance(prepared, PreparedKernel) or session is None:
            return prepared
        t0 = time.perf_counter()
        small = prepared.validation and _with_binary(prepared.validation, session)
        target = _with_binary(prepared.target, session)
        return dataclasses.replace(
            prepared, target=target, validation=small, prebuild_s=time.perf_counter() - t0
        )

    def ready(self, prepared: Any, session: Any, protocol: Protocol) -> None:
        """The measurement's inputs on the device and its reference, and the small kernels
        that poison outputs and compare on the device compiled: what ``measure`` would
        otherwise do first (a cold build readies this before it asks for the device)."""
        if not isinstance(prepared, PreparedKernel) or session is None:
            return
        target = prepared.target
        inputs = self._target_inputs(target.args, protocol.seed, session)
        inputs.reference(self, needed=prepared.validation is None)
        inputs.warm(_KernelArrays.create(self.name, target, inputs.device, session))

    # --- measure: in the device process ------------------------------------------------------
    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Outcome:
        if not isinstance(prepared, PreparedKernel):
            raise TypeError(f"{self.name}.measure needs a PreparedKernel, got {type(prepared)}")
        if session is None:
            raise DeviceError(f"problem {self.name} needs an OpenCL device, not the host")
        watch = _Stopwatch(Phase.SETUP)
        target = prepared.target
        small = prepared.validation
        details: dict[str, Any] = {
            "codegen_s": target.codegen_s + (small.codegen_s if small else 0.0),
            "prepare_s": prepared.prepare_s,
            "global_size": list(target.global_size),
            "local_size": list(target.local_size),
            "local_mem_bytes": target.local_mem_bytes,
            "validation_args": (small or target).args,
        }
        measured_protocol = protocol.to_json()
        restored = sorted(a.name for a in target.arrays if a.is_output and a.is_input)
        if restored:  # recorded only where it happens: other measurements keep their protocol
            measured_protocol[RESTORED_KEY] = restored
        base = {
            "protocol": measured_protocol,
            "versions": software_versions(session),
            "device": session.info.to_json(),
            "code": target.source,
            "flop_count": float(self.flop_count(target.args)),
            "byte_count": float(self.byte_count(target.args)),
        }

        def invalid(reason: str, validation: dict[str, Any] | None = None) -> Outcome:
            details["compile_s"] = details["codegen_s"] + details["build_s"]
            return Outcome(
                state=TrialState.INVALID,
                error=reason[:_MAX_REASON],
                validation=validation or {},
                details=details,
                compile_s=details["compile_s"],
                phases=watch.total(),
                **base,
            )

        # The build happened where it cost time: in prebuild, and here (a cache hit after it).
        details["build_s"] = prepared.prebuild_s
        verdict: dict[str, Any] = {}
        if small is not None:
            # 1. The target size's reference is too costly: validate at the small size.
            with watch(Phase.BUILD):
                launcher, reason = _Launcher.create(small, session)
            if launcher is None:
                return invalid(reason)
            details["build_s"] += launcher.build_s
            with watch(Phase.VALIDATION):
                host_inputs = self.make_inputs(small.args, np.random.default_rng(protocol.seed))
                # Before the reference: a missing starting content is named, not a KeyError.
                given = _to_device(host_inputs, session)
                arrays = _KernelArrays.create(self.name, small, given, session)
                expected = self.reference(small.args, host_inputs)
                self._require_outputs(expected, arrays)
                launcher.bind(arrays.by_name)
                try:
                    launcher.launch().wait()
                except _cl_errors() as exc:
                    return invalid(_launch_failed(session, exc, "the validation size"))
                verdict = self.compare(expected, {k: arrays.outputs[k].get() for k in expected})
                verdict["args"] = small.args
            if not verdict["passed"]:
                return invalid(verdict["reason"], verdict)

        inputs = self._target_inputs(target.args, protocol.seed, session)
        with watch(Phase.BUILD):
            launcher, reason = _Launcher.create(target, session)
        if launcher is None:
            return invalid(reason, verdict)
        details["build_s"] += launcher.build_s
        # "binary": the code-generation process compiled it; "source": compiled here.
        details["device_build"] = launcher.origin
        arrays = _KernelArrays.create(self.name, target, inputs.device, session)
        launcher.bind(arrays.by_name)
        if small is None:
            # 1. Validate at the target size: one launch from the starting contents, against
            # the reference computed once per size and input seed (while this launch ran,
            # on a device that is not the host's cores).
            with watch(Phase.VALIDATION):
                try:
                    launcher.launch().wait()
                except _cl_errors() as exc:
                    return invalid(_launch_failed(session, exc, "the target size"))
            with watch(Phase.REFERENCE):
                reference = inputs.reference(self, needed=True)
            assert reference is not None
            with watch(Phase.VALIDATION):
                expected = reference
                self._require_outputs(expected, arrays)
                wrote = inputs.changed()
                verdict = inputs.compare(self, expected, arrays.outputs)
                verdict["args"] = target.args
            if wrote:
                return invalid(_wrote_into(inputs, wrote), verdict)
            if not verdict["passed"]:
                return invalid(f"at the target size, {verdict['reason']}", verdict)
            arrays.reset()  # the timed launches start from NaN again
        details["compile_s"] = details["build_s"] + details["codegen_s"]
        details["source_sha256"] = source_hash(target.source)

        def launch() -> Any:
            arrays.restore()
            return launcher.launch()

        race = getattr(session, "race_above_s", None)
        try:
            with watch(Phase.TIMING):
                samples, raced = time_launches(
                    launch if arrays.restores else launcher.launch, protocol, race
                )
        except _cl_errors() as exc:
            return invalid(_launch_failed(session, exc, "the target size"), verdict)
        if raced:  # recorded only where it happens, as the restored arguments are
            measured_protocol[RACED_KEY] = race
        watch.switch(Phase.CHECK)
        # 2. The inputs are as they were, and the outputs of the last timed launch agree with
        # the reference at the target size (or, where it is too costly, are finite).
        changed = inputs.changed()
        if changed:
            return invalid(_wrote_into(inputs, changed), verdict)
        partial = any(o["checked"] < o["elements"] for o in verdict["outputs"].values())
        with watch(Phase.REFERENCE):
            want = inputs.reference(self, needed=partial)
        if want is not None:
            at_target = inputs.compare(self, want, arrays.outputs)
            if not at_target["passed"]:
                return invalid(f"at the target size, {at_target['reason']}", verdict)
            verdict["target_checked"] = {
                name: {"checked": o["checked"], "elements": o["elements"]}
                for name, o in at_target["outputs"].items()
            }
            verdict["target_outputs"] = at_target["outputs"]
        else:
            target_checked: dict[str, Any] = {}
            for name, arr in arrays.outputs.items():
                if np.dtype(arr.dtype).kind not in "fc":
                    continue
                bad = inputs.checker.nonfinite(arr)
                target_checked[name] = {"checked": int(arr.size), "elements": int(arr.size)}
                if bad:
                    return invalid(
                        f"{name}: {bad} of {_outputs(arr.size, arr.size)} are NaN or "
                        "infinite at the target size (not written, or overflow)",
                        verdict,
                    )
            verdict["target_checked"] = target_checked
        median = statistics.median(samples)
        stat = median if protocol.statistic == "median" else min(samples)
        flops, nbytes = base["flop_count"], base["byte_count"]
        details["launches"] = len(samples)
        return Outcome(
            state=TrialState.DONE,
            median_s=median,
            min_s=min(samples),
            samples_s=tuple(samples),
            gflops=flops / stat / 1e9 if flops > 0 else None,
            gbps=nbytes / stat / 1e9 if nbytes > 0 else None,
            compile_s=details["compile_s"],
            validation=verdict,
            details=details,
            phases=watch.total(),
            **base,
        )

    def compare(self, expected: Mapping[str, Any], got: Mapping[str, Any]) -> dict[str, Any]:
        """Validation verdict: ``passed``, ``reason``, and per output the scaled error, the
        tolerance it was held to and how many of its elements were checked (``checked`` of
        ``elements``: where the reference is NaN an element is not checked)."""
        per_output: dict[str, Any] = {}
        for name, want in expected.items():
            want_arr = np.asarray(want)
            have = np.asarray(got[name]).reshape(want_arr.shape)
            tol = self.tolerance(have.dtype)
            mask = _checked_mask(want_arr)
            if mask is not None:
                want_arr, have = want_arr[mask], have[mask]
            entry = _entry(tol, have.dtype, int(have.size), mask.size if mask is not None else None)
            per_output[name] = entry
            if have.dtype.kind in "fc" and not np.isfinite(have).all():
                bad = int(have.size - np.isfinite(have).sum())
                return _failed(_nonfinite_reason(name, bad, entry), per_output)
            scale = float(np.max(np.abs(want_arr))) if want_arr.size else 0.0
            # Complex arithmetic only for complex numbers: a real GEMM 4096's check took 1.4 s
            # in complex128 on two cores, 0.1 s in float64.
            wide = np.complex128 if "c" in (have.dtype.kind, want_arr.dtype.kind) else np.float64
            diff = float(np.max(np.abs(have.astype(wide) - want_arr))) if have.size else 0.0
            err = diff / scale if scale > 0 else diff
            entry["max_rel_error"] = err
            if not err <= tol:
                return _failed(_wrong_reason(name, err, tol, have.dtype), per_output)
        return {"passed": True, "reason": "", "outputs": per_output}

    def _require_outputs(self, expected: Mapping[str, Any], arrays: _KernelArrays) -> None:
        missing = sorted(set(expected) - set(arrays.outputs))
        if missing:
            raise KeyError(f"{self.name}: the reference has outputs {missing} the kernel lacks")

    def _target_inputs(self, args: Mapping[str, Any], seed: int, session: Any) -> _TargetInputs:
        # This problem object (the device process keeps one per problem), not just its class:
        # two objects of one class may make other inputs or references.
        key = (id(self), canonical_json(dict(args)), seed, id(session))
        cached = _DEVICE_INPUTS.get(key)
        if cached is not None and (cached.problem is not self or cached.session is not session):
            cached = None  # a freed object's identity, reused
        if cached is None:
            _DEVICE_INPUTS.clear()  # one problem size at a time: free the previous arrays first
            host = self.make_inputs(args, np.random.default_rng(seed))
            cached = _TargetInputs(self, dict(args), host, _to_device(host, session), session)
            if self.target_reference_affordable(args) and not session.info.on_host_cores:
                # Off the device's path: numpy works beside the first validation launch. On a
                # CPU device it would steal the timing's cores, so it runs when first needed.
                cached.start_reference(self)
            _DEVICE_INPUTS[key] = cached
        return cached

    def target_reference_affordable(self, args: Mapping[str, Any]) -> bool:
        """Whether the NumPy reference at the target size is cheap enough to check every
        timed configuration's output against (computed once per size and input seed)."""
        return self.flop_count(args) <= TARGET_REFERENCE_MAX_FLOP


# --- helpers --------------------------------------------------------------------------------

#: Target-size inputs on the device, reused while a worker measures one run's configurations.
#: Never bound to a kernel argument that is written: those get a working copy.
_DEVICE_INPUTS: dict[tuple[Any, ...], _TargetInputs] = {}

#: Largest flop count of one launch for which the target size's outputs are compared with a
#: NumPy reference (float64 GEMM at n = 4096 is 1.4e11: a second or two, once per input seed);
#: above it only their finiteness is checked, unless the reference has unchecked elements.
TARGET_REFERENCE_MAX_FLOP = 4e11


class _Stopwatch:
    """Seconds per :class:`~tunefleet.timeline.Phase` of one ``measure``: every moment is
    charged to the phase current then (``switch``, or a ``with`` block), so the phases add
    up to the whole call."""

    def __init__(self, phase: Phase) -> None:
        self.current = phase
        self.mark = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def switch(self, phase: Phase) -> None:
        now = time.perf_counter()
        key = self.current.value
        self.seconds[key] = self.seconds.get(key, 0.0) + now - self.mark
        self.current, self.mark = phase, now

    @contextlib.contextmanager
    def __call__(self, phase: Phase) -> Iterator[None]:
        previous = self.current
        self.switch(phase)
        try:
            yield
        finally:
            self.switch(previous)

    def total(self) -> dict[str, float]:
        self.switch(self.current)
        return dict(self.seconds)


class _TargetInputs:
    """One size's inputs, kept on the device from one configuration to the next: the host
    arrays, their device copies (what kernels read), pristine device copies of those (what
    :meth:`changed` compares with), and the reference outputs at this size, computed once
    (in a thread, beside the device's work, where :meth:`start_reference` was called) and
    kept on the device too, so each check is a reduction there rather than a copy to the
    host and a comparison in NumPy (0.5-0.6 s an evaluation for face_mass on an H100 node)."""

    def __init__(
        self,
        problem: KernelProblem,
        args: dict[str, Any],
        host: dict[str, Any],
        device: dict[str, Any],
        session: Any,
    ) -> None:
        self.problem = problem
        self.session = session
        self.args = args
        self.host = host
        self.device = device
        self.pristine = {name: arr.copy() for name, arr in device.items()}
        self.checker = _DeviceChecker.of(session)
        self._reference: dict[str, Any] | None = None
        self._pending: concurrent.futures.Future[dict[str, Any]] | None = None
        #: Per output: the reference on the device (float64, flat), its largest magnitude
        #: and how many of its elements are numbers (NaN marks an unchecked one).
        self._wanted: dict[str, tuple[Any, float, int]] = {}

    def start_reference(self, problem: KernelProblem) -> None:
        """Compute the reference in a thread (NumPy releases the interpreter meanwhile)."""
        if self._reference is None and self._pending is None:
            self._pending = _reference_pool().submit(problem.reference, self.args, self.host)

    def reference(self, problem: KernelProblem, needed: bool) -> dict[str, Any] | None:
        """The reference outputs: waited for where they are being computed, computed here
        where ``needed`` (the validation showed unchecked elements, which only the reference
        tells from forgotten ones, or there was no validation at a small size) or affordable,
        else ``None``."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._reference = pending.result()
        if self._reference is None and (needed or problem.target_reference_affordable(self.args)):
            self._reference = problem.reference(self.args, self.host)
        return self._reference

    def compare(
        self, problem: KernelProblem, expected: Mapping[str, Any], outputs: Mapping[str, Any]
    ) -> dict[str, Any]:
        """:meth:`KernelProblem.compare` of the device arrays ``outputs`` with ``expected``,
        on the device where it can be (real floating-point outputs, a device with double
        precision, a problem that keeps the base class's comparison), else on the host."""
        on_device = self.checker.fp64 and type(problem).compare is KernelProblem.compare
        per_output: dict[str, Any] = {}
        for name, want in expected.items():
            have = outputs[name]
            dtype = np.dtype(have.dtype)
            if not on_device or dtype.kind != "f" or np.asarray(want).dtype.kind == "c":
                verdict = problem.compare({name: want}, {name: have.get()})
                per_output.update(verdict["outputs"])
                if not verdict["passed"]:
                    return _failed(verdict["reason"], per_output)
                continue
            wanted, scale, checked = self._on_device(name, want)
            tol = problem.tolerance(dtype)
            entry = _entry(tol, dtype, checked, int(have.size))
            per_output[name] = entry
            flat = have.reshape(-1)
            error = self.checker.max_error(flat, wanted)
            if not math.isfinite(error):
                bad = self.checker.nonfinite(flat, wanted)
                return _failed(_nonfinite_reason(name, bad, entry), per_output)
            err = error / scale if scale > 0 else error
            entry["max_rel_error"] = err
            if not err <= tol:
                return _failed(_wrong_reason(name, err, tol, dtype), per_output)
        return {"passed": True, "reason": "", "outputs": per_output}

    def _on_device(self, name: str, want: Any) -> tuple[Any, float, int]:
        if name not in self._wanted:
            import pyopencl.array as cla

            host = np.ascontiguousarray(np.asarray(want, dtype=np.float64)).reshape(-1)
            numbers = ~np.isnan(host)
            scale = float(np.max(np.abs(host[numbers]))) if numbers.any() else 0.0
            wanted = cla.to_device(self.checker.queue, host)
            self._wanted[name] = (wanted, scale, int(numbers.sum()))
        return self._wanted[name]

    def warm(self, arrays: _KernelArrays) -> None:
        """Compile the comparisons a measurement of ``arrays``' kernel makes (pyopencl builds
        each once per context), and put the reference on the device."""
        self.changed()
        if self._reference is not None:
            for name, arr in arrays.outputs.items():
                if name in self._reference and self.checker.fp64:
                    if np.dtype(arr.dtype).kind == "f":
                        wanted, _, _ = self._on_device(name, self._reference[name])
                        self.checker.max_error(arr.reshape(-1), wanted)
        self.checker.queue.finish()

    def changed(self) -> list[str]:
        """The inputs whose device copy no longer equals its pristine copy, bit for bit."""
        return [
            name
            for name, arr in self.device.items()
            if self.checker.differing(arr, self.pristine[name])
        ]


_REFERENCES: concurrent.futures.ThreadPoolExecutor | None = None


def _reference_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _REFERENCES
    if _REFERENCES is None:
        _REFERENCES = concurrent.futures.ThreadPoolExecutor(1, "tunefleet-reference")
    return _REFERENCES


class _DeviceChecker:
    """Reductions over device arrays that stand in for copying them to the host: the largest
    error against a float64 reference, a count of non-finite elements, a bitwise comparison.
    Built once per device session (pyopencl compiles each reduction once per context)."""

    _SESSIONS: dict[int, _DeviceChecker] = {}

    def __init__(self, session: Any) -> None:
        self.session = session
        self.queue = session.queue
        self.fp64 = "cl_khr_fp64" in (getattr(session.device, "extensions", "") or "")
        self._kernels: dict[tuple[str, str], Any] = {}

    @classmethod
    def of(cls, session: Any) -> _DeviceChecker:
        checker = cls._SESSIONS.get(id(session))
        if checker is None or checker.session is not session:
            checker = cls._SESSIONS[id(session)] = cls(session)
        return checker

    def _kernel(self, kind: str, ctype: str) -> Any:
        from pyopencl.reduction import ReductionKernel

        key = (kind, ctype)
        if key not in self._kernels:
            ctx = self.session.context
            if kind == "error":  # NaN in the reference: unchecked; a non-finite output: inf
                self._kernels[key] = ReductionKernel(
                    ctx,
                    np.float64,
                    neutral="0",
                    reduce_expr="fmax(a, b)",
                    map_expr="isnan(w[i]) ? 0.0 : (isfinite(h[i]) ? fabs((double) h[i] - w[i])"
                    " : INFINITY)",
                    arguments=f"__global const {ctype} *h, __global const double *w",
                )
            elif kind == "nonfinite":
                self._kernels[key] = ReductionKernel(
                    ctx,
                    np.int64,
                    neutral="0",
                    reduce_expr="a + b",
                    map_expr="isfinite(h[i]) ? 0 : 1",
                    arguments=f"__global const {ctype} *h",
                )
            elif kind == "nonfinite_checked":  # only where the reference is a number
                self._kernels[key] = ReductionKernel(
                    ctx,
                    np.int64,
                    neutral="0",
                    reduce_expr="a + b",
                    map_expr="!isnan(w[i]) && !isfinite(h[i]) ? 1 : 0",
                    arguments=f"__global const {ctype} *h, __global const double *w",
                )
            else:  # "differ": words that differ
                self._kernels[key] = ReductionKernel(
                    ctx,
                    np.int64,
                    neutral="0",
                    reduce_expr="a + b",
                    map_expr="x[i] != y[i] ? 1 : 0",
                    arguments=f"__global const {ctype} *x, __global const {ctype} *y",
                )
        return self._kernels[key]

    def max_error(self, have: Any, want: Any) -> float:
        """``max |have - want|`` over the elements where ``want`` is a number (in double
        precision; ``inf`` where ``have`` is not finite there)."""
        knl = self._kernel("error", _ctype(have.dtype))
        return float(knl(have, want, queue=self.queue).get())

    def nonfinite(self, have: Any, want: Any = None) -> int:
        """How many elements of ``have`` are NaN or infinite (only where ``want``, if given,
        is a number); complex outputs are counted on the host."""
        flat = have.reshape(-1)
        if np.dtype(flat.dtype).kind != "f":
            return int((~np.isfinite(flat.get())).sum())
        ctype = _ctype(flat.dtype)
        if want is None:
            return int(self._kernel("nonfinite", ctype)(flat, queue=self.queue).get())
        knl = self._kernel("nonfinite_checked", ctype)
        return int(knl(flat, want, queue=self.queue).get())

    def differing(self, a: Any, b: Any) -> int:
        """How many words of ``a`` differ from ``b``'s, bit for bit (NaN equals NaN)."""
        word = np.uint32 if a.nbytes % 4 == 0 else np.uint8
        x, y = a.reshape(-1).view(word), b.reshape(-1).view(word)
        knl = self._kernel("differ", _ctype(np.dtype(word)))
        return int(knl(x, y, queue=self.queue).get())


def _wrote_into(inputs: _TargetInputs, changed: list[str]) -> str:
    """The reason of a kernel that stored into its inputs; the next configuration gets
    pristine ones."""
    _DEVICE_INPUTS.clear()
    return (
        f"the kernel wrote into its input {', '.join(changed)} at the target size (stores out "
        "of bounds?)"
    )


def _ctype(dtype: Any) -> str:
    from pyopencl.tools import dtype_to_ctype

    return str(dtype_to_ctype(np.dtype(dtype)))


def _entry(tol: float, dtype: Any, checked: int, elements: int | None) -> dict[str, Any]:
    """One output's line of a verdict."""
    return {
        "tolerance": tol,
        "dtype": np.dtype(dtype).name,
        "checked": int(checked),
        "elements": int(checked if elements is None else elements),
    }


def _failed(reason: str, per_output: dict[str, Any]) -> dict[str, Any]:
    return {"passed": False, "reason": reason, "outputs": per_output}


def _nonfinite_reason(name: str, bad: int, entry: Mapping[str, Any]) -> str:
    return (
        f"{name}: {bad} of {_outputs(entry['checked'], entry['elements'])} are NaN or infinite "
        "(not written, or a wrong computation)"
    )


def _wrong_reason(name: str, err: float, tol: float, dtype: Any) -> str:
    return (
        f"{name}: wrong numbers (max error {err:.3g} relative to the largest reference value; "
        f"{np.dtype(dtype).name} tolerance {tol:g})"
    )


#: The protocol key of a raced timing (:func:`time_launches`): the bound its first launch
#: passed, in seconds; and how many launches such a timing takes.
RACED_KEY = "raced_above_s"
RACE_LAUNCHES = 2

#: The protocol key naming the arguments restored before each launch (in-place updates).
RESTORED_KEY = "restored_before_each_launch"


def _checked_mask(want: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    """Where the reference is a number (``None``: everywhere); NaN marks an unchecked element."""
    if want.dtype.kind not in "fc":
        return None
    unchecked = np.isnan(want)
    return ~unchecked if unchecked.any() else None


def _outputs(checked: int, total: int) -> str:
    return f"{checked} outputs" if checked == total else f"{checked} checked outputs"


def next_batch(samples: list[float], protocol: Protocol) -> int:
    """How many launches the next timing round needs (0: done). Pure, for testing."""
    n, total = len(samples), sum(samples)
    if n == 0:
        return protocol.min_launches
    if n >= protocol.max_launches:
        return 0
    if n >= protocol.min_launches and total >= protocol.min_seconds:
        if protocol.noise_limit > 0 and agreement.noise(samples) > protocol.noise_limit:
            return min(n, protocol.max_launches - n)  # as many again: the noise is measured
        return 0
    need = protocol.min_launches - n
    if total < protocol.min_seconds:
        mean = total / n if n else 0.0
        more = (
            math.ceil((protocol.min_seconds - total) / mean) if mean > 0 else protocol.max_launches
        )
        need = max(need, more)
    return max(1, min(need, protocol.max_launches - n))


def time_launches(
    launch: Callable[[], Any], protocol: Protocol, race_above_s: float | None = None
) -> tuple[list[float], bool]:
    """Kernel seconds of each timed launch, by the protocol, and whether the timing was
    *raced*. ``launch()`` enqueues one launch and returns its profiling event.

    Racing: when the first warm-up launch alone takes more than ``race_above_s`` (the worker
    passes a multiple of the run's best time), the kernel is no contender; it gets
    :data:`RACE_LAUNCHES` timed launches and no more warm-ups, so a configuration a thousand
    times slower than the best costs seconds, not the protocol's full count of launches."""
    import pyopencl as cl

    def seconds(event: Any) -> float:
        return float((event.profile.end - event.profile.start) * 1e-9)

    last = None
    for index in range(protocol.warmup):
        last = launch()
        if index == 0 and race_above_s is not None:
            last.wait()
            if seconds(last) > race_above_s:
                events = [launch() for _ in range(RACE_LAUNCHES)]
                cl.wait_for_events(events)
                return [seconds(e) for e in events], True
    if last is not None:
        last.wait()
    samples: list[float] = []
    batch = next_batch(samples, protocol)
    while batch:
        events = [launch() for _ in range(batch)]
        cl.wait_for_events(events)
        samples.extend(seconds(e) for e in events)
        batch = next_batch(samples, protocol)
    return samples, False


def check_device_limits(local_size: tuple[int, ...], local_mem: int, device: DeviceInfo) -> None:
    """InvalidConfiguration when the work-group or local memory exceeds the device's limits."""
    why = DeviceLimits.of(device).exceeded_by(Footprint(tuple(local_size), local_mem))
    if why is not None:
        raise InvalidConfiguration(why)


def software_versions(session: Any) -> dict[str, Any]:
    """The versions a measurement records. Read from the installed packages' metadata: the
    device process never imports loopy or islpy (it builds and launches OpenCL C)."""
    import pyopencl

    from tunefleet.version import __version__

    info = session.info
    return {
        "tunefleet": __version__,
        "loopy": _installed("loopy"),
        "pyopencl": pyopencl.VERSION_TEXT,
        "islpy": _installed("islpy"),
        "numpy": np.__version__,
        "driver": info.driver_version,
        "opencl": info.extra.get("opencl_version", ""),
        "platform": info.platform,
    }


@functools.cache
def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


class _Launcher:
    """A generated kernel built on a device session and launched there: the OpenCL source as
    code generation wrote it, built with pyopencl (no loopy in the device process, so what is
    timed is the configuration's own code by construction), its arguments bound by name in
    the order of its signature."""

    def __init__(
        self, built: BuiltKernel, session: Any, program: Any, kernel: Any, build_s: float
    ) -> None:
        self.built = built
        self.session = session
        self.program = program
        self.kernel = kernel
        self.build_s = build_s
        #: How the program came to be here: ``binary`` (a prebuild's, loaded), ``source``
        #: (compiled now) or ``kept`` (compiled earlier by this process, a cold build's own).
        self.origin = "source"

    @classmethod
    def create(cls, built: BuiltKernel, session: Any) -> tuple[_Launcher | None, str]:
        """Build ``built`` on the session's device; ``(None, reason)`` when the build fails
        (the configuration is ``invalid``). After a prebuild of the same source the driver's
        cache answers (NVIDIA's and PoCL's cache builds by source)."""
        import pyopencl as cl

        t0 = time.perf_counter()
        key = (id(session), built.entrypoint, source_hash(built.source))
        kept = _BUILT.get(key)
        if kept is not None and kept.session is session:
            # Built in this process already (a cold build's own prebuild): no second build.
            launcher = cls(built, session, kept.program, kept.kernel, time.perf_counter() - t0)
            launcher.origin = "kept"
            return launcher, ""
        program, origin = None, "source"
        if built.binary is not None and built.binary_device == session.info.fingerprint:
            try:
                program = cl.Program(session.context, [session.device], [built.binary])
                program.build()
                origin = "binary"
            except _cl_errors():
                program = None  # another driver's binary after all: compile the source
        try:
            if program is None:
                program = cl.Program(session.context, built.source).build()
            kernel = cl.Kernel(program, built.entrypoint)
        except _cl_errors() as exc:
            _check_device_alive(session, exc)
            return None, f"OpenCL build failed: {str(exc).strip()}"
        if kernel.num_args != len(built.parameters):
            raise InvalidConfiguration(
                f"{built.entrypoint} takes {kernel.num_args} arguments, its signature names "
                f"{len(built.parameters)} ({', '.join(built.parameters)})"
            )
        launcher = cls(built, session, program, kernel, time.perf_counter() - t0)
        launcher.origin = origin
        _BUILT[key] = launcher
        while len(_BUILT) > _BUILT_KEPT:
            del _BUILT[next(iter(_BUILT))]
        return launcher, ""

    def bind(self, arrays: Mapping[str, Any]) -> None:
        for index, name in enumerate(self.built.parameters):
            arr = arrays.get(name)
            if arr is None:
                raise KeyError(f"{self.built.entrypoint}: no array for kernel argument {name!r}")
            self.kernel.set_arg(index, arr.data)

    def launch(self) -> Any:
        import pyopencl as cl

        return cl.enqueue_nd_range_kernel(
            self.session.queue, self.kernel, self.built.global_size, self.built.local_size
        )


#: The programs this process built last, by session, kernel and source: a process that
#: prebuilds and then measures the same kernel (a cold build) builds it once.
_BUILT: dict[tuple[int, str, str], _Launcher] = {}
_BUILT_KEPT = 4


def _with_binary(built: BuiltKernel, session: Any) -> BuiltKernel:
    """``built`` with the binary a build on ``session`` gives (unchanged if it fails)."""
    import pyopencl as cl

    launcher, _ = _Launcher.create(built, session)
    if launcher is None:
        return built
    try:
        (binary,) = launcher.program.get_info(cl.program_info.BINARIES)
    except (cl.Error, ValueError):
        return built
    return dataclasses.replace(built, binary=bytes(binary), binary_device=session.info.fingerprint)


def kernel_parameters(source: str, name: str) -> tuple[str, ...]:
    """The parameter names of kernel ``name`` in OpenCL C ``source``, in signature order."""
    found = re.search(
        r"__kernel\b[^;{]*?\b" + re.escape(name) + r"\s*\(([^)]*)\)", source, re.DOTALL
    )
    if found is None:
        raise InvalidConfiguration(f"the generated code has no kernel named {name!r}")
    params = [p.strip() for p in found.group(1).split(",") if p.strip()]
    names = []
    for param in params:
        word = re.search(r"(\w+)\s*(\[[^]]*\])?\s*$", param)
        if word is None:
            raise InvalidConfiguration(f"cannot read parameter {param!r} of kernel {name}")
        names.append(word.group(1))
    return tuple(names) if names != ["void"] else ()


def source_hash(source: str) -> str:
    """The identity of generated code: sha256 of its text, hex."""
    return hashlib.sha256(source.encode()).hexdigest()


def _cl_errors() -> tuple[type[BaseException], ...]:
    import pyopencl as cl

    return (cl.Error,)


def _launch_failed(session: Any, exc: BaseException, where: str) -> str:
    """The reason of a launch that failed at ``where`` (an ``invalid`` configuration), once
    the context is known to have survived it (:func:`_check_device_alive`)."""
    _check_device_alive(session, exc)
    return f"kernel launch failed at {where}: {first_line(exc)[:500]}"


def _check_device_alive(session: Any, cause: BaseException) -> None:
    """After an OpenCL error: if the context no longer works, the device process must go."""
    import pyopencl as cl
    import pyopencl.array as cla

    try:
        probe = cla.zeros(session.queue, 16, np.float32)
        probe.get()
        session.queue.finish()
    except cl.Error as exc:
        raise DeviceError(
            f"the OpenCL context broke after {first_line(cause)[:500]} ({first_line(exc)[:500]}); "
            "the device process must be restarted"
        ) from None


def _to_device(host: Mapping[str, Any], session: Any) -> dict[str, Any]:
    import pyopencl.array as cla

    return {
        name: cla.to_device(session.queue, np.ascontiguousarray(arr)) for name, arr in host.items()
    }


def _poison(arr: Any) -> None:
    if np.dtype(arr.dtype).kind in "fc":
        arr.fill(np.nan)
    else:
        arr.fill(np.iinfo(arr.dtype).max if np.dtype(arr.dtype).kind in "iu" else 0)


class _KernelArrays:
    """The device arrays of one kernel's arguments: inputs as given, and a working array per
    output, starting as NaN or as the contents the problem gave. ``restores`` pairs each
    in-place argument with its pristine copy."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.by_name: dict[str, Any] = {}
        self.outputs: dict[str, Any] = {}
        self.starts: list[tuple[Any, Any]] = []
        self.restores: list[tuple[Any, Any]] = []

    @classmethod
    def create(
        cls, problem: str, built: BuiltKernel, given: Mapping[str, Any], session: Any
    ) -> _KernelArrays:
        import pyopencl.array as cla

        self = cls(session)
        for a in built.arrays:
            src = given.get(a.name)
            if not a.is_output:
                if src is not None:
                    self.by_name[a.name] = src
                continue  # a missing input is the launcher's to name
            work = cla.empty(session.queue, a.shape, np.dtype(a.dtype))
            if src is None:
                if a.is_input:
                    raise KeyError(
                        f"{problem}: kernel argument {a.name!r} is read and written (updated "
                        "in place); make_inputs must return its starting contents"
                    )
            else:
                if np.dtype(src.dtype) != work.dtype or src.nbytes != work.nbytes:
                    raise ValueError(
                        f"{problem}: the starting contents of {a.name!r} are {src.dtype} "
                        f"{tuple(src.shape)}; the kernel's argument is {a.dtype} {a.shape}"
                    )
                self.starts.append((work, src))
                if a.is_input:
                    self.restores.append((work, src))
            self.by_name[a.name] = work
            self.outputs[a.name] = work
        self.reset()
        return self

    def reset(self) -> None:
        """Every output as a launch starts: NaN, or the contents the problem gave."""
        started = {id(work) for work, _ in self.starts}
        for arr in self.outputs.values():
            if id(arr) not in started:
                _poison(arr)
        self._copy(self.starts)

    def restore(self) -> None:
        """Put the in-place arguments back to their starting contents, enqueued ahead of the
        next launch on the same in-order queue (outside the kernel's profiling event)."""
        self._copy(self.restores)

    def _copy(self, pairs: list[tuple[Any, Any]]) -> None:
        import pyopencl as cl

        for dst, src in pairs:
            cl.enqueue_copy(self.session.queue, dst.data, src.data, byte_count=src.nbytes)


def _array_info(arg: Any) -> ArrayInfo:
    return ArrayInfo(
        name=arg.name,
        shape=tuple(_as_int(s, f"shape of {arg.name}") for s in arg.shape),
        dtype=np.dtype(arg.dtype.numpy_dtype).name,
        is_output=bool(arg.is_output),
        is_input=bool(arg.is_input),
    )


def _local_mem_bytes(knl: Any) -> int:
    from loopy.kernel.data import AddressSpace

    total = 0
    for tv in knl.temporary_variables.values():
        if tv.address_space == AddressSpace.LOCAL:
            total += _as_int(tv.nbytes, f"size of {tv.name}")
    return total


def _as_int(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidConfiguration(
            f"{what} is not a fixed number ({value}); fix every size with lp.fix_parameters"
        ) from None


__all__ = [
    "RACED_KEY",
    "RESTORED_KEY",
    "TOLERANCES",
    "ArrayInfo",
    "BuiltKernel",
    "KernelProblem",
    "PreparedKernel",
    "check_device_limits",
    "next_batch",
    "software_versions",
    "time_launches",
]
