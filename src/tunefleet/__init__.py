"""tunefleet: distributed autotuning of loopy (OpenCL) kernels through one PostgreSQL database.

This package is the shared core that both ``tunefleet.coordinator`` and ``tunefleet.worker``
import: settings, errors, the database (schema, engine, every SQL statement), the
parameter-space DSL, the problem registry, the embedded database and the CLI. The layout and
the rule at each boundary: docs/layout.md.

Its public Python surface is :data:`__all__`, loaded on first use (``import tunefleet`` stays
cheap for the worker's processes, and loads neither the coordinator nor OpenCL):

>>> import tunefleet
>>> result = tunefleet.tune("gemm", sizes={"m": 256, "n": 256, "k": 256},
...                         max_trials=20)                       # doctest: +SKIP
>>> print(result.config)                                         # doctest: +SKIP
>>> tunefleet.best(result.run_id, top=3).to_dataframe()          # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tunefleet.version import __version__

#: Public name -> the module that defines it.
_PUBLIC = {
    "tune": "tunefleet.api.tune",
    "TuneResult": "tunefleet.api.tune",
    "TuneProgress": "tunefleet.api.tune",
    "runs": "tunefleet.api.read",
    "results": "tunefleet.api.read",
    "best": "tunefleet.api.read",
    "Records": "tunefleet.api.read",
    "RunSummary": "tunefleet.api.read",
    "TrialResult": "tunefleet.api.read",
    "BestTrial": "tunefleet.api.read",
    "Problem": "tunefleet.problems.base",
    "ArgSpec": "tunefleet.problems.base",
    "Outcome": "tunefleet.problems.base",
    "Protocol": "tunefleet.problems.base",
    "TunefleetError": "tunefleet.errors",
    "UsageError": "tunefleet.errors",
    "ProblemError": "tunefleet.errors",
    "RunError": "tunefleet.errors",
    "DeviceError": "tunefleet.errors",
    "TuneInterrupted": "tunefleet.errors",
    "InvalidConfiguration": "tunefleet.errors",
}

__all__ = [
    "ArgSpec",
    "BestTrial",
    "DeviceError",
    "InvalidConfiguration",
    "Outcome",
    "Problem",
    "ProblemError",
    "Protocol",
    "Records",
    "RunError",
    "RunSummary",
    "TrialResult",
    "TuneInterrupted",
    "TuneProgress",
    "TuneResult",
    "TunefleetError",
    "UsageError",
    "__version__",
    "best",
    "results",
    "runs",
    "tune",
]

if TYPE_CHECKING:
    from tunefleet.api.read import (
        BestTrial,
        Records,
        RunSummary,
        TrialResult,
        best,
        results,
        runs,
    )
    from tunefleet.api.tune import TuneProgress, TuneResult, tune
    from tunefleet.errors import (
        DeviceError,
        InvalidConfiguration,
        ProblemError,
        RunError,
        TunefleetError,
        TuneInterrupted,
        UsageError,
    )
    from tunefleet.problems.base import ArgSpec, Outcome, Problem, Protocol


def __getattr__(name: str) -> Any:
    if name == "feinsum":  # the submodule, for `import tunefleet; tunefleet.feinsum.autotune`
        return importlib.import_module("tunefleet.feinsum")
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'tunefleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
