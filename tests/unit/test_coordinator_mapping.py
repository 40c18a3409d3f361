"""The space <-> OpenTuner mapping is exact in both directions for every parameter kind."""

from __future__ import annotations

import itertools
import random

import pytest

from tunefleet.coordinator.mapping import PLACEHOLDER, SpaceMapping
from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.space import Bool, Choice, IntRange, PowerOfTwo, Space, TupleOf

EVERY_KIND = Space.of(
    [
        IntRange("unit_step", -3, 4),
        IntRange("stepped", 8, 40, 8),
        PowerOfTwo("pow2", 2, 64),
        Bool("flag"),
        Choice("ordered", (1, 2, 4, 8)),  # sorted numbers: an ordered index
        Choice("names", ("ijk", "ikj", "jki")),  # unordered: an enum of indices
        Choice("lists", ([1, 2], [2, 1], "none")),  # JSON values OpenTuner cannot hash
        TupleOf("wg", (PowerOfTwo("x", 1, 4), IntRange("y", 1, 3), Bool("z"))),
        TupleOf("nested", (TupleOf("inner", (IntRange("a", 0, 1), Choice("b", (2.5, 3.5)))),)),
        IntRange("fixed", 7, 7),  # single-valued: a constant
        Choice("one", ("only",)),
    ]
)


def every_config(space: Space):
    params = list(space)
    for combo in itertools.product(*(p.values() for p in params)):
        yield {p.name: v for p, v in zip(params, combo, strict=True)}


def test_configurations_round_trip_exactly():
    mapping = SpaceMapping(EVERY_KIND)
    rng = random.Random(1)
    for _ in range(3000):
        config = {p.name: rng.choice(p.values()) for p in EVERY_KIND}
        assert mapping.from_tuner(mapping.to_tuner(config)) == config
    small = Space.of([p for p in EVERY_KIND if p.name not in ("nested", "wg", "lists")])
    small_mapping = SpaceMapping(small)
    decoded = set()
    for config in every_config(small):
        data = small_mapping.to_tuner(config)
        assert small_mapping.from_tuner(data) == config
        decoded.add(tuple(sorted(data.items())))
    assert len(decoded) == small.size()  # distinct configurations stay distinct


def test_opentuner_parameters_cover_the_space_and_decode_inside_it():
    mapping = SpaceMapping(EVERY_KIND)
    manipulator = mapping.manipulator()
    names = {p.name for p in manipulator.params}
    assert names == {
        "unit_step",
        "stepped",
        "pow2",
        "flag",
        "ordered",
        "names",
        "lists",
        "wg[0]",
        "wg[1]",
        "wg[2]",
        "nested[0][0]",
        "nested[0][1]",
    }
    kinds = {p.name: type(p).__name__ for p in manipulator.params}
    assert kinds["unit_step"] == kinds["stepped"] == kinds["ordered"] == "IntegerParameter"
    assert kinds["pow2"] == "PowerOfTwoParameter" and kinds["names"] == "EnumParameter"
    assert kinds["flag"] == "BooleanParameter"
    seen = set()
    for _ in range(500):
        config = mapping.from_tuner(manipulator.random())
        assert EVERY_KIND.check(config) == config
        assert config["fixed"] == 7 and config["one"] == "only"
        seen.add(config["lists"] if isinstance(config["lists"], str) else tuple(config["lists"]))
    assert seen == {(1, 2), (2, 1), "none"}
    # The manipulator's own search-space size is the space's size (constants count once).
    assert manipulator.search_space_size() == EVERY_KIND.size()


def test_an_all_constant_space_gets_a_placeholder_that_maps_to_nothing():
    space = Space.of([IntRange("n", 3, 3), Choice("c", ("x",))])
    mapping = SpaceMapping(space)
    manipulator = mapping.manipulator()
    assert [p.name for p in manipulator.params] == [PLACEHOLDER]
    assert mapping.from_tuner(manipulator.random()) == {"n": 3, "c": "x"}
    assert mapping.to_tuner({"n": 3, "c": "x"}) == {PLACEHOLDER: 0}


def test_configurations_outside_the_space_are_refused_both_ways():
    mapping = SpaceMapping(EVERY_KIND)
    good = next(every_config(EVERY_KIND))
    with pytest.raises(InvalidConfiguration, match="stepped=9 is outside the space"):
        mapping.to_tuner({**good, "stepped": 9})
    data = mapping.to_tuner(good)
    with pytest.raises(InvalidConfiguration, match="index 7 for names"):
        mapping.from_tuner({**data, "names": 7})
    with pytest.raises(InvalidConfiguration, match="pow2=3"):
        mapping.from_tuner({**data, "pow2": 3})


def test_flattened_names_that_clash_are_refused():
    space = Space.of([TupleOf("wg", (IntRange("a", 0, 1),)), IntRange("wg[0]", 0, 1)])
    with pytest.raises(ProblemError, match=r"clash .*rename"):
        SpaceMapping(space)
