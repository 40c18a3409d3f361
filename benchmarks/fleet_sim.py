"""A fleet past one machine, simulated: N virtual workers, each on its own database session
(or, behind PgBouncer in transaction mode, sharing its pool), held by a few processes, against
one PostgreSQL. What does the server carry at N = 100 ... 10,000, what do its sessions wait
on, and would the simulation tell the truth?

A virtual worker is the worker's loop without a device: it registers its device and itself,
takes its device's lease, reports its sizing, claims up to its capacity (1 + prefetch),
"times" a trial by waiting the trial's ``duration`` (its device), starts the next held trial
before it writes the last result, completes (fenced, with a measurement row), runs the
reaper and reports its sizing as often as the worker does for its lease
(``tunefleet.worker.settings.cadence``: at the default 30 s lease every 15 s and every
10 s), waits for work as
the worker does (``tunefleet.worker.wake``: polling with jittered backoff), and its heartbeat
thread (the worker's own ``Heartbeat`` on the worker's one session, with the main loop's
liveness) extends its leases and its device lease every third of the lease. Every statement
is the worker's own, from ``tunefleet.queries.queue``, on connections made by the worker's
``Link``. A coordinator thread keeps the queue at the coordinator's target
(``coordinator.rules.queue_target``, poll 0.2 s), reading outcomes with ``fetch_unreported``
and inserting with ``insert_trials`` (one NOTIFY per poll that inserted).

**Shapes** (``--shapes``, or per cell in ``--cells N:T:SHAPE,...``): ``one`` is the worker;
``one-idle-listen`` the worker with ``--listen``; ``one-listen`` LISTENs all the time and
claims on every notification, and ``two-listen`` is the worker before migration
0011_fleet_shape (its heartbeat on a second session, two statements a beat, LISTEN all the
time): the A/B of the wake-ups and of the sessions; ``pooled`` is the worker behind PgBouncer
in transaction mode (``--pool-size`` server connections, ``--pgbouncer`` the binary), and
``pooled-lease90`` the same workers started with ``--lease 90`` (a heartbeat every 20 s
instead of 10, a reaper turn every 45 s instead of 15, a sizing report every 30 s instead of
10: the lever for a fleet of thousands). A change of shape reconnects the live fleet
(registration, leases and device leases stay).

**Steady state within minutes.** Each cell starts from an idle fleet. The first trial each
virtual worker runs in a cell lasts a uniform random fraction of T, as if the fleet had been
running for a long time with workers started at random moments: completions then arrive at
the steady rate N/T from the first second, instead of in N-wide bursts every T seconds.
After a warm-up (``--warmup``, 6 s: longer than the polling interval an idle worker has
backed off to, so every worker has found the cell's work) a window of ``k x T`` seconds is
measured (``k`` whole trials, ``k = max(1, round(--window / T))``: 10 s at T = 1 s and 10 s,
30 s at 30 s);
a whole number of trial lengths makes every worker contribute the same number of
completions whatever its phase. At the end of a cell its runs are finished and every virtual
worker releases what it holds (the worker's shutdown statement).

**Efficiency**, as ``benchmarks/fleet_scaling.py`` defines it: ``(trials x T / N) / wall``,
the share of the fleet's device time spent timing trials. In a window, ``wall`` is its length
and each trial counts with the part of it timed inside the window (device time from the
trial's start, however late the worker noticed its end): the batch definition with the
edges cut off. ``efficiency_by_count`` counts whole trials completed in the window instead
(one more or less per worker whose phase drifted across an edge: a check, noisier at T = 30 s).

**What the sessions wait on.** During each window ``pg_stat_activity`` is sampled every
``--sample-s`` (0.1 s): which statement each worker session runs and its wait event, so a
statement's mean time inside the server (Little's law: mean sessions in it / its rate) stands
beside the time the clients measured; about once a second, who blocks whom on heavyweight
locks (the same worker's other session, or another worker); the host processes' scheduling
lag (the part of a latency that is the load generator's); how many clients one NOTIFY woke;
in pooled cells PgBouncer's pool (``SHOW POOLS``: clients waiting for a server connection).

**A/B against the real worker.** At ``--ab-workers`` N (64: what this machine holds with
real processes) both fleets get fleet_scaling's batch (N x ideal / T trials of T = 1 s in one
transaction, one NOTIFY, after its warm-up), and efficiency is fleet_scaling's, on the
database clock. The real side *is* fleet_scaling's code (``measure_fleet``).

**What two cores hold.** A cell that a smaller fleet of its shape already saturated at the
same T (efficiency below 0.8), or that needs more trials per second than a saturated cell of
its shape carried, is skipped and says why (``--all-cells`` measures it anyway): on a machine
shared with the load generator it would only thrash for minutes. The fitted model (``model``
in the JSON: server CPU per trial and per worker-second, memory per session, over the ``one``
cells) predicts ``--predict`` fleets; on a machine with the cores, measure them.

Server CPU and memory come from the PostgreSQL process tree (``/proc``: CPU over the
window, proportional and resident memory at its end); sessions from ``pg_stat_activity``.
The load generator runs on the same machine: its CPU is reported beside the server's.

    python benchmarks/fleet_sim.py                          # the table in docs/performance.md
    python benchmarks/fleet_sim.py --workers 20 --durations 0.5 --window 2 --no-ab
    python benchmarks/fleet_sim.py --cells 800:10:one,800:10:two-listen,800:10:pooled --no-ab

Writes ``benchmarks/results/fleet_sim.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import itertools
import math
import multiprocessing as mp
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection as Pipe
from multiprocessing.connection import wait as wait_any
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
# tests.helpers.pgbouncer: the one PgBouncer launcher, shared with the tests.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _harness as h

from tunefleet import __version__
from tunefleet.coordinator.rules import queue_target
from tunefleet.db.engine import connect
from tunefleet.devices import DeviceInfo
from tunefleet.problems.synthetic import FLOP_COUNT, objective
from tunefleet.queries import bench as bq
from tunefleet.queries import capacity, queue, search
from tunefleet.settings import DatabaseSettings
from tunefleet.space import config_hash
from tunefleet.worker.heartbeat import Heartbeat, HeldLeases, Liveness
from tunefleet.worker.link import DatabaseDown, Link
from tunefleet.worker.settings import DEFAULT_LEASE_S, cadence
from tunefleet.worker.wake import WAKE_SPREAD_S, Wakeups

NAME = "fleet_sim"
#: The worker's defaults (worker.settings, worker.loop) the virtual workers follow.
LEASE_S = DEFAULT_LEASE_S
POLL_S = 5.0
PREFETCH = 1
#: The coordinator's defaults (coordinator.settings).
COORDINATOR_POLL_S = 0.2
DEPTH_FACTOR = 2.0
MIN_DEPTH = 1
#: A simulated GPU: one fingerprint (one model and driver), eight per node.
SIM_DEVICE = DeviceInfo(
    platform="simulated", vendor="tunefleet", name="Simulated GPU", driver_version="1"
)
GPUS_PER_NODE = 8
APPLICATION = "tunefleet-worker"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--workers",
        default="100,250,500",
        help="fleet sizes N (comma list; 100,250,500 is what two cores hold, the model in the "
        "output extends it; 100,500,1000,2000 on a machine with the cores for it)",
    )
    p.add_argument(
        "--predict",
        default="1000,2000",
        help="fleet sizes the fitted model predicts the server's load for (comma list)",
    )
    p.add_argument("--durations", default="1,10,30", help="trial lengths T in seconds")
    p.add_argument(
        "--shapes",
        default="one",
        help="fleet shapes measured at each N (comma list of " + ", ".join(SHAPES) + ")",
    )
    p.add_argument(
        "--cells",
        default=None,
        help="the cells to measure, in order, instead of N x shape x T: N:T:SHAPE,... "
        "(N never decreasing), e.g. 2000:1:one,2000:10:one,10000:30:pooled",
    )
    p.add_argument(
        "--pgbouncer",
        default=None,
        help="the PgBouncer binary for pooled cells (default $TUNEFLEET_PGBOUNCER, else "
        "pgbouncer on PATH or /usr/sbin/pgbouncer)",
    )
    p.add_argument(
        "--pool-size",
        type=int,
        default=64,
        help="PgBouncer's server connections for the pooled cells (default_pool_size)",
    )
    p.add_argument("--window", type=float, default=10.0, help="measured window, seconds")
    p.add_argument(
        "--warmup",
        type=float,
        default=6.0,
        help="warm-up of each cell, seconds (longer than the workers' 5 s polling interval: an "
        "idle fleet finds the cell's first trials before the window opens)",
    )
    p.add_argument("--procs", type=int, default=4, help="processes holding the virtual workers")
    p.add_argument("--ab-workers", type=int, default=64, help="N of the real-vs-simulated A/B")
    p.add_argument("--ab-duration", type=float, default=1.0, help="T of the A/B, seconds")
    p.add_argument("--ab-ideal", type=float, default=10.0, help="ideal seconds of the A/B batch")
    p.add_argument("--no-ab", action="store_true", help="skip the A/B with real workers")
    p.add_argument(
        "--all-cells",
        action="store_true",
        help="measure cells that a smaller fleet or the measured ceiling says saturate",
    )
    p.add_argument(
        "--memory-share",
        type=float,
        default=0.7,
        help="skip an N whose estimated server memory exceeds this share of the available",
    )
    p.add_argument(
        "--db",
        default=None,
        help="a scratch database URL (default: a private embedded server in a temporary "
        "directory, started with the settings the fleet needs)",
    )
    p.add_argument(
        "--sample-s",
        type=float,
        default=0.1,
        help="sample pg_stat_activity this often during each window (0: never)",
    )
    p.add_argument("--out", default=None, help="JSON file or folder (default benchmarks/results)")
    return p.parse_args(argv)


# --- the shapes of a fleet ---------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """How the virtual workers reach the database and wait for work."""

    name: str
    #: 1: the worker's one session (its heartbeat thread shares it); 2: the heartbeat on a
    #: session of its own, with its two statements (the worker before 0011_fleet_shape).
    sessions: int
    #: "poll": the worker's wake-ups (no LISTEN, jittered backoff: worker.wake);
    #: "idle": the worker with --listen (LISTEN while it holds nothing);
    #: "listen": LISTEN all the time and claim on every notification (before 0011).
    wake: str
    #: Through PgBouncer in transaction mode (``pool_mode = transaction``).
    pooled: bool
    about: str
    #: The workers' ``--lease``: their heartbeat, reaper and sizing intervals follow it.
    lease_s: float = LEASE_S


SHAPES = {
    s.name: s
    for s in (
        Shape("one", 1, "poll", False, "the worker: one session, polling with jittered backoff"),
        Shape("one-idle-listen", 1, "idle", False, "the worker with --listen: LISTEN when idle"),
        Shape("one-listen", 1, "listen", False, "one session, LISTEN always"),
        Shape("two-listen", 2, "listen", False, "before 0011: two sessions, LISTEN always"),
        Shape("pooled", 1, "poll", True, "the worker behind PgBouncer (transaction mode)"),
        Shape("pooled-lease90", 1, "poll", True, "behind PgBouncer, the workers' --lease 90", 90.0),
    )
}


# --- one virtual worker (in a host process) ----------------------------------------------------
class TimedHeartbeat(Heartbeat):
    """The worker's heartbeat thread (one statement, on the worker's one session), with each
    beat's round trip timed."""

    owner: VirtualWorker

    def beat(self) -> None:
        started = time.perf_counter()
        super().beat()
        self.owner.sample("heartbeat", (time.perf_counter() - started) * 1e3)


