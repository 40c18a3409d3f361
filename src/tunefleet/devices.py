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
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tunefleet.vocabulary import ANY_DEVICE_CLASS

__all__ = ["ANY_DEVICE_CLASS", "DeviceInfo", "DeviceLimits", "Footprint", "device_class_of"]


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


@dataclass(frozen=True)
class Footprint:
    """What one configuration's kernel asks of a device before it runs: its work-group size
    along each local axis (axis 0 first) and the bytes of local memory it allocates."""

    work_group: tuple[int, ...]
    local_mem_bytes: int


@dataclass(frozen=True)
class DeviceLimits:
    """The limits a kernel's :class:`Footprint` must fit; ``None`` (or no sizes per axis):
    not known, nothing is ruled out for it."""

    local_mem_bytes: int | None = None
    max_work_group_size: int | None = None
    max_work_item_sizes: tuple[int, ...] = ()

    @classmethod
    def of(cls, device: DeviceInfo) -> DeviceLimits:
        return cls(device.local_mem_bytes, device.max_work_group_size, device.max_work_item_sizes)

    @classmethod
    def loosest(cls, details: Iterable[Mapping[str, Any]]) -> DeviceLimits | None:
        """The limits no device of ``details`` (``DeviceInfo.to_json()`` of each) is below:
        per limit the largest, and unknown where any device leaves it unknown or garbled.
        Devices register themselves (an untrusted worker may write any details): taking the
        loosest means a bad registration can only make fewer configurations be ruled out,
        never rule out one a real device runs. ``None`` when ``details`` is empty."""
        rows = list(details)
        if not rows:
            return None
        mem = _largest(row.get("local_mem_bytes") for row in rows)
        group = _largest(row.get("max_work_group_size") for row in rows)
        sizes: tuple[int, ...] = ()
        per_device = [row.get("max_work_item_sizes") for row in rows]
        lists = [s for s in per_device if isinstance(s, list) and s]
        if len(lists) == len(rows):  # every device gives its sizes per axis
            axes = min(map(len, lists))
            largest = [_largest(s[axis] for s in lists) for axis in range(axes)]
            if None not in largest:
                sizes = tuple(v for v in largest if v is not None)
        return cls(mem, group, sizes)

    def exceeded_by(self, footprint: Footprint | None) -> str | None:
        """Why ``footprint`` does not fit these limits (one line), or ``None`` when it fits,
        the limit it would break is not known, or there is no footprint (the problem cannot
        tell its own)."""
        if footprint is None:
            return None
        wg = math.prod(footprint.work_group)
        if self.max_work_group_size and wg > self.max_work_group_size:
            return (
                f"work-group of {wg} work-items {tuple(footprint.work_group)} exceeds the "
                f"device's maximum of {self.max_work_group_size}"
            )
        for axis, (size, limit) in enumerate(
            zip(footprint.work_group, self.max_work_item_sizes, strict=False)
        ):
            if size > limit:
                return (
                    f"work-group size {size} along axis {axis} exceeds the device's maximum "
                    f"of {limit}"
                )
        if self.local_mem_bytes and footprint.local_mem_bytes > self.local_mem_bytes:
            return (
                f"needs {footprint.local_mem_bytes} bytes of local memory; the device has "
                f"{self.local_mem_bytes}"
            )
        return None


def _largest(values: Iterable[Any]) -> int | None:
    """The largest of positive integers; ``None`` if any is missing or not one."""
    out = 0
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return None
        out = max(out, value)
    return out or None
