"""The chaos harness: a real coordinator process and a fleet of real worker processes on a
private PostgreSQL server, a seeded schedule of faults injected while the run goes on, and the
SQL checks of the promises that must survive them.

``ChaosRun`` owns every process it starts and kills them all on ``close()``. Faults fire in a
seeded random order, each once the run has made a given share of its progress (so every fault
hits the run mid-flight however fast the machine is); ``events`` records what was done when.
``violations(db, run_id, max_trials)`` returns every broken promise as a sentence (empty when
all hold), so a failure names all of them at once.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.helpers.launch import WorkerProcess, start_worker
from tunefleet.db.embedded import EmbeddedServer
from tunefleet.db.engine import connect

ROOT = Path(__file__).resolve().parents[2]

#: Faults of the schedule; the order is shuffled by the seed, worker kills happen twice.
FAULTS = (
    "kill_worker",
    "kill_worker",
    "stop_worker_past_lease",
    "kill_coordinator",
    "stop_and_resume_coordinator",
    "terminate_worker_backends",
    "terminate_coordinator_backend",
    "restart_postgres",
)
FINISHED_STATES = ("done", "invalid", "failed", "timed_out")
TERMINAL_STATES = (*FINISHED_STATES, "cancelled")


@dataclass
class Event:
    at_s: float
    what: str

    def __str__(self) -> str:
        return f"{self.at_s:7.2f} s  {self.what}"


@dataclass
class ChaosRun:
    """Processes and faults of one chaos run (see the module docstring)."""

    server: EmbeddedServer
    url: str
    port: int
    workdir: Path
    env: dict[str, str]
    seed: int
    lease_s: float = 2.0
    worker_options: dict[str, Any] = field(default_factory=dict)
    #: Where the workers connect: ``url`` itself, or the same database through a pooler.
    worker_url: str | None = None
    rng: random.Random = field(init=False)
    started: float = field(default_factory=time.monotonic)
    events: list[Event] = field(default_factory=list)
    workers: list[WorkerProcess] = field(default_factory=list)
    coordinators: list[subprocess.Popen[bytes]] = field(default_factory=list)
    run_id: int | None = None
    #: worker number -> (trial, attempt) claims it held when it was frozen
    frozen_claims: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    #: coordinators stopped cleanly by the schedule (exit 0 expected)
    clean_exits: set[int] = field(default_factory=set)
    _logs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # --- the record ------------------------------------------------------------------------
    def log(self, what: str) -> None:
        event = Event(time.monotonic() - self.started, what)
        self.events.append(event)
        with open(self.workdir / "chaos.log", "a") as out:
            out.write(f"{event}\n")

    def timeline(self) -> str:
        return "\n".join(str(e) for e in self.events)

    def process_logs(self, tail: int = 60) -> str:
        out = []
        for path in self._logs:
            try:
                lines = path.read_text(errors="replace").splitlines()
            except FileNotFoundError:
                continue
            out.append(f"--- {path.name} (last {tail} lines)\n" + "\n".join(lines[-tail:]))
        return "\n".join(out)

    def report(self) -> str:
        return f"chaos timeline (seed {self.seed}):\n{self.timeline()}\n{self.process_logs()}"

    # --- processes -------------------------------------------------------------------------
    def start_coordinator(self, *args: str) -> subprocess.Popen[bytes]:
        n = len(self.coordinators)
        path = self.workdir / f"coordinator-{n}.log"
        self._logs.append(path)
        argv = [sys.executable, "-m", "tunefleet", "-v", "coordinator", *args, "--db", self.url]
        with open(path, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.workdir,
            )
        self.coordinators.append(proc)
        self.log(f"coordinator {n} started (pid {proc.pid}): {' '.join(args)}")
        return proc

    @property
    def coordinator(self) -> subprocess.Popen[bytes]:
        return self.coordinators[-1]

    def coordinator_took_the_run(self) -> bool:
        """Whether the newest coordinator process has reached the database and taken its run
        (a coordinator that cannot reach the database at start fails at once, by design)."""
        path = self.workdir / f"coordinator-{len(self.coordinators) - 1}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "created run" in text or "resumed with" in text

    def start_worker(self, wait: bool = True) -> WorkerProcess:
        n = len(self.workers)
        path = self.workdir / f"worker-{n}.log"
        self._logs.append(path)
        w = start_worker(
            self.worker_url or self.url,
            log_path=path,
            env=self.env,
            device="host",
            drain=False,
            lease_s=self.lease_s,
            **self.worker_options,
        )
        self.workers.append(w)
        self.log(f"worker {n} started (pid {w.pid})")
        if wait:
            # A worker refuses to start while the database is unreachable (one line, exit 1):
            # let it register before the next fault, so every start is a fleet member.
            self.wait_for(
                lambda: self.query("SELECT 1 FROM tunefleet.worker WHERE pid = %s", (w.pid,)),
                timeout=60,
                what=f"worker {n} to register\n{self.report()}",
            )
            self.log(f"worker {n} registered")
        return w

    def live_workers(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive]

    def close(self) -> None:
        """Kill whatever is still running (a failed test must not leave processes behind)."""
        for w in self.workers:
            with contextlib.suppress(ProcessLookupError):
                w.send(signal.SIGCONT)
            w.kill()
        for proc in self.coordinators:
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)

    # --- the database, as an observer that survives restarts -------------------------------
    def query(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        """One statement on a fresh connection; retried while the server is coming back."""
        deadline = time.monotonic() + 60
        while True:
            try:
                with connect(self.url) as conn:
                    return conn.execute(sql, params).fetchall()
            except (psycopg.OperationalError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the database stayed unreachable: {exc}") from exc
            except Exception as exc:  # DatabaseUnavailable while the server restarts
                if "cannot connect" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def finished_trials(self) -> int:
        if self.run_id is None:
            return 0
        rows = self.query(
            "SELECT count(*) AS n FROM tunefleet.trial"
            " WHERE run_id = %s AND state = ANY(%s) AND purpose = 'search'",
            (self.run_id, list(FINISHED_STATES)),
        )
        return int(rows[0]["n"])

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(0.1)

    # --- faults ----------------------------------------------------------------------------
    def inject(self, fault: str) -> None:
        getattr(self, fault)()

    def _held_by(self, pid: int) -> list[tuple[int, int]]:
        """(trial, attempt) of the running trials whose lease the worker process ``pid`` holds."""
        rows = self.query(
            """
            SELECT t.id, t.attempt FROM tunefleet.trial t JOIN tunefleet.worker w
                ON w.id = t.lease_owner
             WHERE t.state = 'running' AND w.pid = %s
            """,
            (pid,),
        )
        return [(int(r["id"]), int(r["attempt"])) for r in rows]

    def _frozen_holder(self) -> tuple[WorkerProcess, list[tuple[int, int]]] | None:
        """A live worker, stopped (SIGSTOP) while it holds a running trial, and what it holds;
        ``None`` while none holds one (the workers tried are let go again)."""
        live = self.live_workers()
        for victim in self.rng.sample(live, len(live)):
            victim.send(signal.SIGSTOP)
            # Stopped for sure before we look: it can then neither finish nor claim a trial.
            self.wait_for(lambda v=victim: _state(v.pid) in {"T", None}, 10, "the SIGSTOP")
            held = self._held_by(victim.pid)
            if held:
                return victim, held
            victim.send(signal.SIGCONT)
        return None

    def kill_worker(self) -> None:
        """SIGKILL a live worker while it holds a running trial (its leases expire; the reaper
        requeues its trials) and start a replacement.

        The victim is frozen before its claims are read: a worker killed between two trials
        holds nothing, and a run whose kills all fell there exercised no lease expiry (seen
        once in a loaded fresh clone)."""
        victim, held = self.wait_for(
            self._frozen_holder, timeout=60, what=f"a worker holding a trial\n{self.report()}"
        )
        n = self.workers.index(victim)
        victim.kill()
        self.log(f"SIGKILL worker {n} (pid {victim.pid}) holding trials/attempts {held}")
        self.start_worker()

    def stop_worker_past_lease(self) -> None:
        """SIGSTOP a worker that holds a running trial until its lease has expired and the
        reaper has taken the trial back (so another worker redoes it), then SIGCONT it: it is
        now a zombie, and it must notice (heartbeat or completion refused by the fence)."""
        holders = {
            int(r["pid"])
            for r in self.query(
                """
                SELECT w.pid FROM tunefleet.trial t JOIN tunefleet.worker w
                    ON w.id = t.lease_owner
                 WHERE t.state = 'running'
                """
            )
        }
        live = self.live_workers()
        victim = self.rng.choice([w for w in live if w.pid in holders] or live)
        n = self.workers.index(victim)
        victim.send(signal.SIGSTOP)
        self.wait_for(lambda: _state(victim.pid) in {"T", None}, 10, "the SIGSTOP")
        claims = self._held_by(victim.pid)
        self.log(f"SIGSTOP worker {n} (pid {victim.pid}) holding trials/attempts {claims}")
        if claims:
            self.frozen_claims[n] = claims
            self.wait_for(
                lambda: all(
                    self.query(
                        """
                        SELECT 1 FROM tunefleet.attempt a JOIN tunefleet.worker w
                            ON w.id = a.worker_id
                         WHERE a.trial_id = %s AND a.attempt = %s AND w.pid = %s
                           AND a.outcome = 'lease_expired'
                        """,
                        (trial, attempt, victim.pid),
                    )
                    for trial, attempt in claims
                ),
                timeout=60,
                what=f"the frozen worker's leases to be reaped\n{self.report()}",
            )
            self.log(f"the leases of worker {n} were reaped")
        time.sleep(self.rng.uniform(0.0, self.lease_s))
        seen = len(victim.log())
        victim.send(signal.SIGCONT)
        self.log(f"SIGCONT worker {n}")
        if claims:
            self.wait_for(
                lambda: "rejected" in victim.log()[seen:],
                timeout=60,
                what=f"worker {n} to notice it lost its claims\n{self.report()}",
            )
            self.log(f"worker {n} noticed its claims were gone")

    def kill_coordinator(self) -> None:
        """SIGKILL the coordinator and start another one with --resume after a moment."""
        assert self.run_id is not None
        self.coordinator.kill()
        self.coordinator.wait(10)
        self.log(f"SIGKILL coordinator {len(self.coordinators) - 1}")
        time.sleep(self.rng.uniform(0.2, 1.5))
        self.start_coordinator("--resume", str(self.run_id))

    def stop_and_resume_coordinator(self) -> None:
        """SIGTERM the coordinator (a clean stop: pending trials cancelled, run ``stopped``,
        exit 0) and resume the run; the resumed search may queue cancelled ones again."""
        assert self.run_id is not None
        n = len(self.coordinators) - 1
        self.coordinator.terminate()
        code = self.coordinator.wait(60)
        [run] = self.query("SELECT state FROM tunefleet.run WHERE id = %s", (self.run_id,))
        self.log(f"SIGTERM coordinator {n}: exit {code}, run {run['state']}")
        assert code == 0 and run["state"] == "stopped", self.report()
        self.clean_exits.add(n)
        time.sleep(self.rng.uniform(0.2, 1.5))
        self.start_coordinator("--resume", str(self.run_id))

    def _terminate(self, application: str, share: float) -> None:
        sessions = self.query(
            """
            SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = %s
             ORDER BY pid
            """,
            (application,),
        )
        pids = [int(r["pid"]) for r in sessions]
        chosen = sorted(self.rng.sample(pids, max(1, round(share * len(pids))))) if pids else []
        for pid in chosen:
            self.query("SELECT pg_terminate_backend(%s) AS ok", (pid,))
        self.log(f"pg_terminate_backend: {len(chosen)} of {len(pids)} {application} sessions")

    def terminate_worker_backends(self) -> None:
        self._terminate("tunefleet-worker", self.rng.uniform(0.5, 1.0))

    def terminate_coordinator_backend(self) -> None:
        self._terminate("tunefleet-coordinator", 1.0)

    def restart_postgres(self) -> None:
        """Stop the server (fast shutdown: every session is cut) and start it again on the
        same port after a pause."""
        self.server.stop()
        pause = self.rng.uniform(0.5, 2.0)
        self.log(f"PostgreSQL stopped for {pause:.1f} s")
        time.sleep(pause)
        self.server.start(port=self.port)
        self.log("PostgreSQL started again")


def schedule(rng: random.Random) -> list[str]:
    faults = list(FAULTS)
    rng.shuffle(faults)
    return faults


def coordinator_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    """The environment of the processes: this checkout's code, unbuffered output."""
    out = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)}
    out["PYTHONUNBUFFERED"] = "1"
    out.update(extra)
    return out


