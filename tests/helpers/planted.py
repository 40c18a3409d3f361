"""Test and benchmark helper: a planted, deceptive landscape of a GEMM-shaped space (567,000
configurations, ten parameters) whose speed two register tiles decide, and a device-free
search of it by the coordinator's own :class:`~tunefleet.coordinator.tuner.Tuner`.

Speed: ``reg_i`` and ``reg_j`` each have a broad basin (``reg_i = 2``, ``reg_j = 1``) and a
narrow optimum elsewhere (``reg_i = 16``, ``reg_j = 4``); over the whole space they carry
about 70 % and 27 % of the variance of log time (first-order). Six others (work-group sizes,
``tile_k``, ``vec_j``, ``unroll_k``) change the time by up to a fifth each step; the two
prefetch switches and ``vec_i`` change nothing. ``reg_i * reg_j > 64`` is invalid (the
register budget). Each configuration's time carries a fixed noise of up to 3 %.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

from tunefleet.space import Bool, Choice, Config, PowerOfTwo, Space, config_hash

SPACE = Space.of(
    [
        PowerOfTwo("wg_i", 1, 32),
        PowerOfTwo("wg_j", 1, 64),
        PowerOfTwo("reg_i", 1, 16),
        PowerOfTwo("reg_j", 1, 16),
        Choice("vec_i", (1, 2, 4)),
        Choice("vec_j", (1, 2, 4)),
        PowerOfTwo("tile_k", 4, 64),
        Bool("prefetch_a"),
        Bool("prefetch_b"),
        Choice("unroll_k", ("hint", "full", "none")),
    ]
)
#: The parameters that decide the speed.
DECISIVE = ("reg_i", "reg_j")
#: How much each of the six minor parameters changes the time per step.
MINOR = 0.2


def seconds(config: Config) -> float | None:
    """The planted time of a configuration, None where it is invalid."""
    c = config
    if c["reg_i"] * c["reg_j"] > 64:
        return None
    li, lj = math.log2(c["reg_i"]), math.log2(c["reg_j"])
    decisive = min(0.25 * (li - 1) ** 2 + 0.2, 0.6 * abs(li - 4)) + min(
        0.25 * lj**2 + 0.2, 0.6 * abs(lj - 2)
    )
    minor = 1 + MINOR * (
        abs(math.log2(c["tile_k"]) - 4)
        + abs(math.log2(c["wg_j"]) - 3)
        + abs(math.log2(c["wg_i"]) - 2)
        + (c["unroll_k"] == "none")
        + (c["vec_j"] != 2)
    )
    noise = int(hashlib.sha256(config_hash(c).encode()).hexdigest()[:8], 16) / 2**32
    return 1e-3 * math.exp(decisive) * minor * (1 + 0.03 * noise)


def search(
    seed: int, trials: int = 300, techniques: Sequence[str] = (), workers: int = 1
) -> list[dict[str, Any]]:
    """The finished trials of a seeded search of ``trials`` evaluations (as the importance
    analysis reads them), ``workers`` asked for at a time as the engine does; invalid
    configurations are finished trials too (the workers would find them invalid)."""
    from tunefleet.coordinator.budget import horizon
    from tunefleet.coordinator.tuner import Tuner

    tuner = Tuner(SPACE, techniques, seed=seed)
    rows: list[dict[str, Any]] = []
    outcomes: dict[str, float | None] = {}
    try:
        while len(rows) < trials:
            # The horizon a run of ``trials`` trials gives (ModelSearchFinish's end game).
            batch = tuner.ask(workers, horizon(trials, len(rows), 0, None, None))
            if not batch:
                break
            for sug in batch:
                if sug.config_hash not in outcomes:
                    t = outcomes[sug.config_hash] = seconds(sug.config)
                    rows.append(
                        {
                            "run_id": 1,
                            "trial_id": len(rows) + 1,
                            "config": sug.config,
                            "state": "done" if t is not None else "invalid",
                            "median_s": t,
                        }
                    )
            tuner.tell_many([(s, outcomes[s.config_hash]) for s in batch])
    finally:
        tuner.close()
    return rows[:trials]