class LegacyHeartbeat(TimedHeartbeat):
    """The heartbeat before 0011_fleet_shape: on a session of its own, two statements (the
    leases, then the worker row), for the two-session shape."""

    def beat(self) -> None:
        started = time.perf_counter()
        held = self.held.snapshot()
        try:
            if held:
                kept = self.link.run(
                    queue.heartbeat_trials, worker_id=self.worker_id, held=held,
                    lease_s=self.lease_s,
                )  # fmt: skip
                if self.held.mark_lost([k for k in held if k.trial_id not in kept]):
                    self.on_lost()
            self.link.run(queue.heartbeat_worker, self.worker_id, self.worker_secret)
        except DatabaseDown:
            pass
        self.owner.sample("heartbeat", (time.perf_counter() - started) * 1e3)


class VirtualWorker(threading.Thread):
    def __init__(self, host: Host, index: int, shape: Shape) -> None:
        super().__init__(name=f"virtual-worker-{index}", daemon=True)
        self.host = host
        self.index = index
        self.shape = shape
        self.worker_id = uuid.uuid4()
        self.secret = ""
        self.node = f"{host.name}-node{index // GPUS_PER_NODE}"
        self.device = DeviceInfo(
            platform=SIM_DEVICE.platform,
            vendor=SIM_DEVICE.vendor,
            name=SIM_DEVICE.name,
            driver_version=SIM_DEVICE.driver_version,
            index=index % GPUS_PER_NODE,
        )
        self.classes = sorted({self.device.device_class, "any"})
        self.capacity = 1 + PREFETCH
        self.rng = random.Random(hash((host.name, index)))
        self.leases = HeldLeases()
        self.liveness: Liveness | None = None
        self.link = self._link()
        self.heartbeat: TimedHeartbeat | None = None
        self.wake = self._wakeups()
        self.queued: collections.deque[queue.ClaimedTrial] = collections.deque()
        self.running: tuple[queue.ClaimedTrial, float, float, float] | None = None
        self.finished: list[tuple[queue.ClaimedTrial, float]] = []
        self.next_claim = 0.0
        self.cadence = cadence(shape.lease_s)
        self.next_reap = time.monotonic() + self.rng.uniform(0, self.cadence.reap_s)
        self.next_report = time.monotonic() + self.rng.uniform(0, self.cadence.report_s)
        self.generation = 0
        self.randomised_cell = -1
        self.ready = threading.Event()
        self.acked = 0
        self.error: str | None = None
        self.samples: list[tuple[str, float, float, int]] = []
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)

    def _link(self) -> Link:
        return Link(
            self.host.urls[self.shape.pooled],
            self.host.db,
            "main",
            on_connect=self._on_connect,
            on_call_done=lambda: self.liveness.stamp() if self.liveness else None,
        )

    def _wakeups(self) -> Wakeups:
        # The "listen" shape claims at once on every notification, as the worker did.
        spread = 0.0 if self.shape.wake == "listen" else WAKE_SPREAD_S
        return Wakeups(POLL_S, listen=self.shape.wake != "poll", rng=self.rng, spread_s=spread)

    def sample(self, kind: str, ms: float, n: int = 0, at: float | None = None) -> None:
        self.samples.append((kind, time.monotonic() if at is None else at, ms, n))

    def timed(self, kind: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = self.link.run(fn, *args, **kwargs)
        ms = (time.perf_counter() - started) * 1e3
        n = len(out) if isinstance(out, list | set) else int(out is not None)
        self.sample(kind, ms, n)
        return out

    def as_me(self, kind: str, fn: Any, **kwargs: Any) -> Any:
        """One of the worker's statements about its own claims (claim, complete, release),
        timed: they all name this worker."""
        return self.timed(kind, fn, worker_id=self.worker_id, **kwargs)

    def _on_connect(self, conn: Any) -> None:
        self.wake.lost_session()
        if self.shape.wake == "listen":
            queue.listen(conn)
            self.wake.listening = True

    def wake_up(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self.wake_w.send(b"\0")

    # start-up, as the worker's step_start
    def setup(self) -> None:
        self.liveness = Liveness(self.shape.lease_s)  # owned by this thread: its main loop
        with self.host.connect_slots:
            conn = self.link.connect_now()
            device_id = queue.register_device(conn, self.device)
            self.secret = queue.register_worker(
                conn,
                worker_id=self.worker_id,
                host=self.node,
                pid=os.getpid(),
                device_id=device_id,
                device_class=self.device.device_class,
                version=__version__,
                capacity=self.capacity,
            )
            got = queue.take_device(
                conn, worker_id=self.worker_id, secret=self.secret, index=self.device.index,
                lease_s=self.shape.lease_s,
            )  # fmt: skip
            if not got.taken:
                raise RuntimeError(f"device {self.node}/{self.device.index} is leased to another")
            self.report(conn)
        self.start_heartbeat()

    def start_heartbeat(self) -> None:
        if self.shape.sessions == 2:
            with self.host.connect_slots:
                beat_link = Link(self.host.urls[self.shape.pooled], self.host.db, "heartbeat")
                beat_link.connect_now()  # at once, so every session is counted from the start
            beat: TimedHeartbeat = LegacyHeartbeat(
                beat_link, worker_id=self.worker_id, worker_secret=self.secret,
                lease_s=self.shape.lease_s, interval_s=self.cadence.heartbeat_s,
                held=self.leases, on_lost=self.wake_up,
            )  # fmt: skip
        else:
            beat = TimedHeartbeat(
                self.link, worker_id=self.worker_id, worker_secret=self.secret,
                lease_s=self.shape.lease_s, interval_s=self.cadence.heartbeat_s,
                held=self.leases, on_lost=self.wake_up,
                liveness=self.liveness, holds_device=True, on_device_lost=self.wake_up,
            )  # fmt: skip
        beat.owner = self
        self.heartbeat = beat
        beat.start()

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
            if self.heartbeat.link is not self.link:
                self.heartbeat.link.close()
            self.heartbeat = None

    def report(self, conn: Any) -> None:
        queue.report_worker_sizing(
            conn,
            self.worker_id,
            self.secret,
            capacity=self.capacity,
            prepare_workers=1,
            prefetch=PREFETCH,
            sizing="auto",
            device_busy=None,
            peer_alive_s=60.0,
        )

    def run(self) -> None:
        try:
            self.setup()
        except Exception as exc:
            self.error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.ready.set()
            return
        self.ready.set()
        try:
            while not self.host.stopping:
                self.turn()
        except Exception as exc:
            self.error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        finally:
            self.shutdown()

    def held_count(self) -> int:
        return len(self.queued) + (self.running is not None) + len(self.finished)

    def duration(self, claim: queue.ClaimedTrial) -> float:
        d = float(claim.problem_args.get("duration", 0.01))
        cell = self.host.cell
        if cell["randomise"] and claim.run_id >= cell["first_run"]:
            if self.randomised_cell != cell["id"]:
                self.randomised_cell = cell["id"]
                d *= self.rng.random()
        return d

    def turn(self) -> None:
        if self.host.generation != self.generation:
            self.control(self.host.generation)
        if self.liveness is not None:
            self.liveness.stamp()
        now = time.monotonic()
        # collect, then start_next: the device never waits on the database
        if self.running is not None and now >= self.running[1]:
            self.finished.append((self.running[0], self.running[2]))
            # Device time: from its start for its length, however late it is collected.
            self.sample("busy", self.running[2], 1, at=self.running[3] + self.running[2])
            self.running = None
        if self.running is None and self.queued:
            claim = self.queued.popleft()
            d = self.duration(claim)
            self.running = (claim, now + d, d, now)
        try:
            self.complete_finished()
            if now >= self.next_reap:
                self.next_reap = now + self.cadence.reap_s
                self.timed("reap", queue.reap_expired_leases)
            room = self.capacity - self.held_count()
            if room > 0 and now >= self.next_claim:
                if self.claim(now, room):
                    return  # straight to the next turn: start it, claim the rest
            if now >= self.next_report:
                self.next_report = now + self.cadence.report_s
                self.timed("report", self.report)
        except DatabaseDown:
            pass
        self.wait()

    def claim(self, now: float, room: int) -> bool:
        """The worker's claim step: LISTEN first when it is idle, UNLISTEN once it holds a
        trial again (the "listen" shape listens all the time)."""
        listen_first = self.wake.wants_listen(self.held_count())
        claims = self.as_me(
            "claim",
            queue.claim_trials,
            secret=self.secret,
            device_classes=self.classes,
            limit=room,
            lease_s=self.shape.lease_s,
            listen_first=listen_first,
        )
        if listen_first:
            self.wake.listening = True
            self.sample("listen", 0.0)
        for c in claims:
            self.queued.append(c)
            self.leases.add(c.key)
        self.next_claim = self.wake.after_claim(now, len(claims), room, self.held_count())
        if self.shape.wake != "listen" and self.wake.wants_unlisten(self.held_count()):
            self.link.run(queue.unlisten)
            self.wake.listening = False
            self.sample("unlisten", 0.0)
        return bool(claims)

    def complete_finished(self) -> None:
        while self.finished:
            claim, _ = self.finished[0]
            t = objective(claim.config)
            state = self.as_me(
                "complete",
                queue.complete_trial,
                trial_id=claim.trial_id,
                attempt=claim.attempt,
                token=claim.lease_token,
                state="done",
                measurement=queue.MeasurementRow(
                    median_s=t,
                    min_s=t,
                    samples_s=[t, t, t],
                    protocol=claim.protocol,
                    gflops=FLOP_COUNT / t / 1e9,
                    flop_count=FLOP_COUNT,
                    compile_s=0.0,
                    versions={"tunefleet": __version__, "simulated": True},
                ),
            )
            self.finished.pop(0)
            self.leases.remove(claim.key)
            if state is not None:
                self.sample("done", 0.0, claim.run_id)
            self.next_claim = 0.0

    def wait(self) -> None:
        now = time.monotonic()
        deadlines = [self.next_reap, self.next_report, now + POLL_S, now + self.shape.lease_s / 2]
        if self.running is not None:
            deadlines.append(self.running[1])
        if self.held_count() < self.capacity:
            deadlines.append(self.next_claim)
        timeout = max(0.0, min(deadlines) - now)
        conn = self.link.conn if self.link.up and self.wake.listening else None
        waitables: list[Any] = [self.wake_r] + ([conn] if conn is not None else [])
        ready = wait_any(waitables, timeout=timeout)
        if self.wake_r in ready:
            with contextlib.suppress(BlockingIOError, OSError):
                while self.wake_r.recv(4096):
                    pass
        if conn is not None and conn in ready:
            payloads = self.link.notifies()
            if payloads:
                self.sample("notify", 0.0, len(payloads))
            if any(not p or p in self.classes for p in payloads):
                self.next_claim = self.wake.woken(time.monotonic())

    def control(self, generation: int) -> None:
        """A command of the host: end the cell (release everything held) or take another
        shape (reconnect); then acknowledge."""
        self.generation = generation
        command, arg = self.host.command
        try:
            if command in ("end_cell", "stop"):
                self.complete_finished()
                held = [c.key for c in self.queued]
                if self.running is not None:
                    held.insert(0, self.running[0].key)  # claim order, as the worker's
                    # The part of the trial timed so far (the window may end inside it).
                    self.sample("busy", time.monotonic() - self.running[3], 1)
                for k in held:
                    self.leases.remove(k)  # first, or a heartbeat in flight calls them lost
                if held:
                    self.as_me("release", queue.release_trials, held=held)
                self.queued.clear()
                self.running = None
                self.next_claim = 0.0
            elif command == "reshape" and arg != self.shape.name:
                self.stop_heartbeat()
                self.link.close()
                self.shape = SHAPES[arg]
                self.cadence = cadence(self.shape.lease_s)
                self.link = self._link()
                self.wake = self._wakeups()
                with self.host.connect_slots:
                    self.link.connect_now()
                self.start_heartbeat()
                self.next_claim = 0.0
        except DatabaseDown:
            pass
        self.acked = generation

    def shutdown(self) -> None:
        heartbeat = self.heartbeat
        with contextlib.suppress(Exception):
            self.stop_heartbeat()
        with contextlib.suppress(Exception):
            if self.secret:
                self.link.run(queue.stop_worker, self.worker_id, self.secret)
        self.link.close()
        if heartbeat is not None and heartbeat.link is not self.link:
            heartbeat.link.close()
        self.acked = self.host.generation
        self.wake_r.close()
        self.wake_w.close()


# --- a host process: many virtual workers ------------------------------------------------------
class Host:
    def __init__(self, name: str, urls: dict[bool, str]) -> None:
        self.name = name
        #: The database, directly (False) and through the pooler (True, where there is one).
        self.urls = urls
        self.db = DatabaseSettings.build(
            urls[False], application_name=APPLICATION, behind_pooler=True
        )
        self.workers: list[VirtualWorker] = []
        self.stopping = False
        self.generation = 0
        self.command: tuple[str, Any] = ("", None)
        self.cell: dict[str, Any] = {"id": -1, "first_run": 0, "randomise": False}
        # Connections are made a few at a time: a backlog of thousands of forks at once
        # only times out.
        self.connect_slots = threading.BoundedSemaphore(4)
        self.lag: list[tuple[str, float, float, int]] = []
        threading.Thread(target=self._probe_lag, name="lag-probe", daemon=True).start()

    def _probe_lag(self) -> None:
        """How late a thread of this process wakes from a 5 ms sleep (GIL and run queue)."""
        while not self.stopping:
            t = time.perf_counter()
            time.sleep(0.005)
            self.lag.append(("lag", time.monotonic(), (time.perf_counter() - t - 0.005) * 1e3, 0))

    def grow(self, count: int, shape: str) -> dict[str, Any]:
        start = len(self.workers)
        new = [VirtualWorker(self, start + i, SHAPES[shape]) for i in range(count)]
        for w in new:
            w.start()
        for w in new:
            w.ready.wait(600)
        failed = [w.error for w in new if w.error]
        self.workers.extend(w for w in new if not w.error)
        return {"workers": len(self.workers), "failed": len(failed), "errors": failed[:3]}

    def broadcast(self, command: str, arg: Any = None, timeout: float = 300.0) -> None:
        self.command = (command, arg)
        self.generation += 1
        for w in self.workers:
            w.wake_up()
        deadline = time.monotonic() + timeout
        for w in self.workers:
            while w.acked < self.generation and w.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)

    def backend_pids(self) -> list[tuple[int, int]]:
        """(server pid, worker number) of every direct session of the virtual workers."""
        out = []
        for w in self.workers:
            if w.shape.pooled:
                continue
            for link in (w.link, w.heartbeat.link if w.heartbeat is not None else None):
                if link is not None and link.conn is not None and not link.conn.closed:
                    out.append((link.conn.info.backend_pid, w.index))
        return out

    def take_samples(self) -> list[tuple[str, float, float, int]]:
        out, self.lag = self.lag, []
        for w in self.workers:
            taken, w.samples = w.samples, []
            out.extend(taken)
        return out


def host_main(pipe: Pipe, name: str, urls: dict[bool, str]) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    threading.stack_size(256 * 1024)
    host = Host(name, urls)
    while True:
        command, arg = pipe.recv()
        if command == "grow":
            count, shape = arg
            pipe.send(host.grow(int(count), str(shape)))
        elif command == "cell":
            host.cell = dict(arg)
            pipe.send({"ok": True})
        elif command in ("end_cell", "reshape"):
            host.broadcast(command, arg)
            pipe.send({"samples": host.take_samples()})
        elif command == "pids":
            pipe.send({"pids": host.backend_pids()})
        elif command == "errors":
            pipe.send({"errors": [w.error for w in host.workers if w.error][:3]})
        elif command == "stop":
            host.stopping = True
            host.broadcast("stop")
            for w in host.workers:
                w.join(30)
            with contextlib.suppress(Exception):
                pipe.send({"ok": True})
            return


class Fleet:
    """The host processes, driven from the benchmark's process."""

    def __init__(self, urls: dict[bool, str], procs: int) -> None:
        ctx = mp.get_context("spawn")
        self.pipes: list[Pipe] = []
        self.procs: list[Any] = []
        for i in range(procs):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=host_main, args=(child, f"sim{i}", urls), daemon=True)
            p.start()
            self.pipes.append(parent)
            self.procs.append(p)
        self.size = 0
        self.shape = ""

    def ask(self, command: str, args: Sequence[Any] | None = None) -> list[Any]:
        for i, pipe in enumerate(self.pipes):
            pipe.send((command, None if args is None else args[i]))
        return [pipe.recv() for pipe in self.pipes]

    def reshape(self, shape: str) -> None:
        """Every virtual worker takes ``shape`` (reconnecting where its route changes)."""
        if self.size and shape != self.shape:
            self.ask("reshape", [shape] * len(self.pipes))
        self.shape = shape

    def grow(self, n: int, shape: str) -> None:
        self.reshape(shape)
        if n <= self.size:
            return
        add = n - self.size
        share = [
            add // len(self.pipes) + (i < add % len(self.pipes)) for i in range(len(self.pipes))
        ]
        replies = self.ask("grow", [(k, shape) for k in share])
        failed = sum(r["failed"] for r in replies)
        if failed:
            errors = [e for r in replies for e in r["errors"]]
            raise SystemExit(f"{failed} virtual worker(s) could not start: {errors[0]}")
        self.size = sum(r["workers"] for r in replies)

    def samples(self, command: str = "end_cell") -> list[tuple[str, float, float, int]]:
        return [s for r in self.ask(command) for s in r["samples"]]

    def owners(self) -> dict[int, int]:
        """Server pid -> a number per virtual worker (unique over the hosts)."""
        out = {}
        for host, r in enumerate(self.ask("pids")):
            for pid, index in r["pids"]:
                out[int(pid)] = host * 1_000_000 + int(index)
        return out

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        """Ask every host to stop its workers (each releases what it holds and marks itself
        stopped), then make sure no host outlives the benchmark. Replies are not awaited: an
        interrupted command may have left one unread."""
        for pipe in self.pipes:
            with contextlib.suppress(Exception):
                pipe.send(("stop", None))
        deadline = time.monotonic() + 120
        for p in self.procs:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(10)


