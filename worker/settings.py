"""Worker settings: one frozen dataclass built once at the CLI (flag, then ``TUNEFLEET_*``
environment variable, then default).

Timeouts. A trial is evaluated under ``trial.timeout_s`` when the coordinator set one (it
adapts it to the run's best time); otherwise under the worker default ``timeout_s``, 120 s:
about four times the slowest evaluation we expect in practice (code generation + build +
validation + timing of a loopy kernel is 1-30 s), so a legitimately slow configuration is not
cut off while a hung kernel still frees the device within two minutes. One limit bounds a
whole evaluation (code generation, build, validation, timing): with code-generation processes
it is the larger of the trial's limit and ``timeout_s`` (the trial's limit follows the run's
best kernel time, not code generation), and the timing step gets what code generation left
of it, never more than the trial's limit; a cold build (a confirmation) gets it at once; with
``prepare_workers = 0`` the trial's limit covers both steps at once.

Sizing. ``prepare_workers`` and ``prefetch`` are ``None`` unless a flag or variable sets
them: the worker then sizes both itself (``tunefleet.worker.sizing``) from ``cores`` (``None``:
detected) shared with ``peers`` workers its launcher started on this host. An explicit value
always wins over the worker's own choice.

Leases. ``lease_s`` (default 30 s) is how long a claim survives without a heartbeat; the
heartbeat runs every ``lease_s / 3`` so two consecutive beats can be lost before the lease
expires. A shorter lease recovers a dead worker's trials sooner at the cost of more writes.
The worker's other background statements follow the lease too (:func:`cadence`), so a
large fleet halves its background traffic with ``--lease 90``: the reaper runs every half
lease, the sizing report every third of it (at least every 10 s). The heartbeat never waits
more than a third of ``WORKER_ALIVE_S``: the same beat keeps the worker row fresh, and a
longer gap would make coordinators and the dashboard count a working worker as gone.

Standing aside. ``stand_aside_after`` (K, default 3) is how many configurations of one run in a
row must end with the same unexplained error (an exception that is neither
``InvalidConfiguration`` nor a known environment error) before this worker calls it its
environment's fault and stands aside from the run, if no configuration of that run has reached
a verdict on this worker yet. One such error is often a configuration's own; two identical ones
in a row still happen by chance when a share of a space trips the same exception; three
distinct configurations failing identically before anything of the run worked here is what a
broken node looks like, and costs a healthy run at most two trials held a little longer.
0 turns the rule off (every such error counts against its trial at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tunefleet.errors import UsageError
from tunefleet.options.flags import MAX_CORES, MAX_PREFETCH, MAX_PREPARE_WORKERS
from tunefleet.settings import (
    WORKER_ALIVE_S,
    DatabaseSettings,
    bounded,
    non_negative_int,
    parse_bool,
    positive_float,
    positive_int,
    resolve,
)

DEFAULT_LEASE_S = 30.0
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_POLL_S = 5.0
DEFAULT_STAND_ASIDE_AFTER = 3
#: Shortest lease we accept: below it, heartbeats would compete with the work itself.
MIN_LEASE_S = 0.3
#: The sizing and busy fraction are reported at least this often (and when they change).
REPORT_EVERY_S = 10.0


@dataclass(frozen=True)
class Cadence:
    """How often a worker with a given lease sends each background statement, in seconds."""

    heartbeat_s: float
    reap_s: float
    report_s: float


def cadence(lease_s: float) -> Cadence:
    """The background intervals for ``lease_s`` (see the module docstring); the fleet
    simulation follows the same rule."""
    return Cadence(
        heartbeat_s=min(lease_s / 3.0, WORKER_ALIVE_S / 3.0),
        reap_s=max(lease_s / 2.0, 0.25),
        report_s=max(lease_s / 3.0, REPORT_EVERY_S),
    )


@dataclass(frozen=True)
class WorkerSettings:
    db: DatabaseSettings
    #: Device to serve: index, substring of platform/device name/class, or ``host``;
    #: ``None`` = the first GPU, else the first device.
    device: str | None = None
    #: Exit when no trial of our classes is pending or running and no live coordinator drives
    #: a run of them (instead of waiting for work).
    drain: bool = False
    #: Stop claiming after this many trials (``None`` = no limit).
    max_trials: int | None = None
    lease_s: float = DEFAULT_LEASE_S
    #: Evaluation timeout when the trial has none (see the module docstring).
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: Trials claimed ahead of the one being timed (they are prepared meanwhile); ``None``:
    #: the worker sizes it.
    prefetch: int | None = None
    #: Code-generation processes; 0 = prepare in the device process right before timing;
    #: ``None``: the worker sizes (and resizes) its pool.
    prepare_workers: int | None = None
    #: Cores this worker may use for code generation (``None``: detected).
    cores: float | None = None
    #: Workers its launcher started on this host, sharing its cores.
    peers: int = 1
    #: Longest wait between claims that find nothing (the worker backs off to it).
    poll_s: float = DEFAULT_POLL_S
    #: LISTEN for new trials while idle (where the route keeps a session): the next run is
    #: picked up at once rather than within ``poll_s``; off by default, see worker.wake.
    listen: bool = False
    #: Code-generation processes also compile on the device (each opens its own context), so
    #: the device process's build hits OpenCL's caches: on an H200 a face-mass build went
    #: from 0.34 s to 0.008 s. Off saves each code-generation process its device context.
    prebuild: bool = True
    #: Stop the code-generation processes while a CPU device times (:mod:`.quiet`).
    pause_codegen: bool = True
    #: Same unexplained error on this many configurations of a run in a row, before any
    #: verdict of that run here: stand aside from it (see the module docstring); 0 = never.
    stand_aside_after: int = DEFAULT_STAND_ASIDE_AFTER

    def __post_init__(self) -> None:
        if self.lease_s < MIN_LEASE_S:
            raise UsageError(
                f"a lease of {self.lease_s:g} s is too short (--lease / TUNEFLEET_WORKER_LEASE); "
                f"use at least {MIN_LEASE_S:g} seconds"
            )
        if self.max_trials is not None and self.max_trials <= 0:
            raise UsageError(f"--max-trials {self.max_trials}: use a positive number")
        if self.cores is not None and not (self.cores > 0 and math.isfinite(self.cores)):
            raise UsageError(f"--cores {self.cores:g}: use a positive number of cores")

    @property
    def heartbeat_s(self) -> float:
        """Interval of the lease heartbeat: a third of the lease (at most 20 s)."""
        return cadence(self.lease_s).heartbeat_s

    @property
    def reap_s(self) -> float:
        """How often this worker runs the reaper step (serialised fleet-wide)."""
        return cadence(self.lease_s).reap_s

    @property
    def report_s(self) -> float:
        """How often the worker reports its sizing when it has not changed."""
        return cadence(self.lease_s).report_s

    @classmethod
    def build(
        cls,
        *,
        db: str | None = None,
        wait_for_db_s: float | None = None,
        device: str | None = None,
        drain: bool | None = None,
        max_trials: int | None = None,
        lease_s: float | None = None,
        timeout_s: float | None = None,
        prefetch: int | None = None,
        prepare_workers: int | None = None,
        cores: float | None = None,
        poll_s: float | None = None,
        listen: bool | None = None,
        prebuild: bool | None = None,
        pause_codegen: bool | None = None,
        stand_aside_after: int | None = None,
    ) -> WorkerSettings:
        lease = resolve(lease_s, "WORKER_LEASE", DEFAULT_LEASE_S, positive_float)
        return cls(
            db=DatabaseSettings.build(
                db,
                wait_s=wait_for_db_s,
                application_name="tunefleet-worker",
                behind_pooler=True,
                dead_link_s=lease,
            ),
            device=resolve(device, "WORKER_DEVICE", None, str),
            drain=resolve(drain, "WORKER_DRAIN", False, parse_bool),
            max_trials=resolve(max_trials, "WORKER_MAX_TRIALS", None, positive_int),
            lease_s=lease,
            timeout_s=resolve(timeout_s, "WORKER_TIMEOUT", DEFAULT_TIMEOUT_S, positive_float),
            prefetch=resolve(
                prefetch, "WORKER_PREFETCH", None, bounded(non_negative_int, MAX_PREFETCH)
            ),
            prepare_workers=resolve(
                prepare_workers,
                "WORKER_PREPARE_WORKERS",
                None,
                bounded(non_negative_int, MAX_PREPARE_WORKERS),
            ),
            cores=resolve(cores, "WORKER_CORES", None, bounded(positive_float, MAX_CORES)),
            peers=resolve(None, "WORKER_PEERS", 1, positive_int),
            poll_s=resolve(poll_s, "WORKER_POLL", DEFAULT_POLL_S, positive_float),
            listen=resolve(listen, "WORKER_LISTEN", False, parse_bool),
            prebuild=resolve(prebuild, "WORKER_PREBUILD", True, parse_bool),
            pause_codegen=resolve(pause_codegen, "WORKER_PAUSE_CODEGEN", True, parse_bool),
            stand_aside_after=resolve(
                stand_aside_after,
                "WORKER_STAND_ASIDE_AFTER",
                DEFAULT_STAND_ASIDE_AFTER,
                non_negative_int,
            ),
        )
