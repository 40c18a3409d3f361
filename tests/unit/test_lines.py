"""A line written while a second signal arrives stays whole (tunefleet.text.lines)."""

from __future__ import annotations

import io

import pytest

from tunefleet.text.lines import write_line


class SignalledStream(io.StringIO):
    """A stream on which KeyboardInterrupt arrives right after the first write call, as a
    second Ctrl-C or TERM does between any two calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def write(self, s: str) -> int:
        self.calls += 1
        if self.calls == 2:
            raise KeyboardInterrupt
        return super().write(s)


def test_a_line_print_writes_is_left_open_by_a_signal_between_its_two_writes():
    stream = SignalledStream()
    with pytest.raises(KeyboardInterrupt):
        print("run 1: 0 finished", file=stream)
    # What the flaky coordinator test saw: the next message lands on the end of this line.
    assert stream.getvalue() == "run 1: 0 finished"


def test_write_line_leaves_the_line_whole_whenever_the_signal_comes():
    stream = SignalledStream()
    write_line("run 1: 0 finished", stream)
    with pytest.raises(KeyboardInterrupt):
        stream.write("tunefleet: interrupted\n")
    assert stream.getvalue() == "run 1: 0 finished\n"
