"""Test and benchmark helper: runs whose speed depends on known parameters, written straight
into the tables (a run, its finished trials, a measurement per measured one) in three
statements, so a run of 10,000 trials is there in seconds.

:func:`synthetic_trials` draws configurations of the synthetic problem's space, timed by its
objective restricted to ``depends_on``; :func:`wide_trials` draws from a GEMM-like space of
ten parameters (over 500,000 points) where ``reg_i``, ``wg_j`` and ``unroll_k`` decide the
time and ``reg_i * reg_j > 64`` is invalid, for runs too big for the synthetic space.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from tunefleet.problems.base import Protocol, cache_key
from tunefleet.problems.synthetic import PARAMETERS, Synthetic, invalid_by_value, objective
from tunefleet.space import config_hash

#: One finished trial: configuration, state, median seconds (``None`` unless done).
Trial = tuple[dict[str, Any], str, float | None]

WIDE_SPACE: dict[str, list[Any]] = {
    "wg_i": [1, 2, 4, 8, 16, 32],
    "wg_j": [1, 2, 4, 8, 16, 32, 64],
    "reg_i": [1, 2, 4, 8, 16],
    "reg_j": [1, 2, 4, 8, 16],
    "vec_i": [1, 2, 4],
    "vec_j": [1, 2, 4],
    "tile_k": [4, 8, 16, 32, 64],
    "prefetch_a": [False, True],
    "prefetch_b": [False, True],
    "unroll_k": ["hint", "full", "none"],
}
#: What decides the wide space's time, most first.
WIDE_DEPENDS_ON = ("reg_i", "wg_j", "unroll_k")
FLOPS = 2.0 * 256**3


def synthetic_trials(
    depends_on: Sequence[str] = PARAMETERS,
    invalid_values: dict[str, list[Any]] | None = None,
    noise: float = 0.05,
    seed: int = 0,
) -> list[Trial]:
    """Every configuration of the synthetic space, shuffled."""
    space = Synthetic().space({})
    configs = [
        dict(zip(space.names(), combo, strict=True))
        for combo in itertools.product(*(p.values() for p in space))
    ]
    rng = random.Random(seed)
    rng.shuffle(configs)
    args = {"invalid_values": invalid_values or {}}
    out: list[Trial] = []
    for c in configs:
        if invalid_by_value(args, c):
            out.append((c, "invalid", None))
        else:
            out.append((c, "done", objective(c, depends_on) * (1 + noise * rng.random())))
    return out


def wide_trials(n: int, seed: int = 0, noise: float = 0.05) -> list[Trial]:
    """``n`` distinct configurations of :data:`WIDE_SPACE`, timed by a made-up objective."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[Trial] = []
    while len(out) < n:
        c = {k: rng.choice(v) for k, v in WIDE_SPACE.items()}
        h = config_hash(c)
        if h in seen:
            continue
        seen.add(h)
        if c["reg_i"] * c["reg_j"] > 64:
            out.append((c, "invalid", None))
            continue
        if rng.random() < 0.01:
            out.append((c, "timed_out", None))
            continue
        t = 1e-3 * (
            1
            + 0.8 * abs(math.log2(c["reg_i"]) - 2)
            + 0.3 * abs(math.log2(c["wg_j"]) - 4)
            + {"hint": 0.0, "full": 0.4, "none": 1.0}[c["unroll_k"]]
            + 0.02 * abs(math.log2(c["tile_k"]) - 4)
        )
        out.append((c, "done", t * (1 + noise * rng.random())))
    return out


