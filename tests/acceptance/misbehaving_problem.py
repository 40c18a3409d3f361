"""A user problem (loaded by path) that misbehaves in every way a worker must survive; the
configuration's ``mode`` picks the misbehaviour."""

from __future__ import annotations

from typing import Any

import numpy as np

from tunefleet.errors import InvalidConfiguration
from tunefleet.problems.base import Outcome, Problem
from tunefleet.space import Choice, Space

MODES = ("numpy", "no_times", "raises", "outcome_invalid", "prepare_invalid", "nan_json")


class Misbehaving(Problem):
    name = "misbehaving"
    needs_opencl = False

    def normalise_args(self, raw: Any) -> dict[str, Any]:
        return dict(raw)

    def space(self, args: Any) -> Space:
        return Space.of([Choice("mode", MODES)])

    def prepare(self, args: Any, config: Any, device: Any) -> Any:
        if config["mode"] == "prepare_invalid":
            raise InvalidConfiguration("this point cannot be built")
        return config["mode"]

    def measure(self, prepared: Any, session: Any, protocol: Any) -> Outcome:
        if prepared == "raises":
            raise RuntimeError("driver said no")
        if prepared == "no_times":
            return Outcome(state="done")
        if prepared == "outcome_invalid":
            return Outcome(state="invalid", error="wrong numbers: max rel err 0.5")
        t = np.float32(0.003)
        samples = tuple(np.array([0.002, 0.003, 0.004], dtype=np.float32))
        validation: dict[str, Any] = {"passed": np.bool_(True), "max_rel_err": np.float64(1e-7)}
        if prepared == "nan_json":
            validation["max_rel_err"] = float("nan")
            validation["shape"] = (np.int64(4), 5)
        return Outcome(
            state="done",
            median_s=t,
            min_s=np.float64(0.002),
            samples_s=samples,
            gflops=np.float32(1.5),
            validation=validation,
        )
