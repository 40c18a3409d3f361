"""The one progress line (``tunefleet tune`` and ``tunefleet coordinator``) says what the
database holds: counts per state, the best, the rate, the workers able to serve the run."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.helpers.coordinator import register_worker
from tests.helpers.queue_data import (
    finish_reported,
    insert_run,
    insert_trials,
    synthetic_configs,
)
from tunefleet.settings import DatabaseSettings
from tunefleet.text.progress import ProgressReader


def test_the_progress_line_counts_what_the_database_holds(db_url, db):
    run = insert_run(db)
    ids = insert_trials(db, run, synthetic_configs(9))
    for trial_id, median_s in zip(ids[:3], (0.5, 0.25, 1.0), strict=True):
        finish_reported(db, trial_id, "done", median_s)  # best: 4 GFLOP/s
    finish_reported(db, ids[3], "invalid")
    finish_reported(db, ids[4], "failed")
    finish_reported(db, ids[5], "timed_out")
    live = [register_worker(db, "host-cpu") for _ in range(3)]
    register_worker(db, "host-cpu", age_s=3600)  # silent for an hour: not live
    db.execute(
        "UPDATE tunefleet.trial SET state = 'running', lease_owner = %s, attempt = 1, "
        "lease_expires_at = now() + interval '1 minute' WHERE id = %s",
        (live[0], ids[6]),
    )
    db.execute("UPDATE tunefleet.trial SET state = 'cancelled' WHERE id = %s", (ids[8],))
    db.execute(
        "INSERT INTO tunefleet.stand_aside (worker_id, run_id, reason) VALUES (%s, %s, 'no')",
        (live[2], run),
    )
    # Two minutes of run time, fixed (a finished_at), so the rate is exact: 6 in 2 min.
    db.execute(
        "UPDATE tunefleet.run SET max_trials = 20, created_at = now() - interval '2 min', "
        "finished_at = now() WHERE id = %s",
        (run,),
    )
    db.execute(
        "UPDATE tunefleet.run SET finished_at = created_at + interval '2 min' WHERE id = %s",
        (run,),
    )
    reader = ProgressReader(DatabaseSettings(url=db_url), db_url, run)
    try:
        line = reader.line("nobody can serve it: test")
    finally:
        reader.close()
    assert line == (
        f"run {run}: 6/20 finished (3 done, 1 invalid, 1 failed, 1 timed out), 1 running,"
        " 1 pending"
        " | best 4.00 GFLOP/s (unconfirmed) | 3.0 eval/min | 2 workers | 2m00s"
        " | 1 standing aside | nobody can serve it: test"
    )


def _confirm(db: psycopg.Connection[Any], trial_id: int, median_s: float, disagrees: bool) -> int:
    """A done confirmation of ``trial_id`` measured at ``median_s``, judged ``disagrees``."""
    row = db.execute(
        """
        INSERT INTO tunefleet.trial (run_id, config, config_hash, device_class, purpose,
               confirms_trial_id, confirm_round, state, disagrees, agreement_p, finished_at)
        SELECT run_id, config, config_hash, device_class, 'confirm', id, 1, 'done', %s, 0.5,
               now()
          FROM tunefleet.trial WHERE id = %s
        RETURNING id
        """,
        (disagrees, trial_id),
    ).fetchone()
    assert row is not None
    finish_reported(db, row["id"], "done", median_s)
    return int(row["id"])


def test_the_best_everywhere_is_the_confirmed_one_and_says_what_it_is(db_url, db):
    """The progress line, ``runs`` and ``status`` read the run's best from one place
    (``best_per_run``): the search's fastest while unconfirmed; its re-measured figure once
    confirmed; and once a re-measurement disagrees, the re-measured figure marked NOT
    reproduced (or the next best, if that is faster now)."""
    from tunefleet.queries import report
    from tunefleet.text.render import runs_table, status_text

    run = insert_run(db)
    fast, slow = insert_trials(db, run, synthetic_configs(2))
    finish_reported(db, fast, "done", 0.25)  # 4 GFLOP/s in the search
    finish_reported(db, slow, "done", 0.5)  # 2 GFLOP/s

    def best() -> tuple[str, str, str]:
        reader = ProgressReader(DatabaseSettings(url=db_url), db_url, run)
        try:
            line = reader.line()
        finally:
            reader.close()
        assert line is not None
        table = runs_table(report.list_runs(db))
        return line.split(" | ")[1], table.splitlines()[-1], status_text(db, run)

    line, row, status = best()
    assert line == "best 4.00 GFLOP/s (unconfirmed)"
    assert "4.00" in row and "unconfirmed" in row
    assert f"4.00 GFLOP/s (median 250 ms), trial {fast}, unconfirmed" in status

    agrees = _confirm(db, fast, 0.3125, disagrees=False)  # 3.2 GFLOP/s, re-measured
    line, row, status = best()
    assert line == "best 3.20 GFLOP/s"  # the confirmed figure, not the search's 4
    assert "3.20" in row and "confirmed" in row
    assert f"3.20 GFLOP/s (median 312 ms), trial {fast}, confirmed" in status

    db.execute("UPDATE tunefleet.trial SET disagrees = true WHERE id = %s", (agrees,))
    line, row, status = best()
    assert line == "best 3.20 GFLOP/s (NOT reproduced)"
    assert "not reproduced" in row
    assert f"trial {fast}: NOT reproduced" in status

    # re-measured far slower: the other configuration (2 GFLOP/s, unconfirmed) ranks first
    db.execute(
        "UPDATE tunefleet.measurement SET median_s = 1.0, gflops = 1.0 WHERE trial_id = %s",
        (agrees,),
    )
    line, row, status = best()
    assert line == "best 2.00 GFLOP/s (unconfirmed)"
    assert f"trial {slow}, unconfirmed" in status


def test_a_progress_line_is_skipped_while_the_database_is_away(db_url, db):
    """Progress never stops a run: an unreachable database gives no line, not an error, and
    the next read connects again."""
    run = insert_run(db)
    settings = DatabaseSettings(url=db_url, application_name="tunefleet-progress-test")
    reader = ProgressReader(settings, db_url, run)

    def counts(line: str | None) -> str:
        assert line is not None
        return line.rsplit(" | ", 1)[0]  # all but the elapsed time

    try:
        first = counts(reader.line())
        assert first.startswith(f"run {run}: 0 finished (0 done, 0 invalid, 0 failed), 0 running")
        ended = db.execute(
            "SELECT count(pg_terminate_backend(pid, 30000)) AS n FROM pg_stat_activity "
            "WHERE application_name = %s",
            (settings.application_name,),
        ).fetchone()
        assert ended is not None and ended["n"] == 1
        assert reader.line() is None  # its session ended (the call waited for that)
        assert counts(reader.line()) == first  # connected again
    finally:
        reader.close()
    gone = ProgressReader(DatabaseSettings(url=db_url), db_url, run + 1000)
    assert gone.line() is None  # no such run
    gone.close()


def test_best_top_prints_first_the_median_it_ranks_by(db_url, db):
    """``best --top``: a best re-measured slower than its search figure moves down, and the
    table's first figure is the re-measured median it was ranked by, so the column reads
    sorted (the search's figure stands apart as SEARCH); the JSON rows carry it too."""
    from tunefleet.text.output import seconds
    from tunefleet.text.render import best_text, read_best

    run = insert_run(db)
    first, second, third = insert_trials(db, run, synthetic_configs(3))
    finish_reported(db, first, "done", 0.25)  # fastest in the search ...
    finish_reported(db, second, "done", 0.5)
    finish_reported(db, third, "done", 0.75)
    _confirm(db, first, 0.625, disagrees=False)  # ... re-measured between the other two

    found = read_best(db, run, top=3)
    assert [b["trial_id"] for b in found.best] == [second, first, third]
    assert [b["ranked_median_s"] for b in found.best] == [0.5, 0.625, 0.75]
    text = best_text(found).splitlines()
    at = next(i for i, ln in enumerate(text) if ln.startswith("top 3, ranked by MEDIAN"))
    header, *rows = text[at + 1 : at + 5]
    assert header.split()[:3] == ["TRIAL", "MEDIAN", "GFLOP/s"]
    assert [r.split()[:3] for r in rows] == [
        [str(second), *seconds(0.5).split()],
        [str(first), *seconds(0.625).split()],
        [str(third), *seconds(0.75).split()],
    ]
