"""Kernel problems: the generic evaluation of a loopy kernel, and the measurement protocol.

A :class:`KernelProblem` supplies the science — arguments, a space, a loopy builder, inputs, a
NumPy reference, flop and byte counts — and inherits how a configuration is evaluated:

**prepare** (CPU only, in the worker's process pool): check the configuration, build the loopy
translation unit at the target size and at a small validation size, check it against the
device's limits (work-group size per axis and in total, local memory), linearise it and
generate its OpenCL code. Code generation fills loopy's persistent caches (typed-and-scheduled
kernel, generated code, host invoker), so the device process that later calls
``TranslationUnit.executor(queue)`` on the pickled, linearised unit finds everything cached and
only pays the OpenCL build (measured: 3-5 s of code generation for an unrolled GEMM become
0.1 s, build included). Returns a picklable :class:`PreparedKernel`. A configuration builds
to one kernel in every process, whatever its hash seed: the orders loopy would take from
iterating sets (ILP loop nests, privatised accumulators' axes) are fixed from the kernel
(:mod:`tunefleet.problems._loopy`).

**measure** (in the worker's device process, on an open ``DeviceSession``):

1. Build the OpenCL program (``compile_s`` = loopy code generation in prepare + OpenCL build
   here). A build error is an ``invalid`` outcome with the build log. The code the executor
   builds is compared with the code generated for the configuration: loopy's caches answer
   the executor by a hash of the translation unit, and a cache that answers with another
   kernel's code is bypassed (the build is redone without caches), so a configuration is
   never credited with another kernel's time; the measurement records the sha256 of the
   code it timed (``details["source_sha256"]``).
2. Validate at the small size: deterministic inputs, outputs pre-filled with NaN (so elements a
   kernel forgets to write are caught) unless the problem gives their starting contents,
   compared with the NumPy reference (computed in float64) by the scaled max-norm error
   ``max|out - ref| / max|ref|``. Tolerances per dtype (:data:`TOLERANCES`): float32 1e-4,
   float64 1e-10, complex64 1e-4, complex128 1e-10; integers must match exactly. Wrong
   numbers, NaN or infinity give ``invalid`` with the output's name, the error and the
   tolerance. **Unchecked elements:** where the reference holds NaN, the element is not
   checked (the kernel may leave it unwritten); every other element is. The verdict records,
   per output, how many elements were checked.
3. Time at the target size with OpenCL profiling events (see :class:`~tunefleet.problems.base
   .Protocol`): warm-up launches, then rounds until at least ``min_launches`` launches and
   ``min_seconds`` of kernel time, at most ``max_launches``. Every sample is kept; the
   outcome reports median and minimum, GFLOP/s and GB/s from the median, compile time, the
   protocol, software versions and the device.
4. Check where it was timed: the outputs of the last timed launch (they start as NaN) are
   compared with the NumPy reference at the target size, computed once per size and input
   seed, as in validation; a kernel that skips work or reads stale data at the target size
   only is ``invalid`` "at the target size". Where that reference is too costly
   (:data:`TARGET_REFERENCE_MAX_FLOP`, and the validation checked every element) every output
   must at least be finite. Then the inputs, which the worker keeps on the device from one
   configuration to the next, must still equal the host arrays: a kernel that wrote into one
   (out of bounds) is ``invalid``, and the next configuration gets fresh inputs.

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

import dataclasses
import hashlib
import logging
import math
import statistics
import time
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunefleet import agreement
from tunefleet.devices import DeviceInfo
from tunefleet.errors import DeviceError, InvalidConfiguration, first_line
from tunefleet.problems.base import Outcome, Problem, Protocol, normalise_with_specs
from tunefleet.space import Config, Space, canonical_json
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
    #: The linearised loopy translation unit (picklable; its code is in loopy's cache).
    translation_unit: Any
    entrypoint: str
    #: Generated OpenCL C.
    source: str
    arrays: tuple[ArrayInfo, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    local_mem_bytes: int
    codegen_s: float


@dataclass(frozen=True)
class PreparedKernel:
    """What :meth:`KernelProblem.prepare` returns (picklable)."""

    problem: str
    args: dict[str, Any]
    config: Config
    target: BuiltKernel
    #: The kernel at the validation size; ``None`` when that is the target size.
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
        _warm_executor_cache(tu, entry, codegen)
        arrays = tuple(_array_info(a) for a in knl.args if isinstance(a, lp.ArrayArg))
        nd = max(len(groups), len(local))
        groups = groups + (1,) * (nd - len(groups))
        local = local + (1,) * (nd - len(local))
        return BuiltKernel(
            args=args,
            translation_unit=tu,
            entrypoint=entry,
            source=codegen.device_code(),
            arrays=arrays,
            global_size=tuple(g * ls for g, ls in zip(groups, local, strict=True)),
            local_size=local,
            local_mem_bytes=local_mem,
            codegen_s=time.perf_counter() - t0,
        )

    def prebuild(self, prepared: Any, session: Any) -> Any:
        if not isinstance(prepared, PreparedKernel) or session is None:
            return prepared
        t0 = time.perf_counter()
        for built in (prepared.validation, prepared.target):
            if built is not None:
                _Launcher.create(built, session)  # a failed build is measure's to report
        return dataclasses.replace(prepared, prebuild_s=time.perf_counter() - t0)

    # --- measure: in the device process ------------------------------------------------------
    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Outcome:
        if not isinstance(prepared, PreparedKernel):
            raise TypeError(f"{self.name}.measure needs a PreparedKernel, got {type(prepared)}")
        if session is None:
            raise DeviceError(f"problem {self.name} needs an OpenCL device, not the host")
        target = prepared.target
        val = prepared.validation or target
        details: dict[str, Any] = {
            "codegen_s": target.codegen_s
            + (prepared.validation.codegen_s if prepared.validation else 0.0),
            "prepare_s": prepared.prepare_s,
            "global_size": list(target.global_size),
            "local_size": list(target.local_size),
            "local_mem_bytes": target.local_mem_bytes,
            "validation_args": val.args,
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
                **base,
            )

        # The build happened where it cost time: in prebuild, and here (a cache hit after it).
        details["build_s"] = prepared.prebuild_s
        # 1. validation at the small size
        launcher, reason = _Launcher.create(val, session)
        if launcher is None:
            return invalid(reason)
        details["build_s"] += launcher.build_s
        rng = np.random.default_rng(protocol.seed)
        host_inputs = self.make_inputs(val.args, rng)
        # Before the reference: a missing starting content is named, not a KeyError inside it.
        arrays = _KernelArrays.create(self.name, val, _to_device(host_inputs, session), session)
        expected = self.reference(val.args, host_inputs)
        missing = sorted(set(expected) - set(arrays.outputs))
        if missing:
            raise KeyError(f"{self.name}: the reference has outputs {missing} the kernel lacks")
        launcher.bind(arrays.by_name)
        try:
            launcher.launch().wait()
        except _cl_errors() as exc:
            _check_device_alive(session, exc)
            return invalid(f"kernel launch failed at the validation size: {first_line(exc)[:500]}")
        verdict = self.compare(expected, {k: arrays.outputs[k].get() for k in expected})
        verdict["args"] = val.args
        if not verdict["passed"]:
            return invalid(verdict["reason"], verdict)

        # 2. timing at the target size
        if target is not val:
            launcher, reason = _Launcher.create(target, session)
            if launcher is None:
                return invalid(reason, verdict)
            details["build_s"] += launcher.build_s
            inputs = self._target_inputs(target.args, protocol.seed, session)
            arrays = _KernelArrays.create(self.name, target, inputs.device, session)
            launcher.bind(arrays.by_name)
        else:
            inputs = None
            arrays.reset()
        details["compile_s"] = details["build_s"] + details["codegen_s"]
        details["source_sha256"] = source_hash(launcher.source)

        def launch() -> Any:
            arrays.restore()
            return launcher.launch()

        try:
            samples = time_launches(launch if arrays.restores else launcher.launch, protocol)
        except _cl_errors() as exc:
            _check_device_alive(session, exc)
            return invalid(
                f"kernel launch failed at the target size: {first_line(exc)[:500]}", verdict
            )
        # 3. the inputs are as they were, and the outputs of the last timed launch agree with
        # the reference at the target size
        if inputs is not None:
            changed = inputs.changed()
            if changed:
                _DEVICE_INPUTS.clear()  # the next configuration gets pristine inputs
                return invalid(
                    f"the kernel wrote into its input {', '.join(changed)} at the target size "
                    "(stores out of bounds?)",
                    verdict,
                )
        if inputs is None:
            want: dict[str, Any] | None = expected
        else:
            partial = any(o["checked"] < o["elements"] for o in verdict["outputs"].values())
            want = inputs.reference(self, needed=partial)
        got = {name: arr.get() for name, arr in arrays.outputs.items()}
        if want is not None:
            at_target = self.compare(want, got)
            if not at_target["passed"]:
                return invalid(f"at the target size, {at_target['reason']}", verdict)
            verdict["target_checked"] = {
                name: {"checked": o["checked"], "elements": o["elements"]}
                for name, o in at_target["outputs"].items()
            }
            verdict["target_outputs"] = at_target["outputs"]
        else:
            target_checked: dict[str, Any] = {}
            for name, host in got.items():
                if host.dtype.kind not in "fc":
                    continue
                finite = np.isfinite(host)
                target_checked[name] = {"checked": int(finite.size), "elements": int(host.size)}
                if not finite.all():
                    bad = int(finite.size - finite.sum())
                    return invalid(
                        f"{name}: {bad} of {_outputs(finite.size, host.size)} are NaN or "
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
            entry: dict[str, Any] = {
                "tolerance": tol,
                "dtype": have.dtype.name,
                "checked": int(have.size),
                "elements": int(mask.size if mask is not None else have.size),
            }
            per_output[name] = entry
            if have.dtype.kind in "fc" and not np.isfinite(have).all():
                bad = int(have.size - np.isfinite(have).sum())
                return {
                    "passed": False,
                    "reason": f"{name}: {bad} of {_outputs(have.size, entry['elements'])} are "
                    "NaN or infinite (not written, or a wrong computation)",
                    "outputs": per_output,
                }
            scale = float(np.max(np.abs(want_arr))) if want_arr.size else 0.0
            diff = (
                float(np.max(np.abs(have.astype(np.complex128) - want_arr))) if have.size else 0.0
            )
            err = diff / scale if scale > 0 else diff
            entry["max_rel_error"] = err
            if not err <= tol:
                return {
                    "passed": False,
                    "reason": f"{name}: wrong numbers (max error {err:.3g} relative to the "
                    f"largest reference value; {have.dtype.name} tolerance {tol:g})",
                    "outputs": per_output,
                }
        return {"passed": True, "reason": "", "outputs": per_output}

    def _target_inputs(self, args: Mapping[str, Any], seed: int, session: Any) -> _TargetInputs:
        key = (
            type(self).__module__,
            type(self).__qualname__,
            canonical_json(dict(args)),
            seed,
            id(session),
        )
        cached = _DEVICE_INPUTS.get(key)
        if cached is None:
            _DEVICE_INPUTS.clear()  # one problem size at a time: free the previous arrays first
            host = self.make_inputs(args, np.random.default_rng(seed))
            cached = _TargetInputs(dict(args), host, _to_device(host, session))
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


class CodeMismatch(DeviceError):
    """The device process would launch other code than was generated for the configuration."""


@dataclass
class _TargetInputs:
    """One size's inputs: the host arrays, their device copies, and the reference outputs
    (computed when first asked for, ``None`` where unaffordable)."""

    args: dict[str, Any]
    host: dict[str, Any]
    device: dict[str, Any]
    _reference: dict[str, Any] | None = None

    def reference(self, problem: KernelProblem, needed: bool) -> dict[str, Any] | None:
        """``needed``: compute it whatever it costs (the validation showed unchecked elements,
        which only the reference tells from forgotten ones)."""
        if self._reference is None and (needed or problem.target_reference_affordable(self.args)):
            self._reference = problem.reference(self.args, self.host)
        return self._reference

    def changed(self) -> list[str]:
        """The inputs whose device copy no longer equals the host array."""
        return [
            name
            for name, arr in self.device.items()
            if not np.array_equal(arr.get(), np.ascontiguousarray(self.host[name]), equal_nan=True)
        ]


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


def time_launches(launch: Callable[[], Any], protocol: Protocol) -> list[float]:
    """Kernel seconds of each timed launch, by the protocol. ``launch()`` enqueues one launch
    and returns its profiling event."""
    import pyopencl as cl

    last = None
    for _ in range(protocol.warmup):
        last = launch()
    if last is not None:
        last.wait()
    samples: list[float] = []
    batch = next_batch(samples, protocol)
    while batch:
        events = [launch() for _ in range(batch)]
        cl.wait_for_events(events)
        samples.extend((e.profile.end - e.profile.start) * 1e-9 for e in events)
        batch = next_batch(samples, protocol)
    return samples


def check_device_limits(local_size: tuple[int, ...], local_mem: int, device: DeviceInfo) -> None:
    """InvalidConfiguration when the work-group or local memory exceeds the device's limits."""
    wg = math.prod(local_size)
    if device.max_work_group_size and wg > device.max_work_group_size:
        raise InvalidConfiguration(
            f"work-group of {wg} work-items {tuple(local_size)} exceeds the device's maximum "
            f"of {device.max_work_group_size}"
        )
    for axis, (size, limit) in enumerate(zip(local_size, device.max_work_item_sizes, strict=False)):
        if size > limit:
            raise InvalidConfiguration(
                f"work-group size {size} along axis {axis} exceeds the device's maximum of {limit}"
            )
    if device.local_mem_bytes and local_mem > device.local_mem_bytes:
        raise InvalidConfiguration(
            f"needs {local_mem} bytes of local memory; the device has {device.local_mem_bytes}"
        )


