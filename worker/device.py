"""OpenCL device discovery, selection by pattern, and the device session used for timing.

``list_devices()`` enumerates every OpenCL device of the machine as :class:`DeviceInfo`;
``matching_devices(pattern)`` is the one rule for ``--device`` (index, or a substring of
name, platform, class, OpenCL version or type: ``"1"``, ``"h200"``, ``"pocl"``, ``"gpu"``),
shared by workers and ``tune``'s plan; ``select_device(pattern)`` takes its first, or ``"host"`` for
the pseudo-device that serves only synthetic (``any``-class) runs. ``open_session`` creates the
context and the profiling queue; it runs in the worker's device process, never in the parent
(OpenCL state does not survive ``fork``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunefleet.devices import HOST_DEVICE, DeviceInfo
from tunefleet.errors import DeviceError


def _opencl() -> Any:
    try:
        import pyopencl as cl
    except ImportError:
        raise DeviceError(
            "pyopencl is not installed; install the OpenCL extra "
            "(pip install 'tunefleet[pocl]' for a CPU device) or use --device host "
            "for synthetic runs"
        ) from None
    return cl


def list_devices() -> list[DeviceInfo]:
    """Every OpenCL device of this machine, in platform order (empty when there is none)."""
    cl = _opencl()
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # no ICD loader / no platform: "no devices", not a crash
        return []
    infos: list[DeviceInfo] = []
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        for dev in devices:
            infos.append(_info(platform, dev, len(infos)))
    return infos


def _info(platform: Any, dev: Any, index: int) -> DeviceInfo:
    return DeviceInfo(
        platform=platform.name.strip(),
        vendor=dev.vendor.strip(),
        name=dev.name.strip(),
        driver_version=dev.driver_version.strip(),
        compute_units=int(dev.max_compute_units),
        global_mem_bytes=int(dev.global_mem_size),
        local_mem_bytes=int(dev.local_mem_size),
        max_work_group_size=int(dev.max_work_group_size),
        max_work_item_sizes=tuple(int(x) for x in dev.max_work_item_sizes),
        index=index,
        extra={
            "opencl_version": dev.version.strip(),
            "type": cl_type_name(dev),
            "max_clock_mhz": int(dev.max_clock_frequency),
        },
    )


def cl_type_name(dev: Any) -> str:
    cl = _opencl()
    kinds = []
    for name in ("GPU", "CPU", "ACCELERATOR"):
        if dev.type & getattr(cl.device_type, name):
            kinds.append(name.lower())
    return ",".join(kinds) or "other"


def select_device(pattern: str | None) -> DeviceInfo:
    """The device a worker serves: the first that ``pattern`` matches (:func:`matching_devices`),
    or the host pseudo-device for ``host``."""
    if pattern is not None and pattern.strip().lower() == "host":
        return HOST_DEVICE
    return matching_devices(pattern)[0]


#: What a machine without any OpenCL device can do instead, for a worker.
NO_DEVICE_HINT = "or use --device host for synthetic runs"


def matching_devices(
    pattern: str | None, *, no_device_hint: str = NO_DEVICE_HINT
) -> list[DeviceInfo]:
    """The devices a ``--device`` pattern names, in index order; one rule for ``tunefleet
    worker`` and for ``tune``'s plan of local workers, so both pick the same devices.

    ``None`` or empty: the GPUs, else every device. Digits: that index (the only way to tell
    identical GPUs apart). Otherwise a case-insensitive substring of the name, the platform,
    the device class, the OpenCL version string (``pocl`` appears only there: PoCL's platform
    is "Portable Computing Language") or the type (``cpu``, ``gpu``). Raises
    :class:`DeviceError` naming the pattern and listing the machine's devices."""
    devices = list_devices()
    if not devices:
        raise DeviceError(
            "no OpenCL device found; install a driver, or pip install 'tunefleet[pocl]' for a "
            f"CPU device, {no_device_hint}"
        )
    if pattern is None or pattern.strip() == "":
        gpus = [d for d in devices if "gpu" in d.extra.get("type", "")]
        return gpus or devices
    text = pattern.strip()
    if text.isdigit():
        idx = int(text)
        if idx >= len(devices):
            raise DeviceError(
                f"--device {idx}: this machine has {len(devices)} device(s): {_listing(devices)}"
            )
        return [devices[idx]]
    needle = text.lower()
    matches = [d for d in devices if any(needle in part for part in _searchable(d))]
    if not matches:
        raise DeviceError(
            f"no OpenCL device matches --device {pattern!r}; devices: {_listing(devices)}"
        )
    return matches


def _searchable(d: DeviceInfo) -> tuple[str, ...]:
    parts = (d.name, d.platform, d.device_class, d.extra.get("opencl_version", ""))
    return tuple(str(p).lower() for p in (*parts, d.extra.get("type", "")))


def _listing(devices: list[DeviceInfo]) -> str:
    return "; ".join(f"{d.index}: {d.name} ({d.platform})" for d in devices)


@dataclass
class DeviceSession:
    """An open OpenCL context and an in-order profiling queue on one device."""

    info: DeviceInfo
    context: Any
    queue: Any
    device: Any
    #: The racing bound of the measurement in hand (:func:`tunefleet.problems.kernel.
    #: time_launches`): set by the device process from its request, ``None``: no racing.
    race_above_s: float | None = None


def open_session(info: DeviceInfo) -> DeviceSession | None:
    """Open the device; ``None`` for the host pseudo-device (no OpenCL)."""
    if info.platform == HOST_DEVICE.platform:
        return None
    cl = _opencl()
    # Identical GPUs share a name: match by position, then check it is still the same device.
    devices = [dev for platform in cl.get_platforms() for dev in platform.get_devices()]
    if info.index < len(devices):
        dev = devices[info.index]
        if dev.name.strip() == info.name and dev.driver_version.strip() == info.driver_version:
            ctx = cl.Context([dev])
            queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
            return DeviceSession(info=info, context=ctx, queue=queue, device=dev)
    raise DeviceError(f"device {info.index}: {info.name!r} ({info.platform}) is no longer present")