# --- the promises, in SQL ---------------------------------------------------------------------


def violations(db: psycopg.Connection[Any], run_id: int, max_trials: int) -> list[str]:
    """Every promise that does not hold for the run, as one sentence each."""
    bad: list[str] = []

    def rows(sql: str) -> list[dict[str, Any]]:
        return db.execute(sql, {"run": run_id}).fetchall()

    # 1. every enqueued configuration ended in exactly one terminal state
    for r in rows(
        """
        SELECT id, state FROM tunefleet.trial
         WHERE run_id = %(run)s
           AND state NOT IN ('done', 'invalid', 'failed', 'timed_out', 'cancelled')
        """
    ):
        bad.append(f"trial {r['id']} ended the run in state {r['state']!r}")
    for r in rows(
        """
        SELECT config_hash, count(*) AS n FROM tunefleet.trial
         WHERE run_id = %(run)s AND purpose = 'search'
         GROUP BY config_hash HAVING count(*) > 1
        """
    ):
        bad.append(f"configuration {r['config_hash']} has {r['n']} search trials in the run")
    # ... and a confirmation re-measures one done search trial of the same run, at most once
    for r in rows(
        """
        SELECT c.id, o.run_id, o.state, o.purpose,
               (SELECT count(*) FROM tunefleet.trial x
                 WHERE x.confirms_trial_id = c.confirms_trial_id) AS siblings
          FROM tunefleet.trial c LEFT JOIN tunefleet.trial o ON o.id = c.confirms_trial_id
         WHERE c.run_id = %(run)s AND c.purpose = 'confirm'
           AND (o.run_id IS DISTINCT FROM c.run_id OR o.state <> 'done'
                OR o.purpose <> 'search'
                OR (SELECT count(*) FROM tunefleet.trial x
                     WHERE x.confirms_trial_id = c.confirms_trial_id) <> 1)
        """
    ):
        bad.append(
            f"confirmation {r['id']} re-measures a {r['state']} {r['purpose']} trial of run "
            f"{r['run_id']} ({r['siblings']} confirmations of it)"
        )
    for r in rows(
        """
        SELECT t.id, t.state, t.lease_expires_at, t.finished_at FROM tunefleet.trial t
         WHERE t.run_id = %(run)s AND t.state <> 'cancelled'
           AND (t.lease_expires_at IS NOT NULL OR t.finished_at IS NULL)
        """
    ):
        bad.append(
            f"trial {r['id']} is {r['state']} but still has a lease until "
            f"{r['lease_expires_at']} or no finish time"
        )
    # 2. no trial has two measurements; a measurement only for done trials
    for r in rows(
        """
        SELECT t.id, t.state, count(m.id) AS n FROM tunefleet.trial t
          LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
         WHERE t.run_id = %(run)s
         GROUP BY t.id, t.state
        HAVING count(m.id) <> (CASE WHEN t.state = 'done' THEN 1 ELSE 0 END)
        """
    ):
        bad.append(f"trial {r['id']} ({r['state']}) has {r['n']} measurements")
    # 3. no configuration was measured twice by the run's search (a confirmation re-measures
    #    by design, once per search trial and round: the unique index trial_confirms_unique)
    for r in rows(
        """
        SELECT m.config_hash, count(*) AS n FROM tunefleet.measurement m
          JOIN tunefleet.trial t ON t.id = m.trial_id
         WHERE m.run_id = %(run)s AND t.purpose = 'search'
         GROUP BY m.config_hash HAVING count(*) > 1
        """
    ):
        bad.append(f"configuration {r['config_hash']} was measured {r['n']} times")
    # 4. a done trial's measurement came from the lease holder of its final attempt
    for r in rows(
        """
        SELECT t.id, t.attempt, t.lease_owner, m.worker_id, m.attempt AS m_attempt,
               a.worker_id AS a_worker, a.outcome AS a_outcome
          FROM tunefleet.trial t
          JOIN tunefleet.measurement m ON m.trial_id = t.id
          LEFT JOIN tunefleet.attempt a
                 ON a.trial_id = t.id AND a.attempt = t.attempt AND a.outcome = 'done'
         WHERE t.run_id = %(run)s AND t.state = 'done' AND t.source <> 'cache'
           AND (m.worker_id IS DISTINCT FROM t.lease_owner
                OR m.attempt IS DISTINCT FROM t.attempt
                OR a.worker_id IS DISTINCT FROM t.lease_owner)
        """
    ):
        bad.append(
            f"done trial {r['id']} (attempt {r['attempt']}, lease owner {r['lease_owner']}) "
            f"was measured by worker {r['worker_id']} on attempt {r['m_attempt']}; its "
            f"final attempt row: worker {r['a_worker']}, outcome {r['a_outcome']}"
        )
    # The attempt history is whole: numbered 1..attempt, every claim closed with an outcome,
    # exactly one 'done' claim per done trial and none for the others.
    for r in rows(
        """
        SELECT t.id, t.state, t.attempt,
               array_agg(a.attempt ORDER BY a.attempt)
                   FILTER (WHERE a.outcome IS DISTINCT FROM 'released') AS counted,
               count(*) FILTER (WHERE a.id IS NOT NULL AND a.outcome IS NULL) AS open,
               count(*) FILTER (WHERE a.outcome = 'done') AS done
          FROM tunefleet.trial t
          LEFT JOIN tunefleet.attempt a ON a.trial_id = t.id
         WHERE t.run_id = %(run)s AND t.source <> 'cache'
         GROUP BY t.id, t.state, t.attempt
        """
    ):
        counted = [a for a in (r["counted"] or []) if a is not None]
        expected = list(range(1, r["attempt"] + 1))
        if counted != expected:
            bad.append(f"trial {r['id']} has counted attempts {counted}, expected {expected}")
        if r["open"]:
            bad.append(f"trial {r['id']} ({r['state']}) has {r['open']} attempt(s) never closed")
        if r["done"] != (1 if r["state"] == "done" else 0):
            bad.append(f"trial {r['id']} ({r['state']}) has {r['done']} 'done' attempts")
    # 5. the run reached its stop rule, with trial counts that fit it
    [run] = rows("SELECT state, stop_reason, coordinator_id FROM tunefleet.run WHERE id = %(run)s")
    if (run["state"], run["stop_reason"]) != ("finished", "max_trials"):
        bad.append(f"run ended {run['state']} / {run['stop_reason']}, not finished / max_trials")
    if run["coordinator_id"] is not None:
        bad.append("the finished run still names a driving coordinator")
    [count] = rows(
        """
        SELECT count(*) FILTER (WHERE state IN ('done', 'invalid', 'failed', 'timed_out'))
                   AS finished,
               count(*) FILTER (WHERE NOT reported AND state <> 'cancelled') AS unreported
          FROM tunefleet.trial WHERE run_id = %(run)s AND purpose = 'search'
        """
    )
    if count["finished"] != max_trials:
        bad.append(f"{count['finished']} trials finished; the budget was exactly {max_trials}")
    if count["unreported"]:
        bad.append(f"{count['unreported']} finished trials were never reported to the search")
    # 6. the best was confirmed before the run reported it (the default --confirm 3)
    [best] = rows("SELECT confirmed FROM tunefleet.best_per_run WHERE run_id = %(run)s")
    if not best["confirmed"]:
        bad.append("the run's best was not confirmed by a re-measurement")
    return bad


