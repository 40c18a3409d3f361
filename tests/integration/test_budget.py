"""The time budget holds (coordinator.budget): at the deadline the trials in flight are handed
back (cancelled, their claims released, their workers' leases gone), a resume revives them
within the trial budget, and a confirmation that cannot fit is skipped, saying so, rather than
run past the deadline. Real PostgreSQL; workers are real processes or a registered worker
whose claims the test makes itself (so what is in flight at the deadline is known)."""

from __future__ import annotations

import logging
import shlex
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.coordinator import fleet, register_worker, settings, trial_counts
from tests.helpers.queue_data import (
    insert_run,
    insert_trials,
    synthetic_configs,
    wait_until,
    waiting_on_a_lock,
)
from tunefleet.coordinator.create import create_run
from tunefleet.coordinator.engine import Coordinator
from tunefleet.db.engine import connect, redact
from tunefleet.problems.synthetic import OPTIMUM
from tunefleet.queries import queue
from tunefleet.queries.budget import hand_back
from tunefleet.queries.queue import MeasurementRow

SEEDS = [OPTIMUM, {**OPTIMUM, "tile": 8}]


def _claiming_worker(db: Any) -> tuple[uuid.UUID, str]:
    """A registered, live worker that claims only when the test says so and never finishes."""
    worker = uuid.uuid4()
    secret = queue.register_worker(
        db, worker_id=worker, host="test", pid=1, device_id=None, device_class="host-cpu",
        version="test",
    )  # fmt: skip
    return worker, secret


def _handed_back_run(db: Any, db_url: str) -> tuple[int, list[queue.ClaimedTrial], Any]:
    """A run whose two seeds are running (claimed by a worker that never finishes them) when
    its 1 s budget ends; returns the run, the claims and the coordinator's result."""
    s = settings(max_seconds=1.0, confirm=0, seed_configs=SEEDS)
    run_id = create_run(s, db_url)
    worker, secret = _claiming_worker(db)
    claims = queue.claim_trials(
        db, worker_id=worker, secret=secret, device_classes=["any"], limit=5, lease_s=300
    )
    assert len(claims) == len(SEEDS)
    result = Coordinator(s, db_url, clock_start=time.monotonic()).run(run_id)
    # The claims are no longer the worker's: its next heartbeat keeps none of them.
    beat = queue.heartbeat(
        db, worker_id=worker, secret=secret, held=[c.key for c in claims], lease_s=30
    )
    assert beat.kept == frozenset()
    return run_id, claims, result


def test_the_deadline_hands_running_trials_back_and_a_resume_completes_them(
    db_url: str, db: Any, tmp_path: Path
) -> None:
    run_id, claims, result = _handed_back_run(db, db_url)
    assert (result.state, result.stop_reason) == ("finished", "max_seconds")
    assert result.handed_back == len(claims)
    assert result.cut is not None and result.cut.handed_back == len(claims)
    assert "2 trials in flight handed back" in result.cut.sentence("R")
    ids = [c.trial_id for c in claims]
    rows = db.execute(
        "SELECT state, attempt, lease_owner, error FROM tunefleet.trial WHERE id = ANY(%s)",
        (ids,),
    ).fetchall()
    # Cancelled, the attempt not counted (as a worker's release), nobody's lease.
    assert {(r["state"], r["attempt"], r["lease_owner"]) for r in rows} == {("cancelled", 0, None)}
    assert all("time budget" in r["error"] for r in rows)
    outcomes = db.execute(
        "SELECT outcome, ended_at IS NOT NULL AS ended FROM tunefleet.attempt"
        " WHERE trial_id = ANY(%s)",
        (ids,),
    ).fetchall()
    assert [(o["outcome"], o["ended"]) for o in outcomes] == [("released", True)] * len(ids)
    assert not {"pending", "running"} & set(trial_counts(db, run_id))

    # The resume queues exactly those trials again, first, and a worker completes them.
    with fleet(db_url, 1, tmp_path / "logs"):
        resumed = Coordinator(
            settings(resume=run_id, max_trials=len(claims), max_seconds=600.0, confirm=0),
            db_url,
        ).run()
    assert (resumed.state, resumed.stop_reason) == ("finished", "max_trials")
    assert resumed.trials == len(claims) and resumed.handed_back == 0
    done = db.execute(
        "SELECT id FROM tunefleet.trial WHERE run_id = %s AND state = 'done' ORDER BY id",
        (run_id,),
    ).fetchall()
    assert [r["id"] for r in done] == ids


