"""Devices as data: the identity of an OpenCL device and its class.

Runs target a *device class*; workers serve the class of their device. Two devices of the same
model are the same class (their timings are comparable); the class is a slug of the device
name, e.g. ``NVIDIA H200`` -> ``nvidia-h200``. The fingerprint also covers platform, vendor
and driver version: a driver upgrade is a new ``device`` row, still the same class.

This module does not import pyopencl (the coordinator uses it);
``tunefleet.worker.device`` discovers real devices and fills :class:`DeviceInfo` in.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from tunefleet.vocabulary import ANY_DEVICE_CLASS

__all__ = ["ANY_DEVICE_CLASS", "DeviceInfo", "device_class_of"]


def device_class_of(device_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return slug or "unknown"


@dataclass(frozen=True)
class DeviceInfo:
    """What we know about one device; picklable, so it travels to code-generation processes
    (builders check work-group and local-memory limits against it)."""

    platform: str
    vendor: str
    name: str
    driver_version: str
    compute_units: int | None = None
    global_mem_bytes: int | None = None
    local_mem_bytes: int | None = None
    max_work_group_size: int | None = None
    max_work_item_sizes: tuple[int, ...] = ()
    #: Index of the device among all OpenCL devices of the machine (platform order).
    index: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def device_class(self) -> str:
        return device_class_of(self.name)

    @property
    def on_host_cores(self) -> bool:
        """The device runs its kernels on the host's CPU cores (PoCL, a CPU driver): work
        beside its timing takes the same cores."""
        return "cpu" in str(self.extra.get("type", "")).split(",")

    @property
    def fingerprint(self) -> str:
        key = "\x1f".join((self.platform, self.vendor, self.name, self.driver_version))
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["max_work_item_sizes"] = list(self.max_work_item_sizes)
        data["device_class"] = self.device_class
        data["fingerprint"] = self.fingerprint
        return data


#: The pseudo-device of a worker without OpenCL: it serves only runs of class ``any``
#: (the synthetic problem), so the queue can be exercised anywhere.
HOST_DEVICE = DeviceInfo(platform="host", vendor="none", name="host-cpu", driver_version="none")
