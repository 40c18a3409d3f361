"""Where transform-space modules live, and how runs and archives name them.

A run names its space either ``feinsum:NAME.py`` (a module shipped in feinsum's
``tuning/impls`` directory, found on each machine in its own feinsum installation) or by an
absolute path (a user module; it must be readable on the coordinator and on every worker, e.g.
on a shared file system). feinsum's archive stores the same thing in ``transform_id``: the bare
file name for a shipped module, the module path otherwise.

Finding the shipped directory never imports feinsum (importing it pulls in pyopencl):
``importlib.util.find_spec`` only locates the package. ``$TUNEFLEET_FEINSUM_IMPLS`` names a
directory searched first, for machines that have feinsum's sources but cannot install it
(Python < 3.12 on a login node).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tunefleet.errors import ProblemError
from tunefleet.feinsum_support import INSTALL_HINT

SHIPPED = "feinsum:"
IMPLS_ENV = "TUNEFLEET_FEINSUM_IMPLS"


def feinsum_installed() -> bool:
    """Whether a feinsum package (not a stray namespace directory) can be found."""
    try:
        spec = importlib.util.find_spec("feinsum")
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


def installed_impls_dir() -> Path | None:
    """feinsum's ``tuning/impls`` directory of the installed package, or ``None``."""
    try:
        spec = importlib.util.find_spec("feinsum")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).resolve().parent / "tuning" / "impls"
    return path if path.is_dir() else None


def search_dirs() -> list[Path]:
    dirs: list[Path] = []
    explicit = os.environ.get(IMPLS_ENV)
    if explicit:
        dirs.append(Path(explicit).expanduser().resolve())
    installed = installed_impls_dir()
    if installed is not None:
        dirs.append(installed)
    return dirs


def _check_name(name: str, raw: str) -> str:
    if not name.endswith(".py") or "/" in name or "\\" in name or name in {".py", ""}:
        raise ProblemError(
            f"space={raw!r}: a shipped space is feinsum:NAME.py, e.g. "
            "feinsum:ifj_fe_fej_to_ei_v3.py"
        )
    return name


def normalise_space(raw: object) -> str:
    """The stored form: ``feinsum:NAME.py`` or an absolute path to a ``.py`` file."""
    if not isinstance(raw, str) or not raw.strip():
        raise ProblemError(
            "feinsum needs space=PATH.py or space=feinsum:NAME.py (a transform-space module)"
        )
    raw = raw.strip()
    if raw.startswith(SHIPPED):
        return SHIPPED + _check_name(raw[len(SHIPPED) :], raw)
    if not raw.endswith(".py"):
        raise ProblemError(f"space={raw!r} is not a Python file; give PATH.py")
    path = Path(raw).expanduser().resolve()
    installed = installed_impls_dir()
    if installed is not None and path.parent == installed:
        return SHIPPED + path.name
    return str(path)


def space_path(space: str) -> Path:
    """The file of a stored space name on this machine."""
    if not space.startswith(SHIPPED):
        path = Path(space)
        if not path.is_file():
            raise ProblemError(
                f"transform space {space!r} does not exist on this machine; it must be "
                "readable at the same path on the coordinator and every worker"
            )
        return path
    name = _check_name(space[len(SHIPPED) :], space)
    dirs = search_dirs()
    for d in dirs:
        if (d / name).is_file():
            return d / name
    if not dirs:
        raise ProblemError(
            f"cannot find {space}: feinsum is not installed here; {INSTALL_HINT}, or set "
            f"{IMPLS_ENV} to a directory holding feinsum's tuning/impls modules"
        )
    raise ProblemError(
        f"{space} is not among feinsum's shipped spaces (looked in "
        f"{', '.join(str(d) for d in dirs)}); check the name"
    )


def transform_id(space: str) -> str:
    """What feinsum's archive stores in ``transform_id`` for this space."""
    return space[len(SHIPPED) :] if space.startswith(SHIPPED) else space


def space_from_transform_id(tid: str) -> str:
    """The stored space name for an archive's ``transform_id``."""
    if "/" not in tid and "\\" not in tid:
        return SHIPPED + _check_name(tid, tid)
    return tid


def shipped_spaces() -> list[str]:
    """The shipped spaces this machine can see, as ``feinsum:NAME.py``."""
    names: set[str] = set()
    for d in search_dirs():
        names.update(p.name for p in d.glob("*.py") if p.name != "__init__.py")
    return sorted(SHIPPED + n for n in names)
