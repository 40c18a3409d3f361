"""``tunefleet.feinsum.autotune``: feinsum's own ``autotune`` call, run on the fleet.

A feinsum script changes one import and keeps its call::

    import tunefleet.feinsum as fleet
    fleet.autotune(expr, os.path.abspath("my_space.py"), cq, db_path="archive.sqlite",
                   test_limit=100)

The einsum, the transform-space module and the device mean what they mean to feinsum; the
search runs in this process, the evaluations on this machine's workers for ``cq``'s device
(and on any started elsewhere for its device class), and at the end every measured
configuration is appended to feinsum's archive at ``db_path`` (feinsum's default archive when
None), in the layout feinsum reads. A stopped run (Ctrl-C) appends what it measured, then
raises :class:`~tunefleet.errors.TuneInterrupted`.

Arguments as feinsum has them:

``einsum``               a feinsum ``BatchedEinsum`` (brought to feinsum's canonical form,
                         as feinsum's tuner does), or the archive's einsum form as a dict
``module_path``          absolute path of the transform-space module (feinsum requires it);
                         a module shipped with feinsum is recorded by its file name, as
                         feinsum records it
``cq``                   a ``pyopencl.CommandQueue`` (or a ``Context``, as feinsum 2025.3
                         takes): its device names the device class and serves the local
                         workers; None: this machine's default device, as ``tunefleet.tune``
``db_path``              the SQLite archive the results are appended to
``long_dim_length``      the long dimensions' length when timing (default 100000)
``test_limit``           evaluations to run (tunefleet's ``max_trials``)
``stop_after``           seconds the campaign may take (tunefleet's ``max_time``)
``skip_value_mismatch``  a documented no-op: on the fleet a configuration whose values do
                         not match the reference is always recorded ``invalid`` and the
                         search goes on (feinsum's True); no campaign stops for one
                         configuration (feinsum's False would)

Everything else is a :func:`tunefleet.tune` option (``workers``, ``db``, ``name``,
``technique``, ``confirm``, ``progress``, ``protocol``, ...). Timing is tunefleet's protocol
(OpenCL events, the median of the samples, written as ``runtime_in_sec``);
``protocol={"statistic": "feinsum-wall-mean"}`` times with feinsum's own ``timeit`` instead
(it needs a feinsum newer than 2025.3).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tunefleet.errors import ProblemError, TuneInterrupted, UsageError
from tunefleet.feinsum_support import INSTALL_HINT

#: tune() options that autotune sets from feinsum's arguments, so they cannot come twice.
_FROM_FEINSUM = {
    "max_trials": "test_limit",
    "max_time": "stop_after",
    "args": "einsum and module_path",
    "sizes": "einsum",
    "dtype": "einsum",
    "device": "cq",
}


def autotune(
    einsum: Any,
    module_path: str | os.PathLike[str],
    cq: Any = None,
    *,
    db_path: str | os.PathLike[str] | None = None,
    long_dim_length: int = 100_000,
    test_limit: int | None = None,
    stop_after: float | None = None,
    skip_value_mismatch: bool = False,
    **options: Any,
) -> Any:
    """Tune ``module_path``'s transform space for ``einsum`` on the fleet and append the
    results to feinsum's archive at ``db_path``; returns the :class:`tunefleet.TuneResult`
    (feinsum's own returns nothing).

    >>> import tunefleet.feinsum as fleet                                # doctest: +SKIP
    >>> fleet.autotune(expr, impl_path, cq, db_path="t.sqlite", test_limit=6)  # doctest: +SKIP
    """
    from tunefleet.api.tune import tune

    for key in options:
        if key in _FROM_FEINSUM:
            raise UsageError(
                f"autotune() takes {key} from {_FROM_FEINSUM[key]}, feinsum's argument; drop it"
            )
    if not isinstance(skip_value_mismatch, bool):
        raise UsageError(f"skip_value_mismatch={skip_value_mismatch!r}: give True or False")
    if isinstance(long_dim_length, bool) or not isinstance(long_dim_length, int):
        raise UsageError(f"long_dim_length={long_dim_length!r} is not a positive integer")
    if long_dim_length <= 0:
        raise UsageError(f"long_dim_length={long_dim_length} is not a positive integer")
    space = _space(module_path)
    archive_path = _archive_path(db_path)
    args = {"space": space, "einsum": _einsum(einsum), "long_dim_length": long_dim_length}
    device = None if cq is None else _device_name(cq)
    try:
        result = tune(
            "feinsum",
            args=args,
            max_trials=test_limit,
            max_time=stop_after,
            device=device,
            **options,
        )
    except TuneInterrupted as stopped:
        _export(options.get("db"), stopped.run_id, archive_path)
        raise
    _export(options.get("db"), result.run_id, archive_path)
    return result


def _space(module_path: str | os.PathLike[str]) -> str:
    """The ``space`` argument: ``feinsum:NAME.py`` for a module shipped with feinsum (the
    archive's ``transform_id`` is then its file name, as feinsum writes it), else the path."""
    from tunefleet.feinsum_support.spaces import installed_impls_dir

    text = os.fspath(module_path)
    if not os.path.isabs(text):
        raise UsageError(
            f"module_path {text!r} is not absolute; feinsum's autotune expects an absolute "
            "path (os.path.abspath(...))"
        )
    path = Path(text)
    if not path.is_file():
        raise UsageError(f"module_path {text!r} does not exist; check the path")
    shipped = installed_impls_dir()
    if shipped is not None and path.resolve().parent == shipped.resolve():
        return f"feinsum:{path.name}"
    return str(path.resolve())


def _einsum(einsum: Any) -> dict[str, Any]:
    """The ``einsum`` argument in the archive's form: feinsum renders it from the canonical
    form of a ``BatchedEinsum``; a dict is taken as that form already."""
    if isinstance(einsum, Mapping):
        return dict(einsum)
    if not hasattr(einsum, "get_subscripts"):
        raise UsageError(
            f"einsum={type(einsum).__name__}: give a feinsum BatchedEinsum (feinsum.einsum(...) "
            "or feinsum.batched_einsum(...)) or the archive's einsum form as a dict"
        )
    from tunefleet.feinsum_support.canonical import archive_strings, require_feinsum

    fe = require_feinsum()
    return archive_strings(fe.canonicalize_einsum(einsum))


def _device_name(cq: Any) -> str:
    device = getattr(cq, "device", None)
    if device is None and getattr(cq, "devices", None):
        device = cq.devices[0]  # a Context, as feinsum 2025.3's autotune takes
    name = getattr(device, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise UsageError(
            f"cq={cq!r}: give a pyopencl CommandQueue (or Context); its device serves the "
            "local workers"
        )
    return name.strip()


def _archive_path(db_path: str | os.PathLike[str] | None) -> Path:
    if db_path is not None:
        return Path(os.fspath(db_path))
    try:
        from feinsum.sql_utils import DEFAULT_DB
    except (ImportError, SyntaxError):
        raise ProblemError(
            f"db_path=None means feinsum's default archive, and feinsum is not importable "
            f"here; give db_path or {INSTALL_HINT}"
        ) from None
    return Path(DEFAULT_DB)


def _export(db: str | None, run_id: int, path: Path) -> None:
    from tunefleet.db.resolve import open_db
    from tunefleet.feinsum_support.transfer import export_run

    with open_db(db) as conn:
        export_run(conn, run_id, path)
