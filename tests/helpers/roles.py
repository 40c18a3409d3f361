"""The four tunefleet roles for one test: names, settings, a connection as each, and their
removal (the ``roles`` fixture is in tests/integration/conftest.py). Roles are
cluster-global, so each test uses its own prefix. Role sessions connect over the test
server's private socket (trust authentication)."""

from __future__ import annotations

import itertools
import os
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from tunefleet.db.roles import ROLE_NAMES, RolesSettings
from tunefleet.queries import roles as q

_counter = itertools.count()


def unique_prefix() -> str:
    return f"tft{os.getpid()}x{next(_counter)}_"


def drop_roles(admin_url: str, prefix: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for name in ROLE_NAMES:
            q.drop_owned_and_role(conn, prefix + name)


class Roles:
    """The roles of one test: names, settings and a way to connect as each."""

    def __init__(self, db_url: str, settings: RolesSettings) -> None:
        self.db_url = db_url
        self.settings = settings

    def name(self, role: str) -> str:
        return self.settings.role(role)

    def url(self, role: str) -> str:
        return make_conninfo(self.db_url, user=self.name(role))

    def connect(self, role: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.url(role),
            autocommit=True,
            row_factory=dict_row,  # type: ignore[arg-type]
        )
