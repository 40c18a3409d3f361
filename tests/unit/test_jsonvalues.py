"""The one JSON normaliser and its three policies: what each does to the same values, and
where they differ on purpose (the space hashes exactly, the worker never refuses a value, the
CLI prints database rows)."""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any
from uuid import UUID

import numpy as np
import pytest

from tunefleet import jsonvalues
from tunefleet.space import Choice, canonical_json, config_hash
from tunefleet.text.output import jsonable

UID = UUID("12345678-1234-5678-1234-567812345678")
WHEN = datetime(2025, 3, 1, 12, 30, tzinfo=UTC)


@pytest.mark.parametrize("policy", [jsonvalues.exact, jsonvalues.storable, jsonvalues.readable])
def test_every_policy_walks_containers_alike(policy: Any) -> None:
    """Mappings (any kind) become dicts with string keys, tuples lists, at every depth."""
    value = {1: (1, [2, (3,)]), "m": MappingProxyType({"k": (True, None, "s", 1.5)})}
    assert policy(value) == {"1": [1, [2, [3]]], "m": {"k": [True, None, "s", 1.5]}}


def test_exact_only_unwraps_numpy_scalars_and_leaves_the_rest_to_canonical_json() -> None:
    got = jsonvalues.exact({"tile": np.int64(16), "f": np.float32(0.5), "b": np.bool_(True)})
    assert got == {"tile": 16, "f": 0.5, "b": True}
    assert type(got["tile"]) is int and type(got["b"]) is bool
    # NaN stays NaN and an object stays itself: hashing them fails instead of colliding with
    # null or with a string.
    assert math.isnan(jsonvalues.exact(float("nan")))
    with pytest.raises(ValueError):
        config_hash({"x": float("nan")})
    thing = object()
    assert jsonvalues.exact(thing) is thing
    with pytest.raises(TypeError):
        canonical_json(jsonvalues.exact({"x": thing}))
    # An array of several values is no configuration value.
    with pytest.raises(ValueError):
        jsonvalues.exact(np.array([1, 2]))


def test_the_space_hashes_and_checks_through_exact() -> None:
    assert config_hash({"t": (np.int64(1), 2)}) == config_hash({"t": [1, 2]})
    choice = Choice("t", ((1, 2), (3, 4)))
    assert choice.options == ([1, 2], [3, 4])
    assert choice.contains((np.int32(3), 4)) and not choice.contains(object())


def test_storable_never_refuses_a_value() -> None:
    value = {
        "samples": np.array([0.5, np.inf, 1.0], dtype=np.float32),
        "shape": (np.int64(4), 5),
        "nan": float("nan"),
        "numpy_nan": np.float64("nan"),
        "when": WHEN,
        "uid": UID,
        "cost": Decimal("1.5"),
        "set": {1},
    }
    got = jsonvalues.storable(value)
    assert got == {
        "samples": [0.5, None, 1.0],
        "shape": [4, 5],
        "nan": None,
        "numpy_nan": None,
        "when": str(WHEN),
        "uid": str(UID),
        "cost": "1.5",
        "set": "{1}",
    }
    json.dumps(got, allow_nan=False)  # always valid JSON


def test_readable_turns_database_values_into_json_and_leaves_others_alone() -> None:
    row = {
        "started_at": WHEN,
        "day": date(2025, 3, 1),
        "took": timedelta(minutes=1, seconds=30),
        "worker_id": UID,
        "gflops": Decimal("2.25"),
        "nan": float("nan"),
        "numeric_nan": Decimal("NaN"),
        "inf": float("-inf"),
        "n": 3,
    }
    assert jsonvalues.readable(row) == {
        "started_at": "2025-03-01T12:30:00+00:00",
        "day": "2025-03-01",
        "took": 90.0,
        "worker_id": str(UID),
        "gflops": 2.25,
        "nan": None,
        "numeric_nan": None,
        "inf": None,
        "n": 3,
    }
    thing = object()
    assert jsonvalues.readable(thing) is thing  # json.dumps says what it is


def test_the_cli_prints_rows_through_readable() -> None:
    assert jsonable is jsonvalues.readable


@pytest.mark.parametrize(
    ("value", "exact", "storable", "readable"),
    [
        # The differences on purpose, side by side.
        (np.float64(0.25), 0.25, 0.25, np.float64(0.25)),
        (float("inf"), math.inf, None, None),
        (WHEN, WHEN, str(WHEN), WHEN.isoformat()),
        (Decimal("3"), Decimal("3"), "3", 3.0),
        (UID, UID, str(UID), str(UID)),
    ],
)
def test_where_the_policies_differ(value: Any, exact: Any, storable: Any, readable: Any) -> None:
    assert jsonvalues.exact(value) == exact
    assert jsonvalues.storable(value) == storable
    assert jsonvalues.readable(value) == readable