# --- the coordinator ---------------------------------------------------------------------------
class Coordinator(threading.Thread):
    """Keeps the cell's queue at the coordinator's target, as the coordinator's dispatch
    does: read the outcomes, top up, one NOTIFY per poll."""

    def __init__(self, url: str, n: int, capacity: int, duration: float, name: str) -> None:
        super().__init__(name="coordinator", daemon=True)
        self.conn = connect(url)
        self.n, self.capacity, self.duration, self.name = n, capacity, duration, name
        self.coordinator_id = uuid.uuid4()
        self.configs = h.synthetic_configs()
        self.runs: list[int] = []
        self.inserted: dict[int, int] = {}
        self.finished: dict[int, int] = {}
        self.halt = threading.Event()
        self.rate = 0.0
        self.polls = 0
        #: When each NOTIFY went out (one per poll that inserted trials).
        self.notified: list[float] = []
        self.new_run()

    def new_run(self) -> int:
        run_id = h.create_synthetic_run(
            self.conn, {"duration": self.duration}, f"{self.name}/{len(self.runs)}"
        )
        search.take_run(self.conn, run_id, self.coordinator_id)
        self.runs.append(run_id)
        self.inserted[run_id] = self.finished[run_id] = 0
        return run_id

    def run(self) -> None:
        last = time.monotonic()
        while not self.halt.is_set():
            done = 0
            for run_id in self.runs:
                if self.finished[run_id] < self.inserted[run_id]:
                    got = len(search.fetch_unreported(self.conn, run_id))
                    self.finished[run_id] += got
                    done += got
            now = time.monotonic()
            if now > last:
                self.rate = 0.7 * self.rate + 0.3 * done / (now - last)
            last = now
            open_ = sum(self.inserted[r] - self.finished[r] for r in self.runs)
            target = queue_target(
                self.n,
                DEPTH_FACTOR,
                MIN_DEPTH,
                capacity=self.n * self.capacity,
                rate=self.rate,
                poll_s=COORDINATOR_POLL_S,
            )
            need = target - open_
            if need > 0:
                with self.conn.transaction():  # one NOTIFY per poll, however many runs
                    while need > 0:
                        run_id = self.runs[-1]
                        if self.inserted[run_id] >= len(self.configs):
                            run_id = self.new_run()
                        start = self.inserted[run_id]
                        take = self.configs[start : start + need]
                        search.insert_trials(
                            self.conn,
                            run_id,
                            "any",
                            [{"config": c, "config_hash": config_hash(c)} for c in take],
                        )
                        self.inserted[run_id] += len(take)
                        need -= len(take)
                self.notified.append(time.monotonic())
            self.polls += 1
            self.halt.wait(COORDINATOR_POLL_S)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        for run_id in self.runs:
            search.finish_run(self.conn, run_id, self.coordinator_id, "benchmark cell ended")
            search.cancel_pending(self.conn, run_id)
        self.conn.close()


