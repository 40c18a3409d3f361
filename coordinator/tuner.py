"""Owns the in-process OpenTuner search: ask for configurations, tell their outcomes.

Nothing here touches tunefleet's database; one ask or tell costs no network round trip, so
the engine can batch many of them per database statement. OpenTuner keeps its own bookkeeping
in a private in-memory SQLite database (never a file in the working directory), its logging
is silenced, and its global ``logging.Formatter`` patch is undone.

OpenTuner is driven through :class:`opentuner.api.TuningRunManager`, with two lean
replacements for hot paths that would otherwise cost a SQL query per suggestion inside
OpenTuner (about 80 suggestions/s instead of several hundred):

- ``get_configuration`` / ``has_results`` / duplicate detection use in-memory dictionaries
  keyed by OpenTuner's configuration hash instead of querying its database;
- :meth:`Tuner.ask` asks for a whole generation at once (``parallelism`` = the number the
  engine needs) and skips OpenTuner's per-request time-limit query (the engine sets its own
  trial timeouts);
- new results are handed to the techniques from memory in the order told, and the private
  database is never flushed (nothing reads it back).

A seeded Tuner (``seed=N``) repeats its search exactly: its techniques draw from their own
random states (swapped in around every call), the evolutionary techniques order their
population by a counter instead of the wall clock, and differential evolution picks parents
from a list instead of a set of objects (whose order follows memory addresses).

A :class:`Tuner` belongs to one thread: SQLite's in-memory database is per connection.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import random
import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm.attributes import set_committed_value

from tunefleet.errors import UsageError
from tunefleet.settings import DEFAULT_TECHNIQUE
from tunefleet.space import Config, Space, config_hash
from tunefleet.vocabulary import TrialSource

from .budget import Horizon
from .mapping import SpaceMapping

_log = logging.getLogger(__name__)


@contextmanager
def _quiet() -> Iterator[None]:
    """OpenTuner and its SQLAlchemy usage warn about things that are not our users' concern."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


_formatter = logging.Formatter
with _quiet():
    import opentuner
    from opentuner import tuningrunmain
    from opentuner.api import TuningRunManager
    from opentuner.measurement import MeasurementInterface
    from opentuner.measurement.inputmanager import FixedInputManager
    from opentuner.resultsdb.models import Configuration, DesiredResult, Result
    from opentuner.search import composableevolutionarytechniques, differentialevolution
    from opentuner.search import technique as _technique
    from opentuner.search.driver import SearchDriver
    from opentuner.search.objective import MinimizeTime

    from . import grid_technique as _grid_technique  # noqa: F401  (registers ``grid``)
    from .model_search import model_available, require_model
    from .techniques import MODEL_TECHNIQUES  # importing it registers them by name
# Importing OpenTuner replaces logging.Formatter process-wide; put it back.
logging.Formatter = _formatter  # type: ignore[misc]
# Its logging setup writes ``opentuner.log`` into the working directory: never run it.
tuningrunmain.init_logging = lambda: None
logging.getLogger("opentuner").setLevel(logging.CRITICAL)


class _LogicalClock:
    """Stands in for the ``time`` module where OpenTuner's evolutionary techniques stamp
    population members to order them: wall-clock stamps tie when members are made within a
    clock tick, and a seeded search then does not repeat. A counter keeps the order they
    mean (which member was made or replaced first) and never ties."""

    def __init__(self) -> None:
        self._ticks = itertools.count()

    def time(self) -> float:
        return float(next(self._ticks))


differentialevolution.time = _LogicalClock()
composableevolutionarytechniques.time = _LogicalClock()


def _de_parents_in_order(self: Any, parent_pop_member: Any) -> Any:
    """Differential evolution's new member, with the other members listed in population
    order before the shuffle: OpenTuner lists them through a set of objects, whose order
    follows memory addresses and so differs from one process (or run) to the next."""
    cfg = self.manipulator.copy(parent_pop_member.config.data)
    cfg_params = self.manipulator.proxy(cfg)
    others = [p for p in self.population if p is not parent_pop_member]
    if self.driver.best_result:
        best = differentialevolution.PopulationMember(self.driver.best_result.configuration)
        others += [best] * self.information_sharing
    random.shuffle(others)
    x1, x2, x3 = (p.config.data for p in others[:3])
    weight = random.random() / 2.0 + 0.5
    names = self.manipulator.param_names(cfg, x1, x2, x3)
    random.shuffle(names)
    for i, name in enumerate(names):
        if i < self.n_cross or random.random() < self.cr:
            cfg_params[name].op4_set_linear(x1, x2, x3, 1.0, weight, -weight)
    return cfg


