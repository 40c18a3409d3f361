"""tune()'s default progress: the command's live line on stderr when stderr is a terminal,
nothing otherwise; False is silence, and anything but a callable is a one-line error."""

from __future__ import annotations

import io

import pytest

from tunefleet.api.tune import TuneProgress, _callback
from tunefleet.errors import UsageError


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


EVENTS = [
    TuneProgress(1, "start", "tuning run 1: synthetic on any; workers: 1 local"),
    TuneProgress(1, "running", "run 1: 3 done"),
    TuneProgress(1, "end", "run 1: 8 done"),
]


def test_on_a_terminal_the_default_rewrites_one_line_on_stderr(monkeypatch) -> None:
    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    show = _callback(None)
    for event in EVENTS:
        show(event)
    text = err.getvalue()
    assert text.startswith("tuning run 1: synthetic on any; workers: 1 local\n")
    assert "\rrun 1: 3 done" in text and "\rrun 1: 8 done" in text and text.endswith("\n")


@pytest.mark.parametrize("progress", [None, False])
def test_off_a_terminal_and_with_false_nothing_is_written(monkeypatch, progress) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    show = _callback(progress)
    for event in EVENTS:
        show(event)
    assert err.getvalue() == ""


def test_a_callable_is_used_as_it_is_and_anything_else_is_refused() -> None:
    seen: list[TuneProgress] = []
    assert _callback(seen.append) == seen.append
    with pytest.raises(UsageError, match="progress=3: give a callable"):
        _callback(3)  # type: ignore[arg-type]