def software_versions(session: Any) -> dict[str, Any]:
    import islpy
    import loopy
    import pyopencl

    from tunefleet.version import __version__

    info = session.info
    return {
        "tunefleet": __version__,
        "loopy": loopy.version.VERSION_TEXT,
        "pyopencl": pyopencl.VERSION_TEXT,
        "islpy": islpy.version.VERSION_TEXT,
        "numpy": np.__version__,
        "driver": info.driver_version,
        "opencl": info.extra.get("opencl_version", ""),
        "platform": info.platform,
    }


class _Launcher:
    """A built kernel bound to a device session: OpenCL build, then launches."""

    def __init__(self, built: BuiltKernel, session: Any, executor: Any, build_s: float):
        self.built = built
        self.session = session
        self.executor = executor
        self.build_s = build_s
        self.kwargs: dict[str, Any] = {}
        #: The OpenCL source the executor built: what the launches run.
        self.source = built.source

    @classmethod
    def create(cls, built: BuiltKernel, session: Any) -> tuple[_Launcher | None, str]:
        """Build ``built`` on the session's device. The code the executor builds is checked
        against the code generated for the configuration: loopy's caches answer the
        executor by a hash of the translation unit, and should they answer with another
        kernel's code, the build is redone with caching off, so that nothing but this
        configuration's code is ever timed in its name (:class:`CodeMismatch` if even that
        differs)."""
        import loopy as lp

        t0 = time.perf_counter()
        launcher, reason = cls._build(built, session)
        if launcher is not None and launcher.source != built.source:
            _log.warning(
                "%s: loopy's caches answered with other code than was generated for this "
                "configuration (sha256 %s, generated %s); building it again without them",
                built.entrypoint,
                source_hash(launcher.source)[:12],
                source_hash(built.source)[:12],
            )
            with lp.CacheMode(False):
                launcher, reason = cls._build(built, session)
            if launcher is not None and launcher.source != built.source:
                raise CodeMismatch(
                    f"the device built other OpenCL code than code generation produced for "
                    f"this configuration (sha256 {source_hash(launcher.source)[:12]}, "
                    f"generated {source_hash(built.source)[:12]}), even without caches"
                )
        if launcher is not None:
            launcher.build_s = time.perf_counter() - t0
        return launcher, reason

    @classmethod
    def _build(cls, built: BuiltKernel, session: Any) -> tuple[_Launcher | None, str]:
        executor = built.translation_unit.executor(session.queue, entrypoint=built.entrypoint)
        arg_to_dtype = executor.arg_to_dtype({})
        try:
            # Builds the OpenCL program (code generation is a cache hit after prepare).
            executor.translation_unit_info(arg_to_dtype)
        except _cl_errors() as exc:
            _check_device_alive(session, exc)
            return None, f"OpenCL build failed: {str(exc).strip()}"
        launcher = cls(built, session, executor, 0.0)
        launcher.source = executed_source(executor, arg_to_dtype)
        return launcher, ""

    def bind(self, arrays: Mapping[str, Any]) -> None:
        kwargs: dict[str, Any] = {}
        for a in self.built.arrays:
            arr = arrays.get(a.name)
            if arr is None:
                raise KeyError(f"{self.built.entrypoint}: no array for kernel argument {a.name!r}")
            kwargs[a.name] = arr if tuple(arr.shape) == a.shape else arr.reshape(a.shape)
        self.kwargs = kwargs

    def launch(self) -> Any:
        evt, _ = self.executor(self.session.queue, **self.kwargs)
        return evt


