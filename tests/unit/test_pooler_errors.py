"""A connection pooler that refuses tunefleet's session settings is a permanent, one-line error
naming the setting to add (PgBouncer without ``ignore_startup_parameters = options``): waiting
and reconnecting never fix it. The real PgBouncer test is tests/integration/test_pgbouncer.py;
this one runs where PgBouncer is not installed."""

from __future__ import annotations

from tunefleet.db.engine import _hint, _transient


def test_refused_startup_parameter_is_permanent_and_names_the_fix() -> None:
    reason = "unsupported startup parameter: options"
    assert not _transient(reason)
    hint = _hint(reason)
    assert "ignore_startup_parameters = options" in hint
    assert "\n" not in hint


def test_other_reasons_keep_their_hints() -> None:
    assert _transient("Connection refused")
    assert "ignore_startup_parameters" not in _hint("Connection refused")
