"""Owns tunefleet's own search techniques, registered with OpenTuner under their names.

Kernel spaces are small boxes of ordered parameters (powers of two, tile sizes, unroll
factors) with a few switches, where good configurations sit next to good ones and a quarter
or more of the box breaks the problem's rules (rejections cost a replay, and a live run,
no evaluation). :class:`NeighbourhoodSearch` is a local search over such a box:

- it keeps the ``elite`` fastest configurations told so far (whoever asked for them; of
  equals, the newest, so a flat stretch is walked rather than circled);
- it proposes a neighbour of one of them (the fastest most often): one parameter moved one
  step, and with probability ``further`` each one more (a step is the next value of an
  ordered parameter in its own scale, e.g. a power of two doubled or halved, or another
  value of a switch or unordered choice);
- with probability ``mix`` it proposes a configuration between two of the elite instead;
- with probability ``explore``, and whenever every neighbour it tried was asked for
  already, a uniform draw (the restart that finds another basin).

It skips configurations the search already asked for (a repeat that slips through, after
24 tries, is answered by the driver from memory).

Registered names (usable with ``--technique``):

``NeighbourhoodSearch``       the search above (elite 3, further 0.3, explore 0.1, no mix); the
                              default's stand-in where scikit-learn is missing
``NeighbourhoodSearchWide``   elite 8, explore 0.2 (slower to converge, harder to trap)
``NeighbourhoodMix``          elite 5, and 4 proposals in 10 between two of the elite
``NeighbourhoodBandit``       OpenTuner's AUC bandit over NeighbourhoodSearch and uniform draws
``NeighbourhoodBanditDE``     the bandit with differential evolution and greedy mutation too
``ModelSearch``               expected improvement on a learned model (:mod:`.model_search`)
``ModelSearchLocal``          ModelSearch with a quarter of its proposals sweeping the fastest
                              configurations' one-step neighbourhoods (a candidate default for
                              long GPU runs, docs/tuning.md)
``ModelSearchSteady``         ModelSearch that spreads half its proposals out once stalled, not
                              0.8 (a long GPU run's last gains are each under the 1 % that
                              counts as progress; the default until 2026-12-07)
``ModelSearchSweep``          ModelSearchSteady that sweeps the ten fastest configurations'
                              neighbourhoods with a quarter of its proposals while it improves,
                              none once stalled (a candidate default: docs/tuning.md, "Dense
                              recordings")
``ModelSearchFinish``         ModelSearchSteady whose candidates include every one-step
                              neighbour of the five fastest, and whose every proposal sweeps
                              the ten fastest configurations' neighbourhoods once 15 % of the
                              budget is left (or twice the proposals in flight): the default
                              (``tunefleet.settings``; docs/tuning.md, "The end game")

Every random draw goes through the ``random`` module, which :class:`~.tuner.Tuner` swaps for
the run's own generator, so a seeded search repeats exactly.
"""

from __future__ import annotations

import math
import random
from typing import Any

from opentuner.search import differentialevolution, evolutionarytechniques
from opentuner.search.bandittechniques import AUCBanditMetaTechnique
from opentuner.search.manipulator import BooleanParameter, EnumParameter, NumericParameter
from opentuner.search.technique import PureRandom, SearchTechnique, register

from .model_search import ModelSearch

#: How many fresh proposals one call tries before it falls back to a uniform draw.
_TRIES = 24


