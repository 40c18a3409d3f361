"""The one way configurations enter a run, at its creation (seeds) and all through its search
(the engine's batches): :func:`enqueue`, in three to four statements whatever the batch size.

In this order: a configuration the problem's own rules reject becomes an ``invalid`` trial;
one that another run under the same cache key found invalid too (source ``cache``); one
measured under the cache key becomes a ``done`` trial with a copy of that measurement
(source ``cache``); the rest become pending trials, announced with one NOTIFY. Confirmations
take another way in (:mod:`.confirm`): they are never answered from the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from tunefleet.queries import search as q
from tunefleet.space import Config
from tunefleet.vocabulary import TrialSource


@dataclass(frozen=True)
class NewTrial:
    """A configuration about to enter a run."""

    config: Config
    #: ``seed`` or ``search``.
    source: TrialSource
    #: Why the problem's own rules reject it (it becomes ``invalid`` at once), or None.
    illegal: str | None = None


@dataclass(frozen=True)
class Enqueued:
    """What :func:`enqueue` did with each configuration."""

    #: Finished at once: illegal, found invalid by another run, or answered from the cache.
    answered: list[q.TrialOutcome]
    #: Pending trials for the workers.
    queued: list[q.Queued]
    #: Hashes the run already holds in a state that is not revived (nothing was written).
    skipped: list[str]


def enqueue(
    conn: psycopg.Connection[Any],
    run_id: int,
    device_class: str,
    cache_key: str,
    trials: Mapping[str, NewTrial],
    *,
    timeout_s: float | None,
    max_attempts: int,
) -> Enqueued:
    """The one way configurations (keyed by hash) enter a run, at its creation and all
    through its search. In this order: an illegal configuration becomes an ``invalid`` trial;
    one another run with the same cache key found invalid too (source ``cache``); one measured
    under the cache key becomes a ``done`` trial with a copy of that measurement; the rest
    become pending trials, with one NOTIFY. A configuration the run already has stays as it
    is (a ``cancelled`` one is revived). Three to four statements whatever the batch size."""
    todo = dict(trials)
    invalid: list[dict[str, Any]] = [
        {"config": t.config, "config_hash": h, "source": t.source, "error": t.illegal}
        for h, t in todo.items()
        if t.illegal is not None
    ]
    legal = [h for h, t in todo.items() if t.illegal is None]
    invalid += [
        {
            "config": todo[k.config_hash].config,
            "config_hash": k.config_hash,
            "source": TrialSource.CACHE,
            "error": f"invalid in run {k.run_id}: {k.error or 'no reason given'}",
        }
        for k in q.known_invalid(conn, run_id, cache_key, legal)
    ]
    answered = q.insert_invalid_trials(conn, run_id, device_class, invalid)
    skipped = [item["config_hash"] for item in invalid]
    for item in invalid:
        del todo[item["config_hash"]]
    answered += q.insert_cached_trials(conn, run_id, device_class, cache_key, list(todo))
    for outcome in answered:
        todo.pop(outcome.config_hash, None)
    queued = q.insert_trials(
        conn,
        run_id,
        device_class,
        [{"config": t.config, "config_hash": h, "source": t.source} for h, t in todo.items()],
        timeout_s=timeout_s,
        max_attempts=max_attempts,
    )
    for row in queued:
        del todo[row.config_hash]
    written = {o.config_hash for o in answered}
    return Enqueued(
        answered=answered,
        queued=queued,
        skipped=[h for h in skipped if h not in written] + list(todo),
    )
