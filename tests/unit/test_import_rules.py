"""Import rules of the layout, checked over every module that exists (found on disk, so new
modules are covered the day they are added):

- ``tunefleet.coordinator`` never imports ``tunefleet.worker`` and the worker never imports
  the coordinator;
- the coordinator never imports pyopencl or loopy (it runs on login nodes without OpenCL);
- the shared core (``tunefleet`` outside those two and ``tunefleet.migrations``) imports
  neither of the two, nor OpenCL at import time
  (the ``tunefleet.cli`` aggregator excepted: it registers both components' subcommands, and
  the ``tunefleet.api`` front door, which drives the coordinator and starts workers);
- the ``tunefleet`` command itself loads without OpenCL;
- the worker loads without SQLAlchemy;
- no import cycle between first-party modules (:func:`import_graph`, :func:`cycles`);
- layers point down: only the entry points (``__main__`` modules; the console script names
  ``tunefleet.cli:main``) import ``tunefleet.cli``, and the packages (:func:`package_of`:
  each subpackage, component and top-level module of ``tunefleet``) form no import cycle
  either (:func:`package_graph`): what several packages share lives below them
  (``tunefleet.options``, ``tunefleet.text``, ``tunefleet.db.resolve``), never in ``cli/``.

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
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The repository folders installed as tunefleet.<name> (pyproject.toml's package-dir); the
# core itself is src/tunefleet.
COMPONENTS = ("coordinator", "worker", "migrations")
# The core's packages that may name both components (inside functions): the command line and
# the Python API built beside it.
FRONT_DOORS = ("tunefleet.cli", "tunefleet.api")
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
    names: set[str] = set()
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


def first_party_modules() -> dict[str, Path]:
    """Every module of the distribution, by installed name (``__main__`` modules too: they
    are never imported, so they cannot close a cycle, but what they import is checked)."""
    return {
        _module_name(path): path for folder in FOLDERS.values() for path in folder.rglob("*.py")
    }


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Imports(ast.NodeVisitor):
    """The first-party modules one file imports, with the line of the first such import.

    What counts (everything that runs, wherever it is):

    - every ``import``/``from ... import`` statement, in functions too, relative ones resolved
      against the file's package, and ``importlib.import_module("...")``/``__import__("...")``
      of a constant name;
    - ``from P import n`` is an import of the submodule ``P.n`` where that is a module, else of
      ``P`` itself (a name ``P``'s ``__init__`` defines); ``from . import x`` likewise;
    - ``import a.b.c`` is an import of ``a.b.c`` only. Python initialises the parent packages
      first, but that is no edge: a submodule reaches its parent while the parent is already
      being imported (``__init__`` importing its submodule, which imports a sibling, works and
      is no cycle). A submodule that needs a *name* from its parent's ``__init__`` writes
      ``from P import name``, and that is an edge to ``P``.

    Not counted: imports under ``if TYPE_CHECKING:`` (its ``else`` branch is). They never run,
    so they order nothing at import time; they are how an annotation names a type of a module
    that imports this one.
    """

    def __init__(self, name: str, is_package: bool, modules: Mapping[str, Path]) -> None:
        self.name = name
        self.package = name if is_package else name.rpartition(".")[0]
        self.modules = modules
        self.found: dict[str, int] = {}

    def _add(self, target: str, node: ast.AST) -> None:
        if target != self.name and target in self.modules:
            self.found.setdefault(target, getattr(node, "lineno", 0))

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.package.split(".")
            base = ".".join(parts[: len(parts) - (node.level - 1)])
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            self._add(submodule if submodule in self.modules else base, node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if (
            called in {"import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            self._add(node.args[0].value, node)
        self.generic_visit(node)


def import_graph(modules: Mapping[str, Path]) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line of the first import}}`` over ``modules`` (by name)."""
    graph = {}
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py", modules)
        visitor.visit(ast.parse(path.read_text(), filename=str(path)))
        graph[name] = visitor.found
    return graph


def cycles(graph: Mapping[str, Mapping[str, int]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: the
    modules of each can all reach each other through imports, a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, {})):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def package_of(module: str) -> str:
    """The package a module counts for in the layer rule: ``tunefleet.coordinator.cli`` ->
    ``tunefleet.coordinator``, ``tunefleet.db.embedded.server`` -> ``tunefleet.db``, a
    top-level module (``tunefleet.errors``) itself, and ``tunefleet`` (the front's
    ``__init__``) itself."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """:func:`import_graph` folded onto :func:`package_of` (edges inside a package dropped,
    ``__main__`` modules left out: nothing imports them). The line is that of one module's
    import that makes the edge, for :func:`describe_package_cycle`."""
    folded: dict[str, dict[str, int]] = {}
    for module, targets in graph.items():
        if module.rpartition(".")[2] == "__main__":
            continue
        source = package_of(module)
        folded.setdefault(source, {})
        for target, line in targets.items():
            if package_of(target) != source:
                folded[source].setdefault(package_of(target), line)
    return folded


def describe_package_cycle(
    graph: Mapping[str, Mapping[str, int]], component: tuple[str, ...]
) -> str:
    """Which module of each package imports the next package round the loop."""
    packages = package_graph(graph)
    loop = _loop(packages, component)
    steps = []
    for a, b in zip(loop, [*loop[1:], loop[0]], strict=True):
        module, line = next(
            (m, targets[t])
            for m, targets in sorted(graph.items())
            if package_of(m) == a and m.rpartition(".")[2] != "__main__"
            for t in sorted(targets)
            if package_of(t) == b
        )
        steps.append(f"  {module}:{line} imports {b}")
    return " <-> ".join(component) + "\n" + "\n".join(steps)


def _loop(graph: Mapping[str, Mapping[str, int]], component: tuple[str, ...]) -> list[str]:
    """One import loop through a component, from its first module back to it (shortest)."""
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node]):
            if target == start:
                return paths[node]
            if target in component and target not in paths:
                paths[target] = [*paths[node], target]
                queue.append(target)
    raise AssertionError(f"{component} is not a cycle")


def describe_cycle(
    graph: Mapping[str, Mapping[str, int]],
    component: tuple[str, ...],
    modules: Mapping[str, Path],
) -> str:
    loop = _loop(graph, component)
    steps = [
        f"  {modules[a].relative_to(ROOT) if modules[a].is_relative_to(ROOT) else modules[a]}"
        f":{graph[a][b]} imports {b}"
        for a, b in zip(loop, [*loop[1:], loop[0]], strict=True)
    ]
    return " <-> ".join(component) + "\n" + "\n".join(steps)


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
    assert "tunefleet.cli" not in _modules("tunefleet", exclude=FRONT_DOORS)


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
    assert _violations("tunefleet", {"worker", "coordinator"}, exclude=FRONT_DOORS) == []


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
    modules = _modules("tunefleet", exclude=FRONT_DOORS)
    assert _import_blocked({"worker", "coordinator", "pyopencl", "loopy"}, modules) == []


@pytest.mark.parametrize("blocked", [{"pyopencl"}, {"loopy"}])
def test_the_command_line_loads_without_opencl(blocked: set[str]) -> None:
    """`tunefleet ...` runs the coordinator on login nodes: building the whole command tree
    (which registers the worker's subcommands too) must not need OpenCL."""
    assert _import_blocked(blocked, ["tunefleet.cli", "@cli"]) == []


def test_no_import_cycle_between_first_party_modules() -> None:
    """A cycle hidden by a function-local import is a cycle too: it decides which module
    must load first, and a newcomer cannot change one side alone."""
    modules = first_party_modules()
    graph = import_graph(modules)
    found = cycles(graph)
    told = [describe_cycle(graph, c, modules) for c in found]
    assert not told, "import cycles between first-party modules:\n" + "\n".join(told)


def test_the_cycle_rule_catches_a_cycle(tmp_path: Path) -> None:
    """The graph and the search find a loop closed by a function-local relative import, and
    nothing where Python's import order has none."""
    files = {
        # An __init__ importing its submodule, which imports a sibling: no cycle.
        "pkg/__init__.py": "from pkg import a\nVERSION = 1\n",
        # a -> b -> c -> a, closed inside a function, relative.
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def f():\n    from . import c\n",
        "pkg/c.py": "import json\n\ndef g():\n    import pkg.a\n",
        # d -> e only under TYPE_CHECKING; e -> d: no cycle.
        "pkg/d.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.e import E\n"
        ),
        "pkg/e.py": "from pkg.d import TYPE_CHECKING\nclass E: ...\n",
        # A name of the parent's __init__, which imports a: f -> pkg -> a -> ... no way back.
        "pkg/f.py": "from pkg import VERSION\n",
        # g <-> h through importlib and a parent-relative import of a subpackage.
        "pkg/g.py": "import importlib\nimportlib.import_module('pkg.sub.h')\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/h.py": "from .. import g\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    modules = {}
    for rel in files:
        parts = rel.removesuffix(".py").split("/")
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = tmp_path / rel
    graph = import_graph(modules)
    assert graph["pkg"] == {"pkg.a": 1}
    assert graph["pkg.b"] == {"pkg.c": 2}
    assert graph["pkg.d"] == {}
    assert graph["pkg.f"] == {"pkg": 1}
    assert cycles(graph) == [("pkg.a", "pkg.b", "pkg.c"), ("pkg.g", "pkg.sub.h")]
    told = describe_cycle(graph, ("pkg.a", "pkg.b", "pkg.c"), modules)
    assert told.splitlines()[1:] == [
        f"  {tmp_path}/pkg/a.py:1 imports pkg.b",
        f"  {tmp_path}/pkg/b.py:2 imports pkg.c",
        f"  {tmp_path}/pkg/c.py:4 imports pkg.a",
    ]


def test_only_the_entry_points_import_the_command_line() -> None:
    """``tunefleet.cli`` is the top layer: the API, the dashboard and both components take
    what they share from the packages below it, and only the entry points (``python -m
    tunefleet``, ``python -m tunefleet.worker``, the console script) reach it."""
    modules = first_party_modules()
    graph = import_graph(modules)
    importers = sorted(
        f"{modules[m].relative_to(ROOT)}:{targets[t]} imports {t}"
        for m, targets in graph.items()
        if package_of(m) != "tunefleet.cli" and m.rpartition(".")[2] != "__main__"
        for t in targets
        if package_of(t) == "tunefleet.cli"
    )
    assert importers == []
    entry = [m for m, t in graph.items() if "tunefleet.cli" in t]
    assert sorted(entry) == ["tunefleet.__main__", "tunefleet.worker.__main__"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'tunefleet = "tunefleet.cli:main"' in pyproject


def test_no_import_cycle_between_packages() -> None:
    """The packages (tunefleet's subpackages and top-level modules, the coordinator, the
    worker and the migrations) form layers: no package reaches back into one that imports
    it, even through a third, even inside a function."""
    graph = import_graph(first_party_modules())
    packages = package_graph(graph)
    assert {"tunefleet.cli", "tunefleet.api", "tunefleet.options", "tunefleet.text"} <= set(
        packages
    )
    assert {"tunefleet.coordinator", "tunefleet.worker", "tunefleet.migrations"} <= set(packages)
    told = [describe_package_cycle(graph, c) for c in cycles(packages)]
    assert not told, "import cycles between packages:\n" + "\n".join(told)


def test_the_package_rule_catches_a_loop_between_packages() -> None:
    """Modules that form no cycle can still tie two packages into one: a.x -> b.y and
    b.z -> a.w is a loop of packages ``a`` and ``b`` (here ``top.a`` and ``top.b``)."""
    graph = {
        "top.a.x": {"top.b.y": 3},
        "top.a.w": {},
        "top.b.y": {},
        "top.b.z": {"top.a.w": 7},
        "top.b.__main__": {"top.c": 1},
        "top.c": {"top.a.x": 2},
    }
    assert cycles(graph) == []
    packages = package_graph(graph)
    assert packages == {"top.a": {"top.b": 3}, "top.b": {"top.a": 7}, "top.c": {"top.a": 2}}
    assert cycles(packages) == [("top.a", "top.b")]
    assert describe_package_cycle(graph, ("top.a", "top.b")).splitlines()[1:] == [
        "  top.a.x:3 imports top.b",
        "  top.b.z:7 imports top.a",
    ]
