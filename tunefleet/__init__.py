"""tunefleet: distributed autotuning of loopy (OpenCL) kernels through one PostgreSQL database.

This package is the shared core that both ``tunefleet.coordinator`` and ``tunefleet.worker``
import: settings, errors, the database (schema, engine, every SQL statement), the
parameter-space DSL, the problem registry, the embedded database and the CLI. The layout and
the rule at each boundary: docs/layout.md.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__version__ = "0.1.0"

# The subpackages whose source sits in the repository's top-level folders of the same name
# (pyproject.toml's package-dir): installed, they are inside this package's folder.
CHECKOUT_SUBPACKAGES = ("coordinator", "worker", "migrations")


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds ``tunefleet.<name>`` in ``<checkout>/<name>/`` when this package is a checkout's.

    A checkout's ``tunefleet/`` shadows the installed package whenever the checkout is on
    ``sys.path`` (``python -m`` or ``pytest`` started in it, ``PYTHONPATH``); without this the
    three subpackages would then be missing under a regular (not editable) install.
    """

    def __init__(self, folders: dict[str, Path]) -> None:
        self.folders = folders

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


def _serve_checkout_subpackages() -> None:
    here = Path(__file__).resolve().parent
    root = here.parent
    pyproject = root / "pyproject.toml"
    # An installed copy has the subpackages inside ``here``; only a checkout (its own
    # pyproject.toml beside it) maps them to the top-level folders, never another
    # distribution's ``worker`` or ``migrations`` in site-packages.
    if (here / "worker").is_dir() or not pyproject.is_file():
        return
    if 'name = "tunefleet"' not in pyproject.read_text(encoding="utf-8", errors="replace"):
        return
    folders = {f"{__name__}.{name}": root / name for name in CHECKOUT_SUBPACKAGES}
    if all((folder / "__init__.py").is_file() for folder in folders.values()):
        sys.meta_path.append(_CheckoutFinder(folders))


_serve_checkout_subpackages()
