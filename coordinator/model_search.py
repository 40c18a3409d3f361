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
valid, times an **in-flight damping** ``1 - exp(-d^2 / 2)`` where ``d`` is the candidate's
distance (in steps of ordered parameters, one per differing switch or unordered choice) to
the nearest configuration proposed and not yet answered: N workers in flight get N different
ideas, not N copies of one. Every proposal until ``initial`` configurations have a time is a
uniform draw; after that a share of proposals spreads out instead: uniform draws the
classifier is fairly sure are valid, those that bring the most value combinations of three
parameters not seen yet first (:meth:`ModelSearch._spread`). The share is ``explore`` (0.1)
while the search improves and rises to ``stalled_explore`` (0.8) as the outcomes since the
best last improved by 1 % reach ``stall`` (30): the model cannot see a narrow basin it has no
sample near, so a search stuck in a broad one looks elsewhere. On the deceptive landscapes
of :mod:`.landscape` (benchmarks/search_quality.py, runs 0-49 of 300 evaluations) 48 of 50
runs at 1 worker and 48 of 50 at 16 ended within 5 % of the optimum (spreading to the
farthest point instead: 41 and 47 of 50).
Parameter effects stay estimable for the same reason.

Configurations are encoded as the index of each parameter's value (OpenTuner's parameters
as :mod:`.mapping` makes them: integers and powers of two by their step, switches 0/1,
unordered choices by option index, which trees split without assuming an order).

scikit-learn comes with the ``importance`` extra; :func:`require_model` names the missing
package in one line, and :func:`tunefleet.coordinator.tuner.check_techniques` calls it for
every technique that needs it.

Every random draw comes from the ``random`` module (swapped per search by
:class:`~.tuner.Tuner`), so a seeded search repeats exactly.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import numpy as np
from opentuner.search.manipulator import BooleanParameter, EnumParameter, NumericParameter
from opentuner.search.technique import SearchTechnique

from tunefleet.errors import UsageError

#: Techniques of this module (their names as registered), for :func:`require_model`.
MODEL_TECHNIQUES = ("ModelSearch",)
#: Tries before a proposal falls back to a uniform draw when every candidate was asked.
_TRIES = 24
#: Most triples of parameters a spread proposal counts (220 for twelve parameters).
_MAX_TRIPLES = 256
#: The validity classifier's chance a spread proposal needs.
_SURE_VALID = 0.8


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


def _key(row: np.ndarray) -> bytes:
    return row.astype(np.int16).tobytes()


