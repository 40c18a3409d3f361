"""The test database fixture yields a database at head with every table and view."""

from __future__ import annotations

from tunefleet.db.resolve import check_at_head
from tunefleet.db.schema import VIEWS, metadata


def test_fresh_database_is_at_head_with_all_tables_and_views(db):
    check_at_head(db)
    rows = db.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'tunefleet'"
    ).fetchall()
    names = {r["table_name"] for r in rows}
    assert {t.name for t in metadata.sorted_tables} <= names
    assert set(VIEWS) <= names
