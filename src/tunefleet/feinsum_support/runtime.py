"""The worker side of the feinsum problem: feinsum builds the kernel, tunefleet measures it.

The :class:`~tunefleet.feinsum_support.problem.FeinsumProblem` is a
:class:`~tunefleet.problems.kernel.KernelProblem`; these are the pieces it plugs in:

- :func:`build_kernel` builds the batched einsum with feinsum, brings it to feinsum's canonical
  form (as feinsum's own tuner does: transform spaces are written against it), checks the
  configuration against the space feinsum itself derives, lowers the einsum to loopy, applies
  the module's ``transform`` and fixes the long dimensions. feinsum's build options
  (``-cl-fast-relaxed-math -cl-mad-enable``) are kept, so kernels are the ones feinsum times.
- :func:`make_inputs`, :func:`reference`: deterministic operands by canonical name, and
  ``numpy.einsum`` of each einsum of the batch (outputs ``_fe_out``, ``_fe_out_0``, ...).
- :func:`flop_count`: feinsum's operation count (its ``giga_op_info``) at the length used.
- :func:`fact`: what an archive row needs and only feinsum knows (the canonical einsum strings,
  the operation counts, feinsum's device-name and compiler strings), recorded with every
  measurement in ``versions["feinsum_fact"]``.
- :func:`measure_with_feinsum`: feinsum's own ``timeit`` for runs whose protocol statistic is
  ``feinsum-wall-mean``, so the numbers are exactly what feinsum would have recorded.

feinsum, loopy and pyopencl are imported inside the functions: this module imports anywhere,
and a worker without feinsum fails with a one-line :class:`~tunefleet.errors.ProblemError`.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import time
from collections.abc import Mapping
from typing import Any

from tunefleet.devices import DeviceInfo
from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.feinsum_support import archive
from tunefleet.feinsum_support.canonical import (
    archive_strings,
    canonical_einsum,
    canonical_of_json,
    require_feinsum,
)
from tunefleet.feinsum_support.einsum_spec import EinsumSpec
from tunefleet.feinsum_support.spaces import space_path
from tunefleet.problems.base import Outcome
from tunefleet.space import canonical_json
from tunefleet.vocabulary import TrialState

#: feinsum compiles every kernel it validates and times with these options.
BUILD_OPTIONS = ("-cl-fast-relaxed-math", "-cl-mad-enable")
#: feinsum validates at this length of the long dimensions.
VALIDATION_LONG_DIM = 100


def _canonical_of(args: Mapping[str, Any]) -> Any:
    return canonical_einsum(EinsumSpec.from_json(args["einsum"]))


@functools.lru_cache(maxsize=16)
def _op_info(einsum_json: str, long_dim_length: int) -> str:
    from feinsum import sql_utils

    return str(
        sql_utils.dump_op_info(canonical_of_json(einsum_json), long_dim_length=long_dim_length)
    )


def op_info(args: Mapping[str, Any]) -> str:
    """feinsum's ``giga_op_info`` string at ``args['long_dim_length']``."""
    spec = EinsumSpec.from_json(args["einsum"])
    return _op_info(canonical_json(spec.to_json()), int(args["long_dim_length"]))


def flop_count(args: Mapping[str, Any]) -> float:
    """Operations of one launch, as feinsum counts them (all dtypes together)."""
    return float(sum(json.loads(op_info(args)).values())) * 1e9


def byte_count(args: Mapping[str, Any]) -> float:
    """Every operand read once and every output written once, at ``long_dim_length``."""
    import numpy as np

    spec = EinsumSpec.from_json(args["einsum"])
    long = int(args["long_dim_length"])

    def size(shape: tuple[int | str, ...]) -> int:
        return math.prod(d if isinstance(d, int) else long for d in shape)

    dtypes = spec.arg_to_dtype
    total = sum(
        size(spec.arg_shape(name)) * np.dtype(dtypes[name]).itemsize
        for name in {a for row in spec.args for a in row}
    )
    out_shape = tuple(spec.index_to_length.get(i, i.upper()) for i in spec.output)
    out_item = np.dtype(archive.output_dtype(spec)).itemsize
    return float(total + spec.b * size(out_shape) * out_item)


def fact(args: Mapping[str, Any], device: DeviceInfo) -> dict[str, str]:
    """The feinsum-side identity of a measurement (see the module docstring)."""
    out = archive_strings(_canonical_of(args))
    out.update(
        giga_op_info=op_info(args),
        device_name=archive.archive_device_name(device.name),
        compiler_version=f"{device.vendor}-{device.driver_version}",
    )
    return out


def _to_transform_value(value: Any) -> Any:
    # feinsum passes tuples where our configurations carry JSON lists.
    if isinstance(value, list):
        return tuple(_to_transform_value(v) for v in value)
    return value


def transform_params(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _to_transform_value(v) for k, v in config.items()}


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


def bound_transform(args: Mapping[str, Any], config: Mapping[str, Any]) -> Any:
    """The transform of ``args['space']`` bound to the canonical einsum and ``config``, after
    checking ``config`` against the space feinsum itself derives."""
    params = transform_params(config)
    parametrized = load_transform(str(args["space"]))
    canonical = _canonical_of(args)
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


