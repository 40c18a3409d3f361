"""Building this project's wheels in tests, on machines with or without network access."""

from __future__ import annotations

import importlib.metadata


def has_build_backend() -> bool:
    """This interpreter has the setuptools pyproject.toml's ``[build-system]`` asks for, so a
    build needs nothing fetched (``--no-build-isolation``)."""
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 77


def pip_build_flags() -> list[str]:
    """Offline where this interpreter has the backend; else pip fetches it (isolated)."""
    return ["--no-build-isolation"] if has_build_backend() else []