class ModelSearch(SearchTechnique):  # type: ignore[misc]
    """Expected improvement on an extra-trees surrogate, validity-aware and in-flight-aware."""

    def __init__(
        self,
        initial: int = 12,
        explore: float = 0.1,
        candidates: int = 1024,
        trees: int = 32,
        elite: int = 5,
        refit: float = 0.05,
        stalled_explore: float = 0.8,
        stall: int = 30,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.initial = initial
        self.explore = explore
        self.candidates = candidates
        self.trees = trees
        self.elite = elite
        self.refit = refit
        self.stalled_explore = stalled_explore
        self.stall = stall
        self._enc: _Encoding | None = None
        self._rows: list[np.ndarray] = []
        self._log_s: list[float] = []  # log seconds, nan where no time
        self._told: set[bytes] = set()  # configurations with an outcome
        self._seen: set[bytes] = set()  # those and the ones proposed
        self._pending: dict[bytes, np.ndarray] = {}
        self._fitted_at = -1
        self._surrogate: Any = None
        self._validity: Any = None
        # (outcomes known, fitted at), candidate pool, its scores, its chance of validity.
        self._scored: tuple[tuple[int, int], np.ndarray, np.ndarray, np.ndarray] | None = None
        # Every triple of varied parameters with its mixed radix (the space never changes).
        self._all_triples: list[tuple[tuple[int, int, int], np.ndarray]] | None = None

    @classmethod
    def get_hyper_parameters(cls) -> list[str]:
        return [
            "initial",
            "explore",
            "candidates",
            "trees",
            "elite",
            "refit",
            "stalled_explore",
            "stall",
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
        if self._fitted_at >= 0 and n - self._fitted_at < max(1, self.refit * self._fitted_at):
            return self._surrogate is not None
        require_model()
        from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor

        x = np.array(self._rows, dtype=float)
        y = np.array(self._log_s)
        ok = ~np.isnan(y)
        self._fitted_at = n
        if ok.sum() < 2:
            self._surrogate = None
            return False
        seed = random.getrandbits(31)
        self._surrogate = ExtraTreesRegressor(n_estimators=self.trees, random_state=seed).fit(
            x[ok], y[ok]
        )
        self._validity = None
        if 0 < ok.sum() < n:
            self._validity = ExtraTreesClassifier(
                n_estimators=self.trees // 2, random_state=seed
            ).fit(x, ok)
        return True

    # --- proposing --------------------------------------------------------------------------
    def desired_configuration(self) -> Any:
        enc = self._encoding()
        measured = int(np.sum(~np.isnan(np.array(self._log_s)))) if self._log_s else 0
        if measured < self.initial or not self._fit():
            return self._propose(self._uniform(enc))
        if random.random() < self._explore_share():
            return self._propose(self._spread(enc))
        return self._propose(self._best_candidates(enc))

    def _explore_share(self) -> float:
        """``explore``, rising to ``stalled_explore`` as the outcomes since the best last
        improved by 1 % grow to ``stall`` : a search stuck in one basin looks elsewhere."""
        y = np.array(self._log_s)
        y = np.where(np.isnan(y), np.inf, y)
        running = np.minimum.accumulate(y)
        improved = np.flatnonzero(running[1:] < running[:-1] - 0.01)
        since = len(y) - 1 - (int(improved[-1]) + 1 if len(improved) else 0)
        return self.explore + (self.stalled_explore - self.explore) * min(1.0, since / self.stall)

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
        rng = self._generator()
        d = len(enc.sizes)
        pool = rng.integers(0, enc.sizes, size=(256, d))
        seen = np.array([*self._rows, *self._pending.values()], dtype=np.int64).reshape(-1, d)
        score = rng.random(len(pool)) * 1e-3  # ties broken at random
        for combo, radix in self._triples(enc, rng):
            covered = np.isin(pool[:, combo] @ radix, seen[:, combo] @ radix)
            score += ~covered
        valid = np.ones(len(pool))
        if self._validity is not None:
            classes = list(self._validity.classes_)
            valid = self._validity.predict_proba(pool.astype(float))[:, classes.index(True)]
        # Rare combinations gather where proposals came back invalid: only a draw the
        # classifier is fairly sure of counts (with 0.5, a quarter of a stalled search's
        # proposals on the test space were invalid; with 0.8, under a twentieth); with none
        # sure enough, the likeliest valid come first.
        score = score * valid * (valid > _SURE_VALID)
        order = np.lexsort((-valid, -score))
        return [pool[i] for i in order[:_TRIES]]

    def _triples(
        self, enc: _Encoding, rng: np.random.Generator
    ) -> list[tuple[tuple[int, int, int], np.ndarray]]:
        """Triples of parameters with more than one value, each with the mixed radix that
        codes its values as one integer (at most ``_MAX_TRIPLES`` of them, drawn afresh each
        time, so a space of many parameters stays cheap). The full list is built once."""
        if self._all_triples is None:
            varied = [j for j in range(len(enc.sizes)) if enc.sizes[j] > 1]
            self._all_triples = [
                (c, np.array([math.prod(int(enc.sizes[j]) for j in c[i + 1 :]) for i in range(3)]))
                for c in itertools.combinations(varied, 3)
                if math.prod(int(enc.sizes[j]) for j in c) < 2**62
            ]
        triples = self._all_triples
        if len(triples) > _MAX_TRIPLES:
            picked = rng.choice(len(triples), size=_MAX_TRIPLES, replace=False)
            triples = [triples[i] for i in sorted(picked)]
        return triples

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
        one parameter, further ones with probability 0.3 each), those not seen dropped."""
        rng = self._generator()
        d = len(enc.sizes)
        half = self.candidates // 2
        uniform = rng.integers(0, enc.sizes, size=(half, d))
        y = np.array(self._log_s)
        done = np.flatnonzero(~np.isnan(y))
        best = done[np.argsort(y[done], kind="stable")[: self.elite]]
        weights = 1.0 / (np.arange(len(best)) + 1.0)
        centres = np.array(self._rows)[rng.choice(best, size=half, p=weights / weights.sum())]
        local = centres.copy()
        moves = rng.geometric(0.7, size=half)  # 1 with probability 0.7, 2 with 0.21, ...
        for i in range(half):
            for j in rng.choice(d, size=min(int(moves[i]), d), replace=False):
                size = int(enc.sizes[j])
                if size < 2:
                    continue
                if enc.ordered[j]:
                    step = int(rng.choice((-1, 1))) * (1 + int(rng.random() < 0.25))
                    moved = centres[i, j] + step
                    if not 0 <= moved < size:  # at an end: the other way
                        moved = centres[i, j] - step
                    local[i, j] = min(max(moved, 0), size - 1)
                else:
                    local[i, j] = (local[i, j] + rng.integers(1, size)) % size
        pool = np.concatenate([local, uniform])
        _, first = np.unique(pool, axis=0, return_index=True)
        pool = pool[np.sort(first)]
        fresh = np.array([_key(r) not in self._seen for r in pool], dtype=bool)
        return pool[fresh] if fresh.any() else pool

    def _best_candidates(self, enc: _Encoding) -> list[np.ndarray]:
        """The pool ranked by expected improvement x chance of validity x in-flight damping.

        The pool and its model scores are kept while no outcome arrives: a fleet's N
        proposals in one generation are scored once and only re-damped for those in flight
        (64 proposals at 2,000 outcomes took 3-4 s when each scored a pool of its own)."""
        state = (len(self._rows), self._fitted_at)
        if self._scored is None or self._scored[0] != state:
            pool = self._pool(enc)
            base, valid = self._score(pool)
            self._scored = (state, pool, base, valid)
        _, pool, score, valid = self._scored
        fresh = np.array([_key(r) not in self._seen for r in pool], dtype=bool)
        score = np.where(fresh, score, 0.0)
        if self._pending:
            pending = np.array(list(self._pending.values()))
            score = score * (1.0 - np.exp(-0.5 * enc.distance2(pool, pending)))
        # Trees extrapolate a fast region's time into the invalid box beside it: a likely
        # invalid candidate comes after every likely valid one, whatever its score.
        order = np.lexsort((-score, valid < 0.5, ~fresh))
        return [pool[i] for i in order[:_TRIES]]

    def _score(self, pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Expected improvement (log seconds) x chance of validity, and that chance."""
        from scipy.special import ndtr

        x = pool.astype(float)
        per_tree = np.stack([t.predict(x) for t in self._surrogate.estimators_])
        mu = per_tree.mean(axis=0)
        sigma = np.maximum(per_tree.std(axis=0), 1e-3)
        best = float(np.nanmin(np.array(self._log_s)))
        gain = best - mu
        z = gain / sigma
        ei = gain * ndtr(z) + sigma * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        score = np.maximum(ei, 1e-12)
        if self._validity is None:
            return score, np.ones(len(pool))
        classes = list(self._validity.classes_)
        valid = self._validity.predict_proba(x)[:, classes.index(True)]
        return score * valid, valid
