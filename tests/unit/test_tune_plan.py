"""How `tunefleet tune` picks the run's device class and its local workers."""

from __future__ import annotations

import io

import pytest

from tunefleet.api.display import ProgressDisplay
from tunefleet.api.fleet import plan_workers
from tunefleet.devices import HOST_DEVICE, DeviceInfo
from tunefleet.errors import DeviceError, UsageError
from tunefleet.text.progress import progress_line
from tunefleet.worker import device as worker_device


def dev(index: int, name: str, kind: str, platform: str = "P") -> DeviceInfo:
    version = "OpenCL 3.0 PoCL" if kind == "cpu" else "OpenCL 3.0 CUDA"
    return DeviceInfo(
        platform, "V", name, "1.0", index=index, extra={"type": kind, "opencl_version": version}
    )


@pytest.fixture
def machine(monkeypatch):
    """A node with a CPU OpenCL device and two identical GPUs (discovery is faked: this
    machine has no GPU)."""
    devices = [
        dev(0, "pthread-Intel CPU", "cpu", "Portable Computing Language"),
        dev(1, "NVIDIA H200", "gpu", "NVIDIA CUDA"),
        dev(2, "NVIDIA H200", "gpu", "NVIDIA CUDA"),
    ]
    monkeypatch.setattr(worker_device, "list_devices", lambda: devices)
    return devices


def test_default_is_one_worker_per_gpu_of_the_first_gpu_class(machine):
    plan = plan_workers(True, None, None)
    assert plan.device_class == "nvidia-h200" and plan.devices == ("1", "2")


def test_a_pattern_picks_the_class_and_workers_may_be_fewer(machine):
    assert plan_workers(True, None, "pocl").devices == ("0",)
    assert plan_workers(True, None, "pocl").device_class == "pthread-intel-cpu"
    assert plan_workers(True, 1, "h200").devices == ("1",)
    assert plan_workers(True, None, "2").devices == ("2",)
    assert plan_workers(True, None, "cpu").devices == ("0",)
    assert plan_workers(True, None, "gpu").devices == ("1", "2")


def test_more_workers_than_devices_is_refused(machine):
    with pytest.raises(UsageError, match="2 device\\(s\\) of class nvidia-h200"):
        plan_workers(True, 3, None)


def test_unknown_device_pattern_and_index(machine):
    with pytest.raises(DeviceError, match="no OpenCL device matches --device 'mi300'"):
        plan_workers(True, None, "mi300")
    with pytest.raises(DeviceError, match="--device 7: this machine has 3"):
        plan_workers(True, None, "7")


def test_no_opencl_device_at_all(monkeypatch):
    monkeypatch.setattr(worker_device, "list_devices", lambda: [])
    with pytest.raises(DeviceError, match=r"no OpenCL device found.*tunefleet\[pocl\]"):
        plan_workers(True, None, None)


def test_search_only_targets_a_class_named_or_matched(monkeypatch, machine):
    assert plan_workers(True, 0, "h200").device_class == "nvidia-h200"
    plan = plan_workers(True, 0, "AMD MI300X")  # not on this machine: the class itself
    assert plan.device_class == "amd-mi300x" and plan.devices == ()
    with pytest.raises(UsageError, match="--workers 0 needs --device-class CLASS"):
        plan_workers(True, 0, None)


def test_host_problems_use_the_host_pseudo_device(machine):
    plan = plan_workers(False, None, None)
    assert plan.device_class == "any" and plan.devices == ("host",)
    assert plan_workers(False, 3, None).devices == ("host",) * 3
    with pytest.raises(UsageError, match="needs no OpenCL"):
        plan_workers(False, None, "h200")
    with pytest.raises(UsageError, match="--workers -1"):
        plan_workers(False, -1, None)


PROGRESS = {
    "run_id": 4,
    "done": 12,
    "running": 2,
    "pending": 3,
    "invalid": 1,
    "failed": 1,
    "timed_out": 1,
    "cached": 0,
    "max_trials": 30,
    "best_gflops": 14.25,
    "evaluations_per_minute": 8.04,
    "elapsed_s": 95.0,
    "servable_workers": 2,
}


def test_progress_line_has_every_number_a_user_watches():
    assert progress_line(PROGRESS) == (
        "run 4: 15/30 finished (12 done, 1 invalid, 1 failed, 1 timed out), 2 running,"
        " 3 pending"
        " | best 14.2 GFLOP/s | 8.0 eval/min | 2 workers | 95.0 s"
    )
    # Zero timed-out trials (the usual case) keep the line short.
    quiet = progress_line({**PROGRESS, "timed_out": 0, "servable_workers": 1})
    assert "timed out" not in quiet and "1 failed), 2 running" in quiet and "| 1 worker |" in quiet
    # Re-measurements of the best are extra: labelled apart, never in the budget's count.
    remeasuring = progress_line({**PROGRESS, "confirmed": 2, "confirming": 1})
    assert remeasuring.startswith("run 4: 15/30 finished (12 done,")
    assert "3 pending; 2 re-measured, 1 re-measuring (extra) | best" in remeasuring


def test_progress_display_prints_plain_periodic_lines_without_a_terminal():
    out = io.StringIO()
    display = ProgressDisplay(out, every=3600)
    display.show("first")
    display.show("second")  # within the period: not printed
    display.show("final", force=True)
    display.end()
    assert out.getvalue() == "first\nfinal\n"


def test_the_in_process_coordinator_keeps_every_database_setting() -> None:
    from tunefleet.api.fleet import coordinator_db
    from tunefleet.settings import DatabaseSettings

    user = DatabaseSettings(
        url=None,
        statement_timeout_ms=1234,
        idle_in_transaction_timeout_ms=5678,
        connect_timeout_s=3,
        application_name="tunefleet-tune",
    )
    got = coordinator_db(user, "postgresql://h/db")
    assert (got.url, got.application_name) == ("postgresql://h/db", "tunefleet-coordinator")
    assert (got.statement_timeout_ms, got.idle_in_transaction_timeout_ms) == (1234, 5678)
    assert got.connect_timeout_s == 3


@pytest.mark.parametrize("pattern", [None, "", "gpu", "cpu", "pocl", "h200", "2", "CUDA", "0"])
def test_a_worker_picks_the_first_device_that_tunes_plan_picks(machine, pattern):
    # One rule for --device: `tunefleet worker --device P` serves the first device that
    # `tunefleet tune --device P` would start a local worker on.
    planned = plan_workers(True, 1, pattern).devices
    assert planned == (str(worker_device.select_device(pattern).index),)


def test_a_worker_device_pattern_error_lists_the_machine(machine):
    with pytest.raises(DeviceError, match=r"matches --device 'mi300'; devices: 0: pthread"):
        worker_device.select_device("mi300")
    assert worker_device.select_device(" host ") is HOST_DEVICE
