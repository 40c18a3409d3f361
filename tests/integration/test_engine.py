"""Every non-migrator session carries the timeouts of the settings (queue rule 8)."""

from __future__ import annotations

from tunefleet.db.engine import connect
from tunefleet.settings import DatabaseSettings


def test_sessions_carry_statement_and_idle_timeouts(db_url: str) -> None:
    settings = DatabaseSettings(
        url=db_url,
        statement_timeout_ms=1234,
        idle_in_transaction_timeout_ms=5678,
        application_name="tf-test",
    )
    with connect(db_url, settings) as conn:
        row = conn.execute(
            "SELECT current_setting('statement_timeout') AS st,"
            " current_setting('idle_in_transaction_session_timeout') AS idle,"
            " current_setting('application_name') AS app"
        ).fetchone()
    assert row == {"st": "1234ms", "idle": "5678ms", "app": "tf-test"}
