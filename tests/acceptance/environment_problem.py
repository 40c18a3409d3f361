"""A user problem (loaded by path) that works, except on a worker whose environment variable
``TUNEFLEET_TEST_BROKEN`` names how this node is broken:

``import``         the file cannot be imported (a module it needs is missing on this node)
``die``            the process loading it dies (a native library crashing at import)
``needs_module``   ``prepare`` raises ModuleNotFoundError for every configuration
``same_error``     ``prepare`` raises the same RuntimeError for every configuration
``config_error``   ``prepare`` raises RuntimeError for configurations with ``x >= 6`` only,
                   always the same text (a bug of the problem's own, on any node)

The coordinator and healthy workers run without the variable."""

from __future__ import annotations

import os
import signal
from typing import Any

from tunefleet.problems.base import Outcome, Problem
from tunefleet.space import Choice, Space

BROKEN = os.environ.get("TUNEFLEET_TEST_BROKEN", "")
SIZE = 8

if BROKEN == "import":
    import tunefleet_test_module_missing_on_this_node  # noqa: F401
if BROKEN == "die":
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.kill(os.getpid(), signal.SIGSEGV)


class EnvironmentSensitive(Problem):
    name = "environment_sensitive"
    needs_opencl = False

    def normalise_args(self, raw: Any) -> dict[str, Any]:
        return dict(raw)

    def space(self, args: Any) -> Space:
        return Space.of([Choice("x", tuple(range(SIZE)))])

    def prepare(self, args: Any, config: Any, device: Any) -> Any:
        if BROKEN == "needs_module":
            raise ModuleNotFoundError("No module named 'libfoo'", name="libfoo")
        if BROKEN == "same_error":
            raise RuntimeError("libfoo.so.1: cannot open shared object file")
        if BROKEN == "config_error" and config["x"] >= 6:
            raise RuntimeError("the problem's own bug for large x")
        return int(config["x"])

    def measure(self, prepared: Any, session: Any, protocol: Any) -> Outcome:
        t = 1e-3 * (1 + prepared)
        return Outcome(state="done", median_s=t, min_s=t, samples_s=(t, t, t))
