"""User problems (loaded by path, ``bad_input_problems.py:Class``) that are wrong in the ways
users get problems wrong: spaces that are not spaces, code that raises, and an OpenCL kernel
whose configurations fail to build, write NaN or compute the wrong numbers.

``OpenCLDoubler`` is written against the plain prepare/measure problem API with pyopencl
(``y = 2 x``), as a user without the kernel-problem base class would write it: a build error,
NaN or a result that differs from the NumPy reference make the configuration ``invalid`` with
the reason; an error it does not classify (a builder bug, a driver error let through) is the
worker's ``failed``. ``LoopyDoubler`` makes the same mistakes through the kernel-problem base
class (a loopy builder), which does the classifying itself.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np

from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.problems.base import ArgSpec, Outcome, Problem, Protocol
from tunefleet.problems.kernel import KernelProblem
from tunefleet.space import Choice, IntRange, Space


class _Host(Problem):
    needs_opencl = False

    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return dict(raw)

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of([IntRange("a", 0, 3)])

    def prepare(self, args: Any, config: Any, device: Any) -> Any:
        return dict(config)

    def measure(self, prepared: Any, session: Any, protocol: Any) -> Outcome:
        return Outcome(state="done", median_s=1e-3, min_s=1e-3, samples_s=(1e-3,))


class NotASpace(_Host):
    def space(self, args: Mapping[str, Any]) -> Any:
        return {"tile": [1, 2, 4]}


class SpaceRaises(_Host):
    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of([IntRange("tile", 1, args["n"])])  # KeyError: no n given


class NotAParamList(_Host):
    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of(IntRange("tile", 1, 8))  # type: ignore[arg-type]


class EmptyRange(_Host):
    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of([IntRange("tile", 8, 1)])


class DuplicateNames(_Host):
    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of([IntRange("tile", 1, 8), Choice("tile", ("a", "b"))])


class NeedsSetup(_Host):
    def __init__(self) -> None:
        raise RuntimeError("set DOUBLER_HOME first")


class ArgumentsRaise(_Host):
    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return {"n": int(raw.get("n", "many"))}  # ValueError


class ArgumentsRefused(_Host):
    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        raise ProblemError("doubler: n must be a multiple of 64 (--size n=1024)")


# --- an OpenCL problem --------------------------------------------------------------------

MODES = (
    "good",
    "builder_raises",
    "does_not_compile",
    "driver_error_escapes",
    "writes_nan",
    "reference_mismatch",
)
_BODY = {
    "good": "y[i] = 2.0f * x[i];",
    "does_not_compile": "y[i] = 2.0f * x[i] +;",
    "driver_error_escapes": "y[i] = 2.0f * x[i] +;",
    "writes_nan": "y[i] = NAN;",
    "reference_mismatch": "y[i] = 3.0f * x[i];",
}
TOLERANCE = 1e-6


def _source(mode: str) -> str:
    return (
        "__kernel void twice(__global const float *x, __global float *y)\n"
        "{ int i = get_global_id(0); " + _BODY[mode] + " }\n"
    )


class OpenCLDoubler(Problem):
    name = "doubler"
    description = "y = 2 x; the configuration picks how the kernel goes wrong"
    needs_opencl = True

    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return {"n": int(raw.get("n", 4096))}

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of([Choice("mode", MODES)])

    def prepare(self, args: Mapping[str, Any], config: Any, device: Any) -> Any:
        mode = config["mode"]
        if mode == "builder_raises":
            raise ValueError(f"tile 3 does not divide n={args['n']}")  # a bug in the builder
        return {"n": args["n"], "mode": mode, "source": _source(mode)}

    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Outcome:
        import pyopencl as cl

        ctx, queue = session.context, session.queue
        try:
            program = cl.Program(ctx, prepared["source"]).build()
        except cl.RuntimeError as exc:
            if prepared["mode"] == "driver_error_escapes":
                raise  # not classified: the worker records the attempt as failed
            lines = [ln.strip() for ln in str(exc).splitlines() if "error" in ln.lower()]
            reason = lines[1] if len(lines) > 1 else lines[0] if lines else "no build log"
            raise InvalidConfiguration(f"OpenCL build failed: {reason}") from None
        n = prepared["n"]
        x = np.arange(n, dtype=np.float32)
        y = np.full(n, np.nan, dtype=np.float32)
        mf = cl.mem_flags
        x_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
        y_buf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=y)
        kernel = program.twice
        samples = []
        for i in range(protocol.warmup + max(protocol.min_launches, 1)):
            event = kernel(queue, (n,), None, x_buf, y_buf)
            event.wait()
            if i >= protocol.warmup:
                samples.append(max((event.profile.end - event.profile.start) * 1e-9, 1e-9))
        cl.enqueue_copy(queue, y, y_buf).wait()
        reference = 2.0 * x.astype(np.float64)
        bad = int(np.count_nonzero(~np.isfinite(y)))
        if bad:
            return Outcome(state="invalid", error=f"output y: {bad} of {n} values are NaN or inf")
        error = float(np.max(np.abs(y - reference)) / np.max(np.abs(reference)))
        if error > TOLERANCE:
            return Outcome(
                state="invalid",
                error=f"output y differs from the reference: scaled max error {error:.3g} "
                f"> tolerance {TOLERANCE:g}",
            )
        median = statistics.median(samples)
        return Outcome(
            state="done",
            median_s=median,
            min_s=min(samples),
            samples_s=tuple(samples),
            gbps=8.0 * n / median / 1e9,
            validation={"passed": True, "max_rel_err": error, "rtol": TOLERANCE},
            protocol=protocol.to_json(),
            code=prepared["source"],
        )


# --- the same mistakes through the kernel-problem base class (loopy) ------------------------

KERNEL_MODES = ("good", "builder_raises", "does_not_compile", "writes_nan", "reference_mismatch")
_KERNEL_EXPR = {
    "good": "2 * x[i]",
    "does_not_compile": "2 * x[i]",
    "writes_nan": "sqrt(x[i] - x[i] - 1)",
    "reference_mismatch": "3 * x[i]",
}


class LoopyDoubler(KernelProblem):
    """``y = 2 x`` as a loopy kernel; the configuration picks how it goes wrong. The base
    class classifies: build errors, NaN and wrong numbers are ``invalid``."""

    name = "loopy_doubler"
    description = "y = 2 x; the configuration picks how the kernel goes wrong"
    arguments = (ArgSpec("n", 4096, "elements", minimum=16),)

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of([Choice("mode", KERNEL_MODES)])

    def build(self, args: Mapping[str, Any], config: Any, device: Any) -> Any:
        import loopy as lp

        from tunefleet.problems._loopy import global_array, make_kernel

        mode = config["mode"]
        if mode == "builder_raises":
            raise ValueError(f"tile 3 does not divide n={args['n']}")  # a bug in the builder
        knl = make_kernel(
            "{[i]: 0 <= i < n}",
            f"y[i] = {_KERNEL_EXPR[mode]}",
            [global_array("x", np.float32, ("n",)), global_array("y", np.float32, ("n",), True)],
            name="twice",
        )
        if mode == "does_not_compile":
            knl = knl.with_kernel(
                knl.default_entrypoint.copy(
                    preambles=[("00_broken", "#error this kernel does not compile")]
                )
            )
        knl = lp.fix_parameters(knl, n=args["n"])
        return lp.split_iname(knl, "i", 16, outer_tag="g.0", inner_tag="l.0")

    def make_inputs(self, args: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        return {"x": rng.uniform(1, 2, args["n"]).astype(np.float32)}

    def reference(self, args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"y": 2.0 * inputs["x"].astype(np.float64)}

    def flop_count(self, args: Mapping[str, Any]) -> float:
        return float(args["n"])

    def byte_count(self, args: Mapping[str, Any]) -> float:
        return 8.0 * args["n"]