def executed_source(executor: Any, arg_to_dtype: Any) -> str:
    """The device code ``executor`` builds and launches, looked up the way loopy's
    ``translation_unit_info`` looks it up (its persistent caches, keyed by the translation
    unit's hash): a cache that answers with another kernel's code shows here."""
    from loopy.codegen import generate_code_v2

    scheduled = executor.get_typed_and_scheduled_translation_unit(arg_to_dtype)
    return str(generate_code_v2(scheduled).device_code())


def source_hash(source: str) -> str:
    """The identity of generated code: sha256 of its text, hex."""
    return hashlib.sha256(source.encode()).hexdigest()


def _cl_errors() -> tuple[type[BaseException], ...]:
    import pyopencl as cl

    return (cl.Error,)


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


def _warm_executor_cache(tu: Any, entry: str, codegen: Any) -> None:
    """Fill loopy's persistent caches the way ``tu.executor(queue)`` will look them up, so the
    device process skips scheduling and code generation. Failure only costs time there."""
    try:
        from loopy.target.pyopencl_execution import PyOpenCLExecutor

        ex = PyOpenCLExecutor(None, tu, entrypoint=entry)  # type: ignore[arg-type]
        scheduled = ex.get_typed_and_scheduled_translation_unit(ex.arg_to_dtype({}))
        ex.get_invoker(scheduled, entry, codegen)
    except Exception:  # an optimisation only
        pass


def _as_int(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidConfiguration(
            f"{what} is not a fixed number ({value}); fix every size with lp.fix_parameters"
        ) from None


__all__ = [
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
