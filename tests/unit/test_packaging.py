"""The distribution installs one top-level package, ``tunefleet``, whichever way it is installed.

The core lives in ``src/tunefleet/``; the repository keeps ``coordinator/``, ``worker/`` and
``migrations/`` at its top level, and pyproject.toml maps them to ``tunefleet.coordinator``,
``tunefleet.worker`` and ``tunefleet.migrations`` (``package-dir``, an explicit package list).
These tests build the real wheel and install it the ways a user does: a regular install (read
from the wheel, run from a directory without a checkout and from inside a checkout, which
cannot shadow it) and an editable install in a fresh virtual environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.helpers.build import bare_venv, has_build_backend, pip_into, project_wheel, source_copy

ROOT = Path(__file__).resolve().parents[2]
MAPPED = {"tunefleet": "src/tunefleet", "tunefleet.coordinator": "coordinator"}
MAPPED |= {"tunefleet.worker": "worker", "tunefleet.migrations": "migrations"}

# Prints where each package came from, importing nothing outside the standard library.
_WHERE = (
    "import tunefleet, tunefleet.coordinator, tunefleet.worker, tunefleet.migrations\n"
    "import tunefleet.migrations.versions\n"
    "for m in (tunefleet, tunefleet.coordinator, tunefleet.worker, tunefleet.migrations):\n"
    "    print(m.__file__)\n"
)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> str:
    # Nothing of this checkout on the path: only what the command installed is importable.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return project_wheel(tmp_path_factory)


def test_the_package_list_names_every_package_folder() -> None:
    """A new subpackage (a folder with ``__init__.py``) cannot be left out of the wheel."""
    config = _pyproject()["tool"]["setuptools"]
    assert config["package-dir"] == MAPPED
    on_disk = set()
    for package, folder in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            on_disk.add(".".join([package, *rel]))
    assert sorted(config["packages"]) == sorted(on_disk)


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert top == {"tunefleet"}
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["tunefleet"]
    for needed in (
        "tunefleet/coordinator/engine.py",
        "tunefleet/worker/__main__.py",
        "tunefleet/migrations/env.py",
        "tunefleet/migrations/script.py.mako",
        "tunefleet/migrations/versions/0001_initial.py",
    ):
        assert needed in names


def test_a_regular_install_imports_from_anywhere_and_from_a_checkout(
    wheel: Path, tmp_path: Path
) -> None:
    python = bare_venv(tmp_path / "venv")
    _run([*pip_into(python), "install", "--no-deps", "--no-index", "-q", str(wheel)], tmp_path)
    site = Path(
        _run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], tmp_path).strip()
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    installed = _run([str(python), "-c", _WHERE], elsewhere).split()
    assert installed == [
        str(site / "tunefleet" / "__init__.py"),
        str(site / "tunefleet" / "coordinator" / "__init__.py"),
        str(site / "tunefleet" / "worker" / "__init__.py"),
        str(site / "tunefleet" / "migrations" / "__init__.py"),
    ]
    # No generic top-level names: another distribution's `worker` is not shadowed or taken.
    for generic in ("coordinator", "worker", "migrations"):
        assert not (site / generic).exists()
    # Started inside a checkout (its root first on sys.path, as `python -m` and pytest put
    # it): the checkout's root holds no `tunefleet/`, so every package is still the installed
    # one; nothing mixes the checkout's code with the wheel's.
    checkout = source_copy(tmp_path / "checkout")
    assert not (checkout / "tunefleet").exists()
    from_checkout = _run([str(python), "-c", _WHERE], checkout).split()
    assert from_checkout == installed
    on_path = _run([str(python), "-c", f"import sys; sys.path.insert(0, '.'); {_WHERE}"], checkout)
    assert on_path.split() == installed


def test_this_test_session_imports_the_checkouts_code() -> None:
    """`python -m pytest` in a checkout (editable install, as CI does) runs this checkout's
    modules, each from its own folder, and no hand-written import hook is involved."""
    import tunefleet
    import tunefleet.coordinator
    import tunefleet.migrations
    import tunefleet.worker

    assert Path(tunefleet.__file__) == ROOT / "src" / "tunefleet" / "__init__.py"
    for package, folder in MAPPED.items():
        module = sys.modules[package]
        assert Path(module.__file__ or "").parent == ROOT / folder, package
    assert not any(type(f).__module__.startswith("tunefleet") for f in sys.meta_path)


def test_an_editable_install_imports_from_any_directory(tmp_path: Path) -> None:
    checkout = source_copy(tmp_path / "checkout")
    python = bare_venv(tmp_path / "venv")
    if has_build_backend():
        # Built by this interpreter's backend (nothing fetched), installed like pip -e does.
        build = (
            "import sys; from setuptools import build_meta as b; "
            "print(b.build_editable(sys.argv[1]))"
        )
        made = _run([sys.executable, "-c", build, str(tmp_path)], checkout).split()[-1]
        pip = [*pip_into(python), "install", "--no-deps", "--no-index", "-q"]
        _run([*pip, str(tmp_path / made)], tmp_path)
    else:
        pip = [*pip_into(python), "install", "--no-deps", "-q", "-e", str(checkout)]
        _run(pip, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _run([str(python), "-c", _WHERE], elsewhere).split() == [
        str(checkout / "src" / "tunefleet" / "__init__.py"),
        str(checkout / "coordinator" / "__init__.py"),
        str(checkout / "worker" / "__init__.py"),
        str(checkout / "migrations" / "__init__.py"),
    ]


def test_python_m_tunefleet_worker_runs_outside_the_checkout(tmp_path: Path) -> None:
    """The documented ``python -m tunefleet.worker`` with this environment's install."""
    out = _run([sys.executable, "-m", "tunefleet.worker", "--help"], tmp_path, timeout=120)
    assert out.startswith("usage: tunefleet worker")