def test_a_resume_revives_no_more_than_the_trial_budget_left(
    db_url: str, db: Any, tmp_path: Path
) -> None:
    run_id, claims, _ = _handed_back_run(db, db_url)
    with fleet(db_url, 1, tmp_path / "logs"):
        resumed = Coordinator(
            settings(resume=run_id, max_trials=1, max_seconds=600.0, confirm=0), db_url
        ).run()
    assert (resumed.stop_reason, resumed.trials) == ("max_trials", 1)
    counts = trial_counts(db, run_id)
    finished = sum(counts.get(s, 0) for s in ("done", "invalid", "failed", "timed_out"))
    assert finished == 1
    first, second = (c.trial_id for c in claims)
    rows = db.execute(
        "SELECT id, state FROM tunefleet.trial WHERE id = ANY(%s)", ([first, second],)
    ).fetchall()
    states = {r["id"]: r["state"] for r in rows}
    assert states == {first: "done", second: "cancelled"}


def test_a_budget_too_short_for_the_confirmation_skips_it_and_says_so(
    db_url: str, db: Any, tmp_path: Path
) -> None:
    with fleet(db_url, 1, tmp_path / "logs"):
        first = Coordinator(settings(max_trials=3, confirm=0), db_url).run()
    assert first.trials == 3
    # Its trials took 100 s each from claim to result and came back 100 s apart, as far as
    # the plan can tell: a confirmation (a cold build) takes a trial's share of the device.
    db.execute(
        """
        UPDATE tunefleet.trial t
           SET finished_at = o.first + (o.n - 1) * interval '100 seconds',
               started_at = o.first + (o.n - 2) * interval '100 seconds'
          FROM (SELECT id, row_number() OVER (ORDER BY finished_at, id) AS n,
                       min(finished_at) OVER () AS first
                  FROM tunefleet.trial WHERE run_id = %s AND started_at IS NOT NULL) o
         WHERE t.id = o.id
        """,
        (first.run_id,),
    )
    register_worker(db, device_class="any")  # live, so the plan is not "nobody to measure"
    result = Coordinator(
        settings(resume=first.run_id, max_trials=50, max_seconds=30.0, confirm=3),
        db_url,
        clock_start=time.monotonic(),
    ).run()
    # The search stopped at once (30 s cannot hold a 100 s confirmation) and no confirmation
    # was queued: nothing ran into the deadline, nothing was handed back.
    assert (result.state, result.stop_reason) == ("finished", "max_seconds")
    assert result.cut is not None
    assert (result.cut.confirm_wanted, result.cut.confirm_queued) == (3, 0)
    assert result.handed_back == 0 and not result.confirmed
    assert "no time left to confirm the best" in result.cut.sentence("R")
    n = db.execute(
        "SELECT count(*) AS n FROM tunefleet.trial WHERE run_id = %s AND purpose = 'confirm'",
        (first.run_id,),
    ).fetchone()
    assert n["n"] == 0
    assert not {"pending", "running"} & set(trial_counts(db, first.run_id))


