"""``tunefleet replay RUN``: a run's stored measurements replayed, and ``--search-seed``
stored with the run that a real ``tunefleet tune`` (real workers, the synthetic problem)
made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tunefleet.cli import main
from tunefleet.db.engine import connect
from tunefleet.queries.recording import recording_of


def test_a_tuned_run_keeps_its_search_seed_and_replays_from_the_database(
    db_url: str, tmp_path: Path, capsys
) -> None:
    env = {**os.environ, "TUNEFLEET_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [
            sys.executable, "-m", "tunefleet", "tune", "synthetic", "--db", db_url,
            "--workers", "1", "--max-trials", "24", "--confirm", "0", "--arg", "duration=0",
            "--search-seed", "11",
        ],
        env=env, capture_output=True, text=True, timeout=280, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with connect(db_url) as conn:
        run = conn.execute("SELECT id, search, cache_key FROM tunefleet.run").fetchone()
        finished = conn.execute(
            "SELECT count(*) AS n FROM tunefleet.trial WHERE run_id = %s "
            "AND purpose = 'search' AND state IN ('done', 'invalid', 'failed', 'timed_out')",
            (run["id"],),
        ).fetchone()["n"]
        rec = recording_of(conn, str(run["id"]))
        assert recording_of(conn, run["cache_key"]).rows == rec.rows
    assert run["search"]["search_seed"] == 11
    assert len(rec.rows) == finished >= 24
    assert rec.problem == "synthetic" and rec.best.median_s is not None

    out = tmp_path / "replay.json"
    argv = ["replay", str(run["id"]), "--db", db_url, "--seeds", "2", "--evals", "10"]
    assert main([*argv, "--save", str(out)]) == 0
    assert "10: median / worst / best" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["recorded"] == len(rec.rows) and saved["source"] == f"run {run['id']}"

    assert main(["replay", "999999", "--db", db_url]) == 1
    assert "no run 999999" in capsys.readouterr().err
