"""Owns tunefleet's own search techniques, registered with OpenTuner under their names.

Kernel spaces are small boxes of ordered parameters (powers of two, tile sizes, unroll
factors) with a few switches, where good configurations sit next to good ones and a quarter
or more of the box breaks the problem's rules. Replays of recorded spaces (``tunefleet
replay``) showed OpenTuner's default bandit settling into the first decent basin; what kept
finding the best was a plain local search around the best few configurations, restarted
from a uniform draw whenever their neighbourhoods are spent, with a share of uniform draws
all along so a second basin is still found.

:class:`NeighbourhoodSearch` is that search. It proposes a neighbour of one of the best
``elite`` configurations measured so far (whoever asked for them): one parameter (sometimes
two) moved one step, where a step is the next value of an ordered parameter (a power of two
doubled or halved, the next index of an ordered choice) or another value of a switch. A
configuration already asked for is never proposed again; with a probability ``explore``, or
once every neighbour of the elite was asked for, it proposes a uniform draw instead.

Registered names (usable with ``--technique``):

``NeighbourhoodSearch``       the search above (elite 3, explore 0.1)
``NeighbourhoodSearchWide``   elite 8, explore 0.2 (slower to converge, harder to trap)
``NeighbourhoodBandit``       OpenTuner's AUC bandit over NeighbourhoodSearch and uniform draws
``NeighbourhoodBanditDE``     the bandit with differential evolution and greedy mutation too

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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.elite = elite
        self.explore = explore
        self.further = further
        self.newest_first = newest_first
        # (seconds, order told, configuration data) of the fastest configurations told.
        self._best: list[tuple[float, int, dict[str, Any]]] = []
        self._told = 0

    @classmethod
    def get_hyper_parameters(cls) -> list[str]:
        return ["elite", "explore", "further", "newest_first"]

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
for _elite in (1, 3, 5):
    for _explore in (0.05, 0.1, 0.2, 0.3):
        for _further in (0.2, 0.4, 0.6):
            for _newest in (True, False):
                register(
                    NeighbourhoodSearch(
                        elite=_elite,
                        explore=_explore,
                        further=_further,
                        newest_first=_newest,
                        name=f"NS_{_elite}_{_explore}_{_further}_{int(_newest)}",
                    )
                )
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
