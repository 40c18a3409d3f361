"""Fixtures of the integration tests beyond the database ones in tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.roles import Roles, drop_roles, unique_prefix
from tunefleet.db.roles import RolesSettings, setup_roles


@pytest.fixture
def roles(db_url: str, tmp_path: Path) -> Iterator[Roles]:
    settings = RolesSettings(prefix=unique_prefix(), pgpass=tmp_path / "roles.pgpass")
    setup_roles(db_url, settings)
    try:
        yield Roles(db_url, settings)
    finally:
        drop_roles(db_url, settings.prefix)
