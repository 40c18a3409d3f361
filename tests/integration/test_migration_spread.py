"""Migration 0016_spread on a database with confirmations in it: they become round 1 and rank
as they did; a search trial may then have one confirmation per round (never two of one);
the downgrade keeps the first round and drops the shoot-out's."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.helpers.queue_data import (
    finish_reported,
    insert_run,
    insert_trials,
    synthetic_configs,
)
from tunefleet.db.engine import connect
from tunefleet.db.migrate import downgrade, upgrade

BEFORE = "0015_timeline"


def _confirm(conn: psycopg.Connection[Any], trial_id: int, round: int | None = None) -> int:
    """A pending confirmation of ``trial_id``: as 0015 wrote it (no round), or of ``round``."""
    if round is None:
        row = conn.execute(
            """
            INSERT INTO tunefleet.trial (run_id, config, config_hash, device_class, purpose,
                   confirms_trial_id)
            SELECT run_id, config, config_hash, device_class, 'confirm', id
              FROM tunefleet.trial WHERE id = %s RETURNING id
            """,
            (trial_id,),
        ).fetchone()
    else:
        row = conn.execute(
            """
            INSERT INTO tunefleet.trial (run_id, config, config_hash, device_class, purpose,
                   confirms_trial_id, confirm_round)
            SELECT run_id, config, config_hash, device_class, 'confirm', id, %s
              FROM tunefleet.trial WHERE id = %s RETURNING id
            """,
            (round, trial_id),
        ).fetchone()
    assert row is not None
    return int(row["id"])


def test_confirmations_become_round_one_rank_as_before_and_the_downgrade_keeps_them(
    empty_db_url: str,
) -> None:
    upgrade(empty_db_url, BEFORE)
    with connect(empty_db_url) as conn:
        run = insert_run(conn)
        fast, slow = insert_trials(conn, run, synthetic_configs(2))
        finish_reported(conn, fast, "done", 0.25)
        finish_reported(conn, slow, "done", 0.5)
        # The fast one's re-measurement was slower than the slow one: it ranked second.
        first = _confirm(conn, fast)
        finish_reported(conn, first, "done", 0.6)
        conn.execute("UPDATE tunefleet.trial SET disagrees = true WHERE id = %s", (first,))
    upgrade(empty_db_url)
    with connect(empty_db_url) as conn:
        row = conn.execute(
            "SELECT confirm_round FROM tunefleet.trial WHERE id = %s", (first,)
        ).fetchone()
        assert row is not None and row["confirm_round"] == 1
        best = conn.execute(
            "SELECT trial_id, standing, figure_s FROM tunefleet.best_per_run WHERE run_id = %s",
            (run,),
        ).fetchone()
        assert best is not None
        assert (best["trial_id"], best["standing"], best["figure_s"]) == (slow, None, None)
        # One confirmation per search trial and round: a second round is a row of its own,
        # a second round 1 is refused, and a confirmation must say its round.
        second = _confirm(conn, fast, 2)
        with pytest.raises(psycopg.errors.UniqueViolation):
            _confirm(conn, fast, 1)
        with pytest.raises(psycopg.errors.CheckViolation):
            _confirm(conn, slow)
        # The view joins the first round only: one row per search trial.
        rows = conn.execute(
            "SELECT count(*) AS n FROM tunefleet.best_per_run WHERE run_id = %s", (run,)
        ).fetchone()
        assert rows is not None and rows["n"] == 1
    downgrade(empty_db_url, BEFORE)
    with connect(empty_db_url) as conn:
        left = conn.execute(
            "SELECT id FROM tunefleet.trial WHERE purpose = 'confirm' ORDER BY id"
        ).fetchall()
        assert [r["id"] for r in left] == [first] and second != first
