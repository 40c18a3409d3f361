"""How big a worker makes its code-generation pool and how far it claims ahead.

Everything here is a pure function of what it is handed (file contents, environment values,
measured times), so each decision is unit-tested; :func:`detect_resources` and
:class:`CpuSampler` are the only parts that read the machine (``/proc``, ``/sys/fs/cgroup``).

Cores. A worker may use the fewest of: the CPUs it may run on (``os.sched_getaffinity``), the
CPU quota of its cgroup (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``, the
tightest of the cgroup and its ancestors) and Slurm's ``SLURM_CPUS_PER_TASK``. Those cores
are shared with the other workers on the same host (N GPUs of a node share its cores): the
live workers of this host in the database, or the number its launcher started
(``TUNEFLEET_WORKER_PEERS``), whichever is larger. ``--cores`` replaces the detection.

Initial size. Half of the worker's share of the cores, at least one process: a small machine
keeps today's one code-generation process, a 16-core node starts with 8, and the controller
corrects either way within seconds. The *ceiling* is the whole share (the device process
mostly waits while code generation is what it waits for), never more than memory allows
(half the available memory over what one code-generation process holds). Prefetch follows
the pool: one trial held per code-generation process beyond the one being timed.

Runtime control (:class:`PoolController`), once per window of several prepared trials:

* demand = ``ceil(1.25 x prepare seconds / max(device seconds, SHORT_TRIAL_S))``: the
  processes needed so the device never waits (a device time below ``SHORT_TRIAL_S`` counts
  as that: the loop's own database round trips then bound the rate, so more processes add
  nothing). Trials that are quick to generate need only one.
* grow when the device waited for prepared kernels (``STARVED_FRACTION`` of the window or
  more), demand is above the pool and cores are idle: by as many processes as the idle cores
  hold at the CPU one process was seen to use (a process that mostly waits needs none), at
  most to demand and the ceiling;
* shrink by one when demand is below the pool (device-bound or short trials), or when the
  cores are saturated and the last growth did not raise the rate of prepared trials by
  ``GAIN`` (code generation starves the machine: the device process and the search need a
  core); a size that did not pay, and any larger one, is not tried again for
  ``RETRY_AFTER`` windows.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Memory one code-generation process is assumed to hold until one is measured: loopy, the
#: problem, and a device context for prebuilds (benchmarks/worker_memory.py measured ~120 MiB
#: PSS per process on PoCL; GPU contexts and big kernels hold more).
CODEGEN_MEMORY_BYTES = 512 * 1024**2
#: Share of the available memory the pool may take.
MEMORY_SHARE = 0.5
#: Device seconds per trial below which a trial counts as short (see the module docstring).
SHORT_TRIAL_S = 0.02
#: Safety margin of the demand: code generation times vary between configurations.
HEADROOM = 1.25
#: Fraction of a window the device waited for a prepared kernel that counts as starved.
STARVED_FRACTION = 0.10
#: Idle cores needed before growing; fewer than this counts as saturated when shrinking.
IDLE_TO_GROW = 1.0
SATURATED_IDLE = 0.25
#: A code-generation process using less of a core than this counts as waiting, not working.
MIN_CPU_PER_PROCESS = 0.1
#: Relative gain in prepared trials per second a growth must bring to be kept.
GAIN = 1.10
#: Windows before a size that did not pay may be tried again.
RETRY_AFTER = 6
#: Most code-generation processes one worker starts, whatever the machine.
MAX_POOL = 256


# --- what the worker may use ------------------------------------------------------------------


def cgroup_v2_cpus(cpu_max: str) -> float | None:
    """CPUs granted by a cgroup v2 ``cpu.max`` (``"max 100000"``: no limit)."""
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = float(parts[0]), float(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_v1_cpus(quota_us: str, period_us: str) -> float | None:
    """CPUs granted by cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none)."""
    try:
        quota, period = float(quota_us), float(period_us)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit(proc_self_cgroup: str, root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The tightest CPU quota of this process's cgroup and its ancestors (v2 or v1), or
    ``None`` when there is none. ``proc_self_cgroup`` is the text of ``/proc/self/cgroup``."""
    limits: list[float] = []
    for line in proc_self_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = Path(path.lstrip("/"))
        chain = [rel, *rel.parents]
        if controllers == "":  # the v2 unified hierarchy
            for p in chain:
                text = _read(root / p / "cpu.max")
                value = None if text is None else cgroup_v2_cpus(text)
                if value is not None:
                    limits.append(value)
        elif "cpu" in controllers.split(","):
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                for p in chain:
                    quota = _read(root / mount / p / "cpu.cfs_quota_us")
                    period = _read(root / mount / p / "cpu.cfs_period_us")
                    if quota is not None and period is not None:
                        value = cgroup_v1_cpus(quota, period)
                        if value is not None:
                            limits.append(value)
    return min(limits) if limits else None


