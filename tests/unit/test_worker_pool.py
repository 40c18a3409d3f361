"""The code-generation pool's books and housekeeping (tunefleet.worker.pool): time booked under
what the device was doing, windows that end when full, processes grown and retired, the
initial resize when more workers share the host. Its processes are never started here."""

from __future__ import annotations

import os

from tunefleet.worker.pool import WINDOW_MAX_S, WINDOW_MIN_S, CodegenPool
from tunefleet.worker.sizing import Resources
from tunefleet.worker.supervise import Child

GIB = 1024**3


def pool(
    cores: float = 8, prepare_workers: int | None = None, prefetch: int | None = None
) -> CodegenPool:
    return CodegenPool(
        Resources(cores, memory_bytes=64 * GIB, source="--cores"), prepare_workers, prefetch, 0.0
    )


def test_time_is_booked_under_what_the_device_did_since_the_last_turn() -> None:
    p = pool()
    p.book(1.0, busy=True, starved=False)  # the first second: neither
    p.book(3.0, busy=False, starved=True)  # two seconds busy
    p.book(3.5, busy=False, starved=False)  # half a second starved
    p.book(4.0, busy=False, starved=False)
    assert (p.books.busy_s, p.books.starved_s) == (2.0, 0.5)


def test_a_window_ends_once_it_holds_enough_prepared_trials_or_after_the_longest_wait() -> None:
    p = pool(prepare_workers=2)  # a fixed pool: no controller
    assert p.controller is None
    p.timed(preparing=True, seconds=0.5)
    assert p.end_window(WINDOW_MIN_S + 1, [os.getpid()]) is None  # one of two prepared
    p.timed(preparing=True, seconds=0.7)
    p.timed(preparing=False, seconds=0.1)
    assert p.end_window(WINDOW_MIN_S / 2, [os.getpid()]) is None  # too short still
    ended = p.end_window(WINDOW_MIN_S + 1, [os.getpid()])
    assert ended is not None
    window, _ = ended
    assert window.prepare_s == (0.5, 0.7) and window.measure_s == (0.1,)
    assert p.books.started == WINDOW_MIN_S + 1 and p.books.prepare_s == []  # a new window
    assert p.end_window(WINDOW_MIN_S + 1 + WINDOW_MAX_S, [os.getpid()]) is not None
    assert not p.control(window, [])  # nothing to decide without a controller


def test_processes_grow_to_the_size_and_only_idle_unused_ones_retire() -> None:
    p = pool(cores=8)
    assert p.sizing.prepare_workers == 4 and len(p.children) == 4
    names = [c.name for c in p.children]
    busy, held = p.children[3], p.children[2]
    busy.busy = True
    p.resize(1, p.sizing.ceiling, in_use=[held])
    assert p.sizing.prefetch == 1  # the automatic prefetch follows the pool
    assert p.active() == [p.children[0]]
    # Newest idle first: the busy one is skipped, and the one a held trial is tied to stops
    # the retiring (its trial finishes first).
    assert len(p.children) == 4
    busy.busy = False
    p.retire(in_use=[held])
    assert [c.name for c in p.children] == names[:3]
    p.retire(in_use=[])
    assert [c.name for c in p.children] == names[:1]
    p.resize(3, p.sizing.ceiling, in_use=[])
    assert [c.name for c in p.children] == [names[0], "codegen-4", "codegen-5"]
    assert all(isinstance(c, Child) and c.proc is None for c in p.children)


def test_a_fixed_prefetch_stays_when_the_pool_resizes() -> None:
    p = pool(cores=8, prefetch=5)
    p.resize(2, p.sizing.ceiling, in_use=[])
    assert (p.sizing.prepare_workers, p.sizing.prefetch) == (2, 5)


def test_more_workers_on_the_host_resize_an_automatic_pool_at_start_only() -> None:
    p = pool(cores=16)
    assert p.sizing.prepare_workers == 8
    assert not p.share_with(1, initial=True)  # no change
    assert p.share_with(4, initial=True)
    assert p.resources.peers == 4 and p.sizing.prepare_workers == 2 and len(p.children) == 2
    assert p.controller is not None and p.controller.pool == 2
    assert not p.share_with(8, initial=False)  # later: only the share (and the ceiling) moves
    assert p.resources.peers == 8 and p.sizing.prepare_workers == 2
    fixed = pool(cores=16, prepare_workers=3)
    assert not fixed.share_with(4, initial=True) and fixed.sizing.prepare_workers == 3
