"""What a node is told when the database host refuses it: the fix, in the same one line."""

from __future__ import annotations

from tunefleet.db.engine import _hint, _transient

NO_TLS = (
    'pg_hba.conf rejects connection for host "10.1.0.11", user "tunefleet_worker", '
    'database "tunefleet", no encryption'
)
NO_ENTRY = (
    'no pg_hba.conf entry for host "10.1.0.11", user "tunefleet_worker", database '
    '"tunefleet", SSL encryption'
)


def test_a_server_that_wants_tls_names_sslmode() -> None:
    hint = _hint(NO_TLS)
    assert "sslmode=verify-full" in hint and "sslrootcert" in hint and "\n" not in hint
    assert not _transient(NO_TLS)  # waiting never fixes it


def test_a_network_the_server_does_not_let_in_names_pg_hba() -> None:
    hint = _hint(NO_ENTRY)
    assert "hostssl line" in hint and "sslmode" not in hint
    assert not _transient(NO_ENTRY)
