"""``tunefleet.feinsum.autotune`` with feinsum's own call shape, against an installed feinsum
(Python >= 3.12) and an OpenCL device (PoCL is enough): skipped where either is missing.

The run's measurements land in the archive at ``db_path`` in the layout feinsum reads: the
canonical einsum strings feinsum renders, the shipped module's file name as the transform id,
feinsum's spelling of the device name.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.feinsum, pytest.mark.opencl]

EINSUM = {"einsum": "ifj,fe,fej->ei", "i": 10, "f": 4, "j": 4, "batch": 2, "operands": "L,J,v*"}
SPACE = "ifj_fe_fej_to_ei.py"


def _feinsum() -> Any:
    try:
        import feinsum
    except Exception as exc:  # ImportError, or SyntaxError on Python < 3.12
        pytest.skip(f"feinsum is not importable here: {exc!r}")
    return feinsum


@pytest.fixture
def cq() -> Any:
    cl = pytest.importorskip("pyopencl")
    devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    if not devices:
        pytest.skip("no OpenCL device")
    return cl.CommandQueue(cl.Context([devices[0]]))


def test_autotune_with_feinsums_call_shape_leaves_rows_feinsum_reads(
    db_url: str, tmp_path: Path, cq: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _feinsum()
    import tunefleet.feinsum as fleet
    from tunefleet.feinsum_support import archive
    from tunefleet.feinsum_support.canonical import (
        archive_strings,
        build_einsum,
        canonical_einsum,
    )
    from tunefleet.feinsum_support.einsum_spec import parse_einsum
    from tunefleet.feinsum_support.spaces import installed_impls_dir

    monkeypatch.setenv("TUNEFLEET_HOME", str(tmp_path / "home"))
    impls = installed_impls_dir()
    assert impls is not None
    spec, _ = parse_einsum(EINSUM)
    expr = build_einsum(spec)
    out = tmp_path / "t.sqlite"

    result = fleet.autotune(
        expr, str(impls / SPACE), cq, db_path=out, test_limit=6, db=db_url, progress=False
    )
    assert result.state == "finished"

    with sqlite3.connect(out) as conn:
        rows = conn.execute(
            "SELECT subscripts, index_to_length, args, arg_to_dtype, device_name,"
            " transform_id, runtime_in_sec FROM FEINSUM_TIMING_FACTS"
        ).fetchall()
    assert len(rows) >= 1
    strings = archive_strings(canonical_einsum(spec))
    expected = (strings["subscripts"], strings["index_to_length"], strings["args"])
    assert {r[:3] for r in rows} == {expected}
    assert {r[4] for r in rows} == {archive.archive_device_name(cq.device.name)}
    assert {r[5] for r in rows} == {SPACE}
    assert all(r[6] > 0 for r in rows)
    found = _feinsum_query(expr, cq, out)
    if found is not None:  # feinsum's own reader, where the installed one works
        assert len(found) == len(rows) and {f.transform_id for f in found} == {SPACE}


def _feinsum_query(expr: Any, cq: Any, path: Path) -> Any:
    """``feinsum.query`` on the archive, or None where the installed feinsum's is the 2025.3
    one that filters on a column its own table lacks (docs/feinsum.md)."""
    import inspect

    fe = _feinsum()
    where = cq.context if "cl_ctx" in inspect.signature(fe.query).parameters else cq.device
    try:
        return fe.query(expr, where, database=str(path))
    except sqlite3.OperationalError as exc:
        if "arg_names" in str(exc):
            return None
        raise


def test_autotune_refuses_what_feinsum_refuses(tmp_path: Path) -> None:
    import tunefleet.feinsum as fleet
    from tunefleet.errors import TunefleetError

    with pytest.raises(TunefleetError, match="not absolute"):
        fleet.autotune({}, "relative/space.py", db_path=tmp_path / "t.sqlite")
    with pytest.raises(TunefleetError, match="takes max_trials from test_limit"):
        fleet.autotune({}, str(tmp_path), db_path=tmp_path / "t.sqlite", max_trials=3)
