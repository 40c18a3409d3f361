"""Device classes: the name under which runs target, and workers serve, a kind of device.

Two devices of the same model and driver family are the same class (their timings are
comparable); the class is a slug of the device name, e.g. ``NVIDIA H200`` -> ``nvidia-h200``.
This module does not import pyopencl: the coordinator uses it too.
"""

from __future__ import annotations

import re

from tunefleet.db.schema import ANY_DEVICE_CLASS

__all__ = ["ANY_DEVICE_CLASS", "device_class_of"]


def device_class_of(device_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return slug or "unknown"
