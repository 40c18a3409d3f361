"""Owns the model-based search technique: a surrogate of log time proposes where to look.

Local search with restarts does not learn where it has already been: on a landscape with a
broad deceptive basin it settles in the basin's floor (the restarts land on slopes slower
than the floor and are forgotten). :class:`ModelSearch` keeps every outcome it hears of and
learns two models from them (scikit-learn extra-trees, refitted as outcomes arrive):

- a **surrogate** of ``log(seconds)`` of the measured configurations; the spread of its
  trees' predictions is its uncertainty;
- a **validity classifier** of "gave a time" over every finished configuration: the rules and
  the device reject a quarter or more of a kernel space, and those proposals cost a live run
  a round trip (a replay, nothing) but teach where not to go.

Each proposal scores a pool of candidates (uniform draws and neighbours of the fastest few)
by *expected improvement* over the best time so far, times the chance that the candidate is
valid, times a **damping** ``1 - exp(-d^2 / 2)`` where ``d`` is the candidate's distance (in
steps of ordered parameters, one per differing switch or unordered choice) to the nearest
configuration the models do not know yet: proposed and not yet answered, or answered since
the last fit. N workers in flight get N different ideas, not N copies of one, and the pool
is scored once per fit and best, not once per outcome. The models are refitted when the
outcomes have grown by ``refit`` (10 %) since the last fit. Every proposal until ``initial``
configurations have a time is a uniform draw; after that a share of proposals spreads out
instead: of ``spread_pool`` (1,024) uniform draws, one the classifier is fairly sure is
valid that brings the most value combinations of three parameters not seen yet
(:meth:`ModelSearch._spread`). The share is ``explore`` (0.1) while the search improves and
rises to ``stalled_explore`` (0.8) as the outcomes since the best last improved by 1 % reach
``stall`` (20): the model cannot see a narrow basin it has no sample near, so a search stuck
in a broad one looks elsewhere. Parameter effects stay estimable for the same reason (the
importance report's forest sees every parameter move).

With ``local`` > 0 (0 in ``ModelSearch``, 0.25 in ``ModelSearchLocal``) that share of the
proposals sweeps the untried one-step neighbours of the fastest configurations instead
(:meth:`ModelSearch._neighbours`): a model of a few hundred outcomes cannot rank
configurations a few per cent apart, which is where a long GPU run's last gains are. With
``stalled_local`` the share moves from ``local`` to that value as the search stalls (in
``ModelSearchSweep``: 0.25 of the proposals while it improves, none once stalled, so a
search stuck in a deceptive basin spreads out as the default does).

With ``end`` > 0 (0.15 in ``ModelSearchFinish``, the default) the search plans for the end of
its budget: once what is left (:class:`.budget.Horizon`, which the engine and replays pass
with every ask) is at most ``end`` of the budget, or twice the proposals in flight, every
proposal sweeps the untried one-step neighbours of the ``end_elite`` (10) fastest; a
proposal elsewhere that late could not be followed up. With ``ring`` > 0 (5 in
``ModelSearchFinish``) the model's candidate pool holds every one-step neighbour of the
``ring`` fastest, not a random share of them, so the model ranks them all. A run without a
budget (no ``--max-trials`` or ``--max-time``) has no horizon and never enters the end game.

On held-out deceptive landscapes of :mod:`.landscape` (benchmarks/default_technique.py: 50
runs of 300 evaluations, variants 1000-1049 in four shapes) 48 of 50 runs at 1 worker and 48
of 50 at 16 ended within 5 % of the optimum, at 7-8 ms of CPU per evaluation; its settings
were chosen on variants 0-49 and 500-517 (before, with ``stall`` 30, a spread pool of 256
and refits at 5 %: 48 of 50 at 1 and 16 workers on variants 0-49, and 27-29 ms of CPU per
evaluation on variants 500-507 on the same machine).

Configurations are encoded as the index of each parameter's value (OpenTuner's parameters
as :mod:`.mapping` makes them: integers and powers of two by their step, switches 0/1,
unordered choices by option index, which trees split without assuming an order).

scikit-learn is a dependency of tunefleet (it was the ``importance`` extra, which still
names it); where it is missing all the same, :func:`require_model` names it in one line,
:func:`tunefleet.coordinator.tuner.check_techniques` calls it for every technique named that
needs it, and a run that names none falls back to ``NeighbourhoodSearch``
(:func:`tunefleet.coordinator.tuner.default_search`).

Every random draw comes from the ``random`` module (swapped per search by
:class:`~.tuner.Tuner`), so a seeded search repeats exactly.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from typing import TYPE_CHECKING, Any

import numpy as np
from opentuner.search.manipulator import BooleanParameter, EnumParameter, NumericParameter
from opentuner.search.technique import SearchTechnique

from tunefleet.errors import UsageError

if TYPE_CHECKING:
    from .budget import Horizon

_log = logging.getLogger(__name__)

#: Tries before a proposal falls back to a uniform draw when every candidate was asked.
_TRIES = 24
#: Most triples of parameters a spread proposal counts (220 for twelve parameters).
_MAX_TRIPLES = 256
#: Most flags the coverage of value combinations of three parameters keeps (one byte each).
_MAX_COVER = 1 << 24
#: The validity classifier's chance a spread proposal needs.
_SURE_VALID = 0.8


def model_available() -> bool:
    """Whether scikit-learn is installed (found, not imported: importing it takes seconds)."""
    import importlib.util

    try:
        return importlib.util.find_spec("sklearn") is not None
    except (ImportError, ValueError):
        return False


def require_model(technique: str = "ModelSearch") -> None:
    """Raise a one-line :class:`UsageError` when scikit-learn is missing."""
    try:
        import sklearn.ensemble  # noqa: F401
    except ImportError:
        raise UsageError(
            f"search technique {technique!r} needs scikit-learn: "
            "pip install 'tunefleet[importance]', or choose another --technique"
        ) from None


class _Encoding:
    """The index encoding of one manipulator's parameters (see the module docstring)."""

    def __init__(self, manipulator: Any) -> None:
        self.manipulator = manipulator
        self.params = list(manipulator.params)
        self.lows: list[int] = []
        sizes: list[int] = []
        ordered: list[bool] = []
        for p in self.params:
            if isinstance(p, NumericParameter):
                low, high = p.legal_range(None)
                self.lows.append(int(low))
                sizes.append(int(high) - int(low) + 1)
                ordered.append(True)
            elif isinstance(p, BooleanParameter):
                self.lows.append(0)
                sizes.append(2)
                ordered.append(False)
            elif isinstance(p, EnumParameter):
                self.lows.append(0)
                sizes.append(len(p.options))
                ordered.append(False)
            else:
                raise UsageError(f"ModelSearch cannot search parameter {p.name!r} ({type(p)})")
        self.sizes = np.array(sizes, dtype=np.int64)
        self.ordered = np.array(ordered, dtype=bool)
        self._template = manipulator.seed_config()

    def encode(self, cfg: dict[str, Any]) -> np.ndarray:
        row = []
        for p, low in zip(self.params, self.lows, strict=True):
            value = p.get_value(cfg)
            if isinstance(p, NumericParameter):
                row.append(int(value) - low)
            elif isinstance(p, BooleanParameter):
                row.append(int(bool(value)))
            else:
                row.append(p.options.index(value))
        return np.array(row, dtype=np.int64)

    def decode(self, row: np.ndarray) -> dict[str, Any]:
        cfg: dict[str, Any] = self.manipulator.copy(self._template)
        for p, low, index in zip(self.params, self.lows, row.tolist(), strict=True):
            if isinstance(p, NumericParameter):
                p.set_value(cfg, low + index)
            elif isinstance(p, BooleanParameter):
                p.set_value(cfg, bool(index))
            else:
                p.set_value(cfg, p.options[index])
        return cfg

    def one_step(self, centre: np.ndarray) -> list[np.ndarray]:
        """Every configuration one step from ``centre``: an ordered parameter one step either
        way, any other parameter at any other of its values."""
        steps = []
        for j, size in enumerate(self.sizes.tolist()):
            values = (centre[j] - 1, centre[j] + 1) if self.ordered[j] else range(size)
            for v in values:
                if 0 <= v < size and v != centre[j]:
                    row = centre.copy()
                    row[j] = v
                    steps.append(row)
        return steps

    def _features(self, rows: np.ndarray) -> np.ndarray:
        """Rows as points whose squared Euclidean distance is the squared step distance:
        ordered parameters by index, the others one-hot scaled by 1/sqrt(2) (two differing
        one-hot vectors are 1 apart)."""
        columns = []
        for j, (ordered, size) in enumerate(zip(self.ordered, self.sizes, strict=True)):
            if ordered:
                columns.append(rows[:, j : j + 1].astype(float))
            else:
                columns.append(np.eye(int(size))[rows[:, j]] / math.sqrt(2.0))
        return np.concatenate(columns, axis=1)

    def distance2(self, candidates: np.ndarray, others: np.ndarray) -> np.ndarray:
        """Squared step distance of each candidate to its nearest row of ``others`` (one
        matrix product: the pairwise differences of 256 candidates against 2,000 rows were
        most of a proposal's time)."""
        a, b = self._features(candidates), self._features(others)
        d2 = (a * a).sum(axis=1)[:, None] + (b * b).sum(axis=1)[None, :] - 2.0 * a @ b.T
        return np.asarray(np.maximum(d2.min(axis=1), 0.0), dtype=float)


