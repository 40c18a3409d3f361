"""How many suggestions per second the coordinator's search step sustains, without a database.

The engine asks OpenTuner for a batch of configurations, then tells it a batch of outcomes;
this script times exactly that step (``tunefleet.coordinator.tuner.Tuner``) on a
9-parameter space with an analytic objective. 100 workers with 0.5 s trials need 200 suggestions/s.

    python benchmarks/coordinator_ask_tell.py [--suggestions 3000] [--batch 50]
"""

from __future__ import annotations

import argparse
import math
import time

from tunefleet.coordinator.tuner import Tuner
from tunefleet.space import Bool, Choice, IntRange, PowerOfTwo, Space, TupleOf

SPACE = Space.of(
    [
        IntRange("x", 0, 31),
        IntRange("y", 0, 30, 2),
        PowerOfTwo("p", 1, 64),
        Bool("flag"),
        Choice("mode", ("a", "b", "c")),
        Choice("unroll", (1, 2, 4, 8)),
        TupleOf("wg", (PowerOfTwo("wx", 1, 16), IntRange("wy", 1, 4))),
    ]
)


def seconds(c: dict) -> float | None:
    if c["x"] == 3:
        return None
    return 1e-3 * (
        1
        + (c["x"] - 20) ** 2
        + (c["y"] - 10) ** 2 / 4
        + abs(math.log2(c["p"]) - 3)
        + c["flag"]
        + (c["mode"] != "b")
        + (c["unroll"] != 4)
        + abs(c["wg"][0] - 4)
        + abs(c["wg"][1] - 3)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suggestions", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args()
    tuner = Tuner(SPACE)
    start = time.perf_counter()
    done = 0
    while done < args.suggestions:
        batch = tuner.ask(args.batch)
        tuner.tell_many([(s, seconds(s.config)) for s in batch])
        done += len(batch)
    elapsed = time.perf_counter() - start
    tuner.close()
    print(
        f"{done} suggestions in {elapsed:.2f} s: {done / elapsed:.0f} suggestions/s "
        f"(batch {args.batch})"
    )


if __name__ == "__main__":
    main()
