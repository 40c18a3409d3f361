"""Owns device-free landscapes: analytic spaces of the GEMM problem's shape with a known
optimum and a broad deceptive basin, for replays that no recording can give.

The published recordings hold a few hundred configurations of spaces of tens or hundreds of
thousands, so a replay over them mostly answers with neighbours and cannot rank searches. A
:class:`Landscape` answers *every* configuration of the ``gemm`` problem's space (567,000
points, the same parameters but its loop ``nest``, the same device-free rules, so 25-40 % of
uniform proposals are rejected as in a live run) from a formula, and knows its optimum exactly.

The formula, in log time over the configuration's position ``u`` (each ordered parameter's
value index scaled to [0, 1]; a switch or unordered choice counts 0 where it equals the
centre's value, 1 elsewhere):

- a **broad deceptive basin** around a centre ``b``: ``log(1 / basin) + 1.2 * D_b(u)``, with
  ``D_b`` the weighted mean squared distance over every parameter: most of the space drains
  towards ``b``, whose floor runs at ``basin`` (0.82) of the optimum's speed;
- a **narrow global basin** around the optimum ``o``: ``8 * D_o(u) + 0.1 * D_rest(u)``, with
  ``D_o`` the summed squared distance over three key parameters (register and work-group
  tiles; ``keys`` of them where the settings say) and ``D_rest`` the mean over the others:
  only configurations that match ``o`` on the key parameters beat the deceptive floor
  (about 1 % of the space);
- the time is the faster of the two, plus a deterministic ruggedness of up to
  ``ruggedness`` (2 %) per configuration (zero at the optimum, so it stays unique).

``o`` and ``b`` are legal configurations drawn from the variant's seed, at least two steps
apart on every key parameter; the variant also draws the key parameters and the weights.
Each evaluation costs 1-2 virtual seconds (drawn per configuration) so that virtual workers
finish out of order, as real ones do.

A landscape answers replays (:func:`tunefleet.coordinator.replay.replay`) as a recording's
:class:`~tunefleet.coordinator.replay.Answers` does; ``tunefleet replay landscape:N`` replays
variant ``N``.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tunefleet.errors import InvalidConfiguration, UsageError
from tunefleet.recording import Row
from tunefleet.space import Bool, Choice, Config, IntRange, Param, PowerOfTwo, Space, config_hash
from tunefleet.vocabulary import TrialState

#: Prefix of a replay source naming a landscape variant (``landscape:3``).
SOURCE_PREFIX = "landscape:"
#: The problem and arguments whose space and rules a landscape borrows.
PROBLEM = "gemm"
PROBLEM_ARGS: Mapping[str, Any] = {"n": 2048, "m": 2048, "k": 2048, "dtype": "float32"}
#: Parameters of the gemm space a landscape leaves out (its rules see their defaults): they
#: came after the landscapes were published (the nest, a's padding), and would multiply the
#: space (the nest by 24) and move every variant's optimum and centre.
OMITTED = ("nest", "pad_a")
#: Parameters the narrow global basin is drawn on (three of them per variant).
KEY_CANDIDATES = ("wg_i", "wg_j", "reg_i", "reg_j", "tile_k")
KEYS = 3


@dataclass(frozen=True)
class LandscapeSettings:
    """What shapes one landscape (the defaults are the published deceptive landscapes)."""

    variant: int = 0
    #: Speed of the deceptive basin's floor over the optimum's (the optimum's time / its time).
    basin: float = 0.82
    #: The optimum's time, seconds.
    optimum_s: float = 3.0e-3
    #: How steeply the global basin falls (per unit of summed squared key distance).
    sharpness: float = 8.0
    #: How steeply the deceptive basin rises from its floor (its breadth: small is broad).
    slope: float = 1.2
    #: Largest deterministic per-configuration excess of log time.
    ruggedness: float = 0.02
    #: How many of :data:`KEY_CANDIDATES` the narrow global basin is drawn on.
    keys: int = KEYS

    def __post_init__(self) -> None:
        if not 0.0 < self.basin < 1.0:
            raise UsageError(f"landscape basin={self.basin!r}: give a speed ratio in (0, 1)")
        if self.optimum_s <= 0:
            raise UsageError(f"landscape optimum_s={self.optimum_s!r}: give seconds > 0")
        if not 1 <= self.keys <= len(KEY_CANDIDATES):
            raise UsageError(
                f"landscape keys={self.keys!r}: give 1 to {len(KEY_CANDIDATES)} key parameters"
            )


def _ordered(param: Param) -> bool:
    if isinstance(param, IntRange | PowerOfTwo):
        return True
    if isinstance(param, Bool):
        return False
    if isinstance(param, Choice):
        options = list(param.options)
        numbers = all(isinstance(o, int | float) and not isinstance(o, bool) for o in options)
        return numbers and options == sorted(options)
    return False


def _unit(config_hash_hex: str, salt: str) -> float:
    """A deterministic number in [0, 1) per configuration (and purpose)."""
    digest = hashlib.sha256(f"{salt}:{config_hash_hex}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


class Landscape:
    """One seeded landscape over the ``gemm`` space (see the module docstring)."""

    def __init__(self, settings: LandscapeSettings | None = None) -> None:
        from tunefleet.problems.registry import get_problem

        self.settings = s = settings or LandscapeSettings()
        problem = get_problem(PROBLEM)
        self.problem = PROBLEM
        self.problem_args = dict(PROBLEM_ARGS)
        self.space: Space = Space.of(
            p for p in problem.space(self.problem_args) if p.name not in OMITTED
        )
        self.source = f"{SOURCE_PREFIX}{s.variant}"
        args = self.problem_args

        def rules(config: Config) -> bool:
            try:
                problem.check_config(args, config)
            except InvalidConfiguration:
                return False
            return True

        self.rules: Callable[[Config], bool] = rules
        self._legal: dict[str, bool] = {}
        params = self.space.params
        self._names = [p.name for p in params]
        self._values = [p.values() for p in params]
        self._ordered = [_ordered(p) for p in params]
        rng = random.Random(f"tunefleet-landscape-{s.variant}")
        keys = set(rng.sample(KEY_CANDIDATES, s.keys))
        self.keys = tuple(n for n in self._names if n in keys)
        self._key = [n in keys for n in self._names]
        self._weights = [rng.uniform(0.5, 1.5) for _ in params]
        self.optimum, self.centre = self._centres(rng)
        self._o = self._position(self.optimum)
        self._b = self._position(self.centre)

    def _centres(self, rng: random.Random) -> tuple[Config, Config]:
        """The optimum and the deceptive centre: legal, two or more steps apart on every key
        parameter (so no single move crosses from one basin to the other)."""
        for _ in range(100_000):
            o, b = self.space.sample(rng), self.space.sample(rng)
            if not (self.rules(o) and self.rules(b)):
                continue
            far = all(
                abs(values.index(o[n]) - values.index(b[n])) >= 2
                for n, values, key in zip(self._names, self._values, self._key, strict=True)
                if key
            )
            if far:
                return o, b
        raise RuntimeError("no pair of legal centres found")  # not reached with the gemm space

    def _position(self, config: Mapping[str, Any]) -> list[float]:
        return [
            values.index(config[n]) / (len(values) - 1)
            if ordered
            else float(values.index(config[n]))
            for n, values, ordered in zip(self._names, self._values, self._ordered, strict=True)
        ]

    # --- the objective ----------------------------------------------------------------------
    def log_ratio(self, config: Mapping[str, Any]) -> float:
        """log(time / optimum time) of ``config`` (0 at the optimum)."""
        s = self.settings
        u = self._position(config)
        deceptive = near = rest = 0.0
        rest_n = 0
        for x, o, b, w, ordered, key in zip(
            u, self._o, self._b, self._weights, self._ordered, self._key, strict=True
        ):
            db = (x - b) ** 2 if ordered else float(x != b)
            do = (x - o) ** 2 if ordered else float(x != o)
            deceptive += w * db
            if key:
                near += do
            else:
                rest += do
                rest_n += 1
        deceptive = -math.log(s.basin) + s.slope * deceptive / sum(self._weights)
        glob = s.sharpness * near + 0.1 * rest / max(rest_n, 1)
        value = min(deceptive, glob)
        h = config_hash(config)
        if value > 0.0:
            value += s.ruggedness * _unit(h, f"rugged-{s.variant}")
        return value

    def seconds(self, config: Mapping[str, Any]) -> float:
        return self.settings.optimum_s * math.exp(self.log_ratio(config))

    @property
    def best_s(self) -> float:
        """The optimum's time (the landscape's best, as a recording's best row)."""
        return self.settings.optimum_s

    @property
    def basin_s(self) -> float:
        """The deceptive basin's floor."""
        return self.settings.optimum_s / self.settings.basin

    # --- what a replay asks (as replay.Answers) ---------------------------------------------
    def legal(self, config: Config, key: str | None = None) -> bool:
        key = key or config_hash(config)
        known = self._legal.get(key)
        if known is None:
            known = self._legal[key] = self.rules(config)
        return known

    def answer(self, config: Config) -> tuple[Row, bool]:
        """Every configuration is answered by itself (nothing is ever missing)."""
        h = config_hash(config)
        cost = 1.0 + _unit(h, f"cost-{self.settings.variant}")
        row = Row(dict(config), TrialState.DONE, self.seconds(config), 0.8 * cost, 0.2 * cost)
        return row, True

    def cost_s(self, row: Row) -> float:
        return row.worker_s or 1.0


def from_source(source: str) -> Landscape | None:
    """The landscape a replay source names (``landscape:N``), or None for any other source."""
    if not source.startswith(SOURCE_PREFIX):
        return None
    variant = source[len(SOURCE_PREFIX) :]
    if not variant.isdigit():
        raise UsageError(
            f"replay source {source!r}: name a landscape variant by number, e.g. landscape:0"
        )
    return Landscape(LandscapeSettings(variant=int(variant)))
