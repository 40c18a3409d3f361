"""Python values made JSON values: one walk, and the three policies its callers need.

:func:`walk` turns every mapping into a dict with string keys and every list or tuple into a
list, at any depth, and hands each remaining value (a *leaf*) to a policy. The policies differ
on purpose, each for what happens to the JSON afterwards:

``exact``     the parameter space (:mod:`tunefleet.space`) hashes configurations and checks
              membership on their canonical JSON. A numpy scalar becomes its Python number;
              nothing else changes, so ``canonical_json`` refuses what JSON cannot hold
              exactly (NaN, an arbitrary object): a configuration is hashed exactly or not at
              all, never as a look-alike (NaN as ``null``, an object as its text).
``storable``  the worker stores what a problem reports (protocol, validation, versions) as
              JSONB. Numpy arrays and scalars become lists and numbers, non-finite floats
              ``None`` (JSON has no NaN) and anything else its ``str``: a measurement is never
              lost to an odd value in its validation dict.
``readable``  the CLI's ``--json`` and the dashboard print database rows. Datetimes become ISO
              text, intervals seconds, UUIDs text, decimals floats, non-finite numbers
              ``None``; other values are left as they are (psycopg hands back nothing else).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

Leaf = Callable[[Any], Any]


def walk(value: Any, leaf: Leaf) -> Any:
    """``value`` with mappings as dicts (keys as strings), lists and tuples as lists, and every
    other value replaced by ``leaf(value)``."""
    if isinstance(value, Mapping):
        return {str(k): walk(v, leaf) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [walk(v, leaf) for v in value]
    return leaf(value)


def exact(value: Any) -> Any:
    """A configuration (or one of its values) as JSON for hashing: numpy scalars as Python
    numbers, nothing else changed (see the module docstring)."""
    return walk(value, _exact_leaf)


def storable(value: Any) -> Any:
    """What a problem reports, made storable as JSONB: never refuses a value."""
    return walk(value, _storable_leaf)


def readable(value: Any) -> Any:
    """Rows from the database as JSON-friendly values."""
    return walk(value, _readable_leaf)


def _exact_leaf(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    return value


def _storable_leaf(value: Any) -> Any:
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays and scalars
        return storable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _readable_leaf(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Decimal):
        value = float(value)  # then checked like any float: numeric 'NaN' is no JSON either
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
