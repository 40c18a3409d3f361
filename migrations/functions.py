"""How a migration installs the database functions untrusted roles call.

A worker writes only through functions (SECURITY DEFINER: they run with the rights of their
owner, the migrator, who owns the tables). Every such function is created the same way, by
:func:`create`: a fixed ``search_path = pg_catalog, pg_temp`` (internal helpers inherit it
from the definer function that calls them) (so no object a caller creates
can stand in for one the body names; every name of ours in the body is written
``tunefleet.<name>``), and ``EXECUTE`` taken from ``PUBLIC`` at once (``tunefleet db roles``
grants it to the roles that may call it, from ``tunefleet.db.roles.WORKER_FUNCTIONS``).

Migrations are frozen history: each revision passes its own copy of the function bodies, and
what :func:`create` emits must never change (write a new helper instead). The current body of
every function, whichever revision last defined it, is in ``src/tunefleet/db/functions.sql``:
a revision that changes a function changes it there too (that file's header says how), and
``tests/integration/test_functions_sql.py`` holds the two together. Revisions never read it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from alembic import op

SCHEMA = "tunefleet"


@dataclass(frozen=True)
class Function:
    """One function of the ``tunefleet`` schema.

    ``args`` is the argument list as written in ``CREATE FUNCTION`` (names and types),
    ``returns`` the text after ``RETURNS``, ``body`` the code between the dollar quotes.
    ``definer=False`` makes an internal helper (name starting with ``_``) that runs with its
    caller's rights and search_path: it is only ever called from the definer functions, so it
    runs as the owner, under their fixed path, there; nobody else may execute it. It gets no
    SET clause of its own, because each SET clause costs a settings save and restore per
    call (PostgreSQL before 17), and a plain SQL helper can then be inlined.
    """

    name: str
    args: str
    returns: str
    body: str
    language: str = "plpgsql"
    volatility: str = "VOLATILE"
    definer: bool = True

    @property
    def qualified(self) -> str:
        return f"{SCHEMA}.{self.name}({self.args})"


def create(functions: Iterable[Function]) -> None:
    for fn in functions:
        if fn.definer == fn.name.startswith("_"):
            raise ValueError(f"{fn.name}: only internal helpers (named _...) are not definers")
        security = "SECURITY DEFINER" if fn.definer else "SECURITY INVOKER"
        pinned = "SET search_path = pg_catalog, pg_temp\n" if fn.definer else ""
        op.execute(
            f"CREATE OR REPLACE FUNCTION {fn.qualified} RETURNS {fn.returns}\n"
            f"LANGUAGE {fn.language} {fn.volatility} {security}\n"
            f"{pinned}AS $fn$\n{fn.body}\n$fn$"
        )
        op.execute(f"REVOKE ALL ON FUNCTION {fn.qualified} FROM PUBLIC")


def drop(functions: Iterable[Function]) -> None:
    for fn in reversed(list(functions)):
        op.execute(f"DROP FUNCTION IF EXISTS {fn.qualified}")
