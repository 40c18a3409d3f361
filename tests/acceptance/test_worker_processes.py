"""Real ``python -m tunefleet.worker`` processes against a real PostgreSQL: the worker's
promises under crashes, stops, hangs, restarts and signals.

These must hold on a loaded machine too. Leases are 2 s where one has to expire during the
test or a rescuer has to reap one soon (the reaper runs every half lease), else
:data:`SAFE_LEASE_S`: a worker whose heartbeat is late by most of a lease loses its trial to
its own reaper, and the attempt history the test asserts gains an attempt. A trial is "being
timed" once the worker says so (:func:`wait_timing`), not once it is ``running`` in the
database: a claimed trial that is not yet being timed is released by a graceful stop."""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.launch import WorkerProcess, running_workers, start_worker, wait_all
from tests.helpers.queue_data import (
    attempts_of,
    insert_run,
    insert_trials,
    synthetic_configs,
    trial_states,
    wait_until,
)
from tunefleet.db.engine import connect
from tunefleet.problems.synthetic import OPTIMUM
from tunefleet.queries import queue

pytestmark = pytest.mark.acceptance

#: Debug logging (``-v -v``) says when a trial is handed to the device process
#: (:func:`wait_timing`).
FAST = {"poll_s": 0.2, "prepare_workers": 0, "extra": ["-v"]}
#: A lease no heartbeat misses on a loaded machine, for workers whose leases must not expire.
SAFE_LEASE_S = 20
ROOT = Path(__file__).resolve().parents[2]


def worker_id_of(db: Any, w: WorkerProcess) -> Any:
    row = wait_until(
        lambda: db.execute("SELECT id FROM tunefleet.worker WHERE pid = %s", (w.pid,)).fetchone(),
        what=f"worker pid {w.pid} to register",
    )
    return row["id"]


def wait_timing(w: WorkerProcess, trial_id: int) -> None:
    """Until the worker has handed ``trial_id`` to its device process (started with ``FAST``:
    the debug log says so right after the hand-over, when a graceful stop no longer releases
    the trial)."""
    line = re.compile(rf"timing trial {trial_id}$", re.MULTILINE)
    wait_until(lambda: line.search(w.log()), what=f"worker {w.pid} to time trial {trial_id}")


