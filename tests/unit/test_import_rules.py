"""Import rules of the layout, checked over every module that exists (found on disk, so new
modules are covered the day they are added):

- ``tunefleet.coordinator`` never imports ``tunefleet.worker`` and the worker never imports
  the coordinator;
- the coordinator never imports pyopencl or loopy (it runs on login nodes without OpenCL);
- the shared core (``tunefleet`` outside those two and ``tunefleet.migrations``) imports
  neither of the two, nor OpenCL at import time
  (the ``tunefleet.cli`` aggregator excepted: it registers both components' subcommands);
- the ``tunefleet`` command itself loads without OpenCL;
- the worker loads without SQLAlchemy.

Two checks each: the source (every import statement, also those inside functions) and a real
import of every module in a fresh interpreter where the forbidden packages cannot load.
A name is judged by its *area* (:func:`area`): ``tunefleet.worker.loop`` is in ``worker``,
``tunefleet.db`` in ``tunefleet``, ``pyopencl.array`` in ``pyopencl``; relative imports are
resolved first.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The repository folders installed as tunefleet.<name> (pyproject.toml's package-dir); the
# core itself is src/tunefleet.
COMPONENTS = ("coordinator", "worker", "migrations")
FOLDERS = {"tunefleet": ROOT / "src" / "tunefleet"} | {c: ROOT / c for c in COMPONENTS}


def area(module: str) -> str:
    """``tunefleet.worker.x`` -> ``worker``; ``tunefleet.db`` -> ``tunefleet``; ``a.b`` -> ``a``."""
    parts = module.split(".")
    if parts[0] == "tunefleet" and len(parts) > 1 and parts[1] in COMPONENTS:
        return parts[1]
    return parts[0]


# Raises on any import of a blocked area, then imports the given modules and prints which
# blocked areas' modules ended up in sys.modules anyway.
_PROBE = r"""
import importlib, json, sys
blocked = set(sys.argv[1].split(","))

def area(name):
    parts = name.split(".")
    if parts[0] == "tunefleet" and parts[1:2] in (["coordinator"], ["worker"], ["migrations"]):
        return parts[1]
    return parts[0]

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if area(name) in blocked:
            raise ImportError(f"import of {name!r} is forbidden here")
        return None

sys.meta_path.insert(0, Blocker())
for module in sys.argv[2:]:
    if module == "@cli":
        from tunefleet.cli import build_parser
        build_parser().format_help()
    else:
        importlib.import_module(module)
print(json.dumps(sorted(n for n in sys.modules if area(n) in blocked)))
"""


def _module_name(path: Path) -> str:
    """The installed name of a source file: ``worker/loop.py`` -> ``tunefleet.worker.loop``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "src":
        parts.pop(0)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in COMPONENTS:
        parts.insert(0, "tunefleet")
    return ".".join(parts)


def _modules(folder: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """Every module in a repository folder (``__main__`` would run code)."""
    found = []
    for path in sorted(FOLDERS[folder].rglob("*.py")):
        name = _module_name(path)
        parts = name.split(".")
        if parts[-1] == "__main__" or any(name == e or name.startswith(e + ".") for e in exclude):
            continue
        found.append(name)
    return found


def _import_blocked(blocked: set[str], modules: list[str]) -> list[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(sorted(blocked)), *modules],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


def _imported_names(path: Path, package: str = "") -> set[str]:
    """Areas imported anywhere in a file (functions included); ``package`` is the file's own
    package, against which relative imports resolve."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(area(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(area(node.module))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            if node.module:
                names.add(area(".".join([*base, node.module])))
            else:  # from .. import worker
                names.update(area(".".join([*base, alias.name])) for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in {"import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(area(node.args[0].value))
    return names


def _violations(folder: str, forbidden: set[str], exclude: tuple[str, ...] = ()) -> list[str]:
    out = []
    for path in sorted(FOLDERS[folder].rglob("*.py")):
        rel = path.relative_to(ROOT)
        name = _module_name(path)
        if any(name == e or name.startswith(e + ".") for e in exclude):
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for name in sorted(_imported_names(path, package) & forbidden):
            out.append(f"{rel} imports {name}")
    return out


def test_modules_are_found() -> None:
    """The walk sees the packages' modules (an empty walk would make the rest vacuous)."""
    assert "tunefleet.coordinator" in _modules("coordinator")
    assert "tunefleet.worker.cli" in _modules("worker")
    assert "tunefleet.db.engine" in _modules("tunefleet")
    assert "tunefleet.cli" not in _modules("tunefleet", exclude=("tunefleet.cli",))


def test_blocker_and_scanner_catch_forbidden_imports(tmp_path: Path) -> None:
    """Both checks fail on a module that breaks the rule (so a pass means something)."""
    bad = tmp_path / "bad_module.py"
    bad.write_text("def f():\n    import pyopencl\n\nimport json\nimport tunefleet.worker.cli\n")
    assert _imported_names(bad) == {"pyopencl", "json", "worker"}
    relative = tmp_path / "relative.py"
    relative.write_text("from ..worker import loop\nfrom .rules import x\nfrom .. import db\n")
    assert _imported_names(relative, "tunefleet.coordinator") == {
        "worker",
        "coordinator",
        "tunefleet",
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{ROOT}"
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, "worker", "bad_module"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0 and "import of 'tunefleet.worker' is forbidden" in proc.stderr


def test_coordinator_source_never_names_worker_or_opencl() -> None:
    assert _violations("coordinator", {"worker", "pyopencl", "loopy"}) == []


def test_worker_source_never_names_coordinator() -> None:
    assert _violations("worker", {"coordinator"}) == []


def test_shared_core_source_never_names_the_components() -> None:
    assert _violations("tunefleet", {"worker", "coordinator"}, exclude=("tunefleet.cli",)) == []


def test_coordinator_modules_import_without_worker_or_opencl() -> None:
    blocked = {"worker", "pyopencl", "loopy"}
    assert _import_blocked(blocked, _modules("coordinator")) == []


def test_worker_modules_import_without_coordinator() -> None:
    assert _import_blocked({"coordinator"}, _modules("worker")) == []


def test_worker_modules_import_without_sqlalchemy() -> None:
    """A worker, and each device and code-generation process it spawns, talks to the queue
    through psycopg alone: SQLAlchemy (the schema's definition, for migrations and people)
    cost each of those processes 0.6 s of CPU at start."""
    assert _import_blocked({"sqlalchemy"}, _modules("worker")) == []


def test_shared_core_imports_without_opencl_or_components() -> None:
    modules = _modules("tunefleet", exclude=("tunefleet.cli",))
    assert _import_blocked({"worker", "coordinator", "pyopencl", "loopy"}, modules) == []


@pytest.mark.parametrize("blocked", [{"pyopencl"}, {"loopy"}])
def test_the_command_line_loads_without_opencl(blocked: set[str]) -> None:
    """`tunefleet ...` runs the coordinator on login nodes: building the whole command tree
    (which registers the worker's subcommands too) must not need OpenCL."""
    assert _import_blocked(blocked, ["tunefleet.cli", "@cli"]) == []
