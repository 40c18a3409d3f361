"""Every ```python block of the README and docs/ whose first line is ``# runnable`` runs as
it is, each in a fresh interpreter, against a fresh database (``TUNEFLEET_DATABASE_URL``) and
home; the blocks keep to the synthetic problem so that they stay fast."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = "# runnable\n"


def runnable_blocks() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        blocks = re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)
        runnable = [b for b in blocks if b.startswith(MARK)]
        found += [(f"{path.name}#{i}", b) for i, b in enumerate(runnable, 1)]
    return found


BLOCKS = runnable_blocks()


def test_the_docs_have_runnable_python_blocks() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("code", [b for _, b in BLOCKS], ids=[name for name, _ in BLOCKS])
def test_a_runnable_block_runs(code: str, db_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "TUNEFLEET_DATABASE_URL": db_url, "TUNEFLEET_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
