"""Owns the exact translation between a :class:`tunefleet.space.Space` and OpenTuner's
parameters, in both directions.

Every leaf of the space becomes one OpenTuner parameter; tuples are flattened into leaves
named ``name[i]`` (recursively ``name[i][j]``) and rebuilt as lists on the way back.

=====================================  ==============================================
tunefleet parameter                    OpenTuner parameter (value it carries)
=====================================  ==============================================
``IntRange`` step 1                    ``IntegerParameter(low, high)`` (the value)
``IntRange`` step > 1                  ``IntegerParameter(0, n-1)`` (index of the value)
``PowerOfTwo``                         ``PowerOfTwoParameter(low, high)`` (the value)
``Bool``                               ``BooleanParameter`` (the value)
``Choice`` of sorted distinct numbers  ``IntegerParameter(0, n-1)`` (index: the search
                                       may exploit the order, e.g. unroll 1, 2, 4, 8)
other ``Choice``                       ``EnumParameter(range(n))`` (index: options may be
                                       lists or mixed types, which OpenTuner cannot hash)
any parameter with a single value      nothing: a constant, filled in on the way back
=====================================  ==============================================

A space whose every parameter is constant still needs one OpenTuner parameter; it gets a
one-option placeholder that maps to nothing. Both directions are exact:
``from_tuner(to_tuner(c)) == space.check(c)`` for every configuration of the space.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.space import Bool, Choice, Config, IntRange, Param, PowerOfTwo, Space, TupleOf

#: Name of the placeholder parameter of an all-constant space.
PLACEHOLDER = "__tunefleet_constant__"


@dataclass(frozen=True)
class _Leaf:
    """One scalar of the space and how it is encoded for OpenTuner."""

    key: str  # OpenTuner parameter name
    param: Param
    encoding: str  # "value", "index" or "constant"


def _leaf_encoding(param: Param) -> str:
    values = param.values()
    if len(values) == 1:
        return "constant"
    if isinstance(param, IntRange):
        return "value" if param.step == 1 else "index"
    if isinstance(param, PowerOfTwo | Bool):
        return "value"
    if isinstance(param, Choice):
        return "index"
    raise ProblemError(f"parameter {param.name!r}: kind {param.kind!r} cannot be searched")


def _index(param: Param, value: Any) -> int:
    return param.values().index(value)


def _ordered_numbers(options: list[Any]) -> bool:
    numeric = all(isinstance(o, int | float) and not isinstance(o, bool) for o in options)
    return numeric and all(a < b for a, b in itertools.pairwise(options))


class SpaceMapping:
    """The two-way map between one space and an OpenTuner manipulator."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self._leaves: list[_Leaf] = []
        # For rebuilding: top-level name -> flat list of leaf keys (tuples) or a single key.
        self._shape: dict[str, Any] = {}
        for param in space.params:
            self._shape[param.name] = self._flatten(param, param.name)
        keys = [leaf.key for leaf in self._leaves]
        clashes = sorted({k for k in keys if keys.count(k) > 1} | ({PLACEHOLDER} & set(keys)))
        if clashes:
            raise ProblemError(
                f"parameter names {clashes} clash with flattened tuple items; rename them"
            )
        self._by_key = {leaf.key: leaf for leaf in self._leaves}

    def _flatten(self, param: Param, key: str) -> Any:
        if isinstance(param, TupleOf):
            return [self._flatten(item, f"{key}[{i}]") for i, item in enumerate(param.items)]
        self._leaves.append(_Leaf(key, param, _leaf_encoding(param)))
        return key

    # --- OpenTuner side -----------------------------------------------------------------
    def manipulator(self) -> Any:
        """A fresh ``opentuner`` ConfigurationManipulator for the space."""
        from opentuner.search.manipulator import (
            BooleanParameter,
            ConfigurationManipulator,
            EnumParameter,
            IntegerParameter,
            PowerOfTwoParameter,
        )

        manipulator = ConfigurationManipulator()
        searched = 0
        for leaf in self._leaves:
            p = leaf.param
            if leaf.encoding == "constant":
                continue
            searched += 1
            if isinstance(p, IntRange) and leaf.encoding == "value":
                manipulator.add_parameter(IntegerParameter(leaf.key, p.low, p.high))
            elif isinstance(p, PowerOfTwo):
                manipulator.add_parameter(PowerOfTwoParameter(leaf.key, p.low, p.high))
            elif isinstance(p, Bool):
                manipulator.add_parameter(BooleanParameter(leaf.key))
            elif isinstance(p, Choice) and not _ordered_numbers(list(p.options)):
                manipulator.add_parameter(EnumParameter(leaf.key, list(range(len(p.options)))))
            else:  # stepped integers and ordered numeric choices: an index
                manipulator.add_parameter(IntegerParameter(leaf.key, 0, len(p.values()) - 1))
        if not searched:
            manipulator.add_parameter(EnumParameter(PLACEHOLDER, [0]))
        return manipulator

    def to_tuner(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """OpenTuner's form of a configuration; raises InvalidConfiguration outside the space."""
        checked = self.space.check(config)
        out: dict[str, Any] = {}
        for name, shape in self._shape.items():
            self._encode(shape, checked[name], out)
        if not any(leaf.encoding != "constant" for leaf in self._leaves):
            out[PLACEHOLDER] = 0
        return out

    def _encode(self, shape: Any, value: Any, out: dict[str, Any]) -> None:
        if isinstance(shape, list):
            for sub, v in zip(shape, value, strict=True):
                self._encode(sub, v, out)
            return
        leaf = self._by_key[shape]
        if leaf.encoding == "value":
            out[shape] = value
        elif leaf.encoding == "index":
            p = leaf.param
            out[shape] = (value - p.low) // p.step if isinstance(p, IntRange) else _index(p, value)

    def from_tuner(self, data: Mapping[str, Any]) -> Config:
        """The tunefleet configuration of an OpenTuner configuration (exact inverse)."""
        return {name: self._decode(shape, data) for name, shape in self._shape.items()}

    def _decode(self, shape: Any, data: Mapping[str, Any]) -> Any:
        if isinstance(shape, list):
            return [self._decode(sub, data) for sub in shape]
        leaf = self._by_key[shape]
        p = leaf.param
        if leaf.encoding == "constant":
            return p.default()
        raw = data[shape]
        if isinstance(p, Bool):
            return bool(raw)
        number = int(raw)
        if leaf.encoding == "index" and isinstance(p, IntRange):
            number = p.low + number * p.step
        elif leaf.encoding == "index":
            options = p.values()
            if not 0 <= number < len(options):
                raise InvalidConfiguration(f"search proposed index {raw!r} for {shape}")
            return options[number]
        if not p.contains(number):
            raise InvalidConfiguration(f"search proposed {shape}={raw!r}, outside the space")
        return number
