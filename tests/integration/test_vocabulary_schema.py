"""Each enum of the vocabulary is exactly what a migrated database's CHECK constraint allows,
and a column's server default is the member the code expects.

The schema module generates its CHECK constraints from the enums; the database has whatever
the migrations wrote (history, never rewritten). Alembic's comparison does not look at CHECK
constraints, so this is what keeps a new member from reaching the code without a migration
(or a migration's new state from being unknown to the code).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

import psycopg
import pytest

from tunefleet.db.schema import metadata
from tunefleet.vocabulary import (
    AttemptOutcome,
    MeasurementSource,
    RunState,
    TrialPurpose,
    TrialSource,
    TrialState,
    WorkerState,
)

CONSTRAINTS = [
    ("attempt", "attempt_outcome_valid", AttemptOutcome),
    ("trial", "trial_state_valid", TrialState),
    ("run", "run_state_valid", RunState),
    ("worker", "worker_state_valid", WorkerState),
    ("trial", "trial_purpose_valid", TrialPurpose),
    ("trial", "trial_source_valid", TrialSource),
    ("measurement", "measurement_source_valid", MeasurementSource),
]

#: (table, column, the member a row gets when an INSERT leaves the column out).
DEFAULTS = [
    ("trial", "state", TrialState.PENDING),
    ("run", "state", RunState.RUNNING),
    ("worker", "state", WorkerState.ACTIVE),
    ("trial", "purpose", TrialPurpose.SEARCH),
    ("trial", "source", TrialSource.SEARCH),
    ("measurement", "source", MeasurementSource.MEASURED),
]


def _allowed(definition: str) -> set[str]:
    """The quoted values of a ``CHECK (state IN (...))`` or ``= ANY (ARRAY[...])`` text
    (``outcome IS NULL OR ...`` quotes only the values)."""
    return set(re.findall(r"'([a-z_]+)'", definition))


@pytest.mark.parametrize(("table", "name", "enum"), CONSTRAINTS)
def test_the_database_allows_exactly_the_enum(
    db: psycopg.Connection[Any], table: str, name: str, enum: type[StrEnum]
) -> None:
    row = db.execute(
        "SELECT pg_get_constraintdef(c.oid) AS def FROM pg_constraint c"
        " JOIN pg_class t ON t.oid = c.conrelid"
        " JOIN pg_namespace n ON n.oid = t.relnamespace"
        " WHERE n.nspname = 'tunefleet' AND t.relname = %s AND c.conname = %s",
        (table, name),
    ).fetchone()
    assert row is not None, f"{table}.{name} is missing"
    assert _allowed(row["def"]) == {str(v) for v in enum}


@pytest.mark.parametrize(("table", "name", "enum"), CONSTRAINTS)
def test_the_schema_module_generates_its_check_from_the_enum(
    table: str, name: str, enum: type[StrEnum]
) -> None:
    (check,) = [c for c in metadata.tables[f"tunefleet.{table}"].constraints if c.name == name]
    assert _allowed(str(check.sqltext)) == {str(v) for v in enum}


@pytest.mark.parametrize(("table", "column", "member"), DEFAULTS)
def test_the_database_defaults_to_the_member(
    db: psycopg.Connection[Any], table: str, column: str, member: StrEnum
) -> None:
    row = db.execute(
        "SELECT column_default AS def FROM information_schema.columns"
        " WHERE table_schema = 'tunefleet' AND table_name = %s AND column_name = %s",
        (table, column),
    ).fetchone()
    assert row is not None, f"{table}.{column} is missing"
    assert _allowed(row["def"]) == {str(member)}


@pytest.mark.parametrize(("table", "column", "member"), DEFAULTS)
def test_the_schema_module_defaults_to_the_member(table: str, column: str, member: StrEnum) -> None:
    default = metadata.tables[f"tunefleet.{table}"].c[column].server_default
    assert default is not None
    assert _allowed(str(default.arg)) == {str(member)}
