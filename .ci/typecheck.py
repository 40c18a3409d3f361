#!/usr/bin/env python3
"""CI's type check: mypy over the package as it installs, not as the repository folds it.

``coordinator/``, ``worker/`` and ``migrations/`` sit at the repository's top level and install
as ``tunefleet.coordinator``, ``tunefleet.worker`` and ``tunefleet.migrations``
(pyproject.toml's ``[tool.setuptools.package-dir]``). mypy cannot follow a package-dir
mapping: checked under their folder names, every import of ``tunefleet.coordinator.*`` from
``src/`` was typed ``Any``, so a wrong keyword at an api -> coordinator call passed. This
script builds a tree of symbolic links shaped like the installed package (``tunefleet/`` holding
``src/tunefleet``'s entries and one link per mapped folder) and runs mypy on ``tunefleet`` there,
with pyproject.toml's ``[tool.mypy]`` settings (per-module overrides renamed to the installed
names). Reports name the repository's files.

    python .ci/typecheck.py            # exit status is mypy's
    python .ci/typecheck.py --root DIR # check another checkout (the test of this check does)

The tree and mypy's cache live in ``.mypy_cache/`` under the checked root, so a second run
re-checks only what changed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

PACKAGE = "tunefleet"


def _mapped_folders(pyproject: dict[str, Any]) -> dict[str, str]:
    """``{installed package: repository folder}`` for the core and each mapped subpackage."""
    mapping = pyproject["tool"]["setuptools"]["package-dir"]
    if PACKAGE not in mapping:
        raise SystemExit(f"typecheck: pyproject.toml's package-dir does not map {PACKAGE!r}")
    return dict(mapping)


def build_tree(root: Path, tree: Path, mapping: dict[str, str]) -> Path:
    """Link ``tree/tunefleet`` into the installed layout; returns ``tree``."""
    if tree.exists():
        shutil.rmtree(tree)
    core = root / mapping[PACKAGE]
    package = tree / PACKAGE
    package.mkdir(parents=True)
    mapped = {
        name.removeprefix(PACKAGE + "."): root / folder
        for name, folder in mapping.items()
        if name != PACKAGE
    }
    for sub, folder in mapped.items():
        if "." in sub:
            raise SystemExit(f"typecheck: nested package-dir {PACKAGE}.{sub} is not supported")
        if (core / sub).exists():
            raise SystemExit(f"typecheck: {core / sub} would shadow {folder}")
    for entry in sorted(core.iterdir()):
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for sub, folder in mapped.items():
        (package / sub).symlink_to(folder, target_is_directory=True)
    return tree


def _ini_value(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def write_config(settings: dict[str, Any], mapping: dict[str, str], tree: Path) -> Path:
    """A mypy.ini of pyproject's ``[tool.mypy]`` for the tree: its one package, its path, and
    each override's modules under their installed names (``migrations.*`` ->
    ``tunefleet.migrations.*``)."""
    renames = {folder.strip("/"): name for name, folder in mapping.items() if name != PACKAGE}
    lines = ["[mypy]"]
    for key, value in settings.items():
        if key in {"packages", "modules", "files", "mypy_path", "overrides", "cache_dir"}:
            continue
        lines.append(f"{key} = {_ini_value(value)}")
    lines += [f"packages = {PACKAGE}", f"mypy_path = {tree}"]
    for override in settings.get("overrides", []):
        modules = override["module"]
        modules = [modules] if isinstance(modules, str) else modules
        for module in modules:
            head, dot, rest = module.partition(".")
            name = renames.get(head, head) + dot + rest
            lines.append(f"\n[mypy-{name}]")
            lines += [
                f"{key} = {_ini_value(value)}" for key, value in override.items() if key != "module"
            ]
    config = tree / "mypy.ini"
    config.write_text("\n".join(lines) + "\n")
    return config


def _repository_paths(text: str, mapping: dict[str, str]) -> str:
    """mypy names files by the tree's links, relative to the tree (``tunefleet/coordinator/
    cli.py``); say the repository's paths instead (``coordinator/cli.py``)."""
    out = []
    for line in text.splitlines(keepends=True):
        for name, folder in sorted(mapping.items(), key=lambda item: -len(item[0])):
            linked = name.replace(".", "/") + "/"
            if line.startswith(linked):
                line = folder.rstrip("/") + "/" + line.removeprefix(linked)
                break
        out.append(line)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    mapping = _mapped_folders(pyproject)
    cache = root / ".mypy_cache"
    tree = build_tree(root, cache / "installed-tree", mapping)
    config = write_config(pyproject["tool"].get("mypy", {}), mapping, tree)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--cache-dir",
            str(cache / "installed"),
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "MYPYPATH"},
        check=False,
    )
    sys.stdout.write(_repository_paths(proc.stdout, mapping))
    sys.stderr.write(_repository_paths(proc.stderr, mapping))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