class _Coverage:
    """Which value combinations of every triple of parameters with more than one value the
    told outcomes cover: one flag per combination, all triples' flags in one array (a
    triple's combination codes its values in mixed radix, offset by where its flags start).
    Brought up to date with the outcomes told since (:meth:`fold`), and read for a whole pool
    at once: a spread proposal looked every triple up in every outcome (16 ms at 300
    outcomes). The triples of fewest combinations come first; those past
    :data:`_MAX_COVER` flags in all are left out (a triple of so many combinations is
    almost never covered, so it tells candidates apart by chance alone)."""

    def __init__(self, sizes: np.ndarray) -> None:
        varied = [j for j in range(len(sizes)) if sizes[j] > 1]
        combos = sorted(
            itertools.combinations(varied, 3),
            key=lambda c: math.prod(int(sizes[j]) for j in c),
        )
        spans = [math.prod(int(sizes[j]) for j in c) for c in combos]
        keep = int(np.searchsorted(np.cumsum(spans, dtype=float), _MAX_COVER, side="right"))
        order = sorted(range(keep), key=lambda i: combos[i])  # back in the parameters' order
        self.combos = np.array([combos[i] for i in order], dtype=np.int64).reshape(-1, 3)
        s = sizes[self.combos] if len(self.combos) else np.zeros((0, 3), dtype=np.int64)
        self.radix = np.stack([s[:, 1] * s[:, 2], s[:, 2], np.ones(len(s), np.int64)], axis=1)
        span = s.prod(axis=1)
        self.offsets = np.concatenate([[0], np.cumsum(span)[:-1]]).astype(np.int64)
        # codes = rows @ weights + offsets: weights[j, t] is the radix of parameter j in
        # triple t (0 where j is not in it); one product for a whole pool.
        self.weights = np.zeros((len(sizes), len(self.combos)), dtype=np.int64)
        for t, (combo, radix) in enumerate(zip(self.combos, self.radix, strict=True)):
            self.weights[combo, t] = radix
        self.flags = np.zeros(int(span.sum()), dtype=bool)
        self._folded = 0

    def codes(self, rows: np.ndarray, pick: np.ndarray) -> np.ndarray:
        """Flag index of each row's combination of each picked triple (rows x picked)."""
        return np.asarray(rows @ self.weights[:, pick] + self.offsets[pick])

    def fold(self, rows: np.ndarray) -> None:
        """Flag the combinations of ``rows`` past those folded already (rows only grow)."""
        if len(rows) > self._folded and len(self.combos):
            new = rows[self._folded :]
            self.flags[self.codes(new, np.arange(len(self.combos)))] = True
        self._folded = len(rows)