# --- measuring ---------------------------------------------------------------------------------
class ActivitySampler(threading.Thread):
    """Samples what the virtual workers' server sessions do (``capacity.activity``) every
    ``interval_s`` on its own session, for the window of one cell: which statement each
    session runs, and what it waits on. Over a window, the mean number of sessions active in
    one kind of statement divided by that statement's rate is its mean time inside the
    server (Little's law), to hold against the time the client measured."""

    def __init__(
        self, url: str, interval_s: float, owners: dict[int, int], console: str | None = None
    ) -> None:
        super().__init__(name="activity-sampler", daemon=True)
        self.conn = connect(url)
        #: PgBouncer's admin console (pooled cells): its pool of this database is sampled.
        self.console = psycopg.connect(console, autocommit=True) if console else None
        self.database = str(psycopg.conninfo.conninfo_to_dict(url).get("dbname", ""))
        self.pools: list[dict[str, Any]] = []
        self.interval_s = interval_s
        #: server pid -> the virtual worker (a number) whose session it serves
        self.owners = owners
        self.blocks: collections.Counter[tuple[str, str, str, str, str]] = collections.Counter()
        self.lock_samples = 0
        self.halt = threading.Event()
        self.samples = 0
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.seconds = 0.0

    def run(self) -> None:
        started = time.monotonic()
        last_blockers = -math.inf
        while not self.halt.is_set():
            t = time.monotonic()
            for r in capacity.activity(self.conn, APPLICATION):
                self.counts[(str(r["statement"]), str(r["state"]), str(r["wait"]))] += int(
                    r["count"]
                )
            self.samples += 1
            if self.console is not None:
                self.pools.extend(capacity.pooler_pools(self.console, self.database))
            waiting = any(k[2].startswith("Lock:") for k in self.counts)
            if waiting and t - last_blockers >= BLOCKERS_EVERY_S:
                last_blockers = t
                self.lock_samples += 1
                for r in capacity.lock_waits(self.conn, APPLICATION):
                    mine = self.owners.get(int(r["pid"]))
                    theirs = self.owners.get(int(r["blocker_pid"]))
                    whose = (
                        "the same worker's other session"
                        if mine is not None and mine == theirs
                        else "another worker"
                        if theirs is not None
                        else "not a worker"
                    )
                    key = (str(r["statement"]), str(r["lock"]), str(r["blocker_statement"]),
                           f"{r['blocker_state']} {r['blocker_wait']}".strip(), whose)  # fmt: skip
                    self.blocks[key] += 1
            self.halt.wait(max(0.0, self.interval_s - (time.monotonic() - t)))
        self.seconds = time.monotonic() - started

    def stop(self) -> dict[str, Any]:
        self.halt.set()
        self.join(30)
        self.conn.close()
        if self.console is not None:
            self.console.close()
        n = max(1, self.samples)
        active = {k: v for k, v in self.counts.items() if k[1] == "active"}
        total_active = sum(active.values())
        by_wait: collections.Counter[str] = collections.Counter()
        by_statement: collections.Counter[str] = collections.Counter()
        for (statement, _, wait), v in active.items():
            by_wait[wait or "CPU"] += v
            by_statement[statement] += v
        return {
            "samples": self.samples,
            "interval_s": self.interval_s,
            "mean_active": total_active / n,
            "mean_active_by_statement": {k: v / n for k, v in by_statement.most_common()},
            # Shares of the active samples: what a session that runs a statement waits on
            # ("CPU": on a core or waiting for one).
            "active_share_by_wait": {
                k: v / total_active for k, v in by_wait.most_common() if total_active
            },
            "active_by_statement_and_wait": [
                {"statement": s, "wait": w or "CPU", "mean_sessions": v / n}
                for (s, _, w), v in sorted(active.items(), key=lambda kv: -kv[1])[:25]
            ],
            # Heavyweight lock waits, sampled about once a second: who waits for whom.
            "lock_wait_samples": self.lock_samples,
            "lock_waits": [
                {
                    "statement": s,
                    "lock": lock,
                    "blocker_statement": b,
                    "blocker_doing": doing,
                    "blocker": whose,
                    "mean_sessions": v / max(1, self.lock_samples),
                }
                for (s, lock, b, doing, whose), v in self.blocks.most_common(20)
            ],
            # PgBouncer's pool of the fleet's database (pooled cells): clients waiting for a
            # server connection, server connections in use, the longest wait.
            "pooler": {
                "samples": len(self.pools),
                "clients_waiting_mean": _mean([p["cl_waiting"] for p in self.pools]),
                "clients_waiting_max": max((p["cl_waiting"] for p in self.pools), default=None),
                "server_active_mean": _mean([p["sv_active"] for p in self.pools]),
                "server_active_max": max((p["sv_active"] for p in self.pools), default=None),
                "server_connections_max": max(
                    (
                        p["sv_active"]
                        + p["sv_idle"]
                        + p["sv_used"]
                        + p["sv_tested"]
                        + p["sv_login"]
                        for p in self.pools
                    ),
                    default=None,
                ),
                "max_wait_ms": max(
                    (1e3 * p["maxwait"] + p["maxwait_us"] / 1e3 for p in self.pools),
                    default=None,
                ),
            }
            if self.console is not None
            else None,
            "mean_sessions_by_state": {
                state: sum(v for k, v in self.counts.items() if k[1] == state) / n
                for state in sorted({k[1] for k in self.counts})
            },
        }