def insert_run(
    conn: Any,
    trials: Sequence[Trial],
    *,
    name: str,
    problem_args: dict[str, Any] | None = None,
    device_class: str = "bench-cpu",
) -> int:
    """A finished run with these trials (search trials, finished one a second apart) and a
    measurement for each measured one; returns its id. Runs with equal ``problem_args`` and
    ``device_class`` share a cache key."""
    args = problem_args or {"duration": 0}
    proto = Protocol().to_json()
    run = conn.execute(
        """INSERT INTO tunefleet.run (name, problem, problem_args, space, device_class,
                                      protocol, cache_key, state, stop_reason, created_at,
                                      finished_at)
           VALUES (%s, 'synthetic', %s, '{"version": 1, "params": []}', %s, %s, %s,
                   'finished', 'max_trials', now() - make_interval(secs => %s), now())
           RETURNING id""",
        (
            name,
            Jsonb(args),
            device_class,
            Jsonb(proto),
            cache_key("synthetic", args, device_class, proto),
            len(trials) + 10,
        ),
    ).fetchone()["id"]
    ids = conn.execute(
        """INSERT INTO tunefleet.trial (run_id, device_class, config, config_hash, state,
                                        attempt, started_at, finished_at, error, reported)
           SELECT %(run)s, %(cls)s, x.config, x.hash, x.state, 1,
                  r.created_at + make_interval(secs => x.n), r.created_at
                    + make_interval(secs => x.n + 0.9),
                  CASE x.state WHEN 'invalid' THEN 'invalid by construction'
                               WHEN 'timed_out' THEN 'evaluation exceeded 60 s' END, true
             FROM unnest(%(configs)s::jsonb[], %(hashes)s::text[], %(states)s::text[])
                  WITH ORDINALITY AS x(config, hash, state, n)
             JOIN tunefleet.run r ON r.id = %(run)s
            ORDER BY x.n
           RETURNING id, state""",
        {
            "run": run,
            "cls": device_class,
            "configs": [Jsonb(c) for c, _, _ in trials],
            "hashes": [config_hash(c) for c, _, _ in trials],
            "states": [s for _, s, _ in trials],
        },
    ).fetchall()
    done = [(row["id"], t) for row, (_, _, t) in zip(ids, trials, strict=True) if t is not None]
    conn.execute(
        """INSERT INTO tunefleet.measurement (trial_id, run_id, attempt, cache_key, config_hash,
                   problem, problem_args, config, median_s, min_s, samples_s, gflops,
                   flop_count, protocol)
           SELECT t.id, t.run_id, 1, r.cache_key, t.config_hash, r.problem, r.problem_args,
                  t.config, x.s, x.s * 0.98, ARRAY[x.s * 0.98, x.s, x.s * 1.01],
                  %(flops)s / x.s / 1e9, %(flops)s, r.protocol
             FROM unnest(%(ids)s::bigint[], %(times)s::float8[]) AS x(id, s)
             JOIN tunefleet.trial t ON t.id = x.id
             JOIN tunefleet.run r ON r.id = t.run_id""",
        {"ids": [i for i, _ in done], "times": [t for _, t in done], "flops": FLOPS},
    )
    return int(run)


def add_trial(conn: Any, run_id: int, config: dict[str, Any], median_s: float) -> int:
    """One more measured trial of a run, finished now; returns its id."""
    tid = conn.execute(
        """INSERT INTO tunefleet.trial (run_id, device_class, config, config_hash, state,
                                        attempt, started_at, finished_at, reported)
           SELECT r.id, r.device_class, %s, %s, 'done', 1, now(), now(), true
             FROM tunefleet.run r WHERE r.id = %s RETURNING id""",
        (Jsonb(config), config_hash(config), run_id),
    ).fetchone()["id"]
    conn.execute(
        """INSERT INTO tunefleet.measurement (trial_id, run_id, attempt, cache_key, config_hash,
                   problem, problem_args, config, median_s, min_s, samples_s, gflops,
                   flop_count, protocol)
           SELECT t.id, t.run_id, 1, r.cache_key, t.config_hash, r.problem, r.problem_args,
                  t.config, %(s)s, %(s)s, ARRAY[%(s)s], %(flops)s / %(s)s / 1e9, %(flops)s,
                  r.protocol
             FROM tunefleet.trial t JOIN tunefleet.run r ON r.id = t.run_id
            WHERE t.id = %(id)s""",
        {"id": tid, "s": median_s, "flops": FLOPS},
    )
    return int(tid)