def _key(row: np.ndarray) -> bytes:
    return row.astype(np.int16).tobytes()


class _Trees:
    """Extremely randomised trees (scikit-learn's ``ExtraTreesRegressor`` and
    ``ExtraTreesClassifier`` with their defaults: every row to every tree, a random split per
    feature, of all features for the regressor and the square root of their number for the
    classifier), grown one by one: the ensemble classes clone a template for every tree
    through their parameters' signatures and check its parameters again, which in a profile
    of a 300-evaluation replay cost about as much as growing the trees."""

    def __init__(self, estimators: list[Any]) -> None:
        self.estimators_ = estimators
        self.classes_ = getattr(estimators[0], "classes_", None)

    @classmethod
    def grow(
        cls, x: np.ndarray, y: np.ndarray, trees: int, seed: int, *, classify: bool = False
    ) -> _Trees:
        import sklearn
        from sklearn.tree import ExtraTreeClassifier, ExtraTreeRegressor

        x32 = np.ascontiguousarray(x, dtype=np.float32)
        seeds = np.random.RandomState(seed).randint(np.iinfo(np.int32).max, size=max(trees, 1))
        grown = []
        with sklearn.config_context(skip_parameter_validation=True, assume_finite=True):
            for s in seeds.tolist():
                tree: Any = (
                    ExtraTreeClassifier(max_features="sqrt", random_state=s)
                    if classify
                    else ExtraTreeRegressor(max_features=1.0, random_state=s)
                )
                grown.append(tree.fit(x32, y, check_input=False))
        return cls(grown)


