"""Test support for the coordinator: an analytic problem with a known optimum and a minimal
in-test worker that claims with the queue's pattern (SELECT ... FOR UPDATE SKIP LOCKED, then a
fenced completion) and evaluates problems without OpenCL.

The fake worker stands in until the real worker processes are available on this branch; it
never mocks the database, it is a second client of the same queue.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tunefleet.devices import HOST_DEVICE
from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.problems.base import Outcome, Problem, Protocol
from tunefleet.space import Bool, Choice, Config, IntRange, PowerOfTwo, Space, TupleOf

#: The problem spec of :class:`Analytic` (a user problem file, resolved like any other).
ANALYTIC = f"{Path(__file__).resolve()}:Analytic"

OPTIMUM: dict[str, Any] = {"x": 11, "y": 6, "p": 8, "flag": True, "mode": "b", "wg": [4, 2]}
#: A configuration the problem rejects.
INVALID: dict[str, Any] = {**OPTIMUM, "x": 0}
OPTIMUM_SECONDS = 1e-3
FLOP_COUNT = 2e6
OPTIMUM_GFLOPS = FLOP_COUNT / OPTIMUM_SECONDS / 1e9


def analytic_seconds(config: Mapping[str, Any]) -> float:
    """Separable bowl with its minimum at :data:`OPTIMUM`; ``x < 4`` with ``flag`` is
    invalid (configurations the search must learn to avoid, see :data:`INVALID`)."""
    if config["x"] < 4 and config["flag"]:
        raise InvalidConfiguration("x < 4 with flag is illegal")
    factor = (
        1.0
        + 0.02 * (config["x"] - 11) ** 2
        + 0.01 * (config["y"] - 6) ** 2
        + 0.1 * (math.log2(config["p"]) - 3) ** 2
        + (0.0 if config["flag"] else 0.3)
        + {"a": 0.4, "b": 0.0, "c": 0.2}[config["mode"]]
        + 0.1 * abs(math.log2(config["wg"][0]) - 2)
        + 0.1 * abs(config["wg"][1] - 2)
    )
    return OPTIMUM_SECONDS * factor


class Analytic(Problem):
    name = "analytic"
    description = "test objective with a known optimum"
    needs_opencl = False

    def normalise_args(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(raw) - {"n", "dtype"})
        if unknown:
            raise ProblemError(f"analytic: unknown argument {unknown[0]!r}; use n or dtype")
        n = raw.get("n", 64)
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ProblemError(f"analytic: n={n!r} must be a positive integer (--size n=64)")
        dtype = raw.get("dtype", "float32")
        if dtype not in ("float32", "float64"):
            raise ProblemError(f"analytic: dtype={dtype!r}; use float32 or float64")
        return {"n": n, "dtype": dtype}

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of(
            [
                IntRange("x", 0, 15),
                IntRange("y", 0, 30, 2),
                PowerOfTwo("p", 1, 32),
                Bool("flag"),
                Choice("mode", ("a", "b", "c")),
                TupleOf("wg", (PowerOfTwo("wx", 1, 8), IntRange("wy", 1, 3))),
            ]
        )

    def prepare(self, args: Mapping[str, Any], config: Config, device: Any) -> Any:
        return dict(config)

    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Outcome:
        seconds = analytic_seconds(prepared)
        return Outcome(
            state="done",
            median_s=seconds,
            min_s=seconds,
            samples_s=(seconds,),
            gflops=FLOP_COUNT / seconds / 1e9,
            flop_count=FLOP_COUNT,
            compile_s=0.0,
            validation={"passed": True},
            protocol=protocol.to_json(),
        )


class Kernel(Analytic):
    """The same objective, declared as needing an OpenCL device (device class required)."""

    needs_opencl = True


class Tiny(Analytic):
    """Six configurations: small enough for the search to run out of new ones."""

    def space(self, args: Mapping[str, Any]) -> Space:
        return Space.of([IntRange("x", 10, 12), Bool("flag")])

    def measure(self, prepared: Any, session: Any, protocol: Protocol) -> Outcome:
        full = {**OPTIMUM, "x": prepared["x"], "flag": prepared["flag"]}
        return super().measure(full, session, protocol)


class FakeWorker(threading.Thread):
    """A queue client in a thread: registers a worker row, heartbeats it, claims a few
    pending trials at a time, evaluates them and completes them fenced by lease owner and
    attempt. ``evaluated`` lists ``(run_id, config_hash)`` of every evaluation it made."""

    def __init__(
        self,
        db_url: str,
        *,
        device_class: str = HOST_DEVICE.device_class,
        delay_s: float = 0.0,
        batch: int = 2,
        evaluated: list[tuple[int, str]] | None = None,
        on_claim: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.db_url = db_url
        self.device_class = device_class
        self.delay_s = delay_s
        self.batch = batch
        self.id = uuid.uuid4()
        self.evaluated = evaluated if evaluated is not None else []
        self.on_claim = on_claim
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._runs: dict[int, dict[str, Any]] = {}
        self.conn = psycopg.connect(db_url, autocommit=True, row_factory=psycopg.rows.dict_row)
        self.conn.execute(
            """
            INSERT INTO tunefleet.worker (id, host, pid, device_class, version)
            VALUES (%s, %s, %s, %s, 'test')
            """,
            (self.id, socket.gethostname(), os.getpid(), device_class),
        )

    def __enter__(self) -> FakeWorker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        self.stop.set()
        if self.ident is not None:  # started
            self.join(10)
        if not self.conn.closed:
            self.conn.execute(
                "UPDATE tunefleet.worker SET state = 'stopped', stopped_at = now() WHERE id = %s",
                (self.id,),
            )
            self.conn.close()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.conn.execute(
                    "UPDATE tunefleet.worker SET heartbeat_at = now() WHERE id = %s", (self.id,)
                )
                claimed = self._claim()
                if not claimed:
                    time.sleep(0.01)
                    continue
                for row in claimed:
                    if self.on_claim:
                        self.on_claim(row)
                    if self.delay_s:
                        time.sleep(self.delay_s)
                    self._complete(row)
        except BaseException as exc:  # surfaced by the test through .error
            self.error = exc

    def _claim(self) -> list[dict[str, Any]]:
        return self.conn.execute(
            """
            WITH pick AS (
                SELECT id FROM tunefleet.trial
                 WHERE state = 'pending' AND device_class IN (%(class)s, 'any')
                 ORDER BY priority, id
                 LIMIT %(n)s
                 FOR UPDATE SKIP LOCKED
            )
            UPDATE tunefleet.trial t
               SET state = 'running', attempt = t.attempt + 1, lease_owner = %(me)s,
                   lease_expires_at = now() + interval '60 seconds', started_at = now()
              FROM pick
             WHERE t.id = pick.id
            RETURNING t.id, t.run_id, t.config, t.config_hash, t.attempt
            """,
            {"class": self.device_class, "n": self.batch, "me": self.id},
        ).fetchall()

    def _run(self, run_id: int) -> dict[str, Any]:
        if run_id not in self._runs:
            from tunefleet.problems.registry import get_problem

            run = self.conn.execute(
                "SELECT * FROM tunefleet.run WHERE id = %s", (run_id,)
            ).fetchone()
            assert run is not None
            run["impl"] = get_problem(run["problem"])
            self._runs[run_id] = run
        return self._runs[run_id]

    def _complete(self, row: dict[str, Any]) -> None:
        run = self._run(row["run_id"])
        problem: Problem = run["impl"]
        self.evaluated.append((row["run_id"], row["config_hash"]))
        try:
            prepared = problem.prepare(run["problem_args"], row["config"], HOST_DEVICE)
            outcome = problem.measure(prepared, None, Protocol.from_json(run["protocol"]))
        except InvalidConfiguration as exc:
            outcome = Outcome(state="invalid", error=str(exc))
        with self.conn.transaction():
            fenced = self.conn.execute(
                """
                UPDATE tunefleet.trial
                   SET state = %s, finished_at = now(), error = %s
                 WHERE id = %s AND attempt = %s AND lease_owner = %s AND state = 'running'
                RETURNING id
                """,
                (outcome.state, outcome.error, row["id"], row["attempt"], self.id),
            ).fetchone()
            if fenced is None or outcome.state != "done":
                return
            self.conn.execute(
                """
                INSERT INTO tunefleet.measurement
                       (trial_id, run_id, attempt, cache_key, config_hash, problem,
                        problem_args, config, worker_id, median_s, min_s, samples_s, gflops,
                        flop_count, protocol, compile_s, validation)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                """,
                (
                    row["id"],
                    row["run_id"],
                    row["attempt"],
                    run["cache_key"],
                    row["config_hash"],
                    run["problem"],
                    Jsonb(run["problem_args"]),
                    Jsonb(row["config"]),
                    self.id,
                    outcome.median_s,
                    outcome.min_s,
                    list(outcome.samples_s),
                    outcome.gflops,
                    outcome.flop_count,
                    Jsonb(run["protocol"]),
                    outcome.compile_s,
                    Jsonb(outcome.validation),
                ),
            )


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.05)