def child_pids(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            pass
    return out


def gone(pids: set[int]) -> bool:
    return not any(Path(f"/proc/{p}").exists() for p in pids)


def measurements(db: Any) -> list[dict[str, Any]]:
    return db.execute("SELECT * FROM tunefleet.measurement ORDER BY trial_id").fetchall()


def logs(workers: list[WorkerProcess]) -> str:
    return "\n".join(f"--- worker {w.pid}\n{w.log()}" for w in workers)


def test_idle_workers_wake_on_notify_share_the_work_exactly_once_and_skip_other_classes(
    db_url, db, tmp_path
):
    # Polling every 30 s, listening while idle (--listen): only the NOTIFY can wake them in
    # time.
    opts = {"drain": False, "lease_s": SAFE_LEASE_S, "poll_s": 30, "listen": True}
    pipelined = start_worker(db_url, log_path=tmp_path / "a.log", **opts)
    inline = start_worker(db_url, log_path=tmp_path / "b.log", prepare_workers=0, **opts)
    fleet = [pipelined, inline]
    try:
        for w in fleet:
            wait_until(lambda w=w: "waiting for work" in w.log(), what="an idle worker")
        # 6 s of work: a worker that wakes late on a loaded machine still gets its share.
        good = insert_run(db, problem_args={"duration": 0.3})
        good_ids = insert_trials(db, good, [*synthetic_configs(19), dict(OPTIMUM)])
        bad = insert_run(db, problem_args={"invalid_rate": 1.0})
        bad_ids = insert_trials(db, bad, synthetic_configs(2))
        gpu = insert_run(db, device_class="nvidia-h200")
        gpu_ids = insert_trials(db, gpu, synthetic_configs(2))
        queue.notify_new_trials(db, "any")
        wait_until(
            lambda: set(trial_states(db, good_ids + bad_ids).values()) <= {"done", "invalid"},
            timeout=25,  # less than the polling interval
            what="the notified workers to finish the run",
        )
        for w in fleet:
            w.stop()
        codes = wait_all(fleet, 30)
    finally:
        for w in fleet:
            w.kill()
    assert codes == [0, 0], logs(fleet)

    assert set(trial_states(db, good_ids).values()) == {"done"}
    assert set(trial_states(db, bad_ids).values()) == {"invalid"}
    assert set(trial_states(db, gpu_ids).values()) == {"pending"}  # another class: untouched
    assert not db.execute(
        "SELECT 1 FROM tunefleet.attempt WHERE trial_id = ANY(%s)", (gpu_ids,)
    ).fetchall()
    errors = db.execute(
        "SELECT error FROM tunefleet.trial WHERE id = ANY(%s)", (bad_ids,)
    ).fetchall()
    assert all("invalid by construction" in r["error"] for r in errors)

    ms = measurements(db)
    assert sorted(m["trial_id"] for m in ms) == good_ids  # exactly one each
    assert all(m["device_id"] is not None and len(m["samples_s"]) == 3 for m in ms)
    assert len({m["worker_id"] for m in ms}) == 2, logs(fleet)  # both took part
    best = db.execute("SELECT config FROM tunefleet.best_per_run WHERE run_id = %s", (good,))
    assert best.fetchone()["config"] == OPTIMUM
    states = db.execute("SELECT state FROM tunefleet.worker").fetchall()
    assert [r["state"] for r in states] == ["stopped", "stopped"]


def test_sigkilled_worker_trial_is_requeued_after_its_lease_and_finished_by_another(
    db_url, db, tmp_path
):
    run = insert_run(db, problem_args={"duration": 2.0})
    [tid] = insert_trials(db, run, synthetic_configs(1))
    victim = start_worker(db_url, log_path=tmp_path / "victim.log", lease_s=2, **FAST)
    try:
        victim_id = worker_id_of(db, victim)
        wait_timing(victim, tid)
        children = child_pids(victim.pid)
        assert children
        victim.kill()
        wait_until(lambda: gone(children), what="the orphaned evaluator to die")
        # Only the victim's lease is short: the rescuer's own must not lapse under load.
        rescuer = start_worker(
            db_url, log_path=tmp_path / "rescuer.log", lease_s=SAFE_LEASE_S, **FAST
        )
        assert rescuer.wait(60) == 0, rescuer.log()
    finally:
        victim.kill()
    rescuer_id = worker_id_of(db, rescuer)
    assert trial_states(db, [tid]) == {tid: "done"}
    assert [m["worker_id"] for m in measurements(db)] == [rescuer_id]
    history = [(a["attempt"], a["worker_id"], a["outcome"]) for a in attempts_of(db, tid)]
    assert history == [(1, victim_id, "lease_expired"), (2, rescuer_id, "done")]


def test_stopped_worker_past_its_lease_is_a_zombie_whose_result_is_rejected(db_url, db, tmp_path):
    # The evaluation outlasts the moments between its start and the SIGSTOP on a loaded machine.
    run = insert_run(db, problem_args={"duration": 2.0})
    [tid] = insert_trials(db, run, synthetic_configs(1))
    zombie = start_worker(db_url, log_path=tmp_path / "zombie.log", lease_s=2, **FAST)
    try:
        zombie_id = worker_id_of(db, zombie)
        wait_timing(zombie, tid)
        zombie.send(signal.SIGSTOP)  # only the worker: its evaluator finishes meanwhile
        other = start_worker(db_url, log_path=tmp_path / "other.log", lease_s=SAFE_LEASE_S, **FAST)
        assert other.wait(60) == 0, other.log()
        assert trial_states(db, [tid]) == {tid: "done"}
        zombie.send(signal.SIGCONT)
        wait_until(lambda: "completion rejected" in zombie.log(), what="the zombie's rejection")
        assert zombie.wait(30) == 0, zombie.log()
    finally:
        zombie.send(signal.SIGCONT)
        zombie.kill()
    other_id = worker_id_of(db, other)
    assert [m["worker_id"] for m in measurements(db)] == [other_id]
    history = [(a["attempt"], a["worker_id"], a["outcome"]) for a in attempts_of(db, tid)]
    assert history == [(1, zombie_id, "lease_expired"), (2, other_id, "done")]
    assert "dropping its done result" in zombie.log()


def test_trial_lasting_three_leases_is_never_claimed_again_while_heartbeated(db_url, db, tmp_path):
    # Three 3 s leases: a heartbeat (every second) that a loaded machine delays by a second
    # still lands in time.
    run = insert_run(db, problem_args={"duration": 9.0})
    [tid] = insert_trials(db, run, synthetic_configs(1))
    with running_workers(db_url, 2, log_dir=tmp_path, lease_s=3.0, **FAST) as fleet:
        codes = wait_all(fleet, 60)
    assert codes == [0, 0], logs(fleet)
    assert trial_states(db, [tid]) == {tid: "done"}
    assert [(a["attempt"], a["outcome"]) for a in attempts_of(db, tid)] == [(1, "done")]
    assert len(measurements(db)) == 1
    assert "reaper" not in logs(fleet)


def test_hung_evaluations_are_killed_at_the_timeout_and_the_worker_goes_on(db_url, db, tmp_path):
    hang = insert_run(db, problem_args={"hang_rate": 1.0, "duration": 0})
    [own_timeout] = insert_trials(db, hang, synthetic_configs(1), timeout_s=1.0)
    [worker_default] = insert_trials(db, hang, synthetic_configs(1, start=1))
    fine = insert_run(db, problem_args={"duration": 0.01})
    fine_ids = insert_trials(db, fine, synthetic_configs(2), priority=1)
    w = start_worker(
        db_url, log_path=tmp_path / "w.log", lease_s=SAFE_LEASE_S, timeout_s=1.5, **FAST
    )
    try:
        assert w.wait(60) == 0, w.log()
    finally:
        w.kill()
    assert trial_states(db, [own_timeout, worker_default]) == {
        own_timeout: "timed_out",
        worker_default: "timed_out",
    }
    assert set(trial_states(db, fine_ids).values()) == {"done"}
    errors = {
        r["id"]: r["error"]
        for r in db.execute("SELECT id, error FROM tunefleet.trial WHERE run_id = %s", (hang,))
    }
    assert "exceeded the 1 s timeout" in errors[own_timeout]
    assert "exceeded the 1.5 s timeout" in errors[worker_default]
    assert [a["outcome"] for a in attempts_of(db, own_timeout)] == ["timed_out"]


def test_code_generation_gets_at_least_the_workers_timeout_and_a_hung_one_is_killed(
    db_url, db, tmp_path
):
    # The trial's own 1 s limit (the coordinator's, from the run's best kernel time) is for
    # timing; code generation of 1.5 s is slow, not wrong. The code-generation process starts
    # with the first trial it gets, and its interpreter's start-up counts against that trial's
    # limit (seconds on a loaded machine): a warm-up trial with a generous limit takes it.
    warm = insert_run(db, problem_args={"duration": 0.01})
    [warm_up] = insert_trials(db, warm, synthetic_configs(1), timeout_s=120)
    slow = insert_run(db, problem_args={"prepare_duration": 1.5, "duration": 0.01})
    [slow_codegen] = insert_trials(db, slow, synthetic_configs(1), timeout_s=1.0, priority=1)
    hung = insert_run(db, problem_args={"hang_rate": 1.0, "fault_phase": "prepare"})
    [hung_codegen] = insert_trials(db, hung, synthetic_configs(1), timeout_s=1.0, priority=2)
    w = start_worker(
        db_url,
        log_path=tmp_path / "w.log",
        lease_s=SAFE_LEASE_S,
        timeout_s=4,
        poll_s=0.2,
        prepare_workers=1,
    )
    try:
        assert w.wait(60) == 0, w.log()
    finally:
        w.kill()
    assert trial_states(db, [warm_up, slow_codegen, hung_codegen]) == {
        warm_up: "done",
        slow_codegen: "done",
        hung_codegen: "timed_out",
    }, w.log()
    error = db.execute(
        "SELECT error FROM tunefleet.trial WHERE id = %s", (hung_codegen,)
    ).fetchone()["error"]
    assert error == "code generation exceeded the 4 s timeout and was killed"


def test_one_limit_bounds_code_generation_and_timing_together(db_url, db, tmp_path):
    # Code generation (2.5 s) and timing (2.5 s) each fit the worker's 4 s timeout but not
    # together: the evaluation is killed at 4 s, not after 4 s of each. A warm-up trial with a
    # generous limit takes both processes' start-up.
    warm = insert_run(db, problem_args={"duration": 0.01})
    [warm_up] = insert_trials(db, warm, synthetic_configs(1), timeout_s=120)
    slow = insert_run(db, problem_args={"prepare_duration": 2.5, "duration": 2.5})
    [slow_both] = insert_trials(db, slow, synthetic_configs(1), priority=1)
    w = start_worker(
        db_url,
        log_path=tmp_path / "w.log",
        lease_s=SAFE_LEASE_S,
        timeout_s=4,
        poll_s=0.2,
        prepare_workers=1,
    )
    try:
        assert w.wait(60) == 0, w.log()
    finally:
        w.kill()
    assert trial_states(db, [warm_up, slow_both]) == {
        warm_up: "done",
        slow_both: "timed_out",
    }, w.log()
    error = db.execute("SELECT error FROM tunefleet.trial WHERE id = %s", (slow_both,)).fetchone()[
        "error"
    ]
    assert error == "evaluation exceeded the 4 s timeout and was killed"


def test_crashing_evaluations_fail_after_max_attempts_with_their_history(db_url, db, tmp_path):
    crash = insert_run(db, problem_args={"fail_rate": 1.0, "duration": 0})
    [measure_crash] = insert_trials(db, crash, synthetic_configs(1), max_attempts=2)
    codegen = insert_run(
        db, problem_args={"fail_rate": 1.0, "fault_phase": "prepare", "duration": 0}
    )
    [codegen_crash] = insert_trials(db, codegen, synthetic_configs(1), max_attempts=2)
    fine = insert_run(db, problem_args={"duration": 0.01})
    [fine_id] = insert_trials(db, fine, synthetic_configs(1), priority=1)
    w = start_worker(
        db_url, log_path=tmp_path / "w.log", lease_s=SAFE_LEASE_S, poll_s=0.2, prepare_workers=1
    )
    try:
        assert w.wait(60) == 0, w.log()
    finally:
        w.kill()
    assert trial_states(db, [measure_crash, codegen_crash, fine_id]) == {
        measure_crash: "failed",
        codegen_crash: "failed",
        fine_id: "done",
    }
    for tid, phase in ((measure_crash, "evaluation"), (codegen_crash, "code generation")):
        history = attempts_of(db, tid)
        assert [(a["attempt"], a["outcome"]) for a in history] == [(1, "failed"), (2, "failed")]
        assert all(f"{phase} process killed by SIGSEGV" in a["error"] for a in history)
        error = db.execute("SELECT error FROM tunefleet.trial WHERE id = %s", (tid,)).fetchone()
        assert "SIGSEGV" in error["error"]


def test_workers_recover_from_a_postgresql_restart_and_finish_the_run(tmp_path, cli_env):
    from tunefleet.db.embedded import EmbeddedServer
    from tunefleet.db.migrate import upgrade

    server = EmbeddedServer(tmp_path / "pg" / "data")
    server.start()
    try:
        url = server.local_url()
        port = server.status().port
        upgrade(url)
        db = connect(url)
        # 24 half-second trials on two workers: when the second is done some five seconds of
        # work are left, so the server stops mid-run however late the stop is sent.
        run = insert_run(db, problem_args={"duration": 0.5})
        ids = insert_trials(db, run, synthetic_configs(24))
        with running_workers(url, 2, log_dir=tmp_path, lease_s=2, env=cli_env, **FAST) as fleet:
            wait_until(
                lambda: list(trial_states(db, ids).values()).count("done") >= 2,
                what="some trials done before the restart",
            )
            db.close()
            server.stop()
            time.sleep(1.5)
            server.start(port=port)
            codes = wait_all(fleet, 90)
        assert codes == [0, 0], logs(fleet)
        db = connect(url)
        assert set(trial_states(db, ids).values()) == {"done"}
        assert sorted(m["trial_id"] for m in measurements(db)) == ids
        assert "connection lost" in logs(fleet) and "reachable again" in logs(fleet)
        db.close()
    finally:
        server.stop()


def test_first_signal_finishes_the_timed_trial_and_releases_the_others(db_url, db, tmp_path):
    # 6 s trials: the stop lands while the first is being timed, however late it is sent.
    run = insert_run(db, problem_args={"duration": 6.0})
    ids = insert_trials(db, run, synthetic_configs(5))
    w = start_worker(db_url, log_path=tmp_path / "w.log", lease_s=SAFE_LEASE_S, prefetch=2, **FAST)
    try:
        wid = worker_id_of(db, w)
        wait_until(lambda: list(trial_states(db, ids).values()).count("running") == 3)
        wait_timing(w, ids[0])
        w.stop()
        assert w.wait(30) == 0, w.log()
    finally:
        w.kill()
    states = trial_states(db, ids)
    assert states == {ids[0]: "done", **{t: "pending" for t in ids[1:]}}, w.log()
    for tid in ids[1:3]:
        assert [(a["attempt"], a["outcome"]) for a in attempts_of(db, tid)] == [(1, "released")]
    attempts = db.execute("SELECT id, attempt FROM tunefleet.trial ORDER BY id").fetchall()
    assert [r["attempt"] for r in attempts] == [1, 0, 0, 0, 0]  # releases are not counted
    worker = db.execute("SELECT state FROM tunefleet.worker WHERE id = %s", (wid,)).fetchone()
    assert worker["state"] == "stopped"


def test_second_signal_exits_at_once_and_leaves_the_lease_to_expire(db_url, db, tmp_path):
    """The first signal lets the trial being timed finish; the second kills the evaluator and
    exits at once, leaving the trial to its lease (nothing is written on the way out).

    The trial must be *being timed* when the first signal comes: one that is only claimed is
    released by the graceful stop, as it should be (this test once saw ``pending`` because it
    signalled as soon as the claim was visible in the database)."""
    run = insert_run(db, problem_args={"duration": 60})
    [tid] = insert_trials(db, run, synthetic_configs(1))
    w = start_worker(db_url, log_path=tmp_path / "w.log", lease_s=SAFE_LEASE_S, **FAST)
    try:
        wid = worker_id_of(db, w)
        wait_timing(w, tid)
        children = child_pids(w.pid)
        assert children
        w.send(signal.SIGINT)
        wait_until(lambda: "send it again" in w.log(), what="the first signal's message")
        w.send(signal.SIGTERM)
        assert w.wait(30) == 128 + signal.SIGTERM, w.log()
        wait_until(lambda: gone(children), what="the evaluator to be killed")
    finally:
        w.kill()
    # Still held by the dead worker, attempt open, until a reaper sees the lease expire.
    trial = db.execute(
        "SELECT state, attempt, lease_owner FROM tunefleet.trial WHERE id = %s", (tid,)
    ).fetchone()
    assert trial == {"state": "running", "attempt": 1, "lease_owner": wid}, w.log()
    assert [(a["attempt"], a["outcome"]) for a in attempts_of(db, tid)] == [(1, None)]
    assert "released" not in w.log() and "aborted" in w.log()


def test_repeated_parent_gone_signals_stop_gracefully_without_escalating(db_url, db, tmp_path):
    """SIGUSR1 is the parent-death signal of the workers `tunefleet tune` starts; Linux sends it
    once per thread of the dying parent, so a burst must not become the abort of a second
    SIGTERM: the timed trial is still recorded and the worker marks itself stopped."""
    run = insert_run(db, problem_args={"duration": 1.5})
    ids = insert_trials(db, run, synthetic_configs(3))
    w = start_worker(db_url, log_path=tmp_path / "w.log", lease_s=SAFE_LEASE_S, **FAST)
    try:
        wid = worker_id_of(db, w)
        wait_until(lambda: "running" in trial_states(db, ids).values(), what="the claim")
        wait_timing(w, ids[0])
        for _ in range(4):
            w.send(signal.SIGUSR1)
        assert w.wait(30) == 0, w.log()
    finally:
        w.kill()
    assert "aborted" not in w.log()
    assert sorted(trial_states(db, ids).values()) == ["done", "pending", "pending"], w.log()
    worker = db.execute("SELECT state FROM tunefleet.worker WHERE id = %s", (wid,)).fetchone()
    assert worker["state"] == "stopped"


def test_the_device_starts_the_next_held_trial_before_the_last_result_is_written(
    db_url, db, tmp_path
):
    """The device never waits on the database: when a timing ends and the worker already
    holds its next trial, that trial is handed to the device before the finished one's
    result is written (the log at debug level shows the order)."""
    run = insert_run(db, problem_args={"duration": 0.2})
    ids = insert_trials(db, run, synthetic_configs(4))
    w = start_worker(
        db_url,
        log_path=tmp_path / "w.log",
        prefetch=1,
        poll_s=0.2,
        prepare_workers=0,
        extra=["-v"],
    )
    try:
        assert w.wait(60) == 0, w.log()
    finally:
        w.kill()
    assert set(trial_states(db, ids).values()) == {"done"}
    lines = w.log().splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    done = sorted(ids, key=lambda t: first(f"trial {t} attempt 1: done"))
    assert done == sorted(ids)  # timed in claim order
    for finished, following in itertools.pairwise(done):
        assert first(f"timing trial {following}") < first(f"trial {finished} attempt 1: done")


def test_max_trials_stops_claiming(db_url, db, tmp_path):
    run = insert_run(db, problem_args={"duration": 0})
    ids = insert_trials(db, run, synthetic_configs(4))
    w = start_worker(db_url, log_path=tmp_path / "w.log", drain=False, max_trials=2, **FAST)
    try:
        assert w.wait(30) == 0, w.log()
    finally:
        w.kill()
    assert list(trial_states(db, ids).values()).count("done") == 2
    assert list(trial_states(db, ids).values()).count("pending") == 2


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunefleet.worker", *args],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_database_behind_head_is_refused_with_the_fix(empty_db_url, cli_env):
    done = _cli(["--db", empty_db_url, "--device", "host", "--drain"], cli_env)
    assert done.returncode == 1
    assert "tunefleet db upgrade" in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.opencl
def test_second_worker_on_the_same_device_exits_with_a_clear_message(db_url, tmp_path, cli_env):
    pytest.importorskip("pyopencl")
    first = start_worker(db_url, log_path=tmp_path / "first.log", device="0", drain=False, **FAST)
    try:
        wait_until(lambda: "serving" in first.log(), timeout=60, what="the first worker")
        second = _cli(["--db", db_url, "--device", "0", "--drain"], cli_env)
        assert second.returncode == 1, second.stderr
        assert "already used by another tunefleet worker" in second.stderr
        assert second.stderr.count("\n") == 1
        first.stop()
        assert first.wait(30) == 0, first.log()
    finally:
        first.kill()
    missing = _cli(["--db", db_url, "--device", "no-such-device-xyz"], cli_env)
    assert missing.returncode == 1 and "no OpenCL device matches" in missing.stderr


def test_a_misbehaving_problem_never_crashes_the_worker(db_url, db, tmp_path):
    from tests.acceptance.misbehaving_problem import MODES

    path = str(Path(__file__).with_name("misbehaving_problem.py"))
    run = insert_run(db, problem=path)
    trial_ids = insert_trials(db, run, [{"mode": m} for m in MODES], max_attempts=1)
    ids = dict(zip(MODES, trial_ids, strict=True))
    w = start_worker(db_url, log_path=tmp_path / "w.log", lease_s=SAFE_LEASE_S, poll_s=0.2)
    try:
        assert w.wait(60) == 0, w.log()
    finally:
        w.kill()
    rows = {
        r["id"]: r for r in db.execute("SELECT id, state, error FROM tunefleet.trial").fetchall()
    }
    got = {mode: rows[tid]["state"] for mode, tid in ids.items()}
    assert got == {
        "numpy": "done",
        "no_times": "failed",
        "raises": "failed",
        "outcome_invalid": "invalid",
        "prepare_invalid": "invalid",
        "nan_json": "done",
    }, w.log()
    assert "unusable timings" in rows[ids["no_times"]]["error"]
    assert "RuntimeError: driver said no" in rows[ids["raises"]]["error"]
    assert "max rel err" in rows[ids["outcome_invalid"]]["error"]
    assert "cannot be built" in rows[ids["prepare_invalid"]]["error"]
    ms = {m["trial_id"]: m for m in measurements(db)}
    assert ms[ids["numpy"]]["median_s"] == pytest.approx(0.003)
    assert ms[ids["numpy"]]["validation"] == {"passed": True, "max_rel_err": 1e-7}
    assert ms[ids["nan_json"]]["validation"]["max_rel_err"] is None
    assert ms[ids["nan_json"]]["validation"]["shape"] == [4, 5]
