"""A newcomer follows the README's five-minute tour verbatim: every ```bash block the README
marks with ``<!-- tour -->`` runs, in order, in one shell (as a reader types them), with a fresh
home directory, so the tour's own ``TUNEFLEET_HOME`` is a fresh embedded database. The README
and this test cannot drift: the test reads the blocks from the README itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tunefleet.db.engine import connect

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
pytestmark = pytest.mark.acceptance


def tour_blocks() -> list[str]:
    return re.findall(r"^<!-- tour -->\n```bash\n(.*?)^```", README.read_text(), re.S | re.M)


def test_the_tour_covers_tune_watch_sql_and_a_fleet() -> None:
    script = "\n".join(tour_blocks())
    assert len(tour_blocks()) >= 4
    for step in ("tunefleet tune ", "tunefleet status ", "SELECT ", "tunefleet worker "):
        assert step in script, f"the README's tour lost its {step.strip()!r} step"


def test_the_readme_tour_runs_verbatim(tmp_path: Path) -> None:
    home = tmp_path / "user"
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "PYTHONUNBUFFERED": "1",
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }
    for name in ("TUNEFLEET_HOME", "TUNEFLEET_DATABASE_URL", "VIRTUAL_ENV"):
        env.pop(name, None)
    script = "set -euo pipefail\n" + "\n".join(tour_blocks())
    tour_home = home / "tunefleet-tour"
    data = tour_home / "postgres" / "data"
    try:
        proc = subprocess.run(
            ["bash", "-c", script],
            cwd=home,
            env=env,
            capture_output=True,
            text=True,
            timeout=280,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert not (data / "postmaster.pid").exists(), "the tour's last step stops its server"
        # What the reader was shown: a best with its reproduce command, a status, the SQL rows.
        assert "best: trial" in proc.stdout and "tunefleet measure synthetic" in proc.stdout
        sql_rows = [ln for ln in proc.stdout.splitlines() if re.match(r"\d+ \{.*\} \d", ln)]
        assert len(sql_rows) == 3, proc.stdout

        tour_env = {**env, "TUNEFLEET_HOME": str(tour_home)}
        for argv in (["db", "start"], ["db", "url"]):
            db = subprocess.run(
                ["tunefleet", *argv], env=tour_env, capture_output=True, text=True, timeout=120
            )
            assert db.returncode == 0, db.stderr
        with connect(db.stdout.strip()) as conn:
            runs = conn.execute("SELECT id, state FROM tunefleet.run ORDER BY id").fetchall()
            fleet = conn.execute(
                "SELECT count(*) AS n, count(DISTINCT worker_id) AS workers"
                " FROM tunefleet.results WHERE run_id = 2"
            ).fetchone()
        assert [(r["id"], r["state"]) for r in runs] == [(1, "finished"), (2, "finished")]
        # The search alone, served by the one worker the tour started on its own.
        assert fleet is not None
        assert fleet["n"] >= 8 and fleet["workers"] == 1
    finally:
        if (data / "postmaster.pid").exists():
            from tunefleet.db.embedded import EmbeddedServer

            EmbeddedServer(data).stop()
