"""The grid's plan and automatic choice (pure), and the ``grid`` technique in the search."""

from __future__ import annotations

import itertools

import pytest

from tunefleet.coordinator import grid
from tunefleet.coordinator.tuner import Tuner, check_techniques
from tunefleet.errors import UsageError
from tunefleet.space import Bool, Choice, IntRange, PowerOfTwo, Space, TupleOf, config_hash

SPACE = Space.of(
    [
        IntRange("x", 0, 9),
        PowerOfTwo("p", 1, 64),
        Bool("flag"),
        Choice("mode", ("a", "b", "c")),
    ]
)


def hashes(configs):
    return [config_hash(c) for c in configs]


@pytest.mark.parametrize("order", grid.ORDERS)
def test_every_order_visits_the_whole_box_exactly_once(order):
    plan = hashes(grid.configurations(SPACE, order))
    names = SPACE.names()
    box = [
        dict(zip(names, c, strict=True)) for c in itertools.product(*(p.values() for p in SPACE))
    ]
    assert len(plan) == len(set(plan)) == SPACE.size() == 420
    assert set(plan) == set(hashes(box))


def test_the_plan_depends_on_the_box_alone_so_a_restart_walks_it_again():
    first = hashes(grid.configurations(SPACE))
    assert first == hashes(grid.configurations(Space.from_json(SPACE.to_json())))


def test_the_rings_start_at_the_centre_and_the_interleaved_order_alternates():
    rings = list(grid.configurations(SPACE, "rings"))
    centre = [c for c in rings[:6]]
    # The middle of x (0..9) is 4.5, of p (1..64, seven values) 8: the first ring is there,
    # with every switch and mode (unordered: no centre).
    assert {c["x"] for c in centre} <= {4, 5} and {c["p"] for c in centre} == {8}
    shuffled = hashes(grid.configurations(SPACE, "shuffled"))
    interleaved = hashes(grid.configurations(SPACE))
    assert interleaved[0] == config_hash(rings[0]) and interleaved[1] == shuffled[0]
    # Far from the centre, the interleaved order reaches a corner long before the rings do.
    corner = config_hash({"x": 0, "p": 1, "flag": False, "mode": "a"})
    assert interleaved.index(corner) < hashes(rings).index(corner)


def test_a_box_too_big_to_enumerate_is_refused_naming_its_size():
    big = Space.of([IntRange(f"v{i}", 0, 99) for i in range(3)])
    with pytest.raises(UsageError, match=r"has 1,000,000 configurations, more than the grid"):
        next(grid.configurations(big))


def test_the_grid_is_chosen_when_the_valid_configurations_fit_the_budget():
    def allowed(c):
        return c["x"] < 5  # half the box is invalid: 210 valid

    assert grid.automatic_choice(SPACE, None, allowed) is None  # no trial budget
    assert "all 420 configurations" in (grid.automatic_choice(SPACE, 420, None) or "")
    said = grid.automatic_choice(SPACE, 300, allowed)
    assert said == (
        "search: grid (the 210 valid configurations of the space's 420 fit --max-trials 300; "
        "each is measured once)"
    )
    assert grid.automatic_choice(SPACE, 209, allowed) is None
    assert grid.automatic_choice(SPACE, 300, None) is None  # validity unknown: search
    # Counting costs a rule check per point: not for a box far beyond the budget.
    assert grid.automatic_choice(SPACE, 20, lambda c: False) is None


def test_the_technique_asks_for_every_configuration_once_then_nothing():
    space = Space.of([*SPACE.params, TupleOf("t", (IntRange("a", 1, 2), Bool("b")))])
    assert check_techniques(["grid"]) == ("grid",)
    tuner = Tuner(space, ["grid"], seed=0)
    seen: list[str] = []
    while batch := tuner.ask(37):
        seen += [s.config_hash for s in batch]
        tuner.tell_many([(s, None if s.config["x"] == 3 else 1.0) for s in batch])
    assert len(seen) == len(set(seen)) == space.size() == 1680
    tuner.close()


def test_a_resumed_grid_skips_what_it_learned_and_keeps_the_order():
    whole = Tuner(SPACE, ["grid"])
    order = [s.config for s in whole.ask(SPACE.size())]
    whole.close()
    # A restart after 100 outcomes: the rest of the same walk, nothing asked twice.
    resumed = Tuner(SPACE, ["grid"])
    resumed.learn([(c, 1.0) for c in order[:100]])
    rest = [s.config for s in resumed.ask(SPACE.size())]
    resumed.close()
    assert hashes(rest) == hashes(order[100:])
