"""The chaos suite's network faults: worker nodes and the coordinator's login node on their own
network (:mod:`tests.helpers.cluster`), each reaching the database host over TCP with TLS as
its own role, while links go down and come back.

* A partition longer than the lease while a node's kernel runs, then healed: the node gives its
  dead connection up by itself (nothing tells it of a cut one hop away); the trial is taken
  back and measured elsewhere, once; the node's late result is refused by the fence and counted
  in its exit summary (``dropped``).
* The coordinator's link cut while the workers keep going: they finish what is queued, wait
  (``--drain`` workers too: a coordinator silent for less than 30 s still drives its run), and
  the run goes on when the link is back.
* Half the nodes flapping for a whole run: ``benchmarks/flapping_links.py`` at its smoke size
  (see tests/acceptance/test_benchmarks.py for the other scripts), efficiency in its JSON.

Each ends with the chaos suite's accounting: every promise of ``violations``, and lost,
duplicated and stuck trials all 0.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import cluster
from tests.helpers.chaos import accounting, violations
from tests.helpers.cluster import ROOT, SiteRun, exit_summary
from tunefleet.db.engine import connect

pytestmark = [pytest.mark.acceptance, pytest.mark.chaos, pytest.mark.cluster]

LEASE_S = 3.0
ENV = {
    "TUNEFLEET_POLL_S": "0.05",
    "TUNEFLEET_TRIAL_TIMEOUT_MIN_S": "20",
    "TUNEFLEET_TRIAL_TIMEOUT_MAX_S": "30",
}


@pytest.fixture
def site_run(site, site_db, tmp_path):
    run = SiteRun(site, site_db, tmp_path, dict(ENV))
    try:
        yield run
    finally:
        site.net.heal_all()
        run.close()


def books(run: SiteRun, trials: int) -> dict[str, int]:
    assert run.run_id is not None
    with connect(run.db.admin_url) as db:
        broken = violations(db, run.run_id, trials)
        counted = accounting(db, run.run_id)
    assert not broken, "\n".join(broken) + "\n" + run.report()
    assert (counted["lost"], counted["duplicated"], counted["stuck"]) == (0, 0, 0), counted
    return counted


def test_a_partition_longer_than_the_lease_is_healed_and_the_late_result_is_fenced(site_run):
    run = site_run
    trials = 30
    run.start_coordinator(
        "login1",
        "synthetic",
        "--arg",
        "duration=1.0",
        "--max-trials",
        str(trials),
        "--confirm",
        "1",
    )
    for node in ("node1", "node2", "node3"):
        # One trial at a time, measured as soon as it is claimed: a claim is a running kernel.
        run.start_worker(node, lease_s=LEASE_S, poll_s=0.2, prepare_workers=0, prefetch=0)
    run.wait_registered()
    victim = run.site.node("node1")
    victim_pid = run.worker_on("node1").pid

    def held_by_victim() -> tuple[int, int] | None:
        rows = run.query(
            "SELECT t.id, t.attempt FROM tunefleet.trial t JOIN tunefleet.worker w"
            " ON w.id = t.lease_owner WHERE t.state = 'running' AND w.pid = %s",
            (victim_pid,),
        )
        return (int(rows[0]["id"]), int(rows[0]["attempt"])) if rows else None  # type: ignore[call-overload]

    # Cut node1 while it holds a trial; a result that slipped through before the cut does not
    # count, so try again with its next trial.
    for _ in range(20):
        trial, attempt = run.wait_for(held_by_victim, 60, "node1 to hold a trial")  # type: ignore[misc]
        victim.cut()
        if held_by_victim() == (trial, attempt):
            break
        victim.heal()
    else:
        raise AssertionError(f"node1 never held a trial when cut\n{run.report()}")

    # The partition outlasts the lease: another worker's reaper takes the trial back and
    # another node measures it.
    def redone() -> bool:
        rows = run.query(
            """
            SELECT a.attempt, a.outcome, w.pid FROM tunefleet.attempt a
              JOIN tunefleet.worker w ON w.id = a.worker_id
             WHERE a.trial_id = %s ORDER BY a.attempt
            """,
            (trial,),
        )
        return any(r["outcome"] == "done" and r["pid"] != victim_pid for r in rows)

    run.wait_for(redone, 90, f"trial {trial} to be measured elsewhere")
    # Nothing told node1 of the cut; it gave its connection up by itself, a lease after its
    # last statement went unanswered, rather than waiting on TCP's retransmissions.
    run.wait_for(
        lambda: "main connection lost" in run.worker_on("node1").log(),
        60,
        "node1 to give its dead connection up",
    )
    assert not victim.link_up and run.worker_on("node1").alive
    victim.heal()
    # The late result reaches the database and is refused.
    fenced = f"completion rejected: trial {trial} attempt {attempt} is no longer ours"
    run.wait_for(lambda: fenced in run.worker_on("node1").log(), 90, "the fenced completion")

    assert run.coordinator is not None
    assert run.coordinator.wait(180) == 0, run.report()
    assert run.stop_workers() == [0, 0, 0], run.report()
    counted = books(run, trials)
    attempts = run.query(
        "SELECT a.attempt, a.outcome, w.host FROM tunefleet.attempt a JOIN tunefleet.worker w"
        " ON w.id = a.worker_id WHERE a.trial_id = %s ORDER BY a.attempt",
        (trial,),
    )
    cut_off = next(a for a in attempts if a["attempt"] == attempt)
    assert cut_off == {"attempt": attempt, "outcome": "lease_expired", "host": "node1"}
    final = attempts[-1]
    assert final["outcome"] == "done" and final["host"] != "node1", attempts
    [measured] = run.query(
        "SELECT count(*) AS n FROM tunefleet.measurement WHERE trial_id = %s", (trial,)
    )
    assert measured["n"] == 1
    summary = exit_summary(run.worker_on("node1").log())
    assert summary.get("dropped") == 1, run.worker_on("node1").log()
    print(f"partition healed: {counted} ; node1's exit summary {summary}")


def test_the_coordinators_link_is_cut_while_the_workers_keep_going(site_run):
    run = site_run
    trials = 40
    run.start_coordinator(
        "login1", "synthetic", "--arg", "duration=0.3", "--max-trials", str(trials)
    )
    for node in ("node1", "node2", "node3"):
        run.start_worker(node, drain=True, lease_s=LEASE_S, poll_s=0.2, prepare_workers=0)
    run.wait_registered()
    login = run.site.node("login1")
    run.wait_for(lambda: run.finished_trials() >= 5, 90, "the run to get going")

    login.cut()
    finished_at_cut = run.finished_trials()
    run.wait_for(
        lambda: run.finished_trials() > finished_at_cut and not run.query(
            "SELECT 1 FROM tunefleet.trial WHERE run_id = %s AND state = 'pending'",
            (run.run_id,),
        ),
        60,
        "the workers to finish what was queued",
    )  # fmt: skip
    # The coordinator beats every 2 s: a beat 8 s old is a cut of 6 s at least, longer than
    # the workers' lease, shorter than the 30 s after which --drain workers stop counting on
    # a silent coordinator.
    run.wait_for(
        lambda: run.query(
            "SELECT clock_timestamp() - coordinator_heartbeat_at > interval '8 s' AS silent"
            " FROM tunefleet.run WHERE id = %s",
            (run.run_id,),
        )[0]["silent"],
        60,
        "the coordinator to be silent for 8 s",
    )
    assert all(w.alive for _, w in run.workers), run.report()
    login.heal()

    assert run.coordinator is not None
    assert run.coordinator.wait(180) == 0, run.report()
    # The drain workers leave by themselves once the run is over.
    for _, w in run.workers:
        assert w.wait(60) == 0, run.report()
    counted = books(run, trials)
    print(f"coordinator cut: {counted}")


def test_half_the_nodes_flapping_for_a_whole_run_lose_nothing(tmp_path):
    """The benchmark at its smoke size (it builds a site of its own): both arms' books
    balance, and the flapping run's efficiency is in its JSON."""
    reason = cluster.unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "flapping.json"
    argv = [
        sys.executable, str(ROOT / "benchmarks" / "flapping_links.py"),
        "--workers", "4", "--trials", "30", "--duration", "0.3", "--lease", "3",
        "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    data = json.loads(out.read_text())
    arms = {a["arm"]: a for a in data["arms"]}
    assert set(arms) == {"steady", "flapping"}
    for arm in arms.values():
        assert arm["violations"] == [], arm["violations"]
        assert (arm["lost"], arm["duplicated"], arm["stuck"]) == (0, 0, 0), arm
        assert arm["finished"] == 30
        assert 0 < arm["fleet_efficiency"] <= 1.05
        # The sessions nodes left behind when cut off were found dead by the server.
        assert arm["worker_sessions_never_dropped"] == 0, arm
    flapping = arms["flapping"]
    assert flapping["outages"] > 0 and flapping["flapping_nodes"] == 2
    assert 0 < data["flapping_vs_steady"] <= 1.5