def proc_cpu_s(pids: Sequence[int], children: bool = False) -> float:
    """User + system CPU seconds of these processes (with their reaped children's)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
        if children:
            total += int(fields[13]) + int(fields[14])
    return total / tick


def postmaster_pid(conn: Any) -> int:
    pid = capacity.backend_pid(conn)
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def server_memory(postmaster: int) -> dict[str, float]:
    procs = h.descendants(postmaster)
    mem = [h.process_memory(p) for p in procs]
    return {
        "processes": len(procs),
        "pss_mib": sum(m["pss"] for m in mem),
        "rss_mib": sum(m["rss"] for m in mem),
    }


def session_counts(conn: Any) -> dict[str, Any]:
    rows = capacity.sessions(conn)
    total = sum(int(r["count"]) for r in rows)
    workers = sum(
        int(r["count"]) for r in rows if r["here"] and r["application_name"] == APPLICATION
    )
    by_state: dict[str, int] = collections.Counter()
    for r in rows:
        by_state[str(r["state"]) or "?"] += int(r["count"])
    return {"total": total, "workers": workers, "by_state": dict(by_state)}


def measure_cell(
    url: str,
    conn: Any,
    fleet: Fleet,
    postmaster: int,
    plan: Cell,
    args: argparse.Namespace,
    cell_id: int,
    started: float,
    idle_pss: float,
    console: str | None,
) -> dict[str, Any]:
    n, duration, shape = plan.workers, plan.duration, SHAPES[plan.shape]
    coordinator = Coordinator(url, n, 1 + PREFETCH, duration, f"fleet_sim N={n} T={duration:g}")
    fleet.ask(
        "cell",
        [{"id": cell_id, "first_run": coordinator.runs[0], "randomise": True}] * len(fleet.pipes),
    )
    k = max(1, round(args.window / duration))
    window = k * duration
    t_start = time.monotonic()
    coordinator.start()
    time.sleep(args.warmup)
    # The CPU counters are read around the window, which is exact: scanning the server's
    # thousands of processes takes a moment on a loaded machine.
    cpu = h.CpuMeter()
    cpu.start()
    c0 = time.monotonic()
    server0, load0 = proc_cpu_s(h.descendants(postmaster), children=True), proc_cpu_s(fleet.pids())
    t0 = time.monotonic()
    t1 = t0 + window
    sampler = (
        ActivitySampler(url, args.sample_s, fleet.owners(), console if shape.pooled else None)
        if args.sample_s > 0
        else None
    )
    if sampler is not None:
        sampler.start()
    time.sleep(window)
    activity = sampler.stop() if sampler is not None else None
    server1, load1 = proc_cpu_s(h.descendants(postmaster), children=True), proc_cpu_s(fleet.pids())
    cpu_span = time.monotonic() - c0
    busy = cpu.stop()
    sessions_now = session_counts(conn)
    memory = server_memory(postmaster)
    memory["pss_per_session_mib"] = (memory["pss_mib"] - idle_pss) / max(1, sessions_now["total"])
    coordinator.stop()
    samples = fleet.samples("end_cell")
    cell_runs = set(coordinator.runs)
    inside = [s for s in samples if t0 <= s[1] <= t1]
    done = [s for s in inside if s[0] == "done" and s[3] in cell_runs]
    busy_s = sum(
        max(0.0, min(t, t1) - max(t - d, t0)) for kind, t, d, _ in samples if kind == "busy"
    )
    lat = {
        kind: h.summary([s[2] for s in inside if s[0] == kind and (kind != "claim" or s[3] > 0)])
        for kind in ("claim", "complete", "heartbeat", "reap", "report")
    }
    empty_claims = sum(1 for s in inside if s[0] == "claim" and s[3] == 0)
    first_claims = [s[1] - t_start for s in samples if s[0] == "claim" and s[3] > 0]
    statements = sum(1 for s in inside if s[0] in ("claim", "complete", "reap", "report"))
    heartbeats = sum(1 for s in inside if s[0] == "heartbeat")
    listens = sum(1 for s in inside if s[0] in ("listen", "unlisten"))
    notifies = sum(1 for t in coordinator.notified if t0 <= t <= t1)
    delivered = sum(s[3] for s in inside if s[0] == "notify")
    trials = len(done)
    cell = {
        "workers": n,
        "shape": shape.name,
        "wake": shape.wake,
        "pooled": shape.pooled,
        "sessions_per_worker": shape.sessions,
        "duration_s": duration,
        "window_s": window,
        "warmup_s": args.warmup,
        "trials": trials,
        "trials_per_s": trials / window,
        "efficiency": busy_s / (n * window),
        "efficiency_by_count": trials * duration / n / window,
        "claim_ms": lat["claim"],
        "complete_ms": lat["complete"],
        "heartbeat_ms": lat["heartbeat"],
        "reap_ms": lat["reap"],
        "report_ms": lat["report"],
        "empty_claims": empty_claims,
        # A heartbeat is one statement (two in the two-session shape); LISTEN and UNLISTEN
        # count (a LISTEN goes in the claim's round trip).
        "worker_statements_per_s": (statements + shape.sessions * heartbeats + listens) / window,
        "statement_rates": {
            kind: sum(1 for s in inside if s[0] == kind) / window
            for kind in ("claim", "complete", "heartbeat", "reap", "report", "listen", "unlisten")
        },
        # The coordinator's NOTIFYs in the window, and the notifications the virtual workers
        # received: how many clients one NOTIFY woke.
        "notifies": notifies,
        "notifications_delivered": delivered,
        "wakeups_per_notify": delivered / notifies if notifies else None,
        "first_claim_s": min(first_claims) if first_claims else None,
        "coordinator_polls": coordinator.polls,
        "runs": len(coordinator.runs),
        "server_cpu_cores": (server1 - server0) / cpu_span,
        "server_cpu_ms_per_trial": 1e3 * (server1 - server0) / cpu_span / (trials / window)
        if trials
        else None,
        "load_generator_cpu_cores": (load1 - load0) / cpu_span,
        "machine_cpu_busy": busy,
        "server_memory": memory,
        "sessions": sessions_now,
        "load_average": os.getloadavg(),
        # Scheduling delay inside the host processes (a thread asking to sleep 5 ms, late
        # by this much): the part of a client-measured latency that is the load generator's.
        "host_lag_ms": h.summary([s[2] for s in inside if s[0] == "lag"]),
        "activity": activity,
    }
    cell["top_wait"] = "-"
    if activity is not None and activity["active_share_by_wait"]:
        wait, share = next(iter(activity["active_share_by_wait"].items()))
        cell["top_wait"] = f"{wait} {share:.0%}"
    if activity is not None:
        # Little's law: mean sessions inside a statement / its rate = its mean time in the
        # server, beside the mean the clients measured.
        server_ms = {}
        for kind, functions in SAMPLED_STATEMENTS.items():
            rate = cell["statement_rates"].get(kind, 0.0)
            inside_server = sum(activity["mean_active_by_statement"].get(f, 0.0) for f in functions)
            client = lat[kind].get("mean")
            server_ms[kind] = {
                "server_mean_ms": 1e3 * inside_server / rate if rate else None,
                "client_mean_ms": client,
            }
        cell["server_vs_client_ms"] = server_ms
    print(
        f"[{h.elapsed(started)}] N={n} T={duration:g} {shape.name}: {trials} trials in "
        f"{window:g} s, efficiency {cell['efficiency']:.3f} (by count "
        f"{cell['efficiency_by_count']:.3f}), "
        f"claim p50/p99 {lat['claim'].get('median', math.nan):.1f}/"
        f"{lat['claim'].get('p99', math.nan):.1f} ms, complete p50/p99 "
        f"{lat['complete'].get('median', math.nan):.1f}/{lat['complete'].get('p99', math.nan):.1f}"
        f" ms, server {cell['server_cpu_cores']:.2f} cores {memory['pss_mib']:.0f} MiB PSS, "
        f"{sessions_now['workers']} worker sessions, woken per NOTIFY "
        f"{h.fmt(cell['wakeups_per_notify'], 1)}, top wait {cell['top_wait']}",
        flush=True,
    )
    return cell


def sim_batch(conn: Any, fleet: Fleet, n: int, duration: float, ideal: float) -> dict[str, Any]:
    """fleet_scaling's batch, on the virtual fleet: warm-up, then N x ideal/T trials at once."""
    import fleet_scaling as fs

    fleet.ask("cell", [{"id": -1, "first_run": 0, "randomise": False}] * len(fleet.pipes))
    # fleet_scaling's warm-up: small batches until every worker has finished a trial.
    served: set[Any] = set()
    rounds = 0
    while len(served) < n and rounds < 8:
        rounds += 1
        warm = h.enqueue_synthetic(conn, 2 * n, {"duration": 0.05}, f"warm-up {rounds}")
        fs.wait_done(conn, warm, [], 120 + 2 * n)
        served |= {row["worker_id"] for row in bq.trials_per_worker(conn, warm)}
    per_worker = max(1, round(ideal / duration))
    trials = n * per_worker
    runs = h.enqueue_synthetic(conn, trials, {"duration": duration}, f"fleet_sim A/B N={n}")
    fs.wait_done(conn, runs, [], 60 + 5 * ideal)
    timing = bq.batch_timing(conn, runs)
    counts = [int(r["trials"]) for r in bq.trials_per_worker(conn, runs)]
    samples = fleet.samples("end_cell")
    wall = float(timing["wall_s"])
    ideal_s = trials * duration / n
    return {
        "duration_s": duration,
        "trials": trials,
        "done": int(timing["done"]),
        "ideal_s": ideal_s,
        "wall_s": wall,
        "efficiency": ideal_s / wall if wall > 0 else None,
        "first_claim_s": timing["first_claim_s"],
        "trials_per_worker": {"min": min(counts, default=0), "max": max(counts, default=0)},
        "warm_up_rounds": rounds,
        "claim_ms": h.summary([s[2] for s in samples if s[0] == "claim" and s[3] > 0]),
        "complete_ms": h.summary([s[2] for s in samples if s[0] == "complete"]),
    }


