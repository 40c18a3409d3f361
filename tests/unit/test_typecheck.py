"""CI's type check (.ci/typecheck.py) sees across the repository's top-level folders: a call
from ``src/`` into ``coordinator/`` is typed against the coordinator's real signature.

The check runs on a copy of the checkout (with a copy of the checkout's mypy cache where CI's
type check left one: 6 s for both runs instead of 21 s cold, on one core): once as it is
(passes), once with a wrong
keyword planted at the API's ``CoordinatorSettings.build(...)`` call (fails, naming the file).
Plain ``mypy`` with pyproject's settings missed that planted keyword: it checks
``coordinator/`` under its folder name and types ``tunefleet.coordinator.*`` as ``Any``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUNE = Path("src/tunefleet/api/tune.py")
CALL = "CoordinatorSettings.build("
PLANTED = "no_such_keyword"


def _copy_checkout(to: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("src", "coordinator", "worker", "migrations", ".ci"):
        shutil.copytree(ROOT / folder, to / folder, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", to / "pyproject.toml")
    # The checkout's own cache where CI's type check (or a developer's) left one: mypy
    # re-checks what differs by content, so the clean run is a warm one.
    cache = ROOT / ".mypy_cache" / "installed"
    if cache.is_dir():
        shutil.copytree(cache, to / ".mypy_cache" / "installed")


def _typecheck(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / ".ci" / "typecheck.py"), "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_wrong_keyword_at_an_api_to_coordinator_call_fails_the_check(tmp_path: Path) -> None:
    # mypy comes with the dev extra; an environment with only the test extra (CI's second
    # Python) has no type checker to test.
    pytest.importorskip("mypy", reason="mypy is not installed here (pip install -e '.[dev]')")
    _copy_checkout(tmp_path)
    clean = _typecheck(tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "Success" in clean.stdout

    source = (tmp_path / TUNE).read_text()
    assert source.count(CALL) == 1, f"{TUNE} no longer calls {CALL}...): update this test"
    (tmp_path / TUNE).write_text(source.replace(CALL, f"{CALL}{PLANTED}=1, "))
    planted = _typecheck(tmp_path)
    assert planted.returncode == 1, planted.stdout + planted.stderr
    errors = [line for line in planted.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, planted.stdout
    assert errors[0].startswith(f"{TUNE}:") and PLANTED in errors[0], errors[0]
