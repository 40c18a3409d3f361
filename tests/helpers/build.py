"""Building this project's wheel in tests, once per test run, on machines with or without
network access."""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


def source_copy(dest: Path) -> Path:
    """The checkout's files a source distribution would hold: no history, environments,
    build outputs or tests."""
    shutil.copytree(
        ROOT,
        dest,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "tests"
        ),
    )
    return dest


def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built from a copy of it once per test run.

    The parallel sessions of one run (pytest-xdist) share their base directory's parent; the
    first to get there builds under a lock, the others wait for it and reuse the wheel:
    a build costs seconds of CPU that the rest of the suite needs.
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = shared / "project-wheel"
    folder.mkdir(exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = sorted(folder.glob("tunefleet-*.whl"))
        if not built:
            src = source_copy(folder / "src")
            pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *pip_build_flags()]
            done = subprocess.run(
                [*pip, "-w", str(folder), str(src)],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, f"building the wheel failed: {done.stderr}"
            shutil.rmtree(src)
            built = sorted(folder.glob("tunefleet-*.whl"))
    (wheel,) = built
    return wheel


def bare_venv(path: Path) -> Path:
    """A virtual environment without pip of its own (seeding pip costs more CPU than the
    tests that use it); install into it with :func:`pip_into`. Returns its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def pip_into(python: Path) -> list[str]:
    """This interpreter's pip, installing into the environment of ``python``."""
    return [sys.executable, "-m", "pip", "--python", str(python)]
