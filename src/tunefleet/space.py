"""The parameter-space DSL: what a problem's transform space looks like, as data.

A :class:`Space` is an ordered tuple of named parameters. It serialises to JSON (stored in
``run.space``) so the coordinator can rebuild it and map it to OpenTuner without loopy or
OpenCL. A configuration is a plain ``dict`` of parameter name to JSON value; tuples travel as
lists. :func:`config_hash` is stable across processes, Python versions and key order.

Kernel builders raise :class:`~tunefleet.errors.InvalidConfiguration` for points of the space
that are illegal (the space describes a box; legality can be richer than a box): use
:func:`require` for such rules, so the message names the rule.

Membership is exact on the JSON form: ``True`` is not ``1`` and ``1.0`` is not ``1``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tunefleet import jsonvalues
from tunefleet.errors import InvalidConfiguration, ProblemError

Config = dict[str, Any]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the form we hash."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def config_hash(config: Mapping[str, Any]) -> str:
    """Stable hash of a configuration (tuples and lists hash alike)."""
    return hashlib.sha256(canonical_json(jsonvalues.exact(config)).encode()).hexdigest()[:32]


def require(condition: bool, message: str) -> None:
    """Raise InvalidConfiguration(message) unless ``condition``: how builders state the rules
    that make a point of the box illegal (``require(tile % wg == 0, "tile_i must be ...")``)."""
    if not condition:
        raise InvalidConfiguration(message)


@dataclass(frozen=True)
class Param:
    """One named parameter. Subclasses define the set of legal values."""

    name: str
    kind: ClassVar[str] = ""

    def values(self) -> list[Any]:
        """Every legal value, in order (spaces are finite)."""
        raise NotImplementedError

    def contains(self, value: Any) -> bool:
        try:
            key = canonical_json(jsonvalues.exact(value))
        except (TypeError, ValueError):
            return False
        return key in self._value_keys

    @functools.cached_property
    def _value_keys(self) -> frozenset[str]:
        # Built once per parameter: every configuration the search proposes is checked.
        return frozenset(canonical_json(jsonvalues.exact(v)) for v in self.values())

    def default(self) -> Any:
        return self.values()[0]

    def sample(self, rng: random.Random) -> Any:
        """A uniformly random legal value."""
        return rng.choice(self.values())

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class IntRange(Param):
    """Integers ``low, low+step, ..., <= high``."""

    low: int = 0
    high: int = 0
    step: int = 1
    kind: ClassVar[str] = "int"

    def __post_init__(self) -> None:
        if self.step <= 0 or self.high < self.low:
            raise ProblemError(
                f"parameter {self.name!r}: empty integer range {self.low}..{self.high} "
                f"step {self.step}"
            )

    def values(self) -> list[Any]:
        return list(range(self.low, self.high + 1, self.step))

    def contains(self, value: Any) -> bool:
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and self.low <= value <= self.high
            and (value - self.low) % self.step == 0
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "low": self.low,
            "high": self.high,
            "step": self.step,
        }


@dataclass(frozen=True)
class PowerOfTwo(Param):
    """Powers of two ``low <= 2**k <= high``."""

    low: int = 1
    high: int = 1
    kind: ClassVar[str] = "pow2"

    def __post_init__(self) -> None:
        for bound in (self.low, self.high):
            if bound <= 0 or bound & (bound - 1):
                raise ProblemError(f"parameter {self.name!r}: bound {bound} is not a power of 2")
        if self.high < self.low:
            raise ProblemError(f"parameter {self.name!r}: empty range {self.low}..{self.high}")

    def values(self) -> list[Any]:
        out, v = [], self.low
        while v <= self.high:
            out.append(v)
            v *= 2
        return out

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class Bool(Param):
    kind: ClassVar[str] = "bool"

    def values(self) -> list[Any]:
        return [False, True]

    def contains(self, value: Any) -> bool:
        return isinstance(value, bool)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name}


@dataclass(frozen=True)
class Choice(Param):
    """One of an explicit list of JSON values (strings, numbers, lists)."""

    options: tuple[Any, ...] = ()
    kind: ClassVar[str] = "choice"

    def __post_init__(self) -> None:
        if not self.options:
            raise ProblemError(f"parameter {self.name!r}: a choice needs at least one option")
        object.__setattr__(self, "options", tuple(jsonvalues.exact(o) for o in self.options))

    def values(self) -> list[Any]:
        return list(self.options)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "options": list(self.options)}


@dataclass(frozen=True)
class TupleOf(Param):
    """A tuple of sub-parameters, e.g. a work-group shape ``(lx, ly)``; travels as a list."""

    items: tuple[Param, ...] = ()
    kind: ClassVar[str] = "tuple"

    def __post_init__(self) -> None:
        if not self.items:
            raise ProblemError(f"parameter {self.name!r}: a tuple needs at least one item")

    def values(self) -> list[Any]:
        import itertools

        return [list(p) for p in itertools.product(*(item.values() for item in self.items))]

    def contains(self, value: Any) -> bool:
        return (
            isinstance(value, list | tuple)
            and len(value) == len(self.items)
            and all(item.contains(v) for item, v in zip(self.items, value, strict=True))
        )

    def default(self) -> Any:
        return [item.default() for item in self.items]

    def sample(self, rng: random.Random) -> Any:
        return [item.sample(rng) for item in self.items]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "items": [item.to_json() for item in self.items],
        }


_KINDS: dict[str, type[Param]] = {
    cls.kind: cls for cls in (IntRange, PowerOfTwo, Bool, Choice, TupleOf)
}


def _int(data: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProblemError(f"malformed parameter {dict(data)!r}: {key!r} must be an integer")
    return value


def param_from_json(data: Any) -> Param:
    """Rebuild one parameter from :meth:`Param.to_json`; ProblemError for malformed input."""
    if not isinstance(data, Mapping):
        raise ProblemError(f"malformed parameter {data!r}: expected an object with 'kind'")
    kind = data.get("kind")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ProblemError(f"malformed parameter {dict(data)!r}: 'name' must be a string")
    if kind == "int":
        return IntRange(name, _int(data, "low"), _int(data, "high"), _int(data, "step", 1))
    if kind == "pow2":
        return PowerOfTwo(name, _int(data, "low"), _int(data, "high"))
    if kind == "bool":
        return Bool(name)
    if kind == "choice":
        options = data.get("options")
        if not isinstance(options, list):
            raise ProblemError(f"malformed parameter {dict(data)!r}: 'options' must be a list")
        return Choice(name, tuple(options))
    if kind == "tuple":
        items = data.get("items")
        if not isinstance(items, list):
            raise ProblemError(f"malformed parameter {dict(data)!r}: 'items' must be a list")
        return TupleOf(name, tuple(param_from_json(i) for i in items))
    raise ProblemError(f"unknown parameter kind {kind!r}; use one of {sorted(_KINDS)}")


#: The version of the JSON form written by :meth:`Space.to_json`.
SPACE_JSON_VERSION = 1


@dataclass(frozen=True)
class Space:
    """An ordered set of named parameters."""

    params: tuple[Param, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ProblemError(f"space has duplicate parameter names: {dupes}")

    @classmethod
    def of(cls, params: Iterable[Param]) -> Space:
        return cls(tuple(params))

    def __iter__(self) -> Any:
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)

    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def size(self) -> int:
        total = 1
        for p in self.params:
            total *= len(p.values())
        return total

    def default(self) -> Config:
        return {p.name: p.default() for p in self.params}

    def sample(self, rng: random.Random) -> Config:
        """A uniformly random point of the box (it may still be illegal for the builder)."""
        return {p.name: p.sample(rng) for p in self.params}

    def check(self, config: Mapping[str, Any]) -> Config:
        """Return ``config`` normalised (tuples as lists), or raise InvalidConfiguration."""
        if not isinstance(config, Mapping):
            raise InvalidConfiguration(
                f"a configuration is an object of parameter values, not {config!r}"
            )
        missing = [n for n in self.names() if n not in config]
        extra = [k for k in config if k not in self.names()]
        if missing or extra:
            raise InvalidConfiguration(
                f"configuration does not match the space: missing {missing}, unknown {extra}"
            )
        out: Config = {}
        for p in self.params:
            value = jsonvalues.exact(config[p.name])
            if not p.contains(value):
                raise InvalidConfiguration(f"{p.name}={value!r} is outside the space")
            out[p.name] = value
        return out

    def to_json(self) -> dict[str, Any]:
        return {"version": SPACE_JSON_VERSION, "params": [p.to_json() for p in self.params]}

    def dumps(self) -> str:
        """The canonical JSON text of this space."""
        return canonical_json(self.to_json())

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | Sequence[Any]) -> Space:
        """Rebuild a space from :meth:`to_json` (or a bare list of parameters);
        ProblemError for anything malformed."""
        if isinstance(data, Mapping):
            version = data.get("version", SPACE_JSON_VERSION)
            if not isinstance(version, int) or version > SPACE_JSON_VERSION:
                raise ProblemError(
                    f"space format version {version!r} is not understood by this tunefleet "
                    f"(it reads up to {SPACE_JSON_VERSION}); upgrade tunefleet"
                )
            items = data.get("params")
        else:
            items = data
        if not isinstance(items, list | tuple):
            raise ProblemError("malformed space: expected {'params': [...]}")
        return cls(tuple(param_from_json(p) for p in items))

    @classmethod
    def loads(cls, text: str) -> Space:
        """Parse JSON text; ProblemError for invalid JSON or a malformed space."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ProblemError(f"space is not valid JSON: {exc}") from None
        return cls.from_json(data)