differentialevolution.DifferentialEvolution.create_new_configuration = _de_parents_in_order


def technique_names() -> list[str]:
    """Every search technique OpenTuner knows (valid values for ``--technique``)."""
    with _quiet():
        techniques, _ = _technique.all_techniques()
    return sorted(t.name for t in techniques)


#: The default's stand-in where the default needs scikit-learn and it is not installed.
FALLBACK_TECHNIQUE = "NeighbourhoodSearch"


def default_search() -> tuple[str, ...]:
    """The techniques of a search that names none: :data:`DEFAULT_TECHNIQUE`, or
    :data:`FALLBACK_TECHNIQUE` (with a warning) where the default needs scikit-learn and it
    is missing, so a run never stops at its first model fit."""
    if DEFAULT_TECHNIQUE in MODEL_TECHNIQUES and not model_available():
        _log.warning(
            "the default search %s needs scikit-learn, which is not installed: searching with "
            "%s (pip install scikit-learn)",
            DEFAULT_TECHNIQUE,
            FALLBACK_TECHNIQUE,
        )
        return (FALLBACK_TECHNIQUE,)
    return (DEFAULT_TECHNIQUE,)


def check_techniques(names: Sequence[str]) -> tuple[str, ...]:
    known = technique_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown search technique {unknown[0]!r}; use one of {', '.join(known)}")
    for name in names:
        if name in MODEL_TECHNIQUES:
            require_model(name)  # a missing scikit-learn is named now, not mid-run
    return tuple(names)


@dataclass(eq=False)
class Suggestion:
    """One configuration OpenTuner wants measured. Tell its outcome exactly once."""

    config: Config
    config_hash: str
    requestor: str
    handle: Any  # OpenTuner's DesiredResult

    @property
    def seed(self) -> bool:
        """A seed configuration handed out before the techniques' own (its trial's source)."""
        return self.requestor == TrialSource.SEED


class Interface(MeasurementInterface):  # type: ignore[misc]
    """OpenTuner wants a measurement interface; measuring is the workers' job."""

    def run(self, desired_result: Any, input: Any, limit: Any) -> Any:
        raise NotImplementedError("tunefleet measures through its queue")

    def save_final_config(self, configuration: Any) -> None:
        pass


