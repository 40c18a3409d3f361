"""The parameter-space DSL: JSON round trips, stable hashes, membership, malformed input."""

from __future__ import annotations

import json
import random

import pytest

from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.space import (
    Bool,
    Choice,
    IntRange,
    PowerOfTwo,
    Space,
    TupleOf,
    config_hash,
    param_from_json,
    require,
)

SPACE = Space.of(
    [
        IntRange("unroll", 1, 9, 2),
        PowerOfTwo("tile", 4, 64),
        Bool("prefetch"),
        Choice("order", ("ij", "ji", [1, 2])),
        TupleOf("wg", (PowerOfTwo("x", 1, 32), IntRange("y", 1, 3))),
    ]
)


def test_space_round_trips_through_json_text():
    text = json.dumps(SPACE.to_json())
    again = Space.loads(text)
    assert again == SPACE
    assert again.to_json() == SPACE.to_json()
    assert Space.from_json(SPACE.to_json()["params"]) == SPACE  # a bare list works too
    assert again.dumps() == SPACE.dumps()


def test_values_sizes_and_defaults():
    assert SPACE.param("unroll").values() == [1, 3, 5, 7, 9]
    assert SPACE.param("tile").values() == [4, 8, 16, 32, 64]
    assert SPACE.size() == 5 * 5 * 2 * 3 * (6 * 3)
    assert SPACE.default() == {
        "unroll": 1,
        "tile": 4,
        "prefetch": False,
        "order": "ij",
        "wg": [1, 1],
    }
    assert SPACE.names() == ["unroll", "tile", "prefetch", "order", "wg"]


def test_config_hash_is_stable_and_order_independent():
    config = {"tile": 16, "unroll": 3, "prefetch": True, "order": "ji", "wg": (8, 2)}
    reordered = {"wg": [8, 2], "order": "ji", "prefetch": True, "unroll": 3, "tile": 16}
    assert config_hash(config) == config_hash(reordered)
    # A golden value (sha256 of the canonical JSON, computed outside Python): hashes are
    # stored in the database and must never drift.
    canonical = '{"order":"ji","prefetch":true,"tile":16,"unroll":3,"wg":[8,2]}'
    assert canonical  # printf '%s' "$canonical" | sha256sum | cut -c1-32
    assert config_hash(config) == "a0dc638fb8fb5679fd0634362e03ef3d"
    assert config_hash({"a": 1}) != config_hash({"a": True})
    assert config_hash({"a": 1}) != config_hash({"a": 1.0})


def test_membership_is_exact():
    assert SPACE.param("unroll").contains(5)
    assert not SPACE.param("unroll").contains(4)  # off the step
    assert not SPACE.param("unroll").contains(True)
    assert not SPACE.param("tile").contains(12)
    assert not SPACE.param("prefetch").contains(1)
    order = SPACE.param("order")
    assert order.contains([1, 2]) and order.contains((1, 2))
    assert not order.contains("IJ")
    assert not Choice("c", (1, 2)).contains(True)
    assert not Choice("c", (1, 2)).contains(1.0)
    wg = SPACE.param("wg")
    assert wg.contains((8, 3)) and not wg.contains((8, 4)) and not wg.contains((8,))


def test_check_normalises_and_rejects_with_the_parameter_named():
    good = {"unroll": 3, "tile": 8, "prefetch": True, "order": "ji", "wg": (2, 1)}
    assert SPACE.check(good)["wg"] == [2, 1]
    with pytest.raises(InvalidConfiguration, match="tile=12 is outside"):
        SPACE.check({**good, "tile": 12})
    with pytest.raises(InvalidConfiguration, match=r"missing \['wg'\]"):
        SPACE.check({k: v for k, v in good.items() if k != "wg"})
    with pytest.raises(InvalidConfiguration, match=r"unknown \['extra'\]"):
        SPACE.check({**good, "extra": 1})
    with pytest.raises(InvalidConfiguration, match="object of parameter values"):
        SPACE.check([1, 2])  # type: ignore[arg-type]


def test_samples_are_members_and_reproducible():
    a = [SPACE.sample(random.Random(7)) for _ in range(3)]
    b = [SPACE.sample(random.Random(7)) for _ in range(3)]
    assert a == b
    rng = random.Random(1)
    for _ in range(50):
        SPACE.check(SPACE.sample(rng))


def test_require_raises_invalid_configuration_with_the_message():
    require(True, "never")
    with pytest.raises(InvalidConfiguration, match="tile must divide n"):
        require(False, "tile must divide n")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ('{"params": 3}', "expected"),
        ('{"version": 99, "params": []}', "version 99"),
        ('{"params": [{"kind": "spline", "name": "x"}]}', "unknown parameter kind 'spline'"),
        ('{"params": [{"kind": "int", "low": 1, "high": 2}]}', "'name' must be a string"),
        ('{"params": [{"kind": "int", "name": "x", "low": 1.5, "high": 2}]}', "'low' must be"),
        ('{"params": [{"kind": "int", "name": "x", "low": 3, "high": 2}]}', "empty integer"),
        ('{"params": [{"kind": "pow2", "name": "x", "low": 3, "high": 8}]}', "not a power"),
        ('{"params": [{"kind": "choice", "name": "x", "options": []}]}', "at least one"),
        ('{"params": [{"kind": "choice", "name": "x", "options": "ab"}]}', "must be a list"),
        ('{"params": [{"kind": "tuple", "name": "x", "items": []}]}', "at least one item"),
        ('{"params": ["x"]}', "expected an object"),
        ('{"params": [{"kind": "bool", "name": "x"}, {"kind": "bool", "name": "x"}]}', "dupl"),
    ],
)
def test_malformed_space_json_is_a_problem_error(text, match):
    with pytest.raises(ProblemError, match=match):
        Space.loads(text)


def test_param_from_json_rebuilds_each_kind():
    for param in SPACE.params:
        assert param_from_json(param.to_json()) == param