@pytest.mark.parametrize("meanwhile", ["claimed", "released"])
def test_the_deadline_hands_back_a_trial_whose_claim_changes_while_it_waits(
    db_url: str, db: Any, meanwhile: str
) -> None:
    """A worker's claim (or release) commits after the deadline's statement took its snapshot
    and before it could lock the row. Seen from the snapshot the trial is pending (running),
    locked it is running (pending). PostgreSQL checks a new row against the table's
    constraints before it notices the concurrent change and recomputes the row, so a new
    attempt computed from the locked state and the snapshot's counter was -1, and the whole
    hand-back failed (CI, stop 61); the claim's attempt row, newer than the snapshot, would
    have stayed open. Now the trial is handed back as the worker left it: the attempt not
    counted, the claim closed as released."""
    run_id = insert_run(db)
    [trial_id] = insert_trials(db, run_id, synthetic_configs(1))
    worker, secret = _claiming_worker(db)
    claim = dict(worker_id=worker, secret=secret, device_classes=["any"], limit=1, lease_s=300)
    if meanwhile == "released":
        [held] = queue.claim_trials(db, **claim)  # type: ignore[arg-type]
    changer = connect(db_url, autocommit=False)
    deadline = connect(db_url)
    try:
        # The worker's statement, its transaction still open: the row is locked and changed.
        if meanwhile == "claimed":
            assert len(queue.claim_trials(changer, **claim)) == 1  # type: ignore[arg-type]
        else:
            assert queue.release_trials(changer, worker_id=worker, held=[held.key]) == {trial_id}
        given: list[Any] = []
        failed: list[BaseException] = []

        def hand_back_at_the_deadline() -> None:
            try:
                given.append(hand_back(deadline, run_id, "handed back: the test's deadline"))
            except BaseException as e:  # reported by the assertion below
                failed.append(e)

        thread = threading.Thread(target=hand_back_at_the_deadline)
        thread.start()
        wait_until(
            lambda: waiting_on_a_lock(db, deadline.info.backend_pid),
            timeout=30,
            what="the hand-back to wait for the worker's row lock",
        )
        changer.commit()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        changer.close()
        deadline.close()
    assert failed == []
    [result] = given
    row = db.execute(
        "SELECT state, attempt, lease_owner FROM tunefleet.trial WHERE id = %s", (trial_id,)
    ).fetchone()
    assert (row["state"], row["attempt"], row["lease_owner"]) == ("cancelled", 0, None)
    outcomes = db.execute(
        "SELECT outcome FROM tunefleet.attempt WHERE trial_id = %s ORDER BY id", (trial_id,)
    ).fetchall()
    assert [o["outcome"] for o in outcomes] == ["released"]
    if meanwhile == "claimed":
        assert (result.pending, result.running) == (0, 1)
    else:
        assert (result.pending, result.running) == (1, 0)


def test_a_stopping_worker_drops_a_handed_back_trial_it_is_timing(
    db_url: str, db: Any, tmp_path: Path
) -> None:
    """The trial would be timed for an hour; once the deadline handed it back, a graceful
    stop drops it at once (its first beat finds the lease gone) instead of finishing it."""
    s = settings(problem_args={"duration": 3600.0}, seed_configs=[OPTIMUM], confirm=0)
    run_id = create_run(s, db_url)
    with fleet(db_url, 1, tmp_path / "logs", lease_s=300) as [worker]:
        wait_until(
            lambda: trial_counts(db, run_id).get("running") == 1,
            timeout=60,
            what="the worker to claim the trial",
        )
        given = hand_back(db, run_id, "handed back: the test's deadline")
        assert given.running == 1
        worker.stop()
        assert worker.wait(60) == 0, worker.log()
    row = db.execute(
        "SELECT w.state, t.state AS trial FROM tunefleet.worker w, tunefleet.trial t"
        " WHERE w.pid = %s AND t.run_id = %s",
        (worker.pid, run_id),
    ).fetchone()
    assert (row["state"], row["trial"]) == ("stopped", "cancelled")