def real_batch(url: str, n: int, duration: float, ideal: float) -> dict[str, Any]:
    """fleet_scaling's own measurement of N real worker processes."""
    import fleet_scaling as fs

    fs_args = fs.parse_args(
        [
            "--workers",
            str(n),
            "--durations",
            f"{duration:g}",
            "--ideal-seconds",
            f"{ideal:g}",
            "--prefetch",
            str(PREFETCH),
            "--prepare-workers",
            "0",
        ]
    )
    log_root = Path(tempfile.mkdtemp(prefix="tunefleet-fleet-sim-logs-"))
    try:
        fleet = fs.measure_fleet(url, n, fs_args, log_root)
    finally:
        shutil.rmtree(log_root, ignore_errors=True)
    (batch,) = fleet["batches"]
    return {**batch, "memory_mib": {"pss_per_worker": fleet["memory_mib"]["pss_per_worker"]}}


# --- the server --------------------------------------------------------------------------------
def needed_connections(cells: Sequence[Cell], pool_size: int) -> int:
    """Server sessions the plan needs: the direct sessions of the largest direct fleet, the
    pooler's, the coordinator, this script's monitors and the reserved ones."""
    direct = [c.workers * SHAPES[c.shape].sessions for c in cells if not SHAPES[c.shape].pooled]
    pooled = any(SHAPES[c.shape].pooled for c in cells)
    return max(direct, default=0) + (pool_size if pooled else 0) + 100


