"""A draining worker leaves only when there is no work now and none coming: a run whose
coordinator is alive refills the queue, so its momentarily empty queue is not "drained".

Regression: ``--drain`` workers started next to a coordinator (the Slurm launcher does this)
used to exit as soon as they had emptied the queue between two refills, stalling the run.
"""

from __future__ import annotations

import uuid

from tests.helpers.queue_data import insert_run
from tunefleet.queries import queue
from tunefleet.queries import search as q

ANY = ["any"]


def test_a_live_coordinators_run_with_an_empty_queue_is_open_work(db):
    run = insert_run(db)
    assert not queue.has_open_trials(db, ANY)  # a run nobody drives: nothing will come
    coordinator = uuid.uuid4()
    assert q.take_run(db, run, coordinator) is not None  # driven, heartbeat now
    assert queue.has_open_trials(db, ANY)
    assert not queue.has_open_trials(db, ["nvidia-h200"])  # another class's run
    # A coordinator that stopped heartbeating (SIGKILLed) feeds nobody.
    db.execute("UPDATE tunefleet.run SET coordinator_heartbeat_at = now() - interval '31 seconds'")
    assert not queue.has_open_trials(db, ANY)
    assert queue.has_open_trials(db, ANY, coordinator_alive_s=60)
    q.heartbeat_run(db, run, coordinator)
    assert queue.has_open_trials(db, ANY)
    # A finished run is done with the queue.
    assert q.finish_run(db, run, coordinator, "max_trials")
    assert not queue.has_open_trials(db, ANY)
