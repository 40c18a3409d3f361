"""The one driver of a run's search (coordinator.session.SearchSession), which both search-only
spellings (``tunefleet coordinator`` and ``tunefleet tune --workers 0``) and ``tune`` with
local workers go through: the stop rule holds around what the door starts before the search
and around the search, a second signal ends it, and progress lines are read from the
database at most every ``every_s``.

The engine is a stand-in here (it only calls back and waits for a stop); the progress reader
reads a real run row of a real database."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

from tests.helpers.coordinator import settings
from tunefleet.coordinator.create import create_run
from tunefleet.coordinator.session import SearchSession
from tunefleet.settings import DatabaseSettings


class _Progress:
    unserved = None
    end_game: object = None


class _Engine:
    """Stands in for coordinator.engine.Coordinator: calls back ``ticks`` times, then runs
    until asked to stop (or returns at once when told so)."""

    def __init__(self, ticks: int, wait_for_stop: bool, end_game_at: int | None = None) -> None:
        self.ticks = ticks
        self.wait_for_stop = wait_for_stop
        self.end_game_at = end_game_at  # from this tick on, the records show the end game
        self.stop = threading.Event()
        self.stops = 0

    def request_stop(self) -> None:
        self.stops += 1
        self.stop.set()

    def run(self, run_id: int, progress_callback: Any) -> str:
        for tick in range(self.ticks):
            p = _Progress()
            if self.end_game_at is not None and tick >= self.end_game_at:
                p.end_game = ("began at tick", self.end_game_at)
            progress_callback(p)
        if self.wait_for_stop:
            assert self.stop.wait(60), "the stop signal never reached the engine"
        return f"result of run {run_id}"


def _session(engine: _Engine, db_url: str, every_s: float) -> SearchSession:
    run_id = create_run(settings(max_trials=5), db_url)
    return SearchSession(engine, run_id, DatabaseSettings.build(db_url), db_url, every_s=every_s)  # type: ignore[arg-type]


def test_progress_lines_come_from_the_database_at_most_every_every_s(db_url: str) -> None:
    engine = _Engine(ticks=50, wait_for_stop=False)
    session = _session(engine, db_url, every_s=3600.0)
    lines: list[str | None] = []
    try:
        assert session.run(lambda line, p: lines.append(line)) == f"result of run {session.run_id}"
    finally:
        row = session.final_row()
    # 50 callbacks within the hour: one line, read from the run's row.
    assert len(lines) == 1 and lines[0] is not None and f"run {session.run_id}" in lines[0]
    assert row is not None and row["run_id"] == session.run_id
    assert session.signals == 0 and engine.stops == 0


def test_the_record_that_first_shows_the_end_game_is_never_held_back(db_url: str) -> None:
    """A run whose last trials all end within one tick of the end game's start would end
    without the door's saying so: that one record passes the throttle, later ones do not."""
    engine = _Engine(ticks=50, wait_for_stop=False, end_game_at=30)
    session = _session(engine, db_url, every_s=3600.0)
    seen: list[tuple[str | None, Any]] = []
    try:
        session.run(lambda line, p: seen.append((line, p.end_game)))
    finally:
        session.close()
    assert [end_game for _, end_game in seen] == [None, ("began at tick", 30)]
    assert all(line is not None and f"run {session.run_id}" in line for line, _ in seen)


def test_a_signal_while_the_door_starts_its_workers_stops_the_run(db_url: str) -> None:
    engine = _Engine(ticks=0, wait_for_stop=True)
    session = _session(engine, db_url, every_s=1.0)

    def before() -> None:  # e.g. tune starting its local workers: a TERM arrives meanwhile
        os.kill(os.getpid(), signal.SIGTERM)

    own = signal.getsignal(signal.SIGTERM)
    try:
        session.run(lambda line, p: None, before)
    finally:
        session.close()
    assert session.signals == 1 and engine.stops == 1
    # The rule is gone with the session: the process's own handler is back.
    assert signal.getsignal(signal.SIGTERM) is own


def test_a_second_signal_ends_the_search_at_once(db_url: str) -> None:
    engine = _Engine(ticks=0, wait_for_stop=False)
    session = _session(engine, db_url, every_s=1.0)
    engine.run = lambda run_id, progress_callback: _signal_twice()  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            session.run(lambda line, p: None)
    finally:
        session.close()
    assert session.signals == 2 and engine.stops == 1


def _signal_twice() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
    raise AssertionError("the second signal did not end the search")
