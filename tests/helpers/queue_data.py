"""Runs and trials inserted with plain SQL, so queue and worker tests do not depend on the
coordinator; plus ``wait_until`` for tests that watch other processes."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tunefleet.problems.base import Protocol, cache_key
from tunefleet.problems.synthetic import Synthetic, fault_of
from tunefleet.space import config_hash
from tunefleet.vocabulary import ANY_DEVICE_CLASS

#: A protocol that keeps synthetic measurements tiny.
FAST_PROTOCOL = Protocol(warmup=0, min_launches=3, min_seconds=0.0, max_launches=3)


def insert_run(
    conn: psycopg.Connection[Any],
    *,
    problem: str = "synthetic",
    problem_args: Mapping[str, Any] | None = None,
    device_class: str = ANY_DEVICE_CLASS,
    protocol: Protocol = FAST_PROTOCOL,
    name: str | None = None,
) -> int:
    if problem == "synthetic":
        args = Synthetic().normalise_args(problem_args or {})
        space = Synthetic().space(args).to_json()
    else:  # any other problem: arguments as given, an empty space (the worker never reads it)
        args, space = dict(problem_args or {}), {"version": 1, "params": []}
    proto = protocol.to_json()
    row = conn.execute(
        """
        INSERT INTO tunefleet.run (name, problem, problem_args, space, device_class, protocol,
                                   cache_key)
        VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id
        """,
        (
            name,
            problem,
            Jsonb(args),
            Jsonb(space),
            device_class,
            Jsonb(proto),
            cache_key(problem, args, device_class, proto),
        ),
    ).fetchone()
    assert row is not None
    return int(row["id"])


def synthetic_configs(n: int, start: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct configurations of the synthetic space, in a fixed order."""
    space = Synthetic().space({})
    values = [p.values() for p in space]
    names = space.names()
    out = []
    for combo in itertools.islice(itertools.product(*values), start, start + n):
        out.append(dict(zip(names, combo, strict=True)))
    return out


def first_invalid(args: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration the synthetic problem rejects as invalid under these arguments.

    The search is random: a test that needs an ``invalid`` trial seeds this one rather than
    hoping the search meets one."""
    problem = Synthetic()
    full = problem.normalise_args(args)
    space = problem.space(full)
    for values in itertools.product(*(param.values() for param in space)):
        config = space.check(dict(zip(space.names(), values, strict=True)))
        if fault_of(full, config) == "invalid":
            return config
    raise AssertionError(f"no synthetic configuration is invalid under {dict(args)}")


def seed_with_invalid_default(args: Mapping[str, Any]) -> int:
    """A synthetic ``seed`` under which the default configuration (the baseline that ``tune``
    measures first) is invalid, for runs started without seed configurations."""
    problem = Synthetic()
    for seed in range(10_000):
        full = problem.normalise_args({**args, "seed": seed})
        if fault_of(full, problem.space(full).default()) == "invalid":
            return seed
    raise AssertionError(f"no seed makes the default configuration invalid under {dict(args)}")


def insert_trials(
    conn: psycopg.Connection[Any],
    run_id: int,
    configs: Iterable[Mapping[str, Any]],
    *,
    device_class: str | None = None,
    max_attempts: int = 3,
    timeout_s: float | None = None,
    priority: int = 0,
) -> list[int]:
    """Insert pending trials (device class copied from the run unless given)."""
    if device_class is None:
        row = conn.execute("SELECT device_class FROM tunefleet.run WHERE id = %s", (run_id,))
        device_class = str(row.fetchone()["device_class"])  # type: ignore[index]
    ids = []
    for config in configs:
        row = conn.execute(
            """
            INSERT INTO tunefleet.trial (run_id, device_class, config, config_hash,
                                         max_attempts, timeout_s, priority)
            VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id
            """,
            (
                run_id,
                device_class,
                Jsonb(dict(config)),
                config_hash(config),
                max_attempts,
                timeout_s,
                priority,
            ),
        ).fetchone()
        assert row is not None
        ids.append(int(row["id"]))
    return ids


def finish_reported(
    conn: psycopg.Connection[Any], trial_id: int, state: str, median_s: float = 0
) -> None:
    """Finish a trial as a worker's completion and the coordinator's reading leave it: the
    state, attempt 1 (a worker claimed it: an invalid trial no worker saw is a rule rejection,
    counted apart from the budget), reported; with ``median_s``, a one-sample measurement."""
    conn.execute(
        "UPDATE tunefleet.trial SET state = %s, attempt = 1, finished_at = now(), reported = true"
        " WHERE id = %s",
        (state, trial_id),
    )
    if median_s:
        conn.execute(
            """
            INSERT INTO tunefleet.measurement (trial_id, run_id, cache_key, config_hash, problem,
                   problem_args, config, median_s, min_s, samples_s, gflops, protocol)
            SELECT t.id, t.run_id, r.cache_key, t.config_hash, r.problem, r.problem_args,
                   t.config, %(s)s, %(s)s, ARRAY[%(s)s], 1.0 / %(s)s, r.protocol
              FROM tunefleet.trial t JOIN tunefleet.run r ON r.id = t.run_id
             WHERE t.id = %(id)s
            """,
            {"s": median_s, "id": trial_id},
        )


def trial_states(conn: psycopg.Connection[Any], ids: Sequence[int] | None = None) -> dict[int, str]:
    if ids is None:
        rows = conn.execute("SELECT id, state FROM tunefleet.trial").fetchall()
    else:
        rows = conn.execute(
            "SELECT id, state FROM tunefleet.trial WHERE id = ANY(%s)", (list(ids),)
        ).fetchall()
    return {int(r["id"]): str(r["state"]) for r in rows}


def attempts_of(conn: psycopg.Connection[Any], trial_id: int) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT attempt, worker_id, outcome, error, ended_at FROM tunefleet.attempt "
        "WHERE trial_id = %s ORDER BY id",
        (trial_id,),
    ).fetchall()


#: The trigger functions of :func:`refuse_claims`: one broken row (the lowest trial id), or
#: every row.
_REFUSE_FIRST = """
CREATE FUNCTION tunefleet.refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.trial_id = (SELECT min(id) FROM tunefleet.trial) THEN
        RAISE EXCEPTION 'this row is broken';
    END IF;
    RETURN NEW;
END $$
"""
_REFUSE_ALL = """
CREATE FUNCTION tunefleet.refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the attempt table is broken'; END $$
"""


def refuse_claims(conn: psycopg.Connection[Any], *, only_the_first: bool) -> None:
    """Make the database refuse claims as a broken row (or table) would: a trigger on the
    attempt rows a claim inserts raises ``this row is broken`` for the lowest trial id
    (``only_the_first``), else ``the attempt table is broken`` for every trial."""
    conn.execute(_REFUSE_FIRST if only_the_first else _REFUSE_ALL)
    conn.execute(
        "CREATE TRIGGER refuse_claim BEFORE INSERT ON tunefleet.attempt FOR EACH ROW "
        "EXECUTE FUNCTION tunefleet.refuse_claim()"
    )


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def waiting_on_a_lock(db: Any, pid: int) -> bool:
    """The backend ``pid`` is blocked on a lock (``pg_stat_activity``), seen from ``db``."""
    row = db.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row["wait_event_type"] == "Lock"
