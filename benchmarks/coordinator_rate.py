"""Coordinator rate: how many configurations per second the coordinator's engine (OpenTuner
ask/tell + the queue statements) can feed the fleet, and how long a finished trial waits
before the coordinator enqueues the next configuration.

The coordinator (``tunefleet.coordinator.engine.Coordinator``, in this process, default
settings) tunes
``benchmarks/wide_problem.py`` (an analytic objective over about 2.6 billion points, so the
search never runs dry) until ``--trials`` evaluations. The fleet is played by client processes
that claim through tunefleet's queue functions and complete each trial at once with the
analytic time (``--delay`` seconds later): workers infinitely faster than the coordinator.

0. **Tuner alone**: the coordinator's OpenTuner wrapper with no database, asking ``ask size``
   configurations at a time and telling their times at once.
1. **Rate**: trials enqueued per second of the run (``--clients`` instant clients, each
   claiming up to ``--batch`` trials); also the time inside OpenTuner's ``ask`` and ``tell``
   (timed around the engine's calls) and suggestions per second of ``ask`` alone.
2. **Latency**: with ``--latency-clients`` clients that take ``--latency-delay`` seconds per
   trial (a fleet that is not saturating the coordinator), for every finished trial the time
   from its completion (``trial.finished_at``) to the next trial the coordinator inserted
   (``trial.created_at``), both on the database clock. The coordinator reads outcomes every
   ``poll_s`` (default 0.2 s) when idle.

    python benchmarks/coordinator_rate.py
    python benchmarks/coordinator_rate.py --clients 1 --trials 100 --latency-trials 20

Writes ``benchmarks/results/coordinator_rate.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.synchronize
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from tunefleet.coordinator import tuner as tuner_module
from tunefleet.coordinator.budget import Budget
from tunefleet.coordinator.create import create_run
from tunefleet.coordinator.engine import Coordinator
from tunefleet.coordinator.settings import CoordinatorSettings
from tunefleet.db.engine import connect
from tunefleet.queries import bench as bq

NAME = "coordinator_rate"
PROBLEM = str(Path(__file__).resolve().parent / "wide_problem.py")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=2000, help="evaluations per rate run")
    p.add_argument(
        "--max-seconds", type=float, default=20.0, help="time limit of each rate run (default 20)"
    )
    p.add_argument("--clients", default="1,4,16", help="instant clients per rate run (list)")
    p.add_argument("--batch", type=int, default=4, help="claim limit of each client")
    p.add_argument(
        "--tuner-batches", default="1,8,32", help="ask sizes of the database-free tuner loop"
    )
    p.add_argument("--latency-trials", type=int, default=200, help="evaluations (latency run)")
    p.add_argument("--latency-clients", type=int, default=2, help="clients of the latency run")
    p.add_argument(
        "--latency-delay", type=float, default=0.1, help="seconds per trial (latency run)"
    )
    p.add_argument("--poll", type=float, default=None, help="coordinator poll_s (default: its)")
    p.add_argument(
        "--db",
        default=None,
        help="a scratch database URL (default: a private embedded server in a temporary directory)",
    )
    p.add_argument("--out", default=None, help="JSON file or folder (default benchmarks/results)")
    return p.parse_args(argv)


# --- the instant fleet --------------------------------------------------------------------------
def client_main(url: str, batch: int, delay: float, stop: Any, ready: Any) -> None:
    """Claim trials of class ``any`` and complete each with the analytic time."""
    import importlib.util

    from tunefleet import __version__
    from tunefleet.problems.base import Protocol
    from tunefleet.queries import queue
    from tunefleet.queries.queue import MeasurementRow

    spec = importlib.util.spec_from_file_location("wide_problem", PROBLEM)
    assert spec is not None and spec.loader is not None
    wide = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wide)
    protocol = Protocol(warmup=0, min_launches=1, min_seconds=0.0, max_launches=1).to_json()
    worker_id = uuid.uuid4()
    conn = connect(url)
    secret = queue.register_worker(
        conn,
        worker_id=worker_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        device_id=None,
        device_class="any",
        version=__version__,
    )
    queue.listen(conn)
    ready.set()
    last_beat = time.monotonic()
    while not stop.is_set():
        claims = queue.claim_trials(
            conn,
            worker_id=worker_id,
            secret=secret,
            device_classes=["any"],
            limit=batch,
            lease_s=60.0,
        )
        if not claims:
            for _ in conn.notifies(timeout=0.05, stop_after=1):
                pass
        for c in claims:
            if delay:
                time.sleep(delay)
            t = wide.seconds(c.config)
            queue.complete_trial(
                conn,
                trial_id=c.trial_id,
                attempt=c.attempt,
                token=c.lease_token,
                worker_id=worker_id,
                state="done",
                measurement=MeasurementRow(
                    median_s=t,
                    min_s=t,
                    samples_s=[t],
                    protocol=protocol,
                    gflops=wide.FLOP_COUNT / t / 1e9,
                    flop_count=wide.FLOP_COUNT,
                ),
            )
        if time.monotonic() - last_beat > 5.0:
            queue.heartbeat_worker(conn, worker_id, secret)
            last_beat = time.monotonic()
    queue.stop_worker(conn, worker_id, secret)
    conn.close()


class Fleet:
    def __init__(self, url: str, n: int, batch: int, delay: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop_event = ctx.Event()
        self.procs = []
        readies = []
        for _ in range(n):
            ready = ctx.Event()
            proc = ctx.Process(
                target=client_main,
                args=(url, batch, delay, self.stop_event, ready),
                daemon=True,
            )
            proc.start()
            self.procs.append(proc)
            readies.append(ready)
        for ready in readies:
            if not ready.wait(120):
                self.close()
                raise SystemExit("a client did not start")

    def close(self) -> None:
        self.stop_event.set()
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


# --- timing the engine's calls into OpenTuner -----------------------------------------------------
class Timers:
    """Wraps the Tuner's ask/tell/learn for the duration of a run: seconds and items."""

    NAMES = ("ask", "tell_many", "learn")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.NAMES, 0.0)
        self.calls = dict.fromkeys(self.NAMES, 0)
        self.items = dict.fromkeys(self.NAMES, 0)
        self._saved: dict[str, Callable[..., Any]] = {}

    def __enter__(self) -> Timers:
        cls = tuner_module.Tuner
        for name in self.NAMES:
            original = getattr(cls, name)
            self._saved[name] = original
            setattr(cls, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            setattr(tuner_module.Tuner, name, original)

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(tuner: Any, arg: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = original(tuner, arg, *args, **kwargs)
            self.seconds[name] += time.perf_counter() - started
            self.calls[name] += 1
            self.items[name] += len(result) if name == "ask" else len(arg)
            return result

        return timed


def drive(
    url: str, trials: int, poll: float | None, max_seconds: float | None = None
) -> tuple[Any, float, float, Timers]:
    """Create a run of the wide problem and drive it to ``trials`` evaluations (or
    ``max_seconds``)."""
    # The rate of the search alone: confirmation (a few evaluations after the budget) is off.
    settings = CoordinatorSettings.build(
        problem=PROBLEM,
        budget=Budget.build(max_trials=trials, max_seconds=max_seconds),
        poll_s=poll,
        confirm=0,
    )
    with Timers() as timers:
        started, cpu = time.perf_counter(), time.thread_time()
        run_id = create_run(settings, url)
        result = Coordinator(settings, url).run(run_id)
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
    return result, wall, cpu, timers


def tuner_alone(batch: int, suggestions: int) -> dict[str, Any]:
    """OpenTuner through the coordinator's Tuner with no database: ask ``batch``
    configurations, tell their analytic times at once, until ``suggestions``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("wide_problem", PROBLEM)
    assert spec is not None and spec.loader is not None
    wide = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wide)
    tuner = tuner_module.Tuner(wide.Wide().space({}))
    asked = empty = 0
    ask_s = 0.0
    started, cpu = time.perf_counter(), time.thread_time()
    try:
        while asked < suggestions and empty < 100:
            t0 = time.perf_counter()
            got = tuner.ask(min(batch, suggestions - asked))
            ask_s += time.perf_counter() - t0
            if not got:
                empty += 1  # a generation of repeats only: ask again, as the engine does
                continue
            asked += len(got)
            tuner.tell_many([(g, wide.seconds(g.config)) for g in got])
    finally:
        tuner.close()
    wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
    return {
        "batch": batch,
        "suggestions": asked,
        "wall_s": wall,
        "cpu_s": cpu,
        "suggestions_per_s": asked / wall,
        "suggestions_per_cpu_s": asked / max(cpu, 1e-9),
        "ask_s": ask_s,
        "empty_asks": empty,
    }


def rate_run(url: str, clients: int, args: argparse.Namespace, started: float) -> dict[str, Any]:
    fleet = Fleet(url, clients, args.batch, 0.0)
    try:
        result, wall, cpu, timers = drive(url, args.trials, args.poll, args.max_seconds)
    finally:
        fleet.close()
    with connect(url) as conn:
        timing = bq.batch_timing(conn, [result.run_id])
    row = {
        "clients": clients,
        "batch": args.batch,
        "run_id": result.run_id,
        "evaluations": result.trials,
        "stop_reason": result.stop_reason,
        "wall_s": wall,
        "coordinator_cpu_s": cpu,
        "enqueued_per_cpu_s": int(timing["trials"]) / max(cpu, 1e-9),
        "enqueued_per_s": int(timing["trials"]) / wall,
        "evaluations_per_s": result.trials / wall,
        "ask": {
            "seconds": timers.seconds["ask"],
            "calls": timers.calls["ask"],
            "suggestions": timers.items["ask"],
            "suggestions_per_s": timers.items["ask"] / max(timers.seconds["ask"], 1e-9),
        },
        "tell": {
            "seconds": timers.seconds["tell_many"] + timers.seconds["learn"],
            "results": timers.items["tell_many"] + timers.items["learn"],
        },
        "best_median_s": result.best_median_s,
    }
    row["other_s"] = wall - row["ask"]["seconds"] - row["tell"]["seconds"]
    print(
        f"[{h.elapsed(started)}] {clients:2d} clients: {row['enqueued_per_s']:.0f} trials "
        f"enqueued/s, ask alone {row['ask']['suggestions_per_s']:.0f} suggestions/s, "
        f"{row['evaluations']} evaluations in {wall:.1f} s",
        flush=True,
    )
    return row


def latency_run(url: str, args: argparse.Namespace, started: float) -> dict[str, Any]:
    fleet = Fleet(url, args.latency_clients, 1, args.latency_delay)
    try:
        result, wall, _, _ = drive(url, args.latency_trials, args.poll)
    finally:
        fleet.close()
    with connect(url) as conn:
        rows = bq.trial_times(conn, [result.run_id])
    first_created = min(r["created_at"] for r in rows)
    created = sorted(r["created_at"] for r in rows if r["created_at"] > first_created)
    waits = []
    for r in rows:
        f = r["finished_at"]
        if f is None:
            continue
        later = next((c for c in created if c >= f), None)
        if later is not None:
            waits.append((later - f).total_seconds() * 1e3)
    out = {
        "clients": args.latency_clients,
        "delay_s": args.latency_delay,
        "evaluations": result.trials,
        "wall_s": wall,
        "latency_ms": h.summary(waits),
    }
    lat = out["latency_ms"]
    print(
        f"[{h.elapsed(started)}] latency: median {lat.get('median', float('nan')):.1f} ms, "
        f"p99 {lat.get('p99', float('nan')):.1f} ms over {lat.get('n', 0)} completions",
        flush=True,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: dict[str, Any] = {
        "benchmark": NAME,
        "command": " ".join(["python", "benchmarks/coordinator_rate.py", *(argv or sys.argv[1:])]),
        "machine": h.machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "tuner_alone": [],
        "rate": [],
    }
    started = time.monotonic()
    with h.database(args.db) as url:
        out["postgresql"] = h.server_version(url)
        for k in [int(x) for x in args.tuner_batches.split(",") if x.strip()]:
            alone = tuner_alone(k, args.trials)
            out["tuner_alone"].append(alone)
            print(
                f"[{h.elapsed(started)}] tuner alone, ask({k}): "
                f"{alone['suggestions_per_s']:.0f} suggestions/s "
                f"({alone['suggestions_per_cpu_s']:.0f} per CPU second)",
                flush=True,
            )
        for n in [int(x) for x in args.clients.split(",")]:
            out["rate"].append(rate_run(url, n, args, started))
        out["latency"] = latency_run(url, args, started)
    print()
    print(
        h.table(
            ["ask size", "suggestions", "wall s", "suggestions/s", "per CPU second"],
            [
                [
                    a["batch"],
                    a["suggestions"],
                    h.fmt(a["wall_s"], 2),
                    h.fmt(a["suggestions_per_s"], 0),
                    h.fmt(a["suggestions_per_cpu_s"], 0),
                ]
                for a in out["tuner_alone"]
            ],
        )
    )
    print()
    print(
        h.table(
            [
                "clients",
                "evaluations",
                "wall s",
                "enqueued/s",
                "ask suggestions/s",
                "ask s",
                "tell s",
                "DB + loop s",
                "coordinator CPU s",
                "enqueued per CPU s",
            ],
            [
                [
                    r["clients"],
                    r["evaluations"],
                    h.fmt(r["wall_s"], 2),
                    h.fmt(r["enqueued_per_s"], 0),
                    h.fmt(r["ask"]["suggestions_per_s"], 0),
                    h.fmt(r["ask"]["seconds"], 2),
                    h.fmt(r["tell"]["seconds"], 2),
                    h.fmt(r["other_s"], 2),
                    h.fmt(r["coordinator_cpu_s"], 2),
                    h.fmt(r["enqueued_per_cpu_s"], 0),
                ]
                for r in out["rate"]
            ],
        )
    )
    lat = out["latency"]["latency_ms"]
    print()
    print(
        h.table(
            ["clients", "s per trial", "completions", "median ms", "p90 ms", "p99 ms", "max ms"],
            [
                [
                    out["latency"]["clients"],
                    out["latency"]["delay_s"],
                    lat.get("n", 0),
                    h.fmt(lat.get("median"), 1),
                    h.fmt(lat.get("p90"), 1),
                    h.fmt(lat.get("p99"), 1),
                    h.fmt(lat.get("max"), 1),
                ]
            ],
        )
    )
    h.write_json(NAME, out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
