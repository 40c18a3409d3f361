"""Against an installed feinsum (Python >= 3.12): skipped where feinsum cannot be imported.

Run with ``python -m pytest -m feinsum tests/with_feinsum`` in an environment that has
``tunefleet[feinsum]``; the OpenCL test also needs a device (PoCL is enough).

- the static reading of every shipped transform space agrees with feinsum's own evaluation of
  its parameter functions on the canonical einsum (two einsum families);
- a configuration prepared and measured by our worker path validates, and the archive row we
  export for it is found by feinsum's own ``query``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.feinsum


def _feinsum() -> Any:
    try:
        import feinsum
    except Exception as exc:  # ImportError, or SyntaxError on Python < 3.12
        pytest.skip(f"feinsum is not importable here: {exc!r}")
    return feinsum


FAMILIES = [
    {"einsum": "ifj,fe,fej->ei", "i": 10, "f": 4, "j": 4, "batch": 2, "operands": "L,J,v*"},
    {
        "einsum": "xre,rij,xej->ei",
        "x": 3,
        "r": 3,
        "i": 10,
        "j": 10,
        "batch": 2,
        "operands": "J,D,u*",
    },
]


def _truth(tp: Any) -> Any:
    from feinsum.tuning import BoolParameter, IntParameter, TupleParameter

    if isinstance(tp, tuple):
        tp = TupleParameter(tp)
    if isinstance(tp, IntParameter):
        return ("int", int(tp.low), int(tp.high))
    if isinstance(tp, BoolParameter):
        return ("bool",)
    if isinstance(tp, TupleParameter):
        return ("tuple", tuple(_truth(x) for x in tp._data))
    raise AssertionError(tp)


def _ours(param: Any) -> Any:
    data = param.to_json()
    if data["kind"] == "int":
        return ("int", data["low"], data["high"])
    if data["kind"] == "bool":
        return ("bool",)
    if data["kind"] == "tuple":
        return ("tuple", tuple(_ours(p) for p in param.items))
    if data["kind"] == "choice" and data["options"] == [[]]:
        return ("tuple", ())
    raise AssertionError(data)


def test_static_spaces_agree_with_feinsum_on_shipped_spaces():
    _feinsum()
    from feinsum.tuning import get_transform_func_from_module_path

    from tunefleet.feinsum_support import canonical as fc
    from tunefleet.feinsum_support.einsum_spec import EinsumSpec, parse_einsum
    from tunefleet.feinsum_support.spaces import installed_impls_dir
    from tunefleet.feinsum_support.static_space import space_from_file

    impls = installed_impls_dir()
    assert impls is not None
    compared = 0
    for family in FAMILIES:
        spec = parse_einsum(family)[0]
        canonical = fc.canonical_einsum(spec)
        keys = ("subscripts", "index_to_length", "args", "arg_to_dtype")
        cspec = EinsumSpec.from_json(dict(zip(keys, fc.canonical_archive_key(spec), strict=True)))
        for module in sorted(impls.glob("*.py")):
            if module.name == "__init__.py":
                continue
            try:
                transform = get_transform_func_from_module_path(str(module))
                truth = {p.var_name: _truth(p.func(canonical)) for p in transform.transform_params}
            except Exception:
                continue  # this space does not apply to this einsum in feinsum either
            ours = {p.name: _ours(p) for p in space_from_file(module, cspec)}
            assert ours == truth, module.name
            compared += 1
    assert compared >= 2


@pytest.mark.opencl
def test_prepare_measure_and_export_are_read_by_feinsum(tmp_path: Path):
    fe = _feinsum()
    from tunefleet.feinsum_support import archive
    from tunefleet.problems.base import Protocol
    from tunefleet.problems.registry import get_problem
    from tunefleet.worker.device import open_session, select_device

    problem = get_problem("feinsum")
    args = problem.normalise_args(
        {**FAMILIES[0], "space": "feinsum:ifj_fe_fej_to_ei_v2.py", "long_dim_length": 512}
    )
    space = problem.space(args)
    config = space.default()
    device = select_device(None)
    session = open_session(device)
    prepared = problem.prepare(args, config, device)
    outcome = problem.measure(prepared, session, Protocol(min_seconds=0.01))
    assert outcome.state == "done", outcome.error
    assert outcome.validation["passed"] is True
    assert outcome.median_s and outcome.median_s > 0 and outcome.gflops and outcome.gflops > 0
    fact = outcome.versions[archive.FACT_KEY]
    assert (
        fact["subscripts"]
        == fe.canonicalize_einsum(
            fe.batched_einsum(
                "ifj,fe,fej->ei",
                [
                    [
                        fe.array("L", (10, 4, 4)),
                        fe.array("J", (4, "E")),
                        fe.array(f"v{r}", (4, "E", 4)),
                    ]
                    for r in range(2)
                ],
            )
        ).get_subscripts()
    )

    row = archive.fact_from_measurement(
        args,
        {
            "id": 1,
            "config": config,
            "median_s": outcome.median_s,
            "flop_count": outcome.flop_count,
            "versions": outcome.versions,
            "created_at": None,
        },
        {"name": device.name, "vendor": device.vendor, "driver_version": device.driver_version},
    )
    path = tmp_path / "archive.sqlite"
    archive.write_facts(path, [row])
    einsum = fe.batched_einsum(
        "ifj,fe,fej->ei",
        [
            [fe.array("M", (10, 4, 4)), fe.array("G", (4, "N")), fe.array(f"w{r}", (4, "N", 4))]
            for r in range(2)
        ],
    )
    found = fe.query(einsum, session.device, database=str(path))
    assert len(found) == 1
    assert found[0].transform_id == "ifj_fe_fej_to_ei_v2.py"
    assert dict(found[0].transform_params) == config
    assert found[0].runtime_in_sec == pytest.approx(outcome.median_s)
