"""Owns the ``grid`` search technique: OpenTuner's interface over :func:`.grid.plan`.

It proposes every configuration of the box once, in the plan's order, skipping what the
search already asked for or was told (earlier sessions' outcomes on a resume, seeds, cache
answers); once the plan is spent it proposes nothing, and the run ends ``space_exhausted``
when the last outcome arrives. The box comes from OpenTuner's own parameters (one per leaf of
the space, :mod:`.mapping`), so the technique needs nothing but the search it is part of.

OpenTuner keeps one instance per registered name for the whole process: the walk is kept per
search (per driver), so two searches in one process never share a position.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from opentuner.search.manipulator import (
    BooleanParameter,
    EnumParameter,
    IntegerParameter,
    PowerOfTwoParameter,
)
from opentuner.search.technique import SearchTechnique, register

from .grid import GRID, Axis, plan


def tuner_axes(manipulator: Any) -> list[Axis]:
    """The box of OpenTuner's parameters, in their order."""
    axes = []
    for param in manipulator.params:
        name = param.name
        if isinstance(param, PowerOfTwoParameter):
            low, high = param.min_value.bit_length() - 1, param.max_value.bit_length() - 1
            axes.append(Axis(name, tuple(2**e for e in range(low, high + 1)), True))
        elif isinstance(param, IntegerParameter):
            axes.append(Axis(name, tuple(range(param.min_value, param.max_value + 1)), True))
        elif isinstance(param, BooleanParameter):
            axes.append(Axis(name, (False, True), False))
        elif isinstance(param, EnumParameter):
            axes.append(Axis(name, tuple(param.options), False))
        else:
            raise TypeError(f"the grid cannot enumerate OpenTuner parameter {param!r}")
    return axes


class GridSearch(SearchTechnique):  # type: ignore[misc]
    """Every configuration once, in :func:`.grid.plan`'s order."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._walks: weakref.WeakKeyDictionary[Any, Iterator[dict[str, Any]]]
        self._walks = weakref.WeakKeyDictionary()

    def desired_configuration(self) -> Any:
        driver = self.driver
        walk = self._walks.get(driver)
        if walk is None:
            walk = self._walks[driver] = self._walk()
        for cfg in walk:
            key = self.manipulator.hash_config(cfg)
            if key not in driver.measured and key not in driver.first_request:
                return cfg
        return None  # the whole box was asked for

    def _walk(self) -> Iterator[dict[str, Any]]:
        axes = tuner_axes(self.manipulator)
        for point in plan(axes):
            yield {a.name: a.values[i] for a, i in zip(axes, point, strict=True)}


register(GridSearch(name=GRID))