class LeanSearchDriver(SearchDriver):  # type: ignore[misc]
    """SearchDriver whose per-suggestion bookkeeping lives in dictionaries."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.configurations: dict[str, Any] = {}
        self.first_request: dict[str, Any] = {}
        # OpenTuner configuration hash -> fastest time told (inf for failures).
        self.measured: dict[str, float] = {}
        self.requested: deque[Any] = deque()
        # Results told since the search last looked, in the order they were told.
        self.told: list[Any] = []
        # How far the search is through its budget as of the last ask (None: no end in
        # sight); techniques that plan for the end read it (:class:`.budget.Horizon`).
        self.horizon: Horizon | None = None

    def process_new_results(self) -> None:
        """OpenTuner's own version reads the new results back from its database ordered by
        their collection time, which ties (and then comes back in any order) when outcomes
        are told faster than the clock ticks: a seeded search would not repeat. The results
        are kept in the order told instead, and no query runs."""
        self.new_results: list[Any] = []
        self.best_result: Any
        self.pending_result_callbacks: list[Any]
        told, self.told = self.told, []
        for result in told:
            self.plugin_proxy.on_result(result)
            self.new_results.append(result)
            if self.best_result is None or self.objective.lt(result, self.best_result):
                self.best_result = result
                result.was_new_best = True
                self.plugin_proxy.on_new_best_result(result)
            else:
                result.was_new_best = False
        self.result_callbacks()

    def result_callbacks(self) -> None:
        """Every outcome is set on its request when told (:meth:`Tuner._report`): a request
        still without one is in flight, and OpenTuner's search of its database for it
        (after a few generations) would find nothing."""
        pending, self.pending_result_callbacks = self.pending_result_callbacks, []
        for request, callback in pending:
            if request.result is not None:
                callback(request.result)
            else:
                self.pending_result_callbacks.append((request, callback))

    def get_configuration(self, cfg: dict[str, Any]) -> Any:
        self.manipulator.normalize(cfg)
        key = self.manipulator.hash_config(cfg)
        configuration = self.configurations.get(key)
        if configuration is None:
            configuration = Configuration(program=self.program, hash=key, data=cfg)
            self.session.add(configuration)
            self.configurations[key] = configuration
        return configuration

    def has_results(self, configuration: Any) -> bool:
        return configuration.hash in self.measured

    def run_generation_techniques(self) -> int:
        count = 0
        self.plugin_proxy.before_techniques()
        for _ in range(self.args.parallelism):
            if self.seed_cfgs:
                request = DesiredResult(
                    configuration=self.get_configuration(self.seed_cfgs.pop()),
                    # OpenTuner's own driver names a seed's requestor "seed": the same word
                    # as the trial source it becomes.
                    requestor=TrialSource.SEED.value,
                    generation=self.generation,
                    request_date=datetime.now(),
                    tuning_run=self.tuning_run,
                )
            else:
                request = self.root_technique.desired_result()
            if request is None or request is False:
                break  # every technique is waiting for results
            key = request.configuration.hash
            earlier = self.first_request.get(key)
            if earlier is None:
                self.session.add(request)
                self.first_request[key] = request
                request.state = "REQUESTED"
                self.requested.append(request)
            else:
                # A repeat (most requests, once the search converges): answered in memory
                # with the earlier request's result when that lands, never stored.
                self.register_result_callback(earlier, _copy_result_to(request))
            self.test_count += 1
            count += 1
        self.plugin_proxy.after_techniques()
        return count


class LeanMinimizeTime(MinimizeTime):  # type: ignore[misc]
    """Minimise time, comparing configurations from the driver's dictionary, which holds
    every outcome this search was told. A configuration without one (still in flight, e.g.
    after a resume) counts as infinitely slow: OpenTuner's own comparison would take the
    minimum of its empty result list and raise."""

    def config_compare(self, config1: Any, config2: Any) -> int:
        t1 = self.driver.measured.get(config1.hash, math.inf)
        t2 = self.driver.measured.get(config2.hash, math.inf)
        return (t1 > t2) - (t1 < t2)

    def limit_from_config(self, config: Any) -> None:
        return None  # the engine sets trial timeouts itself


class Manager(TuningRunManager):  # type: ignore[misc]
    """TuningRunManager that never writes its private database: nothing reads it back (the
    driver answers every question from its dictionaries and keeps new results in memory), a
    commit would expire every object OpenTuner holds and reload each on its next use, and a
    flush per step was most of a step's time (a replay of 300 evaluations: 5 s of 7)."""

    def commit(self, force: bool = False) -> None:
        self.forget_collections()

    def forget_collections(self) -> None:
        """Empty the ever-growing back-reference lists (every request and result of the run,
        every result of the machine), which nothing reads: otherwise each flush walks them
        whole and a step costs time proportional to the run's length. The rows stay."""
        set_committed_value(self.tuning_run, "desired_results", [])
        set_committed_value(self.tuning_run, "results", [])
        set_committed_value(self.measurement_driver.machine, "results", [])


def _copy_result_to(request: Any) -> Any:
    def callback(result: Any) -> None:
        # Without events: a plain assignment would also append the repeat to the result's
        # back-reference list, which then grows with every repeat and slows every flush.
        set_committed_value(request, "result", result)
        request.state = "COMPLETE"

    return callback


class _Randomness:
    """The random state of one seeded search. OpenTuner's techniques draw from the ``random``
    module; around every call into OpenTuner the search's own state is swapped in and the
    process's put back, so a seed repeats the search exactly whatever else the process
    draws (within the tuner's thread). NumPy's global generator is left alone: OpenTuner
    draws from it only for array parameters, which :class:`SpaceMapping` never makes."""

    def __init__(self, seed: int) -> None:
        self._state = random.Random(seed).getstate()

    @contextmanager
    def scope(self) -> Iterator[None]:
        outer = random.getstate()
        random.setstate(self._state)
        try:
            yield
        finally:
            self._state = random.getstate()
            random.setstate(outer)


@contextmanager
def _unseeded() -> Iterator[None]:
    yield