@contextlib.contextmanager
def fleet_database(url: str | None, need: int) -> Iterator[tuple[str, str, dict[str, str]]]:
    """A database at the schema head whose server takes ``need`` sessions: ``url`` (refused
    with the setting to raise if it cannot), or a private embedded server started with
    ``max_connections`` raised (a restart: it is fixed at server start). Yields the URL, a
    superuser URL of the server (for the pooler) and the server's settings."""
    if url:
        with h.database(url) as u, connect(u) as conn:
            settings = capacity.server_settings(conn)
        if int(settings["max_connections"]) < need:
            raise SystemExit(
                f"the server at --db allows max_connections = {settings['max_connections']}; "
                f"the fleet needs {need}: raise it (ALTER SYSTEM SET max_connections and "
                "restart) or choose smaller --workers"
            )
        yield url, url, settings
        return
    from tunefleet.db.embedded import EmbeddedServer
    from tunefleet.db.migrate import upgrade

    base = Path(tempfile.mkdtemp(prefix="tunefleet-fleet-sim-"))
    base.chmod(0o755)
    server = EmbeddedServer(base / "postgres" / "data")
    with h.sigterm_unwinds():
        try:
            server.start()
            with connect(server.admin_url()) as conn:
                capacity.alter_system(conn, "max_connections", str(need))
            server.stop()
            server.start()
            local = server.local_url()
            upgrade(local)
            with connect(local) as conn:
                settings = capacity.server_settings(conn)
            yield local, server.admin_url(), settings
        finally:
            with contextlib.suppress(Exception):
                server.stop()
            shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def fleet_pooler(
    admin_url: str, url: str, args: argparse.Namespace, clients: int
) -> Iterator[tuple[str | None, str | None, str | None]]:
    """PgBouncer in transaction mode in front of the fleet's database, when a cell needs
    one: (the database through it, its admin console, its version), else Nones."""
    if clients <= 0:
        yield None, None, None
        return
    from tests.helpers.pgbouncer import find_pgbouncer, pgbouncer

    binary = args.pgbouncer or find_pgbouncer()
    if binary is None:
        raise SystemExit("a pooled cell needs PgBouncer: install it or pass --pgbouncer PATH")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    settings = {
        "admin_users": psycopg.conninfo.conninfo_to_dict(admin_url)["user"],
        # The pool is the only limit on server connections: no reserve pool on top.
        "reserve_pool_size": 0,
        "max_db_connections": args.pool_size,
    }
    with pgbouncer(
        admin_url,
        "transaction",
        pool_size=args.pool_size,
        max_client_conn=clients + 200,
        binary=binary,
        settings=settings,
    ) as bouncer:
        console = f"postgresql://{bouncer.user}@127.0.0.1:{bouncer.port}/pgbouncer"
        yield bouncer.url(url), console, (version.stdout or version.stderr).splitlines()[0]


# --- main --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    workers: int
    duration: float
    shape: str


def plan(args: argparse.Namespace) -> list[Cell]:
    """The cells in the order they run: ``--cells`` as given, else every N (ascending) x
    shape x T. The fleet only grows, so N never decreases."""
    if args.cells:
        cells = []
        for item in args.cells.split(","):
            n, t, shape = item.split(":")
            cells.append(Cell(int(n), float(t), shape))
    else:
        sizes = sorted(int(x) for x in args.workers.split(","))
        shapes = args.shapes.split(",")
        durations = [float(x) for x in args.durations.split(",")]
        cells = [Cell(n, t, s) for n in sizes for s in shapes for t in durations]
    for c in cells:
        if c.shape not in SHAPES:
            raise SystemExit(f"unknown shape {c.shape!r}; choose from {', '.join(SHAPES)}")
    if any(b.workers < a.workers for a, b in itertools.pairwise(cells)):
        raise SystemExit("--cells: the fleet only grows, list the cells by N ascending")
    return cells


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cells = plan(args)
    durations = sorted({c.duration for c in cells})
    started = time.monotonic()
    out: dict[str, Any] = {
        "benchmark": NAME,
        "command": " ".join(["python", "benchmarks/fleet_sim.py", *(argv or sys.argv[1:])]),
        "machine": h.machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "worker_model": {
            "lease_s": LEASE_S,
            "cadence_by_shape": {
                s.name: {"lease_s": s.lease_s, **dataclasses.asdict(cadence(s.lease_s))}
                for s in SHAPES.values()
            },
            "poll_s": POLL_S,
            "prefetch": PREFETCH,
            "coordinator_poll_s": COORDINATOR_POLL_S,
        },
        "shapes": {s.name: s.about for s in SHAPES.values()},
        "cells": [],
        "skipped": [],
    }
    pooled_clients = max((c.workers for c in cells if SHAPES[c.shape].pooled), default=0)
    need = needed_connections(cells, args.pool_size)
    with (
        fleet_database(args.db, need) as (url, admin_url, settings),
        fleet_pooler(admin_url, url, args, pooled_clients) as (pooled, console, bouncer),
    ):
        out["postgresql"] = h.server_version(url)
        out["server_settings"] = settings
        out["pgbouncer"] = bouncer and {"version": bouncer, "pool_size": args.pool_size}
        with connect(url) as conn:
            postmaster = postmaster_pid(conn)
            out["idle_server_memory"] = server_memory(postmaster)
            idle = out["idle_server_memory"]["pss_mib"]
            if not args.no_ab:
                print(f"[{h.elapsed(started)}] A/B: {args.ab_workers} real workers", flush=True)
                real = real_batch(url, args.ab_workers, args.ab_duration, args.ab_ideal)
            urls = {False: url, True: pooled or url}
            fleet = Fleet(urls, max(1, args.procs))
            try:
                if not args.no_ab:
                    fleet.grow(args.ab_workers, "one")
                    sim = sim_batch(conn, fleet, args.ab_workers, args.ab_duration, args.ab_ideal)
                    gap = abs(sim["efficiency"] - real["efficiency"]) / real["efficiency"]
                    out["ab"] = {"workers": args.ab_workers, "real": real, "simulated": sim,
                                 "relative_difference": gap}  # fmt: skip
                    print(
                        f"[{h.elapsed(started)}] A/B N={args.ab_workers} T={args.ab_duration:g}: "
                        f"real {real['efficiency']:.3f}, simulated {sim['efficiency']:.3f} "
                        f"({100 * gap:.1f} % apart)",
                        flush=True,
                    )
                for cell_id, c in enumerate(cells):
                    shape = SHAPES[c.shape]
                    reason = memory_refusal(out, c.workers, shape, args.memory_share)
                    if reason is None:
                        reason = saturation_refusal(out, c, args.all_cells)
                    if reason:
                        print(f"[{h.elapsed(started)}] skipped:", reason, flush=True)
                        out["skipped"].append(
                            {"workers": c.workers, "duration_s": c.duration, "shape": c.shape,
                             "reason": reason}
                        )  # fmt: skip
                        continue
                    if (c.workers, c.shape) != (fleet.size, fleet.shape):
                        grow_started = time.monotonic()
                        fleet.grow(c.workers, c.shape)
                        print(
                            f"[{h.elapsed(started)}] N={c.workers} {c.shape}: fleet up "
                            f"({time.monotonic() - grow_started:.1f} s to grow or reshape)",
                            flush=True,
                        )
                    out["cells"].append(
                        measure_cell(
                            url, conn, fleet, postmaster, c, args, cell_id, started, idle,
                            console,
                        )
                    )  # fmt: skip
                    # Each cell's numbers are kept at once: a run cut short keeps what it had.
                    h.write_json(NAME, {**out, "partial": True}, args.out)
            finally:
                fleet.stop()
    out["model"] = fit_model(out, [int(x) for x in args.predict.split(",") if x], durations)
    out["wall_s"] = time.monotonic() - started
    print_table(out)
    h.write_json(NAME, out, args.out)
    return 0


