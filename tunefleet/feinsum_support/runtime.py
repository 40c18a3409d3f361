"""The worker side of the feinsum problem: feinsum builds the kernel, we time it.

:func:`prepare` (CPU, in the worker's code-generation pool) builds the batched einsum with
feinsum, brings it to feinsum's canonical form (as feinsum's own tuner does: transform spaces
are written against it), checks the configuration against the space that feinsum itself
derives, lowers the einsum to loopy, applies the module's ``transform`` and generates the
code for the target size. It also records what an archive row needs and only feinsum knows:
the canonical einsum strings and the operation counts.

:func:`measure` (in the device process) validates the transformed kernel against NumPy with
feinsum's own check (its tolerances, at a long dimension of 100), then times it with our
protocol: OpenCL profiling markers around each launch, warm-ups first, every sample kept.
When the run's protocol is :data:`~tunefleet.feinsum_support.archive.FEINSUM_PROTOCOL`
(statistic ``feinsum-wall-mean``) it calls ``feinsum.measure.timeit`` instead, so the number
is exactly what feinsum would have recorded.

feinsum, loopy and pyopencl are imported inside the functions: this module imports anywhere,
and a worker without feinsum fails with a one-line :class:`~tunefleet.errors.ProblemError`.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tunefleet.devices import DeviceInfo
from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.feinsum_support import INSTALL_HINT, archive
from tunefleet.feinsum_support.einsum_spec import EinsumSpec
from tunefleet.feinsum_support.spaces import space_path
from tunefleet.problems.base import Outcome, Protocol
from tunefleet.space import canonical_json

#: feinsum compiles every kernel it validates and times with these options.
BUILD_OPTIONS = ("-cl-fast-relaxed-math", "-cl-mad-enable")
#: feinsum validates at this length of the long dimensions.
VALIDATION_LONG_DIM = 100
FEINSUM_STATISTIC = archive.FEINSUM_STATISTIC


def require_feinsum() -> Any:
    """The feinsum module, or a ProblemError that says how to get it."""
    try:
        import feinsum
    except ImportError as exc:
        raise ProblemError(f"the feinsum problem needs feinsum ({exc}); {INSTALL_HINT}") from None
    except SyntaxError:
        raise ProblemError(f"feinsum does not run on this Python; {INSTALL_HINT}") from None
    return feinsum


def build_einsum(spec: EinsumSpec) -> Any:
    """feinsum's ``BatchedEinsum`` for a spec (long dimensions as size parameters)."""
    fe = require_feinsum()
    dtypes = spec.arg_to_dtype
    rows = [
        [fe.array(name, spec.arg_shape(name), dtypes[name]) for name in row] for row in spec.args
    ]
    return fe.batched_einsum(spec.subscripts, rows)


@functools.lru_cache(maxsize=16)
def _canonical(einsum_json: str) -> Any:
    fe = require_feinsum()
    return fe.canonicalize_einsum(build_einsum(EinsumSpec.from_json(json.loads(einsum_json))))


def canonical_einsum(spec: EinsumSpec) -> Any:
    return _canonical(canonical_json(spec.to_json()))


def archive_strings(canonical: Any) -> dict[str, str]:
    """The four einsum columns of an archive row, rendered by feinsum itself."""
    from feinsum import sql_utils

    return {
        "subscripts": canonical.get_subscripts(),
        "index_to_length": sql_utils.dump_index_to_length(canonical),
        "args": sql_utils.dump_arg_names(canonical),
        "arg_to_dtype": sql_utils.dump_arg_to_dtype(canonical),
    }


def canonical_archive_key(spec: EinsumSpec) -> tuple[str, str, str, str]:
    """``(subscripts, index_to_length, args, arg_to_dtype)`` of the canonical form."""
    strings = archive_strings(canonical_einsum(spec))
    return (
        strings["subscripts"],
        strings["index_to_length"],
        strings["args"],
        strings["arg_to_dtype"],
    )


@functools.lru_cache(maxsize=16)
def _op_info(einsum_json: str, long_dim_length: int) -> str:
    from feinsum import sql_utils

    return str(sql_utils.dump_op_info(_canonical(einsum_json), long_dim_length=long_dim_length))


def _to_transform_value(value: Any) -> Any:
    # feinsum passes tuples where our configurations carry JSON lists.
    if isinstance(value, list):
        return tuple(_to_transform_value(v) for v in value)
    return value