class Tuner:
    """An OpenTuner search over one space. ``seconds=None`` means infinitely slow (invalid,
    failed or timed out): the search learns to avoid it and never proposes it again.
    ``seed`` makes the search repeat exactly: the same outcomes told in the same order give
    the same suggestions."""

    def __init__(
        self, space: Space, techniques: Sequence[str] = (), seed: int | None = None
    ) -> None:
        self._randomness = _Randomness(seed) if seed is not None else None
        with self._rng():
            self._start(space, techniques)

    def _rng(self) -> Any:
        return self._randomness.scope() if self._randomness is not None else _unseeded()

    def _start(self, space: Space, techniques: Sequence[str]) -> None:
        self.mapping = SpaceMapping(space)
        argv = ["--database", "sqlite://", "--no-dups", "--quiet", "--parallelism", "1"]
        for name in techniques or default_search():
            argv += ["--technique", name]
        args = argparse.ArgumentParser(parents=opentuner.argparsers()).parse_args(argv)
        with _quiet():
            interface = Interface(
                args=args,
                program_name="tunefleet",
                manipulator=self.mapping.manipulator(),
                objective=LeanMinimizeTime(),
                input_manager=FixedInputManager(),
            )
            self._manager = Manager(interface, args, search_driver=LeanSearchDriver)
        self._driver = self._manager.search_driver
        self._args = args
        self.asked = 0
        self.told = 0

    @property
    def end_game(self) -> Horizon | None:
        """The budget as it stood when a technique of this search began its end game
        (:class:`.model_search.ModelSearch`'s ``end``), or None while none has."""
        root = self._driver.root_technique
        for technique in (root, *getattr(root, "techniques", ())):
            began: Horizon | None = getattr(technique, "end_game", None)
            if began is not None:
                return began
        return None

    # --- ask ------------------------------------------------------------------------------
    def ask(self, n: int, horizon: Horizon | None = None) -> list[Suggestion]:
        """Up to ``n`` new suggestions (fewer, even none, while the search waits for
        outcomes). OpenTuner never repeats a configuration it already asked for here.
        ``horizon`` says how much of the budget is left (None: no end in sight)."""
        if n <= 0:
            return []
        driver = self._driver
        driver.horizon = horizon
        if not driver.requested:
            self._args.parallelism = n
            with _quiet(), self._rng():
                driver.external_main_generation()
        out: list[Suggestion] = []
        while driver.requested and len(out) < n:
            request = driver.requested.popleft()
            request.state = "RUNNING"
            config = self.mapping.from_tuner(request.configuration.data)
            out.append(Suggestion(config, config_hash(config), request.requestor, request))
        self.asked += len(out)
        return out

    # --- tell -----------------------------------------------------------------------------
    def tell(self, suggestion: Suggestion, seconds: float | None) -> None:
        self.tell_many([(suggestion, seconds)])

    def tell_many(self, outcomes: Iterable[tuple[Suggestion, float | None]]) -> None:
        with _quiet(), self._rng():
            for suggestion, seconds in outcomes:
                self._report(suggestion.handle, seconds)
            self._manager.commit()

    def learn(self, outcomes: Iterable[tuple[Mapping[str, Any], float | None]]) -> None:
        """Outcomes the search never asked for (earlier sessions, seeds, the cache).

        A configuration that is still awaited from an earlier :meth:`ask` is answered
        through that request; one that already has an outcome is ignored."""
        driver = self._driver
        with _quiet(), self._rng():
            for config, seconds in outcomes:
                configuration = driver.get_configuration(self.mapping.to_tuner(config))
                if configuration.hash in driver.measured:
                    continue
                request = driver.first_request.get(configuration.hash)
                if request is None:
                    request = DesiredResult(
                        configuration=configuration,
                        requestor="known",
                        generation=driver.generation,
                        request_date=datetime.now(),
                        tuning_run=self._manager.tuning_run,
                        state="RUNNING",
                    )
                    self._manager.session.add(request)
                    driver.first_request[configuration.hash] = request
                elif request.state == "REQUESTED":
                    # Asked by the search but not handed out yet: it is answered now.
                    driver.requested.remove(request)
                self._report(request, seconds)
            self._manager.commit()

    def _report(self, request: Any, seconds: float | None) -> None:
        if request.result is not None:
            return  # told twice: keep the first outcome
        ok = seconds is not None and math.isfinite(seconds) and seconds > 0
        result = Result(time=seconds if ok else math.inf, state="OK" if ok else "ERROR")
        manager = self._manager
        result.configuration = request.configuration
        result.machine = manager.measurement_driver.machine
        result.tuning_run = manager.tuning_run
        result.collection_date = datetime.now()
        manager.session.add(result)
        request.result = result
        request.state = "COMPLETE"
        self._driver.told.append(result)
        measured = self._driver.measured
        key = request.configuration.hash
        measured[key] = min(measured.get(key, math.inf), result.time)
        self.told += 1

    def close(self) -> None:
        with _quiet():
            self._manager.session.close()
            self._manager.engine.dispose()