def fit_model(out: dict[str, Any], predict: Sequence[int], durations: Sequence[float]) -> Any:
    """Server CPU = ``a`` x trials per second + ``b`` x workers (least squares over the
    cells of the worker's own direct shape, ``one``, that did not saturate): ``a`` is the
    server's CPU per trial (claim, completion, the coordinator's insert and read), ``b`` what
    a worker costs it per second while it waits (its heartbeats, reaper turns, sizing
    reports, polls). Memory: the server's proportional memory per session. Predictions for
    fleets not measured here."""
    cells = [c for c in out["cells"] if c["efficiency"] >= SATURATED and c["shape"] == "one"]
    if len(cells) < 2:
        return None
    xs = [(c["trials_per_s"], float(c["workers"])) for c in cells]
    ys = [c["server_cpu_cores"] for c in cells]
    s_rr = sum(r * r for r, _ in xs)
    s_rn = sum(r * n for r, n in xs)
    s_nn = sum(n * n for _, n in xs)
    s_ry = sum(r * y for (r, _), y in zip(xs, ys, strict=True))
    s_ny = sum(n * y for (_, n), y in zip(xs, ys, strict=True))
    det = s_rr * s_nn - s_rn * s_rn
    if det == 0:
        return None
    a = (s_ry * s_nn - s_ny * s_rn) / det
    b = (s_ny * s_rr - s_ry * s_rn) / det
    per_session = max(c["server_memory"]["pss_per_session_mib"] for c in cells)
    predictions = [
        {
            "workers": n,
            "duration_s": t,
            "trials_per_s": n / t,
            "server_cpu_cores": a * n / t + b * n,
            "sessions": n,
            "server_memory_gib": n * per_session / 1024,
        }
        for n in predict
        for t in durations
    ]
    for p in predictions:
        print(
            f"model: N={p['workers']} T={p['duration_s']:g}: {p['trials_per_s']:.0f} trials/s, "
            f"server {p['server_cpu_cores']:.1f} cores (of this machine's), {p['sessions']} "
            f"sessions, {p['server_memory_gib']:.1f} GiB"
        )
    return {
        "server_cpu_ms_per_trial": 1e3 * a,
        "server_cpu_ms_per_worker_second": 1e3 * b,
        "server_pss_mib_per_session": per_session,
        "cells_fitted": len(cells),
        "predictions": predictions,
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


#: Seconds between two samples of the lock waits (``pg_blocking_pids`` is not free).
BLOCKERS_EVERY_S = 1.0

#: The worker statements of each timed kind, as ``capacity.activity`` names them.
SAMPLED_STATEMENTS = {
    "claim": ("claim_trials",),
    "complete": ("complete_trial",),
    "heartbeat": ("heartbeat_trials", "heartbeat_worker", "heartbeat"),
    "reap": ("reap_expired_leases",),
    "report": ("report_worker_sizing",),
}

#: A cell whose efficiency is below this saturated the machine.
SATURATED = 0.8


def saturation_refusal(out: dict[str, Any], cell: Cell, every: bool) -> str | None:
    """Why ``cell`` would only saturate the machine again (None: measure it): a smaller
    fleet of its shape saturated it at this trial length, or the fleet needs more trials per
    second than the most a saturated cell of its shape carried. Such cells cost minutes of
    every core and tell nothing the ceiling does not."""
    if every:
        return None
    saturated = [
        c for c in out["cells"] if c["efficiency"] < SATURATED and c["shape"] == cell.shape
    ]
    n, duration = cell.workers, cell.duration
    smaller = [c for c in saturated if c["duration_s"] == duration and c["workers"] < n]
    if smaller:
        c = smaller[0]
        return (
            f"N={n} T={duration:g} {cell.shape}: N={c['workers']} already saturated this machine "
            f"at T={duration:g} (efficiency {c['efficiency']:.2f}, {c['trials_per_s']:.0f} "
            "trials/s)"
        )
    if saturated:
        ceiling = max(c["trials_per_s"] for c in saturated)
        if n / duration > ceiling:
            return (
                f"N={n} T={duration:g} {cell.shape} needs {n / duration:.0f} trials/s, more "
                f"than the {ceiling:.0f} trials/s this machine carried when saturated"
            )
    return None


def memory_refusal(out: dict[str, Any], n: int, shape: Shape, share: float) -> str | None:
    """Why growing to ``n`` workers of ``shape`` would risk the machine's memory (None: it
    would not), from the server memory per session of the last cell. Workers behind the
    pooler add no server session."""
    import fleet_scaling as fs

    if not out["cells"] or shape.pooled:
        return None
    last = out["cells"][-1]
    sessions = int(last["sessions"]["total"])
    per_session = last["server_memory"]["pss_per_session_mib"]
    need = (shape.sessions * n + 2 - sessions) * per_session
    have = fs.available_mib()
    if need <= share * have:
        return None
    return (
        f"N={n} needs about {need:.0f} MiB more server memory ({per_session:.1f} MiB per "
        f"session), more than {share:.0%} of the {have:.0f} MiB available"
    )


def print_table(out: dict[str, Any]) -> None:
    rows = []
    for c in out["cells"]:
        rows.append(
            [
                c["workers"],
                c["shape"],
                f"{c['duration_s']:g}",
                h.fmt(c["trials_per_s"], 1),
                h.fmt(c["efficiency"]),
                h.fmt(c["claim_ms"].get("median"), 1),
                h.fmt(c["claim_ms"].get("p99"), 1),
                h.fmt(c["complete_ms"].get("median"), 1),
                h.fmt(c["complete_ms"].get("p99"), 1),
                h.fmt(c["heartbeat_ms"].get("p99"), 1),
                h.fmt(c["wakeups_per_notify"], 1),
                h.fmt(c["server_cpu_cores"], 2),
                h.fmt(c["server_cpu_ms_per_trial"], 1),
                h.fmt(c["load_generator_cpu_cores"], 2),
                h.fmt(c["server_memory"]["pss_mib"], 0),
                c["sessions"]["workers"],
                c["top_wait"],
            ]
        )
    print()
    print(
        h.table(
            [
                "N",
                "shape",
                "T s",
                "trials/s",
                "efficiency",
                "claim p50 ms",
                "claim p99 ms",
                "complete p50 ms",
                "complete p99 ms",
                "heartbeat p99 ms",
                "woken per NOTIFY",
                "server CPU cores",
                "server CPU ms/trial",
                "load gen. cores",
                "server PSS MiB",
                "server sessions",
                "top wait (share of active)",
            ],
            rows,
        )
    )
    ab = out.get("ab")
    if ab:
        print(
            f"\nA/B at N = {ab['workers']}, T = {ab['real']['duration_s']:g} s (fleet_scaling's "
            f"batch): real workers {ab['real']['efficiency']:.3f}, simulated "
            f"{ab['simulated']['efficiency']:.3f}, {100 * ab['relative_difference']:.1f} % apart"
        )


if __name__ == "__main__":
    sys.exit(main())