def build_kernel(args: Mapping[str, Any], config: Mapping[str, Any]) -> Any:
    """The transformed loopy translation unit with every long dimension fixed."""
    fe = require_feinsum()
    import loopy as lp

    transform = bound_transform(args, config)
    t_unit = fe.generate_loopy(_canonical_of(args))
    try:
        t_unit = transform(t_unit, insn_match=None, kernel_name=None)
    except fe.InvalidParameterError as exc:
        raise InvalidConfiguration(f"feinsum rejected the parameters: {exc}") from None
    except Exception as exc:  # a transform that cannot apply makes this point illegal
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise InvalidConfiguration(f"the transform failed: {type(exc).__name__}: {first}") from None
    t_unit = lp.set_options(t_unit, build_options=list(BUILD_OPTIONS))
    return lp.fix_parameters(
        t_unit,
        within=None,
        **dict.fromkeys(t_unit.default_entrypoint.all_params(), int(args["long_dim_length"])),
    )


def _shape(shape: tuple[Any, ...], long: int) -> tuple[int, ...]:
    return tuple(int(d) if isinstance(d, int) else long for d in shape)


def make_inputs(args: Mapping[str, Any], rng: Any) -> dict[str, Any]:
    """Operands by their canonical names (the kernel's argument names), in name order."""
    import numpy as np

    canonical = _canonical_of(args)
    long = int(args["long_dim_length"])
    out: dict[str, Any] = {}
    for name in sorted(canonical.arg_to_dtype):
        dtype = np.dtype(canonical.arg_to_dtype[name])
        shape = _shape(tuple(canonical.arg_to_shape[name]), long)
        if dtype.kind == "c":
            real = np.empty(0, dtype).real.dtype
            out[name] = rng.random(shape, dtype=real) + 1j * rng.random(shape, dtype=real)
            out[name] = out[name].astype(dtype)
        elif dtype.kind in "iu":
            out[name] = rng.integers(-100, 100, size=shape).astype(dtype)
        else:
            out[name] = rng.random(shape, dtype=dtype)
    return out


def output_names(b: int) -> list[str]:
    """feinsum's names of the outputs of a batch of ``b`` einsums."""
    return ["_fe_out", *[f"_fe_out_{i}" for i in range(b - 1)]]


def reference(args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Each einsum of the batch with ``numpy.einsum`` in double precision."""
    import numpy as np

    canonical = _canonical_of(args)
    subscripts = canonical.get_subscripts().replace(" ", "")
    out = {}
    for name, row in zip(output_names(canonical.b), canonical.args, strict=True):
        operands = []
        for arr in row:
            value = np.asarray(inputs[arr.name])
            operands.append(value.astype(np.complex128 if value.dtype.kind == "c" else np.float64))
        out[name] = np.einsum(subscripts, *operands, optimize="optimal")
    return out


def feinsum_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return {"feinsum": version("feinsum")}
    except PackageNotFoundError:
        return {"feinsum": "unknown"}


def _device_kwarg(func: Any, queue: Any) -> dict[str, Any]:
    """feinsum's measurement functions take ``cq`` (a queue) on its main branch and
    ``cl_ctx`` (a context) in the 2025.3 release; pass what this feinsum expects."""
    if "cq" in inspect.signature(func).parameters:
        return {"cq": queue}
    return {"cl_ctx": queue.context}


def measure_with_feinsum(
    args: Mapping[str, Any], config: Mapping[str, Any], session: Any, base: Mapping[str, Any]
) -> Outcome:
    """Validate and time with ``feinsum.measure.timeit``; ``base`` holds the Outcome fields
    shared with the default path (protocol, versions, device, code, counts)."""
    from feinsum.diagnostics import TransformValidationError
    from feinsum.measure import timeit

    canonical = _canonical_of(args)
    transform = bound_transform(args, config)
    started = time.perf_counter()
    try:
        runtime = float(
            timeit(
                canonical,
                transform=transform,
                long_dim_length=int(args["long_dim_length"]),
                **_device_kwarg(timeit, session.queue),
            )
        )
    except TransformValidationError as exc:
        first = (str(exc).strip().splitlines() or ["results differ from NumPy"])[0]
        return Outcome(
            state=TrialState.INVALID,
            error=f"wrong results (feinsum's validation): {first}"[:4000],
            validation={"passed": False, "by": "feinsum", "reason": first},
            **base,
        )
    flops = float(base.get("flop_count") or 0.0)
    nbytes = float(base.get("byte_count") or 0.0)
    return Outcome(
        state=TrialState.DONE,
        median_s=runtime,
        min_s=runtime,
        samples_s=(runtime,),
        gflops=flops / runtime / 1e9 if flops > 0 else None,
        gbps=nbytes / runtime / 1e9 if nbytes > 0 else None,
        compile_s=None,
        validation={"passed": True, "by": "feinsum", "long_dim_length": VALIDATION_LONG_DIM},
        details={"feinsum_timeit_s": time.perf_counter() - started},
        **base,
    )
