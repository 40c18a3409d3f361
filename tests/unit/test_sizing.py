"""The worker's sizing decisions as pure functions: cores from affinity, cgroup quotas and
Slurm, the share of co-located workers, memory, the initial pool and prefetch, and the
controller's answer to measured code-generation and device times."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunefleet.worker.sizing import (
    CODEGEN_MEMORY_BYTES,
    MAX_POOL,
    PoolController,
    Resources,
    Window,
    cgroup_cpu_limit,
    cgroup_v1_cpus,
    cgroup_v2_cpus,
    cpu_seconds,
    demand,
    idle_cores,
    initial_sizing,
    machine_idle,
    memory_available,
    pool_ceiling,
    prefetch_for,
    slurm_cpus,
    usable_cores,
)

GIB = 1024**3


# --- cores ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("max 100000", None), ("200000 100000", 2.0), ("150000 100000", 1.5), ("garbage", None)],
)
def test_cgroup_v2_cpu_max(text, cpus):
    assert cgroup_v2_cpus(text) == cpus


@pytest.mark.parametrize(
    ("quota", "period", "cpus"),
    [("-1", "100000", None), ("400000", "100000", 4.0), ("x", "100000", None)],
)
def test_cgroup_v1_quota(quota, period, cpus):
    assert cgroup_v1_cpus(quota, period) == cpus


def test_the_tightest_quota_of_the_cgroup_and_its_ancestors_wins(tmp_path: Path):
    (tmp_path / "slurm" / "job_7").mkdir(parents=True)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "slurm" / "cpu.max").write_text("800000 100000\n")
    (tmp_path / "slurm" / "job_7" / "cpu.max").write_text("300000 100000\n")
    assert cgroup_cpu_limit("0::/slurm/job_7\n", tmp_path) == 3.0
    # The job itself unlimited: its parent's quota still holds.
    (tmp_path / "slurm" / "job_7" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit("0::/slurm/job_7\n", tmp_path) == 8.0


def test_cgroup_v1_cpu_controller_is_read(tmp_path: Path):
    d = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text("250000")
    (d / "cpu.cfs_period_us").write_text("100000")
    text = "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n"
    assert cgroup_cpu_limit(text, tmp_path) == 2.5
    assert cgroup_cpu_limit("1:cpu:/\n0::/\n", tmp_path) is None  # no quota anywhere


def test_slurm_cpus_per_task():
    assert slurm_cpus({"SLURM_CPUS_PER_TASK": "6"}) == 6
    assert slurm_cpus({"SLURM_CPUS_PER_TASK": "0"}) is None
    assert slurm_cpus({"SLURM_CPUS_PER_TASK": "lots"}) is None
    assert slurm_cpus({}) is None


def test_usable_cores_is_the_fewest_of_affinity_quota_and_slurm():
    assert usable_cores(16) == 16
    assert usable_cores(16, quota=4.0) == 4
    assert usable_cores(16, quota=8.0, slurm=6) == 6
    assert usable_cores(2, quota=8.0, slurm=6) == 2
    assert usable_cores(16, quota=0.5) == 1  # a fraction of a CPU still runs one process


def test_co_located_workers_share_the_cores():
    node = Resources(cores=16, peers=1)
    assert node.share == 16
    assert node.with_peers(4).share == 4  # 4 GPUs on a 16-core node: 4 cores each
    assert node.with_peers(32).share == 0.5


def test_memory_available_takes_the_cgroup_limit_into_account():
    meminfo = "MemTotal: 32000000 kB\nMemAvailable: 16000000 kB\n"
    assert memory_available(meminfo, None, None) == 16000000 * 1024
    assert memory_available(meminfo, 4 * GIB, 1 * GIB) == 3 * GIB
    assert memory_available(meminfo, 2**63 - 1, 5) == 16000000 * 1024  # "no limit"
    assert memory_available("", None, None) is None


# --- initial sizing ---------------------------------------------------------------------------


def test_pool_ceiling_is_the_share_of_the_cores_limited_by_memory_and_prefetch():
    assert pool_ceiling(Resources(16)) == 16
    assert pool_ceiling(Resources(16, peers=4)) == 4
    assert pool_ceiling(Resources(2, peers=8)) == 1  # never below one process
    assert pool_ceiling(Resources(16, memory_bytes=2 * CODEGEN_MEMORY_BYTES)) == 1
    assert pool_ceiling(Resources(16, memory_bytes=16 * CODEGEN_MEMORY_BYTES)) == 8
    assert pool_ceiling(Resources(16), prefetch=3) == 4  # 4 held trials: 4 can be generated
    assert pool_ceiling(Resources(100_000)) == MAX_POOL


def test_initial_sizing_starts_at_half_the_share_with_one_trial_per_process():
    small = initial_sizing(Resources(2))
    assert (small.prepare_workers, small.prefetch, small.capacity) == (1, 1, 2)  # as before
    assert small.source == "auto" and small.ceiling == 2
    node = initial_sizing(Resources(16))
    assert (node.prepare_workers, node.prefetch, node.ceiling) == (8, 8, 16)
    shared = initial_sizing(Resources(16, peers=8))
    assert (shared.prepare_workers, shared.prefetch, shared.ceiling) == (1, 1, 2)


def test_explicit_values_win_over_the_sizing():
    fixed = initial_sizing(Resources(16), prepare_workers=12, prefetch=8)
    assert (fixed.prepare_workers, fixed.prefetch, fixed.ceiling) == (12, 8, 12)
    assert (fixed.auto_pool, fixed.auto_prefetch, fixed.source) == (False, False, "flags")
    pool_only = initial_sizing(Resources(16), prepare_workers=3)
    assert (pool_only.prepare_workers, pool_only.prefetch, pool_only.source) == (3, 3, "mixed")
    inline = initial_sizing(Resources(16), prepare_workers=0)
    assert (inline.prepare_workers, inline.prefetch) == (0, 1)
    prefetch_only = initial_sizing(Resources(16), prefetch=2)
    assert (prefetch_only.prepare_workers, prefetch_only.prefetch) == (3, 2)
    assert prefetch_only.auto_pool and not prefetch_only.auto_prefetch


def test_prefetch_follows_the_pool():
    assert [prefetch_for(p) for p in (0, 1, 2, 12)] == [1, 1, 2, 12]


# --- measured times ---------------------------------------------------------------------------


def test_demand_from_code_generation_and_device_times():
    assert demand([], [0.1]) is None
    assert demand([2.0, 2.0], [0.5, 0.5]) == 5  # 1.25 x 2 / 0.5
    assert demand([0.2], [1.0]) == 1  # device-bound: one process keeps up
    # Short trials: a device time under 20 ms counts as 20 ms (the loop's round trips).
    assert demand([0.1], [0.001]) == 7
    assert demand([0.001], [0.001]) == 1


def window(**kw) -> Window:
    base = dict(seconds=5.0, device_busy_s=1.0, device_starved_s=4.0)
    return Window(**{**base, **kw})


def test_a_starved_device_with_idle_cores_grows_the_pool_by_the_idle_cores():
    c = PoolController(pool=2, ceiling=16)
    grown = c.observe(window(prepare_s=[2.0] * 5, measure_s=[0.1] * 5, idle_cores=5.4))
    assert grown == 7 and c.last_reason == "starved"
    # Demand caps the growth: 1.25 x 2 / 0.5 = 5 processes are enough.
    c = PoolController(pool=2, ceiling=16)
    assert c.observe(window(prepare_s=[2.0] * 5, measure_s=[0.5] * 5, idle_cores=12)) == 5


def test_growth_never_passes_the_ceiling_the_cores_allow():
    c = PoolController(pool=2, ceiling=4)
    assert c.observe(window(prepare_s=[2.0] * 4, measure_s=[0.01] * 4, idle_cores=None)) == 4
    assert c.observe(window(prepare_s=[2.0] * 8, measure_s=[0.01] * 8, idle_cores=None)) == 4
    # The ceiling drops (another worker started on the host): the pool follows.
    assert c.observe(window(prepare_s=[2.0] * 8, measure_s=[0.01] * 8), ceiling=2) == 2
    assert c.last_reason == "ceiling"


def test_no_growth_without_idle_cores_or_without_waiting():
    c = PoolController(pool=2, ceiling=16)
    busy_machine = window(prepare_s=[2.0] * 4, measure_s=[0.1] * 4, idle_cores=0.5)
    assert c.observe(busy_machine) == 2
    not_starved = window(
        device_busy_s=4.9, device_starved_s=0.1, prepare_s=[2.0] * 4, measure_s=[0.1] * 4
    )
    assert c.observe(not_starved) == 2


def test_device_bound_or_short_trials_shrink_the_pool_one_at_a_time():
    c = PoolController(pool=4, ceiling=16)
    device_bound = window(device_busy_s=5, device_starved_s=0, prepare_s=[0.3], measure_s=[2.0])
    assert c.observe(device_bound) == 3 and c.last_reason == "demand"
    assert c.observe(device_bound) == 2
    assert c.observe(device_bound) == 1
    assert c.observe(device_bound) == 1  # never below one
    short = window(prepare_s=[0.005] * 50, measure_s=[0.002] * 50, idle_cores=2)
    c = PoolController(pool=3, ceiling=16)
    assert c.observe(short) == 2


def test_a_growth_that_saturates_the_cores_without_paying_is_undone_and_not_retried():
    c = PoolController(pool=4, ceiling=16)
    # 4 processes: 2 prepared per second, the device waits, cores idle: grow to 8.
    assert c.observe(window(prepare_s=[2.0] * 10, measure_s=[0.1] * 10, idle_cores=4)) == 8
    # 8 processes prepare no faster (the cores are oversubscribed) and nothing is idle.
    slow = window(prepare_s=[4.0] * 10, measure_s=[0.1] * 10, idle_cores=0.1)
    assert c.observe(slow) == 4 and c.last_reason == "saturated"
    # The machine is idle again: 8 stays barred for a while, 7 may be tried.
    again = window(prepare_s=[2.0] * 10, measure_s=[0.1] * 10, idle_cores=6)
    assert c.observe(again) == 7


def test_a_growth_that_pays_is_kept_even_when_the_cores_are_saturated():
    c = PoolController(pool=1, ceiling=2)
    assert c.observe(window(prepare_s=[2.0] * 3, measure_s=[0.1] * 3, idle_cores=1.2)) == 2
    faster = window(prepare_s=[2.2] * 5, measure_s=[0.1] * 5, idle_cores=0.0)
    assert c.observe(faster) == 2 and c.last_reason == "steady"


def test_a_window_without_prepared_trials_changes_nothing():
    c = PoolController(pool=3, ceiling=16)
    assert c.observe(window(prepare_s=[], measure_s=[], idle_cores=10)) == 3


# --- measuring the cores ----------------------------------------------------------------------


def test_cpu_seconds_from_proc_stat():
    line = "1234 (python -m tunefleet) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0"
    assert cpu_seconds(line, 100.0) == 3.0
    assert cpu_seconds("garbage", 100.0) is None


def test_idle_cores_of_the_share_and_of_the_machine():
    assert idle_cores(4, used_cpu_s=5.0, seconds=5.0) == 3.0
    assert idle_cores(4, used_cpu_s=30.0, seconds=5.0) == 0.0
    assert idle_cores(4, used_cpu_s=5.0, seconds=5.0, machine_idle_cores=0.5) == 0.5
    assert idle_cores(4, used_cpu_s=None, seconds=5.0) is None
    assert machine_idle("cpu  100 0 50 800 50 0 0 0 0 0") == (1000.0, 850.0)
    assert machine_idle("nonsense") is None


def test_growth_asks_idle_cores_only_for_the_cpu_a_process_burns():
    # Code generation that mostly waits (0.05 of a core each): no idle core needed at all.
    c = PoolController(pool=2, ceiling=8)
    waiting = window(prepare_s=[2.0] * 4, measure_s=[0.1] * 4, idle_cores=0.0, codegen_cores=0.1)
    assert c.observe(waiting) == 8
    # CPU-bound code generation (a full core each): 3.5 idle cores hold 3 more processes.
    c = PoolController(pool=2, ceiling=8)
    burning = window(prepare_s=[2.0] * 4, measure_s=[0.1] * 4, idle_cores=3.5, codegen_cores=2.0)
    assert c.observe(burning) == 5
    # Half a core each: 1.2 idle cores hold 2 more.
    c = PoolController(pool=2, ceiling=8)
    half = window(prepare_s=[2.0] * 4, measure_s=[0.1] * 4, idle_cores=1.2, codegen_cores=1.0)
    assert c.observe(half) == 4
    # CPU-bound and nothing idle: no growth.
    c = PoolController(pool=2, ceiling=8)
    full = window(prepare_s=[2.0] * 4, measure_s=[0.1] * 4, idle_cores=0.3, codegen_cores=2.0)
    assert c.observe(full) == 2


def test_cpu_sampler_counts_only_processes_seen_twice():
    import os

    from tunefleet.worker.sizing import CpuSampler

    sampler = CpuSampler()
    me = os.getpid()
    assert sampler.used([me]) == {}  # first sight: no figure yet
    sum(i * i for i in range(200_000))  # burn a little CPU
    used = sampler.used([me, 2**22 + 12345])  # plus a pid that does not exist
    assert used is not None and set(used) == {me} and used[me] >= 0.0