class NeighbourhoodSearch(SearchTechnique):  # type: ignore[misc]
    """Local search around the best few configurations, with uniform restarts."""

    def __init__(
        self,
        elite: int = 3,
        explore: float = 0.1,
        further: float = 0.3,
        newest_first: bool = True,
        mix: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.mix = mix
        self.elite = elite
        self.explore = explore
        self.further = further
        self.newest_first = newest_first
        # (seconds, order told, configuration data) of the fastest configurations told.
        self._best: list[tuple[float, int, dict[str, Any]]] = []
        self._told = 0

    @classmethod
    def get_hyper_parameters(cls) -> list[str]:
        return ["elite", "explore", "further", "newest_first", "mix"]

    def on_result(self, result: Any) -> None:
        """Every outcome the search hears of (any technique's, seeds, the cache)."""
        seconds = result.time
        if result.state != "OK" or seconds is None or not math.isfinite(seconds):
            return
        self._told += 1
        order = -self._told if self.newest_first else self._told
        self._best.append((seconds, order, dict(result.configuration.data)))
        self._best.sort(key=lambda b: (b[0], b[1]))
        del self._best[self.elite :]

    def desired_configuration(self) -> Any:
        if not self._best or random.random() < self.explore:
            return self._fresh_random()
        for _ in range(_TRIES):
            # The best is the centre most often: rank r is picked with weight 1 / (r + 1).
            weights = [1.0 / (r + 1) for r in range(len(self._best))]
            cfg: dict[str, Any] | None
            if len(self._best) > 1 and random.random() < self.mix:
                first, second = random.sample(self._best, 2)
                cfg = self._between(first[2], second[2])
            else:
                centre = random.choices(self._best, weights)[0][2]
                cfg = self._neighbour(centre)
            if cfg is not None and not self._asked(cfg):
                return cfg
        return self._fresh_random()

    def _neighbour(self, centre: dict[str, Any]) -> dict[str, Any] | None:
        params = [p for p in self.manipulator.parameters(centre) if _movable(p)]
        if not params:
            return None
        cfg = self.manipulator.copy(centre)
        moves = 1
        while moves < len(params) and random.random() < self.further:
            moves += 1
        for param in random.sample(params, moves):
            _step(param, cfg)
        return cfg

    def _between(self, first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
        """A configuration between two good ones: where they differ, each parameter takes
        one's value, the other's, or (ordered parameters) the value halfway between."""
        cfg = self.manipulator.copy(first)
        for param in self.manipulator.parameters(cfg):
            a, b = param.get_value(first), param.get_value(second)
            if a == b:
                continue
            options = [a, b]
            if isinstance(param, NumericParameter) and abs(a - b) > 1:
                options.append((a + b) // 2)
            param.set_value(cfg, random.choice(options))
        return cfg

    def _asked(self, cfg: dict[str, Any]) -> bool:
        key = self.manipulator.hash_config(cfg)
        driver = self.driver
        return key in driver.measured or key in driver.first_request

    def _fresh_random(self) -> Any:
        for _ in range(_TRIES):
            cfg = self.manipulator.random()
            if not self._asked(cfg):
                return cfg
        return self.manipulator.random()


def _movable(param: Any) -> bool:
    if isinstance(param, NumericParameter):
        low, high = param.legal_range(None)
        return bool(high > low)
    if isinstance(param, EnumParameter):
        return len(param.options) > 1
    return isinstance(param, BooleanParameter)


def _step(param: Any, cfg: dict[str, Any]) -> None:
    """Move one parameter of ``cfg`` one step (in the parameter's own search scale)."""
    if isinstance(param, NumericParameter):
        low, high = param.legal_range(cfg)
        value = param.get_value(cfg)
        if value <= low:
            value += 1
        elif value >= high:
            value -= 1
        else:
            value += random.choice((-1, 1))
        param.set_value(cfg, value)
    elif isinstance(param, BooleanParameter):
        param.set_value(cfg, not param.get_value(cfg))
    else:
        current = param.get_value(cfg)
        param.set_value(cfg, random.choice([o for o in param.options if o != current]))


class UniformDraws(PureRandom):  # type: ignore[misc]
    """OpenTuner's uniform sampling, as a bandit member of its own name."""


register(NeighbourhoodSearch(name="NeighbourhoodSearch"))
register(NeighbourhoodSearch(elite=8, explore=0.2, name="NeighbourhoodSearchWide"))
register(NeighbourhoodSearch(elite=5, explore=0.1, further=0.4, mix=0.4, name="NeighbourhoodMix"))
register(
    AUCBanditMetaTechnique(
        [NeighbourhoodSearch(name="neighbourhood"), UniformDraws(name="uniform")],
        name="NeighbourhoodBandit",
    )
)
register(
    AUCBanditMetaTechnique(
        [
            NeighbourhoodSearch(name="neighbourhood"),
            UniformDraws(name="uniform"),
            differentialevolution.DifferentialEvolutionAlt(),
            evolutionarytechniques.UniformGreedyMutation(),
        ],
        name="NeighbourhoodBanditDE",
    )
)
_MODEL_SEARCHES = (
    ModelSearch(name="ModelSearch"),
    ModelSearch(local=0.25, name="ModelSearchLocal"),
    ModelSearch(stalled_explore=0.5, name="ModelSearchSteady"),
    ModelSearch(
        stalled_explore=0.5, local=0.25, stalled_local=0.0, elite=10, name="ModelSearchSweep"
    ),
    ModelSearch(stalled_explore=0.5, ring=5, end=0.15, name="ModelSearchFinish"),
)
for _search in _MODEL_SEARCHES:
    register(_search)
#: The registered techniques that learn a model (they need scikit-learn:
#: :func:`.model_search.require_model`).
MODEL_TECHNIQUES = tuple(t.name for t in _MODEL_SEARCHES)
