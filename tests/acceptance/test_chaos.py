"""The whole system under faults, with nothing lost.

A real coordinator process and a fleet of real worker processes tune the synthetic problem
(short evaluations, some crashing, hanging or invalid configurations) on a private PostgreSQL
server while a seeded schedule SIGKILLs and replaces workers, freezes one past its lease,
SIGKILLs the coordinator and resumes it, stops it cleanly and resumes it, terminates database
sessions and restarts the server.
Then SQL checks every promise of the queue (see ``tests.helpers.chaos.violations``).

Twice: with the workers connected directly, and with the workers behind a real PgBouncer in
transaction mode (three server connections for the whole fleet; the coordinator keeps its
direct session): the terminated sessions are then the pooler's server connections, and the
restarted server is reconnected to by the pooler.

Run it alone with ``pytest -m chaos``; ``TUNEFLEET_CHAOS_SEED`` replays another schedule.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.chaos import ChaosRun, coordinator_env, schedule, violations
from tests.helpers.pgbouncer import find_pgbouncer, pgbouncer
from tunefleet.db.embedded import EmbeddedServer
from tunefleet.db.engine import connect
from tunefleet.db.migrate import upgrade

pytestmark = [pytest.mark.acceptance, pytest.mark.chaos]

SEED = int(os.environ.get("TUNEFLEET_CHAOS_SEED", "20261130"))
#: Enough that the run is still going when the last fault has run its course: four workers
#: finish up to 20 trials a second, and freezing one past its lease takes about 4 s.
MAX_TRIALS = 200
WORKERS = 4
LEASE_S = 2.0
#: Each evaluation really takes this long; some configurations crash, hang or are invalid.
PROBLEM_ARGS = {
    "duration": 0.2,
    "fail_rate": 0.04,
    "hang_rate": 0.02,
    "invalid_rate": 0.05,
}


@contextlib.contextmanager
def worker_route(route: str, server: EmbeddedServer, url: str) -> Iterator[str]:
    """The URL the workers connect to: the database itself, or through PgBouncer."""
    if route == "direct":
        yield url
        return
    if find_pgbouncer() is None:
        pytest.skip("pgbouncer is not installed")
    with pgbouncer(server.admin_url(), "transaction", pool_size=3) as bouncer:
        yield bouncer.url(url)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("route", ["direct", "pooled"])
def test_faults_everywhere_lose_nothing_and_measure_nothing_twice(
    tmp_path: Path, cli_env, route: str
):
    server = EmbeddedServer(tmp_path / "pg" / "data")
    server.start()
    chaos: ChaosRun | None = None
    stack = contextlib.ExitStack()  # the pooler, where there is one
    try:
        port = server.status().port
        assert port is not None
        url = server.local_url()
        upgrade(url)
        worker_url = stack.enter_context(worker_route(route, server, url))
        env = coordinator_env(
            cli_env,
            TUNEFLEET_POLL_S="0.05",
            # Hung evaluations cost seconds, not the default minutes.
            TUNEFLEET_TRIAL_TIMEOUT_MIN_S="4",
            TUNEFLEET_TRIAL_TIMEOUT_MAX_S="6",
            TUNEFLEET_WORKER_ALIVE_S="6",
        )
        workdir = tmp_path / "logs"
        workdir.mkdir()
        chaos = ChaosRun(
            server,
            url,
            port,
            workdir,
            env,
            SEED,
            lease_s=LEASE_S,
            worker_options={"timeout_s": 4, "poll_s": 0.5, "prepare_workers": 0},
            worker_url=worker_url,
        )
        sizes = [f"--arg={k}={v}" for k, v in {**PROBLEM_ARGS, "seed": SEED % 1000}.items()]
        chaos.start_coordinator("synthetic", *sizes, "--max-trials", str(MAX_TRIALS))
        run_id = chaos.wait_for(
            lambda: chaos.query("SELECT max(id) AS id FROM tunefleet.run")[0]["id"],
            timeout=60,
            what="the coordinator to create its run",
        )
        chaos.run_id = int(run_id)
        fleet = [chaos.start_worker(wait=False) for _ in range(WORKERS)]
        chaos.wait_for(
            lambda: len(chaos.query("SELECT id FROM tunefleet.worker")) == len(fleet),
            timeout=60,
            what=f"{WORKERS} workers to register\n{chaos.report()}",
        )

        faults = schedule(chaos.rng)
        chaos.log(f"schedule: {', '.join(faults)}")
        for i, fault in enumerate(faults):
            # Fault i fires once the run has spent i / n of the first half of its budget: every
            # fault hits a run in flight (a fault itself takes seconds, the run goes on).
            due = 5 + i * (MAX_TRIALS // 2 - 5) // len(faults)
            chaos.wait_for(
                lambda due=due: chaos.finished_trials() >= due,
                timeout=90,
                what=f"{due} finished trials before {fault}\n{chaos.report()}",
            )
            # A coordinator started by the previous fault first takes its run: one that meets
            # a restarting server before it ever connected exits at once (a usage error).
            chaos.wait_for(
                chaos.coordinator_took_the_run,
                timeout=60,
                what=f"the coordinator to take its run before {fault}\n{chaos.report()}",
            )
            chaos.log(f"{chaos.finished_trials()} trials finished: {fault}")
            chaos.inject(fault)
            crashed = [
                i
                for i, p in enumerate(chaos.coordinators)
                if p.poll() not in (None, -signal.SIGKILL)
                and not (i in chaos.clean_exits and p.poll() == 0)
            ]
            assert not crashed, f"a coordinator exited on its own\n{chaos.report()}"

        coordinator = chaos.coordinator
        try:
            code = coordinator.wait(180)
        except Exception:
            raise AssertionError(f"the run did not finish\n{chaos.report()}") from None
        chaos.log(f"coordinator exited with {code}")
        assert code == 0, chaos.report()

        # Every worker rode out the faults: the killed ones died of SIGKILL, the others stop
        # cleanly on SIGTERM (exit 0).
        survivors = chaos.live_workers()
        assert len(survivors) == WORKERS, chaos.report()
        for w in survivors:
            w.stop()
        deadline = time.monotonic() + 30
        codes = [w.wait(max(deadline - time.monotonic(), 0.1)) for w in survivors]
        chaos.log(f"workers stopped: exit codes {codes}")
        assert codes == [0] * WORKERS, chaos.report()
        killed = [w for w in chaos.workers if w not in survivors]
        assert all(w.poll() == -signal.SIGKILL for w in killed), chaos.report()

        with connect(url) as db:
            broken = violations(db, chaos.run_id, MAX_TRIALS)
            states = db.execute(
                "SELECT state, count(*) AS n FROM tunefleet.trial WHERE run_id = %s "
                "GROUP BY state ORDER BY state",
                (chaos.run_id,),
            ).fetchall()
            lost = db.execute(
                "SELECT outcome, count(*) AS n FROM tunefleet.attempt GROUP BY outcome "
                "ORDER BY outcome"
            ).fetchall()
        chaos.log("trials by state: " + ", ".join(f"{r['state']} {r['n']}" for r in states))
        chaos.log("attempts by outcome: " + ", ".join(f"{r['outcome']} {r['n']}" for r in lost))
        assert not broken, "\n".join(broken) + "\n" + chaos.report()
        # The faults really happened: leases expired (the killed and the frozen workers').
        assert any(r["outcome"] == "lease_expired" for r in lost), chaos.report()
    finally:
        if chaos is not None:
            chaos.close()
        stack.close()
        server.stop()