def slurm_cpus(env: Mapping[str, str]) -> int | None:
    """``SLURM_CPUS_PER_TASK`` when Slurm set it to a positive integer."""
    raw = env.get("SLURM_CPUS_PER_TASK", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def usable_cores(affinity: int, quota: float | None = None, slurm: int | None = None) -> float:
    """The fewest of the CPUs we may run on, the cgroup quota and Slurm's grant (at least
    one: a quota of half a CPU still runs one process)."""
    limits = [float(max(affinity, 1))]
    limits += [float(v) for v in (quota, slurm) if v is not None]
    return max(min(limits), 1.0)


def memory_available(meminfo: str, cgroup_limit: int | None, cgroup_used: int | None) -> int | None:
    """Bytes this worker's processes may still take: ``MemAvailable`` of ``/proc/meminfo``,
    and no more than what the cgroup's memory limit leaves."""
    values: list[int] = []
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            try:
                values.append(int(line.split()[1]) * 1024)
            except (IndexError, ValueError):
                pass
    if cgroup_limit is not None and cgroup_limit < 2**60:  # "no limit" is a huge number
        values.append(max(cgroup_limit - (cgroup_used or 0), 0))
    return min(values) if values else None


@dataclass(frozen=True)
class Resources:
    """What one worker may use, before and after sharing with its host's other workers."""

    cores: float
    peers: int = 1
    memory_bytes: int | None = None
    #: Where ``cores`` came from, for the log: "affinity", "cgroup", "slurm" or "--cores".
    source: str = "affinity"

    @property
    def share(self) -> float:
        """This worker's cores: the host's usable cores over the workers that share them."""
        return self.cores / max(self.peers, 1)

    def with_peers(self, peers: int) -> Resources:
        return Resources(self.cores, max(peers, 1), self.memory_bytes, self.source)


def detect_resources(
    cores: float | None = None, peers: int = 1, env: Mapping[str, str] | None = None
) -> Resources:
    """Read this machine's limits (``cores`` given: that instead of the CPU detection)."""
    env = os.environ if env is None else env
    memory = _detect_memory()
    if cores is not None:
        return Resources(float(cores), peers, memory, "--cores")
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    quota = cgroup_cpu_limit(_read(Path("/proc/self/cgroup")) or "")
    slurm = slurm_cpus(env)
    found = usable_cores(affinity, quota, slurm)
    source = "affinity"
    if slurm is not None and found == slurm:
        source = "slurm"
    elif quota is not None and found == max(quota, 1.0):
        source = "cgroup"
    return Resources(found, peers, memory, source)


def _detect_memory() -> int | None:
    meminfo = _read(Path("/proc/meminfo")) or ""
    limit = used = None
    for path_limit, path_used in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        raw = _read(Path(path_limit))
        if raw is not None and raw.isdigit():
            limit = int(raw)
            raw_used = _read(Path(path_used))
            used = int(raw_used) if raw_used and raw_used.isdigit() else None
            break
    return memory_available(meminfo, limit, used)


# --- initial sizing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizing:
    """A worker's code-generation processes and prefetch, and whether each is automatic."""

    prepare_workers: int
    prefetch: int
    ceiling: int
    auto_pool: bool = True
    auto_prefetch: bool = True

    @property
    def capacity(self) -> int:
        """Most trials held at once: the one being timed plus the prefetched ones."""
        return 1 + self.prefetch

    @property
    def source(self) -> str:
        """``auto``, ``flags`` or ``mixed``: what chose these numbers (shown by status)."""
        if self.auto_pool and self.auto_prefetch:
            return "auto"
        if not self.auto_pool and not self.auto_prefetch:
            return "flags"
        return "mixed"


def pool_ceiling(
    resources: Resources,
    per_process_bytes: int = CODEGEN_MEMORY_BYTES,
    prefetch: int | None = None,
) -> int:
    """Most code-generation processes this worker may run: its share of the cores (at least
    one), no more than memory allows and, with a fixed prefetch, than it holds trials for."""
    ceiling = max(1, math.floor(resources.share + 1e-9))
    if resources.memory_bytes is not None and per_process_bytes > 0:
        by_memory = math.floor(resources.memory_bytes * MEMORY_SHARE / per_process_bytes)
        ceiling = min(ceiling, max(1, by_memory))
    if prefetch is not None:  # all held trials may be generating while the device waits
        ceiling = min(ceiling, prefetch + 1)
    return min(ceiling, MAX_POOL)


def prefetch_for(pool: int) -> int:
    """Trials claimed ahead of the one being timed for a pool of ``pool`` processes: one for
    each to generate. When code generation is the bottleneck the device takes each kernel the
    moment it is ready, so a deeper prefetch would only hold trials back from other workers
    (and a pool of one keeps the prefetch of 1 this worker always had)."""
    return max(pool, 1)


def initial_sizing(
    resources: Resources,
    prepare_workers: int | None = None,
    prefetch: int | None = None,
) -> Sizing:
    """The sizing a worker starts with; an explicit value (flag or variable) always wins."""
    ceiling = pool_ceiling(resources, prefetch=prefetch)
    if prepare_workers is not None:
        pool = prepare_workers
        ceiling = prepare_workers
    else:
        pool = min(ceiling, max(1, math.ceil(resources.share / 2)))
    return Sizing(
        prepare_workers=pool,
        prefetch=prefetch if prefetch is not None else prefetch_for(pool),
        ceiling=ceiling,
        auto_pool=prepare_workers is None,
        auto_prefetch=prefetch is None,
    )


# --- runtime control --------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """What a worker saw over one window of its run."""

    seconds: float
    #: Time the device process had a trial to time.
    device_busy_s: float
    #: Time the device was idle while a held trial was still being generated.
    device_starved_s: float
    #: Code-generation wall seconds of each trial prepared in the window.
    prepare_s: Sequence[float] = ()
    #: Device seconds of each trial timed in the window.
    measure_s: Sequence[float] = ()
    #: Idle cores of the worker's share (``None``: unknown; then growth is not held back).
    idle_cores: float | None = None
    #: Cores the code-generation processes used on average (``None``: unknown).
    codegen_cores: float | None = None

    @property
    def busy_fraction(self) -> float:
        return min(self.device_busy_s / self.seconds, 1.0) if self.seconds > 0 else 0.0

    @property
    def starved_fraction(self) -> float:
        return min(self.device_starved_s / self.seconds, 1.0) if self.seconds > 0 else 0.0

    @property
    def prepare_rate(self) -> float:
        """Trials prepared per second."""
        return len(self.prepare_s) / self.seconds if self.seconds > 0 else 0.0


def demand(prepare_s: Sequence[float], measure_s: Sequence[float]) -> int | None:
    """Code-generation processes that keep the device busy, from measured times (``None``
    until a trial was prepared)."""
    if not prepare_s:
        return None
    prep = sum(prepare_s) / len(prepare_s)
    dev = sum(measure_s) / len(measure_s) if measure_s else 0.0
    return max(1, math.ceil(HEADROOM * prep / max(dev, SHORT_TRIAL_S)))


@dataclass
class PoolController:
    """Decides the pool size window by window (see the module docstring). Pure: it only
    sees the windows it is handed."""

    pool: int
    ceiling: int
    #: Prepared trials per second seen at each pool size while the device was starved.
    rates: dict[int, float] = field(default_factory=dict)
    #: Size -> windows left before it may be tried again.
    barred: dict[int, int] = field(default_factory=dict)
    #: The size before the last growth (to compare its rate with).
    grew_from: int | None = None
    last_reason: str = "initial"

    def observe(self, w: Window, ceiling: int | None = None) -> int:
        """Take one window; return the pool size for the next one."""
        if ceiling is not None:
            self.ceiling = max(1, ceiling)
        self.barred = {k: v - 1 for k, v in self.barred.items() if v > 1}
        need = demand(w.prepare_s, w.measure_s)
        starved = w.starved_fraction >= STARVED_FRACTION
        if starved and w.prepare_s:
            self.rates[self.pool] = w.prepare_rate
        saturated = w.idle_cores is not None and w.idle_cores < SATURATED_IDLE
        new, reason = self.pool, "steady"
        if self.pool > self.ceiling:
            new, reason = self.ceiling, "ceiling"
        elif need is None:
            pass  # nothing prepared in the window: nothing learned
        elif self.grew_from is not None and saturated and self._growth_did_not_pay():
            self.barred[self.pool] = RETRY_AFTER
            new, reason = self.grew_from, "saturated"
        elif need < self.pool:
            new, reason = max(need, self.pool - 1), "demand"
        elif starved and need > self.pool:
            idle = math.inf if w.idle_cores is None else w.idle_cores
            # What one more process would use: a process that mostly waits (I/O, a remote
            # compiler) costs little, so growth needs idle cores only for what it will burn.
            per = 1.0
            if w.codegen_cores is not None and self.pool > 0:
                per = min(max(w.codegen_cores / self.pool, 0.0), 1.0)
            if per < MIN_CPU_PER_PROCESS:
                step = need - self.pool
            elif idle >= IDLE_TO_GROW * per:
                step = max(1, math.floor(idle / per)) if math.isfinite(idle) else need - self.pool
            else:
                step = 0
            if step > 0:
                # A size that did not pay bars itself and everything above it for a while.
                barred = min(self.barred, default=MAX_POOL + 1) - 1
                target = min(need, self.pool + step, self.ceiling, barred)
                if target > self.pool:
                    new, reason = target, "starved"
        if new > self.pool:
            self.grew_from = self.pool
        elif new != self.pool:
            self.grew_from = None
        elif reason == "steady" and self.grew_from is not None and not saturated:
            self.grew_from = None  # the growth held: keep it
        self.pool, self.last_reason = max(new, 1), reason
        return self.pool

    def _growth_did_not_pay(self) -> bool:
        assert self.grew_from is not None
        before = self.rates.get(self.grew_from)
        now = self.rates.get(self.pool)
        return before is not None and now is not None and now < before * GAIN


# --- measuring the cores ----------------------------------------------------------------------


def cpu_seconds(stat_line: str, ticks_per_s: float) -> float | None:
    """User + system CPU seconds from one ``/proc/<pid>/stat`` line."""
    try:
        fields = stat_line.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks_per_s
    except (IndexError, ValueError):
        return None


class CpuSampler:
    """CPU seconds used by a set of processes between two samples (a process that appears
    or restarts in between counts from its first sample)."""

    def __init__(self) -> None:
        self._last: dict[int, float] = {}
        try:
            self._ticks = float(os.sysconf("SC_CLK_TCK"))
        except (AttributeError, ValueError, OSError):
            self._ticks = 100.0

    def used(self, pids: Sequence[int]) -> dict[int, float] | None:
        """CPU seconds each process used since the previous call, for the processes seen
        both times (``None`` without /proc)."""
        now: dict[int, float] = {}
        for pid in pids:
            text = _read(Path(f"/proc/{pid}/stat"))
            value = None if text is None else cpu_seconds(text, self._ticks)
            if value is not None:
                now[pid] = value
        if not now:
            return None
        used = {p: max(v - self._last[p], 0.0) for p, v in now.items() if p in self._last}
        self._last = now
        return used


def machine_idle(stat_first_line: str) -> tuple[float, float] | None:
    """(total, idle) jiffies of the ``cpu`` line of ``/proc/stat`` (idle + iowait)."""
    try:
        fields = [float(x) for x in stat_first_line.split()[1:]]
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    except (IndexError, ValueError):
        return None


class MachineSampler:
    """Idle cores of the whole machine between two samples (other users included)."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def idle_cores(self) -> float | None:
        text = _read(Path("/proc/stat"))
        now = None if text is None else machine_idle(text.splitlines()[0] if text else "")
        last, self._last = self._last, now
        if now is None or last is None or now[0] <= last[0]:
            return None
        return (now[1] - last[1]) / (now[0] - last[0]) * (os.cpu_count() or 1)


def idle_cores(
    share: float, used_cpu_s: float | None, seconds: float, machine_idle_cores: float | None = None
) -> float | None:
    """Cores of the worker's share that its own processes left idle over ``seconds``, and no
    more than the whole machine had idle (other users' load counts when it is known)."""
    if used_cpu_s is None or seconds <= 0:
        return None
    ours = max(share - used_cpu_s / seconds, 0.0)
    return ours if machine_idle_cores is None else min(ours, max(machine_idle_cores, 0.0))