def _per_tree(forest: Any, x: np.ndarray) -> np.ndarray:
    """Every tree's raw output for the rows ``x`` (trees x rows x outputs), through the
    trees' own arrays: scikit-learn's per-call checks and thread pool cost more than the
    predictions of a few hundred rows (a proposal's scoring took 9 ms, now 3)."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    return np.stack([t.tree_.predict(x32).reshape(len(x32), -1) for t in forest.estimators_])


def _chance_valid(classifier: Any, x: np.ndarray) -> np.ndarray:
    """The validity classifier's chance that each row of ``x`` gives a time."""
    votes = _per_tree(classifier, x)
    votes = votes / np.maximum(votes.sum(axis=2, keepdims=True), 1e-12)
    column = list(classifier.classes_).index(True)
    return np.asarray(votes[:, :, column].mean(axis=0), dtype=float)


class ModelSearch(SearchTechnique):  # type: ignore[misc]
    """Expected improvement on an extra-trees surrogate, validity-aware and in-flight-aware."""

    def __init__(
        self,
        initial: int = 12,
        explore: float = 0.1,
        candidates: int = 1024,
        trees: int = 32,
        elite: int = 5,
        refit: float = 0.1,
        refit_min: int = 1,
        stalled_explore: float = 0.8,
        stall: int = 20,
        spread_pool: int = 1024,
        local: float = 0.0,
        stalled_local: float | None = None,
        ring: int = 0,
        end: float = 0.0,
        end_elite: int = 10,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.ring = ring
        self.end = end
        self.end_elite = end_elite
        self.local = local
        self.stalled_local = stalled_local  # None: ``local`` throughout
        self.initial = initial
        self.explore = explore
        self.candidates = candidates
        self.trees = trees
        self.elite = elite
        self.refit = refit
        self.refit_min = refit_min
        self.stalled_explore = stalled_explore
        self.stall = stall
        self.spread_pool = spread_pool
        self._enc: _Encoding | None = None
        self._rows: list[np.ndarray] = []
        self._log_s: list[float] = []  # log seconds, nan where no time
        self._told: set[bytes] = set()  # configurations with an outcome
        self._seen: set[bytes] = set()  # those and the ones proposed
        #: The budget as it stood when the end game began (None: not yet); said once, in
        #: the log, and read by the engine for its progress.
        self.end_game: Horizon | None = None
        self._pending: dict[bytes, np.ndarray] = {}
        self._fitted_at = -1
        self._surrogate: Any = None
        self._validity: Any = None
        # (fitted at, the best's index), candidate pool, its scores, its chance of validity.
        self._scored: tuple[tuple[int, int], np.ndarray, np.ndarray, np.ndarray] | None = None
        # Which value combinations of three parameters the outcomes cover (built once).
        self._cover: _Coverage | None = None
        # (outcomes known, fitted at), spread pool, tie breakers, triples picked, their
        # codes, chance of validity (:meth:`_spread`).
        self._spread_pool: tuple[Any, ...] | None = None

    @classmethod
    def get_hyper_parameters(cls) -> list[str]:
        return [
            "initial",
            "explore",
            "candidates",
            "trees",
            "elite",
            "refit",
            "refit_min",
            "stalled_explore",
            "stall",
            "spread_pool",
            "local",
            "stalled_local",
            "ring",
            "end",
            "end_elite",
        ]

    # --- learning ---------------------------------------------------------------------------
    def _encoding(self) -> _Encoding:
        if self._enc is None:
            self._enc = _Encoding(self.manipulator)
        return self._enc

    def on_result(self, result: Any) -> None:
        """Every outcome the search hears of (its own, other techniques', seeds, the cache)."""
        row = self._encoding().encode(result.configuration.data)
        key = _key(row)
        self._pending.pop(key, None)
        if key in self._told:
            return  # told again (a repeat): the first outcome stands
        self._told.add(key)
        self._seen.add(key)
        seconds = result.time
        ok = result.state == "OK" and seconds is not None and math.isfinite(seconds)
        self._rows.append(row)
        self._log_s.append(math.log(seconds) if ok and seconds > 0 else math.nan)

    def _fit(self) -> bool:
        """Refit when enough new outcomes arrived; whether a surrogate is usable."""
        n = len(self._rows)
        due = max(self.refit_min, self.refit * self._fitted_at)
        if self._fitted_at >= 0 and n - self._fitted_at < due:
            return self._surrogate is not None
        require_model()
        x = np.array(self._rows, dtype=float)
        y = np.array(self._log_s)
        ok = ~np.isnan(y)
        self._fitted_at = n
        if ok.sum() < 2:
            self._surrogate = None
            return False
        seed = random.getrandbits(31)
        self._surrogate = _Trees.grow(x[ok], y[ok], self.trees, seed)
        self._validity = None
        if 0 < ok.sum() < n:
            self._validity = _Trees.grow(x, ok, self.trees // 2, seed, classify=True)
        return True

    # --- proposing --------------------------------------------------------------------------
    def desired_configuration(self) -> Any:
        enc = self._encoding()
        measured = int(np.sum(~np.isnan(np.array(self._log_s)))) if self._log_s else 0
        if measured < self.initial or not self._fit():
            return self._propose(self._uniform(enc))
        stalled = self._stalled()  # once per proposal: both shares follow it
        if self._near_end():
            ranked = self._neighbours(enc, self.end_elite)
            if ranked:
                return self._propose(ranked)
        else:
            local = self._local_share(stalled)
            if local and random.random() < local:
                ranked = self._neighbours(enc, self.elite)
                if ranked:
                    return self._propose(ranked)
        if random.random() < self._explore_share(stalled):
            return self._propose(self._spread(enc))
        return self._propose(self._best_candidates(enc))

    def _near_end(self) -> bool:
        """Whether the budget's end is near enough (``end``; :meth:`.budget.Horizon.near_end`
        with this search's proposals in flight) that every proposal sweeps the neighbourhoods
        of the fastest instead.

        A proposal that opens new ground late in the budget cannot be followed up; one that
        steps next to a fast configuration still can gain. Replayed on the dense GEMM
        recording of an H100 (50 seeds of 300 evaluations), 22 of 50 ModelSearchSteady runs
        at 64 workers ended at 0.97 of its fastest or better, and 49 with this end game (40
        and 50 at one worker; benchmarks/replay_techniques.py, docs/tuning.md "The end
        game")."""
        horizon = getattr(self.driver, "horizon", None)  # None under a plain OpenTuner driver
        if self.end <= 0 or horizon is None:
            return False
        near = bool(horizon.near_end(self.end, len(self._pending)))
        if near and self.end_game is None:
            self.end_game = horizon
            _log.info(
                "%s: about %d of %d evaluations left; sweeping the neighbourhoods of the "
                "fastest configurations from now on",
                self.name,
                horizon.left,
                horizon.spent + horizon.left,
            )
        return near

    def _neighbours(self, enc: _Encoding, elite: int) -> list[np.ndarray]:
        """The one-step neighbours of the fastest configuration not asked for yet (of the
        next fastest once those are all asked, up to ``elite``): those the validity
        classifier thinks likely valid first, then the ones it doubts, each by the model's
        fastest first.

        A surrogate of a few hundred outcomes cannot rank configurations a few per cent
        apart, and on a real kernel space that is where the last gains are: on one H100 three
        default 300 s GEMM runs ended 4-6 % past the default configuration, three
        NeighbourhoodSearch runs 7-12 % (docs/tuning.md). Sweeping the best's
        neighbourhood makes the best a local optimum in fact, whatever the model says.

        The doubted neighbours are swept too, last, rather than left out: the classifier
        learns from rule and device-limit rejections as well, and near a region of them it
        doubts valid neighbours of the fastest. Left out, one of those (a work-group twice as
        wide) stood between 13 of 50 replays of the dense face-mass recording at 64 workers
        and the recording's fastest (docs/tuning.md, "The doubted neighbours")."""
        y = np.array(self._log_s)
        done = np.flatnonzero(~np.isnan(y))
        rows = np.array(self._rows)
        for centre in rows[done[np.argsort(y[done], kind="stable")[:elite]]]:
            fresh = [r for r in enc.one_step(centre) if _key(r) not in self._seen]
            if not fresh:
                continue
            pool = np.array(fresh)
            mu = _per_tree(self._surrogate, pool)[:, :, 0].mean(axis=0)
            doubted = np.zeros(len(pool), dtype=bool)
            if self._validity is not None:
                doubted = _chance_valid(self._validity, pool) < 0.5
            return [pool[i] for i in np.lexsort((mu, doubted))]
        return []

    def _stalled(self) -> float:
        """How stalled the search is, 0 to 1: the outcomes since the best last improved by
        1 %, over ``stall``."""
        y = np.array(self._log_s)
        y = np.where(np.isnan(y), np.inf, y)
        running = np.minimum.accumulate(y)
        improved = np.flatnonzero(running[1:] < running[:-1] - 0.01)
        since = len(y) - 1 - (int(improved[-1]) + 1 if len(improved) else 0)
        return min(1.0, since / self.stall)

    def _explore_share(self, stalled: float) -> float:
        """``explore``, rising to ``stalled_explore`` as the search stalls (``stalled``, from
        :meth:`_stalled`): a search stuck in one basin looks elsewhere."""
        return self.explore + (self.stalled_explore - self.explore) * stalled

    def _local_share(self, stalled: float) -> float:
        """``local``, moving to ``stalled_local`` as the search stalls (``stalled``, from
        :meth:`_stalled`): a search improving near its best sweeps the neighbourhood, one
        stuck in a broad basin spends that share spreading out and on the model instead."""
        if self.stalled_local is None:
            return self.local
        return self.local + (self.stalled_local - self.local) * stalled

    def _spread(self, enc: _Encoding) -> list[np.ndarray]:
        """Uniform draws likely valid that bring the most value combinations of three
        parameters not measured yet (nor in flight) first.

        A narrow fast region is typically a few parameters at the right values together
        (tiles that fit each other), invisible to a model with no sample there. Drawing the
        next configuration to cover unseen triples, as a covering array does, reaches every
        such combination sooner than uniform draws, and sooner than the farthest point,
        which favours the ends of every range. On the deceptive landscapes (runs 0-49 of 300
        evaluations, one worker) it ended 48 runs within 5 % of the optimum, the farthest
        point 41, covering pairs only 40. A configuration that came back invalid covers its
        combinations too, so the spread does not chase the ones only invalid draws hold."""
        d = len(enc.sizes)
        if self._cover is None:
            self._cover = _Coverage(enc.sizes)
        cover = self._cover
        cover.fold(np.array(self._rows, dtype=np.int64).reshape(-1, d))
        # The pool, its triples' codes and chances of validity are kept while no outcome
        # arrives: a fleet's spread proposals of one generation share them and only count
        # the combinations of those in flight anew.
        state = (len(self._rows), self._fitted_at)
        if self._spread_pool is None or self._spread_pool[0] != state:
            rng = self._generator()
            pool = rng.integers(0, enc.sizes, size=(self.spread_pool, d))
            ties = rng.random(len(pool)) * 1e-3  # ties broken at random
            pick = np.arange(len(cover.combos))
            if len(pick) > _MAX_TRIPLES:
                pick = np.sort(rng.choice(len(pick), size=_MAX_TRIPLES, replace=False))
            valid = np.ones(len(pool))
            if self._validity is not None:
                valid = _chance_valid(self._validity, pool)
            self._spread_pool = (state, pool, ties, pick, cover.codes(pool, pick), valid)
        _, pool, ties, pick, codes, valid = self._spread_pool
        flags = cover.flags
        if self._pending:
            flags = flags.copy()
            flags[cover.codes(np.array(list(self._pending.values())), pick)] = True
        score = ties + (~flags[codes]).sum(axis=1)
        # Rare combinations gather where proposals came back invalid: only a draw the
        # classifier is fairly sure of counts (with 0.5, a quarter of a stalled search's
        # proposals on the test space were invalid; with 0.8, under a twentieth); with none
        # sure enough, the likeliest valid come first.
        score = score * valid * (valid > _SURE_VALID)
        order = np.lexsort((-valid, -score))
        return [pool[i] for i in order[:_TRIES]]

    def _propose(self, ranked: list[np.ndarray]) -> Any:
        enc = self._encoding()
        for row in ranked[:_TRIES]:
            cfg = enc.decode(row)
            if not self._asked(cfg):
                return self._hand_out(row, cfg)
        for _ in range(_TRIES):
            cfg = self.manipulator.random()
            if not self._asked(cfg):
                break
        return self._hand_out(enc.encode(cfg), cfg)

    def _hand_out(self, row: np.ndarray, cfg: dict[str, Any]) -> dict[str, Any]:
        key = _key(row)
        if key not in self._told:
            self._pending[key] = row
        self._seen.add(key)
        return cfg

    def _asked(self, cfg: dict[str, Any]) -> bool:
        key = self.manipulator.hash_config(cfg)
        driver = self.driver
        return key in driver.measured or key in driver.first_request

    def _generator(self) -> np.random.Generator:
        return np.random.default_rng(random.getrandbits(63))

    def _uniform(self, enc: _Encoding) -> list[np.ndarray]:
        rng = self._generator()
        pool = rng.integers(0, enc.sizes, size=(_TRIES, len(enc.sizes)))
        return [r for r in pool if _key(r) not in self._seen] or list(pool)

    def _pool(self, enc: _Encoding) -> np.ndarray:
        """Candidates: half uniform draws, half neighbours of the fastest few (one step on
        one parameter, further ones with probability 0.3 each), and with ``ring`` every
        one-step neighbour of the ``ring`` fastest, those not seen dropped.

        Random neighbours leave a fast configuration's next-door ones out of the pool by
        chance, and the model never gets to rank them. The end game spends evaluations the
        deceptive landscapes' escapes needed; the ring buys them back: on the held-out
        landscapes at 16 workers (benchmarks/default_technique.py) 46 of 50 runs ended within
        5 % of the optimum with both, 43 with the end game alone, 45 with neither."""
        rng = self._generator()
        d = len(enc.sizes)
        half = self.candidates // 2
        uniform = rng.integers(0, enc.sizes, size=(half, d))
        y = np.array(self._log_s)
        done = np.flatnonzero(~np.isnan(y))
        order = done[np.argsort(y[done], kind="stable")]  # fastest first
        best = order[: self.elite]
        weights = 1.0 / (np.arange(len(best)) + 1.0)
        centres = np.array(self._rows)[rng.choice(best, size=half, p=weights / weights.sum())]
        # Each centre moves min(moves, d) parameters, those of its smallest random keys;
        # an ordered one one or (a quarter of the time) two steps either way, the other way
        # at an end; any other to another of its values.
        moves = np.minimum(rng.geometric(0.7, size=half), d)  # 1 w.p. 0.7, 2 w.p. 0.21, ...
        ranks = rng.random((half, d)).argsort(axis=1).argsort(axis=1)
        move = (ranks < moves[:, None]) & (enc.sizes >= 2)[None, :]
        step = rng.choice((-1, 1), size=(half, d)) * (1 + (rng.random((half, d)) < 0.25))
        stepped = centres + step
        stepped = np.where((stepped < 0) | (stepped >= enc.sizes), centres - step, stepped)
        stepped = np.clip(stepped, 0, enc.sizes - 1)
        other = (centres + rng.integers(1, np.maximum(enc.sizes, 2), size=(half, d))) % enc.sizes
        local = np.where(move, np.where(enc.ordered, stepped, other), centres)
        ring = [r for i in order[: self.ring] for r in enc.one_step(self._rows[i])]
        pool = np.concatenate([np.array(ring, dtype=np.int64).reshape(-1, d), local, uniform])
        _, first = np.unique(pool, axis=0, return_index=True)
        pool = pool[np.sort(first)]
        fresh = np.array([_key(r) not in self._seen for r in pool], dtype=bool)
        return pool[fresh] if fresh.any() else pool

    def _best_candidates(self, enc: _Encoding) -> list[np.ndarray]:
        """The pool ranked by expected improvement x chance of validity x damping near the
        configurations the models have not learnt yet.

        The pool and its model scores are kept until the models are refitted or the best
        changes: the proposals in between walk down one ranking, each damped near the
        configurations in flight and those told since the fit (what the models do not know
        yet), so N proposals get N different ideas. Scoring a fresh pool for every outcome
        was most of a proposal's cost (64 proposals at 2,000 outcomes took 3-4 s when each
        scored a pool of its own)."""
        y = np.array(self._log_s)
        state = (self._fitted_at, int(np.nanargmin(y)))
        if self._scored is None or self._scored[0] != state:
            pool = self._pool(enc)
            base, valid = self._score(pool)
            self._scored = (state, pool, base, valid)
        _, pool, score, valid = self._scored
        fresh = np.array([_key(r) not in self._seen for r in pool], dtype=bool)
        score = np.where(fresh, score, 0.0)
        unknown = [*self._pending.values(), *self._rows[max(self._fitted_at, 0) :]]
        if unknown:
            score = score * (1.0 - np.exp(-0.5 * enc.distance2(pool, np.array(unknown))))
        # Trees extrapolate a fast region's time into the invalid box beside it: a likely
        # invalid candidate comes after every likely valid one, whatever its score.
        order = np.lexsort((-score, valid < 0.5, ~fresh))
        return [pool[i] for i in order[:_TRIES]]

    def _score(self, pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Expected improvement (log seconds) x chance of validity, and that chance."""
        from scipy.special import ndtr

        per_tree = _per_tree(self._surrogate, pool)[:, :, 0]
        mu = per_tree.mean(axis=0)
        sigma = np.maximum(per_tree.std(axis=0), 1e-3)
        best = float(np.nanmin(np.array(self._log_s)))
        gain = best - mu
        z = gain / sigma
        ei = gain * ndtr(z) + sigma * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        score = np.maximum(ei, 1e-12)
        if self._validity is None:
            return score, np.ones(len(pool))
        valid = _chance_valid(self._validity, pool)
        return score * valid, valid
