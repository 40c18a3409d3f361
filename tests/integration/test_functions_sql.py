"""``src/tunefleet/db/functions.sql`` is the current definition of every function the
migrations install, as ``schema.py`` is of every table (tests/integration/test_migrations.py).

PostgreSQL is the judge: on a database migrated to head, inside a transaction that is rolled
back, the schema's functions are dropped and the file is run; each function's
``pg_get_functiondef`` (arguments, result, language, volatility, security, settings, the body
byte for byte), signature and privileges must then be what the migrations made. Comparing the
server's own rendering keeps the file free to lay headers out for reading, and holds it to
the body exactly.
"""

from __future__ import annotations

import difflib
import re
from importlib import resources
from typing import Any

import psycopg
import pytest

from tunefleet.db.engine import connect
from tunefleet.db.schema import SCHEMA

#: Every function of the schema: the server's rendering of its definition, and its privileges.
_DEFINITIONS = """
SELECT p.oid::regprocedure::text AS signature,
       pg_get_functiondef(p.oid) AS definition,
       coalesce(p.proacl::text, '') AS privileges
  FROM pg_proc p
 WHERE p.pronamespace = %s::regnamespace
"""

# Drops every function of the schema (each named by its regprocedure, which quotes itself).
_DROP_ALL = """
DO $drop$
DECLARE
  f regprocedure;
BEGIN
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
            WHERE p.pronamespace = 'tunefleet'::regnamespace LOOP
    EXECUTE format('DROP FUNCTION %s', f);
  END LOOP;
END
$drop$
"""


def functions_sql() -> str:
    """The file as the installed package ships it."""
    return (resources.files("tunefleet.db") / "functions.sql").read_text(encoding="utf-8")


def _definitions(conn: psycopg.Connection[Any]) -> dict[str, tuple[str, str]]:
    rows = conn.execute(_DEFINITIONS, (SCHEMA,)).fetchall()
    return {r["signature"]: (r["definition"], r["privileges"]) for r in rows}


def drift(url: str, text: str) -> dict[str, str]:
    """What differs between the migrated functions and those ``text`` defines, by signature:
    ``missing`` (the migrations have it, ``text`` does not), ``extra``, or ``differs`` and, on
    the lines after it, a diff from the migrated definition and privileges to ``text``'s."""
    with connect(url, autocommit=False) as conn:
        try:
            migrated = _definitions(conn)
            conn.execute(_DROP_ALL)
            conn.execute(text)  # no parameters: the file's statements go as one simple query
            written = _definitions(conn)
        finally:
            conn.rollback()
    out = {}
    for signature in sorted(migrated.keys() | written.keys()):
        if signature not in written:
            out[signature] = "missing"
        elif signature not in migrated:
            out[signature] = "extra"
        elif migrated[signature] != written[signature]:
            diff = difflib.unified_diff(
                "\n".join(migrated[signature]).splitlines(),
                "\n".join(written[signature]).splitlines(),
                "migrations",
                "functions.sql",
                lineterm="",
            )
            out[signature] = "\n".join(["differs", *diff])
    return out


def _verdicts(found: dict[str, str]) -> dict[str, str]:
    return {signature: what.split("\n")[0] for signature, what in found.items()}


def _one_function(text: str, name: str) -> tuple[int, int]:
    """Where the block of function ``name`` (its comment, CREATE and REVOKE) starts and ends."""
    start = text.index(f"-- {name} (as of ")
    end = text.index(" FROM PUBLIC;\n", text.index(f"FUNCTION {SCHEMA}.{name}(", start))
    return start, end + len(" FROM PUBLIC;\n")


def test_functions_sql_is_what_the_migrations_installed(db_url: str) -> None:
    found = drift(db_url, functions_sql())
    assert not found, "src/tunefleet/db/functions.sql and the migrations disagree:\n" + "\n".join(
        f"{signature}: {what}" for signature, what in found.items()
    )


def test_each_function_is_written_once(db_url: str) -> None:
    """A second, stale copy further up would pass the comparison (the last one wins) and
    mislead a reader."""
    with connect(db_url) as conn:
        migrated = {s.split("(")[0].removeprefix(f"{SCHEMA}.") for s in _definitions(conn)}
    created = re.findall(rf"^CREATE OR REPLACE FUNCTION {SCHEMA}\.(\w+)\(", functions_sql(), re.M)
    assert sorted(created) == sorted(migrated)


def test_a_drifted_body_is_caught(db_url: str) -> None:
    """The comparison can fail: one changed character of one body is a difference."""
    text = functions_sql()
    start, end = _one_function(text, "heartbeat_trials")
    block = text[start:end]
    assert "ORDER BY t.id" in block
    drifted = text[:start] + block.replace("ORDER BY t.id", "ORDER BY t.id DESC") + text[end:]
    assert _verdicts(drift(db_url, drifted)) == {
        f"{SCHEMA}.heartbeat_trials(uuid,bigint[],integer[],text[],double precision)": "differs"
    }


@pytest.mark.parametrize(
    ("change", "verdict"),
    [
        ("drop", "missing"),
        ("no_revoke", "differs"),
        ("not_definer", "differs"),
    ],
)
def test_a_missing_function_and_a_changed_header_are_caught(
    db_url: str, change: str, verdict: str
) -> None:
    text = functions_sql()
    start, end = _one_function(text, "stop_worker")
    block = text[start:end]
    if change == "drop":
        block = ""
    elif change == "no_revoke":
        block = block[: block.index("REVOKE ALL")]
    else:
        block = block.replace("SECURITY DEFINER", "SECURITY INVOKER")
    assert _verdicts(drift(db_url, text[:start] + block + text[end:])) == {
        f"{SCHEMA}.stop_worker(uuid,text)": verdict
    }