def test_tune_says_what_its_budget_cut_and_how_to_resume(
    db_url: str, db: Any, cli_env: dict[str, str]
) -> None:
    """``tune`` with workers elsewhere: the test's worker claims the baseline and never
    finishes it; at the deadline ``tune`` hands it back, does not wait, and says so."""
    proc = subprocess.Popen(
        ["tunefleet", "tune", "synthetic", "--workers", "0", "--max-time", "15",
         "--confirm", "0", "--db", db_url],
        env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        worker, secret = _claiming_worker(db)

        def claim() -> list[queue.ClaimedTrial]:
            return queue.claim_trials(
                db, worker_id=worker, secret=secret, device_classes=["any"], limit=1, lease_s=300
            )

        claims = wait_until(
            claim,
            timeout=60,
            what="the run's baseline trial to claim",
        )
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Nothing was measured in time: the run has no best, which tune reports as a failure.
    assert proc.returncode == 1 and "has no successful trial yet" in err, out + err
    run_id = claims[0].run_id
    assert f"run {run_id} finished: max_seconds" in out
    db_flag = shlex.quote(redact(db_url))
    assert (
        "stopped at the 15 s budget: 1 trial in flight handed back (resume with "
        f"`tunefleet tune --resume {run_id} --db {db_flag}`)"
    ) in out, out
    row = db.execute(
        "SELECT state FROM tunefleet.trial WHERE id = %s", (claims[0].trial_id,)
    ).fetchone()
    assert row["state"] == "cancelled"


def test_a_deep_prefetch_worker_keeps_the_search_going_past_its_first_batch(
    db_url: str, db: Any, cli_env: dict[str, str]
) -> None:
    """One worker holding nine trials whose preparation is slow (3 s each, prepared nine at
    a time): its first result must not make the budget plan think draining the other eight
    takes eight turnarounds, which stopped the search with only its first batch of claims.
    90 s leave room for a slow start on a loaded machine; the trial budget ends the run."""
    proc = subprocess.run(
        ["tunefleet", "tune", "synthetic", "--workers", "1", "--prefetch", "8",
         "--prepare-workers", "8", "--arg", "prepare_duration=3", "--arg", "duration=0.01",
         "--max-time", "90", "--max-trials", "18", "--db", db_url],
        env=cli_env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = db.execute("SELECT max(id) AS id FROM tunefleet.run").fetchone()["id"]
    measured = db.execute(
        "SELECT count(*) AS n FROM tunefleet.trial WHERE run_id = %s AND purpose = 'search'"
        " AND state = 'done' AND started_at IS NOT NULL",
        (run_id,),
    ).fetchone()["n"]
    assert measured > 9, proc.stdout + proc.stderr


def test_a_short_run_with_short_trials_and_a_deep_pipeline_ends_confirmed(
    db_url: str, db: Any, cli_env: dict[str, str]
) -> None:
    """0.3 s trials, eight prefetched: planned at the search's pipelined pace, the cold
    confirmations (a fresh process each, one at a time on the one worker) did not fit and a
    run this short ended "NOT confirmed". The plan counts them as cold builds, the worker
    times them before its prefetched trials, and the run ends confirmed inside its budget."""
    started = time.monotonic()
    proc = subprocess.run(
        ["tunefleet", "tune", "synthetic", "--workers", "1", "--prefetch", "8",
         "--arg", "duration=0.3", "--max-time", "20", "--db", db_url],
        env=cli_env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=180,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert " processes, confirmed (" in last, proc.stdout + proc.stderr
    run_id = db.execute("SELECT max(id) AS id FROM tunefleet.run").fetchone()["id"]
    best = db.execute(
        "SELECT best_status FROM tunefleet.run_progress WHERE run_id = %s", (run_id,)
    ).fetchone()
    assert best["best_status"] == "confirmed"
    # The budget counts from the command's start; the rest is the embedded server's stop.
    assert elapsed < 20 + 15, elapsed


class _Driving:
    """A coordinator driving one run in a thread of the test, while the test plays its
    worker; ``result()`` waits for it and returns how the run ended."""

    def __init__(self, s: Any, db_url: str, run_id: int, **kw: Any) -> None:
        self.outcome: dict[str, Any] = {}

        def coordinate() -> None:
            try:
                self.outcome["result"] = Coordinator(s, db_url, **kw).run(run_id)
            except BaseException as exc:  # the test thread reports it
                self.outcome["error"] = exc

        self.thread = threading.Thread(target=coordinate, daemon=True)
        self.thread.start()

    def result(self) -> Any:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive() and "error" not in self.outcome, self.outcome
        return self.outcome["result"]


def _claim_one(conn: Any, worker: uuid.UUID, secret: str) -> list[queue.ClaimedTrial]:
    """One claim of the test's worker (empty while nothing is queued for it)."""
    return queue.claim_trials(
        conn, worker_id=worker, secret=secret, device_classes=["any"], limit=1, lease_s=300
    )


def _complete(conn: Any, worker: uuid.UUID, claim: queue.ClaimedTrial, median_s: float) -> None:
    state = queue.complete_trial(
        conn, trial_id=claim.trial_id, attempt=claim.attempt, token=claim.lease_token,
        worker_id=worker, state="done",
        measurement=MeasurementRow(median_s=median_s, min_s=median_s,
                                   samples_s=[median_s] * 5, protocol={}),
    )  # fmt: skip
    assert state == "done"


def test_a_drain_that_outlasts_its_plan_still_leaves_the_best_confirmed(
    db_url: str, db: Any
) -> None:
    """One search trial never comes back (a slow kernel, a worker gone quiet). Waiting for it
    until the deadline, as the confirmation did, left the best measured unconfirmed; now the
    confirmation starts while it is out, once the time left is what the confirmation takes,
    and the straggler is handed back at the deadline."""
    s = settings(max_seconds=20.0, max_trials=2, confirm=1, seed_configs=SEEDS)
    run_id = create_run(s, db_url)
    worker, secret = _claiming_worker(db)
    fast, slow = queue.claim_trials(
        db, worker_id=worker, secret=secret, device_classes=["any"], limit=5, lease_s=300
    )
    driving = _Driving(s, db_url, run_id, clock_start=time.monotonic())
    with connect(db_url, autocommit=True) as conn:
        # The fast trial's result, as if it took 4 s from claim to result (so the plan has a
        # pace to go by), written in one transaction so the coordinator never sees it without.
        with conn.transaction():
            _complete(conn, worker, fast, 1e-3)
            conn.execute(
                "UPDATE tunefleet.trial SET started_at = finished_at - interval '4 seconds'"
                " WHERE id = %s",
                (fast.trial_id,),
            )

        [confirmation] = wait_until(
            lambda: _claim_one(conn, worker, secret),
            timeout=40,
            what="the confirmation of the fast trial",
        )
        _complete(conn, worker, confirmation, 1e-3)
    result = driving.result()
    assert (result.state, result.stop_reason) == ("finished", "max_seconds")
    assert result.confirmed and result.best_trial_id == fast.trial_id
    assert result.handed_back == 1
    rows = db.execute(
        "SELECT id, purpose, state, confirms_trial_id, finished_at FROM tunefleet.trial"
        " WHERE run_id = %s ORDER BY id",
        (run_id,),
    ).fetchall()
    by_id = {r["id"]: r for r in rows}
    confirm_row = by_id[confirmation.trial_id]
    assert (confirm_row["purpose"], confirm_row["state"]) == ("confirm", "done")
    assert confirm_row["confirms_trial_id"] == fast.trial_id
    # Confirmed while the straggler was still out; the straggler was handed back after.
    assert by_id[slow.trial_id]["state"] == "cancelled"
    assert by_id[slow.trial_id]["finished_at"] > confirm_row["finished_at"]


def test_without_a_deadline_the_confirmation_starts_beside_the_last_trials_and_ranks_them(
    db_url: str, db: Any
) -> None:
    """A trial budget (no time budget): the confirmation of the best so far is queued while
    the search's last trial still runs (its cold build prepares beside it, where the device
    would wait on that trial's code generation), and a last trial that lands better is
    confirmed too and becomes the run's best."""
    s = settings(max_trials=2, confirm=1, seed_configs=SEEDS)
    run_id = create_run(s, db_url)
    worker, secret = _claiming_worker(db)
    first, last = queue.claim_trials(
        db, worker_id=worker, secret=secret, device_classes=["any"], limit=5, lease_s=300
    )
    driving = _Driving(s, db_url, run_id)
    with connect(db_url, autocommit=True) as conn:
        _complete(conn, worker, first, 2e-3)

        [early] = wait_until(
            lambda: _claim_one(conn, worker, secret),
            timeout=40,
            what="the first trial's confirmation",
        )
        state = conn.execute(
            "SELECT state FROM tunefleet.trial WHERE id = %s", (last.trial_id,)
        ).fetchone()
        assert state is not None and state["state"] == "running"  # beside the last trial
        _complete(conn, worker, early, 2e-3)
        _complete(conn, worker, last, 1e-3)  # lands better than the confirmed one
        [late] = wait_until(
            lambda: _claim_one(conn, worker, secret),
            timeout=40,
            what="the last trial's confirmation",
        )
        _complete(conn, worker, late, 1e-3)
    result = driving.result()
    assert (result.state, result.stop_reason) == ("finished", "max_trials")
    assert result.confirmed and result.best_trial_id == last.trial_id
    confirms = db.execute(
        "SELECT confirms_trial_id FROM tunefleet.trial"
        " WHERE run_id = %s AND purpose = 'confirm' AND state = 'done' ORDER BY id",
        (run_id,),
    ).fetchall()
    assert [r["confirms_trial_id"] for r in confirms] == [first.trial_id, last.trial_id]


def test_a_trial_budgets_unclaimed_last_trial_goes_ahead_of_the_confirmation(
    db_url: str, db: Any, caplog: Any
) -> None:
    """Every trial of the budget is queued, one not claimed yet: the confirmation waits for
    that claim (queued ahead of it, the confirmation would delay it, and the run's end with
    it), and the run still ends with the budget spent and its best confirmed."""
    s = settings(max_trials=2, confirm=1, seed_configs=SEEDS)
    run_id = create_run(s, db_url)
    worker, secret = _claiming_worker(db)
    [first] = queue.claim_trials(
        db, worker_id=worker, secret=secret, device_classes=["any"], limit=1, lease_s=300
    )
    caplog.set_level(logging.INFO, logger="tunefleet.coordinator")
    driving = _Driving(s, db_url, run_id)
    with connect(db_url, autocommit=True) as conn:
        _complete(conn, worker, first, 1e-3)

        def confirmation_waits() -> bool:
            return any("once the last 1 are claimed" in r.getMessage() for r in caplog.records)

        wait_until(confirmation_waits, timeout=40, what="the confirmation phase, waiting")
        [nxt] = _claim_one(conn, worker, secret)
        purpose = conn.execute(
            "SELECT purpose FROM tunefleet.trial WHERE id = %s", (nxt.trial_id,)
        ).fetchone()
        assert purpose is not None and purpose["purpose"] == "search"  # not a confirmation
        _complete(conn, worker, nxt, 2e-3)

        [confirmation] = wait_until(
            lambda: _claim_one(conn, worker, secret), timeout=40, what="the confirmation"
        )
        _complete(conn, worker, confirmation, 1e-3)
    result = driving.result()
    assert (result.state, result.stop_reason) == ("finished", "max_trials")
    assert result.confirmed and result.best_trial_id == first.trial_id
    counts = db.execute(
        "SELECT purpose, count(*) AS n FROM tunefleet.trial WHERE run_id = %s AND state = 'done'"
        " GROUP BY purpose",
        (run_id,),
    ).fetchall()
    assert {r["purpose"]: r["n"] for r in counts} == {"search": 2, "confirm": 1}
