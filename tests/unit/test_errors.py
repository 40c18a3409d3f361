"""``first_line``: the one way an exception (or a stored error text) is told in one line."""

from __future__ import annotations

import pytest

from tunefleet.errors import first_line


@pytest.mark.parametrize(
    ("what", "expected"),
    [
        (ValueError("bad value\nsecond line"), "bad value"),
        (RuntimeError("\n   \n  indented first  \nnext"), "indented first"),
        (KeyError(), "KeyError"),  # says nothing: told by its class
        (OSError("   "), "OSError"),
        ("stored error text\nwith a traceback", "stored error text"),
    ],
)
def test_first_line(what: object, expected: str) -> None:
    assert first_line(what) == expected


def test_blank_text_gives_the_given_fallback() -> None:
    assert first_line(RuntimeError(""), "lost") == "lost"
    assert first_line("", "") == ""
    assert first_line(RuntimeError("said"), "lost") == "said"
