"""Does restoring an in-place argument before every launch stay out of the timed samples?

Times the built-in ``axpy`` (``u[i] += alpha * v[i]``, ``u`` restored before each launch by a
device-to-device copy) through the real ``prepare``/``measure`` path twice in one process:
as measured (restored), and with the restore switched off (the kernel's work does not depend
on the values of ``u``, so both time the same kernel). A ratio near 1 says the copies sit
outside the kernel's profiling events; had they been inside, the median would grow by the
copy's own time, which is measured too (copy events alone, same size) to show the size of
the difference the ratio would reveal. Wall seconds per launch show what restoring costs in
wall time (the whole evaluation, validation included, over its launches).

Where the arrays fit in the device's caches, back-to-back launches find ``u`` and ``v`` cached
and restored ones find what the copy left: the ratio then measures cache state, not the copy;
run a size beyond the caches too.

Prints a table and writes ``restore_overhead.json`` to ``--out``. Usage::

    python benchmarks/restore_overhead.py [--n 4194304] [--repeats 3] [--out results/]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tunefleet.problems import kernel  # noqa: E402
from tunefleet.problems.base import Protocol  # noqa: E402
from tunefleet.problems.registry import get_problem  # noqa: E402


def measure(session: Any, args: dict[str, Any], protocol: Protocol, restore: bool) -> Any:
    problem = get_problem("axpy")
    full = problem.normalise_args(args)
    prepared = problem.prepare(full, problem.default_config(full), session.info)
    original = kernel._KernelArrays.restore
    if not restore:
        kernel._KernelArrays.restore = lambda self: None  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        outcome = problem.measure(prepared, session, protocol)
        wall = time.perf_counter() - t0
    finally:
        kernel._KernelArrays.restore = original  # type: ignore[method-assign]
    if outcome.state != "done":
        raise SystemExit(f"axpy was {outcome.state}: {outcome.error}")
    return outcome, wall


def copy_seconds(session: Any, n: int, dtype: str, launches: int) -> float:
    """Median seconds of one device-to-device copy of ``n`` elements (its own events)."""
    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla

    src = cla.zeros(session.queue, n, np.dtype(dtype))
    dst = cla.empty_like(src)
    events = [
        cl.enqueue_copy(session.queue, dst.data, src.data, byte_count=src.nbytes)
        for _ in range(launches)
    ]
    cl.wait_for_events(events)
    return statistics.median((e.profile.end - e.profile.start) * 1e-9 for e in events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 22)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each kind")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results")))
    opts = parser.parse_args()

    from tunefleet.worker.device import open_session, select_device

    device = select_device(None)
    session = open_session(device)
    protocol = Protocol()  # the default protocol, as a run measures
    args = {"n": opts.n, "dtype": opts.dtype}
    rows: list[dict[str, Any]] = []
    measure(session, args, protocol, True)  # discarded: builds, and caches the target inputs
    for _ in range(opts.repeats):
        for restore in (True, False):  # interleaved: drift hits both kinds alike
            outcome, wall = measure(session, args, protocol, restore)
            rows.append(
                {
                    "restore": restore,
                    "median_s": outcome.median_s,
                    "min_s": outcome.min_s,
                    "launches": len(outcome.samples_s),
                    "wall_per_launch_s": wall / (len(outcome.samples_s) + protocol.warmup),
                    "protocol": outcome.protocol,
                }
            )
    copy_s = copy_seconds(session, opts.n, opts.dtype, protocol.min_launches)

    def med(restore: bool, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["restore"] is restore)

    summary = {
        "device": device.name,
        "n": opts.n,
        "dtype": opts.dtype,
        "median_restored_s": med(True, "median_s"),
        "median_unrestored_s": med(False, "median_s"),
        "ratio_restored_over_unrestored": med(True, "median_s") / med(False, "median_s"),
        "copy_s": copy_s,
        "ratio_if_the_copy_were_timed": (med(False, "median_s") + copy_s) / med(False, "median_s"),
        "wall_per_launch_restored_s": med(True, "wall_per_launch_s"),
        "wall_per_launch_unrestored_s": med(False, "wall_per_launch_s"),
    }
    print(f"axpy n={opts.n} {opts.dtype} on {device.name}, {opts.repeats} measurements each")
    print(f"{'':34}{'restored':>12}{'not restored':>14}")
    print(
        f"{'kernel median (profiling events)':34}{summary['median_restored_s'] * 1e6:>10.1f}us"
        f"{summary['median_unrestored_s'] * 1e6:>12.1f}us"
    )
    print(
        f"{'wall time per launch':34}{summary['wall_per_launch_restored_s'] * 1e6:>10.1f}us"
        f"{summary['wall_per_launch_unrestored_s'] * 1e6:>12.1f}us"
    )
    print(f"ratio restored / not restored: {summary['ratio_restored_over_unrestored']:.3f}")
    print(
        f"one restoring copy: {copy_s * 1e6:.1f}us; the ratio had the copy been timed: "
        f"{summary['ratio_if_the_copy_were_timed']:.3f}"
    )
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "restore_overhead.json").write_text(
        json.dumps({"summary": summary, "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