def _inside(value: Any, tuning_param: Any) -> bool:
    from feinsum.tuning import BoolParameter, IntParameter, TupleParameter

    if isinstance(tuning_param, tuple):
        tuning_param = TupleParameter(tuning_param)
    if isinstance(tuning_param, IntParameter):
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and tuning_param.low <= value <= tuning_param.high
        )
    if isinstance(tuning_param, BoolParameter):
        return isinstance(value, bool)
    if isinstance(tuning_param, TupleParameter):
        items = tuning_param._data
        return (
            isinstance(value, tuple)
            and len(value) == len(items)
            and all(_inside(v, p) for v, p in zip(value, items, strict=True))
        )
    return False


def load_transform(space: str) -> Any:
    require_feinsum()
    from feinsum.tuning import get_transform_func_from_module_path

    path = space_path(space)
    try:
        return get_transform_func_from_module_path(str(path))
    except Exception as exc:
        raise ProblemError(f"transform space {space} failed to import: {exc!r}") from None


def bound_transform(args: Mapping[str, Any], params: Mapping[str, Any]) -> Any:
    """The transform of ``args['space']`` bound to the canonical einsum and ``params``,
    after checking ``params`` against the space feinsum derives."""
    parametrized = load_transform(str(args["space"]))
    canonical = canonical_einsum(EinsumSpec.from_json(args["einsum"]))
    declared = {p.var_name: p for p in parametrized.transform_params}
    if set(declared) != set(params):
        raise InvalidConfiguration(
            f"configuration keys {sorted(params)} differ from the transform's parameters "
            f"{sorted(declared)}"
        )
    for name, value in params.items():
        allowed = declared[name].func(canonical)
        if not _inside(value, allowed):
            raise InvalidConfiguration(
                f"{name}={value!r} is outside the space feinsum derives ({allowed!r})"
            )
    return parametrized.bind_args(canonical, **params)


@dataclass
class Prepared:
    """What :func:`prepare` hands to :func:`measure` (picklable)."""

    args: dict[str, Any]
    config: dict[str, Any]
    params: dict[str, Any]
    t_unit: Any
    code: str | None
    codegen_s: float
    fact: dict[str, Any]
    flop_count: float
    byte_count: float
    device: DeviceInfo
    versions: dict[str, Any] = field(default_factory=dict)


def _byte_count(spec: EinsumSpec, long_dim_length: int) -> float:
    import numpy as np

    def size(shape: tuple[int | str, ...]) -> int:
        return math.prod(d if isinstance(d, int) else long_dim_length for d in shape)

    dtypes = spec.arg_to_dtype
    total = sum(
        size(spec.arg_shape(name)) * np.dtype(dtypes[name]).itemsize
        for name in {a for row in spec.args for a in row}
    )
    out_shape = tuple(spec.index_to_length.get(i, i.upper()) for i in spec.output)
    out_item = np.dtype(archive.output_dtype(spec)).itemsize
    return float(total + spec.b * size(out_shape) * out_item)