def _state(pid: int) -> str | None:
    """The process's state letter from /proc (``T``: stopped), ``None`` once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def accounting(db: psycopg.Connection[Any], run_id: int) -> dict[str, int]:
    """The books of a run once it ended, as numbers for a report (``violations`` says which
    promise broke; this counts): ``finished`` search trials, ``confirmations``, ``lost``
    (trials that never finished: left pending, or done without their measurement),
    ``duplicated`` (extra measurements of a configuration by the
    search, extra ``done`` claims of a trial), ``stuck`` (trials still leased as running,
    claims never closed), and the attempts taken back (``lease_expired``, ``released``)."""
    [row] = db.execute(
        """
        WITH t AS (SELECT * FROM tunefleet.trial WHERE run_id = %(run)s),
             a AS (SELECT a.* FROM tunefleet.attempt a JOIN t ON t.id = a.trial_id),
             dup AS (SELECT count(*) - 1 AS extra FROM tunefleet.measurement m
                       JOIN t ON t.id = m.trial_id
                      WHERE t.purpose = 'search'
                      GROUP BY m.config_hash HAVING count(*) > 1),
             dup_done AS (SELECT count(*) - 1 AS extra FROM a WHERE outcome = 'done'
                           GROUP BY trial_id HAVING count(*) > 1)
        SELECT
          (SELECT count(*) FROM t WHERE purpose = 'search'
              AND state IN ('done', 'invalid', 'failed', 'timed_out')) AS finished,
          (SELECT count(*) FROM t WHERE purpose = 'confirm') AS confirmations,
          (SELECT count(*) FROM t WHERE state = 'pending')
          + (SELECT count(*) FROM t WHERE state = 'done' AND NOT EXISTS
               (SELECT 1 FROM tunefleet.measurement m WHERE m.trial_id = t.id)) AS lost,
          (SELECT coalesce(sum(extra), 0) FROM dup)
          + (SELECT coalesce(sum(extra), 0) FROM dup_done) AS duplicated,
          (SELECT count(*) FROM t WHERE state = 'running')
          + (SELECT count(*) FROM a WHERE outcome IS NULL) AS stuck,
          (SELECT count(*) FROM a WHERE outcome = 'lease_expired') AS lease_expired,
          (SELECT count(*) FROM a WHERE outcome = 'released') AS released
        """,
        {"run": run_id},
    ).fetchall()
    return {k: int(v) for k, v in row.items()}