def _versions() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {}
    for dist in ("feinsum", "loopy", "pyopencl", "islpy", "pymbolic"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "unknown"
    return out


def prepare(args: Mapping[str, Any], config: Mapping[str, Any], device: DeviceInfo) -> Prepared:
    fe = require_feinsum()
    import loopy as lp

    spec = EinsumSpec.from_json(args["einsum"])
    long_dim = int(args["long_dim_length"])
    params = {k: _to_transform_value(v) for k, v in config.items()}
    transform = bound_transform(args, params)
    canonical = canonical_einsum(spec)
    started = time.perf_counter()
    t_unit = fe.generate_loopy(canonical)
    try:
        t_unit = transform(t_unit, insn_match=None, kernel_name=None)
    except fe.InvalidParameterError as exc:
        raise InvalidConfiguration(f"feinsum rejected the parameters: {exc}") from None
    except Exception as exc:  # a transform that cannot apply is an illegal point
        raise InvalidConfiguration(f"transform failed: {type(exc).__name__}: {exc}") from None
    t_unit = lp.set_options(
        t_unit, no_numpy=True, return_dict=True, build_options=list(BUILD_OPTIONS)
    )
    t_unit = lp.fix_parameters(
        t_unit,
        within=None,
        **dict.fromkeys(t_unit.default_entrypoint.all_params(), long_dim),
    )
    try:
        code = lp.generate_code_v2(t_unit).device_code()
    except Exception as exc:
        raise InvalidConfiguration(f"code generation failed: {type(exc).__name__}: {exc}") from None
    codegen_s = time.perf_counter() - started
    key = canonical_json(spec.to_json())
    op_info = _op_info(key, long_dim)
    fact = archive_strings(canonical)
    fact.update(
        giga_op_info=op_info,
        device_name=archive.archive_device_name(device.name),
        compiler_version=f"{device.vendor}-{device.driver_version}",
    )
    return Prepared(
        args=dict(args),
        config=dict(config),
        params=params,
        t_unit=t_unit,
        code=code,
        codegen_s=codegen_s,
        fact=fact,
        flop_count=float(sum(json.loads(op_info).values())) * 1e9,
        byte_count=_byte_count(spec, long_dim),
        device=device,
        versions=_versions(),
    )


def _validate(prepared: Prepared, queue: Any) -> dict[str, Any]:
    from feinsum.diagnostics import TransformValidationError
    from feinsum.measure import validate_batched_einsum_transform

    canonical = canonical_einsum(EinsumSpec.from_json(prepared.args["einsum"]))
    transform = bound_transform(prepared.args, prepared.params)
    try:
        validate_batched_einsum_transform(
            canonical,
            transform=transform,
            **_device_kwarg(validate_batched_einsum_transform, queue),
        )
    except TransformValidationError as exc:
        first = str(exc).strip().splitlines()
        raise _Mismatch(first[0] if first else "results differ from NumPy") from None
    return {
        "passed": True,
        "method": "feinsum.validate_batched_einsum_transform",
        "long_dim_length": VALIDATION_LONG_DIM,
        "tolerance": "atol=rtol=1e-10 (float64), 1e-6 (float32)",
    }


class _Mismatch(Exception):
    pass


def _device_kwarg(func: Any, queue: Any) -> dict[str, Any]:
    """feinsum's measurement functions take ``cq`` (a queue) since 2026 and ``cl_ctx`` (a
    context) in the 2025.3 release; pass what this feinsum expects."""
    import inspect

    params = inspect.signature(func).parameters
    if "cq" in params:
        return {"cq": queue}
    return {"cl_ctx": queue.context}


def _time_ours(prepared: Prepared, queue: Any, protocol: Protocol) -> tuple[list[float], float]:
    import pyopencl as cl
    from feinsum.measure import generate_input_arrays, generate_out_arrays

    canonical = canonical_einsum(EinsumSpec.from_json(prepared.args["einsum"]))
    long_dim = int(prepared.args["long_dim_length"])
    inputs = generate_input_arrays(queue, canonical, long_dim, np_seed=protocol.seed)
    outputs = generate_out_arrays(queue, prepared.t_unit)
    arrays = {**dict(inputs), **dict(outputs)}
    built = time.perf_counter()
    executor = prepared.t_unit.executor(queue)

    def launch() -> float:
        before = cl.enqueue_marker(queue)
        evt, _ = executor(queue, **arrays)
        after = cl.enqueue_marker(queue)
        after.wait()
        span = (after.profile.end - before.profile.end) * 1e-9
        if span <= 0:  # a driver without marker timestamps: the (last) kernel's own event
            span = (evt.profile.end - evt.profile.start) * 1e-9
        return float(span)

    launch()
    compile_s = time.perf_counter() - built
    for _ in range(max(protocol.warmup - 1, 0)):
        launch()
    samples: list[float] = []
    while len(samples) < protocol.max_launches and (
        len(samples) < protocol.min_launches or sum(samples) < protocol.min_seconds
    ):
        samples.append(launch())
    return samples, compile_s


def measure(prepared: Prepared, session: Any, protocol: Protocol) -> Outcome:
    queue = session.queue
    versions = {**prepared.versions, archive.FACT_KEY: dict(prepared.fact)}
    common: dict[str, Any] = {
        "flop_count": prepared.flop_count,
        "byte_count": prepared.byte_count,
        "protocol": protocol.to_json(),
        "versions": versions,
        "code": prepared.code,
    }
    try:
        validation = _validate(prepared, queue)
    except _Mismatch as exc:
        return Outcome(
            state="invalid",
            validation={"passed": False, "method": "feinsum", "error": str(exc)},
            error=f"wrong results: {exc}",
            **common,
        )
    if protocol.statistic == FEINSUM_STATISTIC:
        from feinsum.measure import timeit

        canonical = canonical_einsum(EinsumSpec.from_json(prepared.args["einsum"]))
        started = time.perf_counter()
        runtime = float(
            timeit(
                canonical,
                transform=bound_transform(prepared.args, prepared.params),
                long_dim_length=int(prepared.args["long_dim_length"]),
                **_device_kwarg(timeit, queue),
            )
        )
        samples = [runtime]
        compile_s = time.perf_counter() - started
    else:
        samples, compile_s = _time_ours(prepared, queue, protocol)
    median = float(statistics.median(samples))
    return Outcome(
        state="done",
        median_s=median,
        min_s=float(min(samples)),
        samples_s=tuple(samples),
        gflops=prepared.flop_count / median * 1e-9,
        gbps=prepared.byte_count / median * 1e-9,
        compile_s=prepared.codegen_s + compile_s,
        validation=validation,
        **common,
    )
