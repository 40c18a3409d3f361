"""Which parameters decide a run's speed, and which make configurations fail: pure analysis.

Input: the finished search trials of a run (or of every run of a cache key), each a mapping
with ``config``, ``state`` and, for ``done`` trials, ``median_s`` (``gflops`` optional). No
database here; :func:`tunefleet.queries.dashboard.importance_trials` reads the rows.

Two methods, both on ``y = log(median time)`` of the measured (``done``) configurations, so a
parameter that doubles the time counts the same on a fast and on a slow kernel:

``variance`` (NumPy only, always computed)
    For each parameter alone, the share of the variance of ``y`` that lies *between* its
    values: ``SS_between / SS_total`` (the correlation ratio eta-squared, a first-order /
    main-effect index estimated from the measured sample), corrected for what chance gives a
    parameter with ``k`` values on ``n`` trials (epsilon-squared:
    ``(SS_between - (k - 1) SS_within / (n - k)) / SS_total``, clipped at 0). A search samples
    the space unevenly and its parameters move together, so a parameter that merely travels
    with an important one gets credit too; the per-value counts show how each was sampled.

``forest`` (needs scikit-learn: ``pip install 'tunefleet[importance]'``)
    A random forest of ``y`` on every parameter (values as ordered codes), with its
    out-of-bag R^2 as the fit's quality: the share of the variance of log time it predicts on
    configurations each tree did not see (near 0 or below: the forest learned nothing, do not
    trust its importances). The importance of a parameter is the fANOVA-style first-order
    index of the fitted forest over the whole space of measured values, every combination
    equally likely: ``Var_v(E[f | p = v]) / Var(f)``, the expectations estimated on a fixed
    sample of that product space (every point of it when small). It removes the search's
    uneven sampling; ``interactions`` is what the main effects leave (``1 - sum``).

``local`` (NumPy only, always computed; what ranks a concentrated sample)
    The search's own one-parameter moves: for each parameter, every pair of measured
    configurations that differ in that parameter alone, and the mean absolute difference of
    their ``y`` (the elementary effect of screening designs, ``mu*``), with how many pairs
    there were. A local search stays near its best and moves one parameter at a time, so its
    sample holds few configurations far from where it looked but many such pairs: the
    effect of a parameter the search kept at one value is still measured, at the places the
    search tried another value. Both methods above need the sample to spread: where the
    search kept a parameter at one value in most trials (at least :data:`CONCENTRATED` of
    them; ``concentration``), a forest fitted there barely sees that parameter's effect and
    ranks it low whatever it is. The report then says which parameters are concentrated
    (``notes``) and ranks by ``local`` (``ranked_by``) where every parameter has at least
    :data:`LOCAL_MIN_PAIRS` pairs; a spread sample (every configuration, uniform draws) is
    ranked by the forest as before.

Failures are counted separately: a configuration that gave no time (``invalid``, ``failed`` or
``timed_out``) is not a slow one. Per value: how many finished, were measured, invalid,
failed or timed out, and the failure rate; per parameter a *validity* importance: the same
between-value share (epsilon-squared) of the 0/1 "gave no time" indicator over every finished
configuration (for a 0/1 outcome eta-squared is the chi-square statistic per trial of the
parameter-by-outcome table).

The result is plain JSON (:func:`analyse`): parameters ranked by importance (forest where it
was fitted, else variance), their values with counts and quartiles of time and GFLOP/s (the
box plots), and the top configurations against the rest (the parallel-coordinates view).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from operator import methodcaller
from typing import Any

import numpy as np

from tunefleet.vocabulary import FAULT_TRIAL_STATES, TrialState

#: Methods a caller may ask for ("auto": forest where scikit-learn is installed).
METHODS = ("auto", "variance", "forest")
#: Trial states that gave no time, counted separately from slow ones.
FAILED_STATES = tuple(str(s) for s in FAULT_TRIAL_STATES)
#: Measured configurations a forest needs before it is fitted at all.
FOREST_MIN_MEASURED = 12
#: Trees of the forest; each sees a bootstrap sample of at most FOREST_MAX_SAMPLES rows.
FOREST_TREES = 100
FOREST_MAX_SAMPLES = 2000
#: Points of the product space the forest's marginals are averaged over.
MARGINAL_SAMPLE = 512
#: Most "rest" lines of the parallel-coordinates view (evenly spaced by speed).
MAX_REST_LINES = 400
MISSING = "(missing)"
#: A parameter is concentrated when this share of the measured trials (and twice the uniform
#: share of a value) has one of its values.
CONCENTRATED = 0.5
#: One-parameter pairs every parameter needs before ``local`` ranks a concentrated sample.
LOCAL_MIN_PAIRS = 3

Row = Mapping[str, Any]


class ForestUnavailable(Exception):
    """scikit-learn is not installed: the forest method cannot run."""


def forest_available() -> str | None:
    """``None`` when the forest method can run, else the one-line reason it cannot."""
    import importlib.util

    # Found, not imported: importing scikit-learn takes seconds, paid only when a forest is
    # fitted.
    try:
        spec = importlib.util.find_spec("sklearn")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return (
            "the forest method needs scikit-learn: pip install 'tunefleet[importance]' "
            "(the variance method needs only NumPy)"
        )
    return None


# --- values -------------------------------------------------------------------------------


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


_SCALARS = {str, int, float, bool, type(None)}


def _value_key(value: Any) -> Any:
    """A hashable key equal for equal JSON values and different for different ones (``1``,
    ``1.0`` and ``true`` are three values, as in the space); cheap for scalars, which almost
    every value is."""
    if value is _ABSENT:
        return ("absent",)
    if value is None or isinstance(value, str | bool | int | float):
        return (type(value).__name__, value)
    return ("json", _key(value))


def label(value: Any) -> str:
    """How a value is shown: strings as they are, everything else as JSON."""
    if value is _ABSENT:
        return MISSING
    return value if isinstance(value, str) else _key(value)


class _Absent:
    pass


_ABSENT: Any = _Absent()


def _order(value: Any) -> tuple[int, Any]:
    """Booleans, then numbers by size, then strings, then the rest by their JSON."""
    if value is _ABSENT:
        return (4, "")
    if isinstance(value, bool):
        return (0, int(value))
    if isinstance(value, int | float):
        return (1, float(value))
    if isinstance(value, str):
        return (2, value)
    return (3, _key(value))


# --- statistics ---------------------------------------------------------------------------


def _group_of_others(codes: np.ndarray, j: int) -> np.ndarray:
    """A group number per row, equal for rows whose codes agree outside column ``j``."""
    others = np.delete(codes, j, axis=1)
    if others.shape[1] == 0:
        return np.zeros(codes.shape[0], dtype=np.int64)  # one parameter: one group
    radix = others.max(axis=0) + 1
    if math.prod(int(r) for r in radix) < 2**62:
        # One integer per row (mixed radix): much faster than unique rows.
        weights = np.cumprod(np.r_[1, radix[:-1]]).astype(np.int64)
        key = others.astype(np.int64) @ weights
        return np.asarray(np.unique(key, return_inverse=True)[1]).reshape(-1)
    return np.asarray(np.unique(others, axis=0, return_inverse=True)[1]).reshape(-1)


def local_effects(codes: np.ndarray, y: np.ndarray) -> list[tuple[float | None, int]]:
    """Per column of ``codes`` (measured configurations x parameters, value codes): the mean
    absolute difference of ``y`` over every pair of rows that differ in that column alone,
    and how many pairs there were (``None`` without a pair)."""
    n, d = codes.shape
    out: list[tuple[float | None, int]] = []
    for j in range(d):
        if n < 2:
            out.append((None, 0))
            continue
        group = _group_of_others(codes, j)
        # Sorted by group, then by y: the sum of |a - b| over a group's pairs is
        # sum_i (2i - m + 1) y_i over its m sorted values (no pair is built).
        order = np.lexsort((y, group))
        g, v = group[order], y[order]
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        sizes = np.diff(np.r_[starts, n])
        rank = np.arange(n) - np.repeat(starts, sizes)
        m = np.repeat(sizes, sizes)
        total = float(np.sum((2 * rank - m + 1) * v))
        pairs = int(np.sum(sizes * (sizes - 1) // 2))
        out.append((total / pairs if pairs else None, pairs))
    return out


def _quartiles(values: np.ndarray) -> dict[str, float] | None:
    """Best, quartiles and worst of ``values`` (linear interpolation, as ``np.quantile``),
    from one sort: called for every value of every parameter, where ``np.quantile``'s own
    overhead would cost more than the data."""
    n = values.size
    if n == 0:
        return None
    v = np.sort(values)
    out = {}
    for name, q in (("min", 0.0), ("q1", 0.25), ("median", 0.5), ("q3", 0.75), ("max", 1.0)):
        pos = (n - 1) * q
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        out[name] = float(v[lo] + (v[hi] - v[lo]) * (pos - lo))
    return out


def between_share(codes: np.ndarray, y: np.ndarray, k: int) -> tuple[float | None, float | None]:
    """``(eta2, epsilon2)`` of ``y`` grouped by ``codes`` (``0..k-1``): the share of the
    variance of ``y`` between the groups, raw and corrected for chance (clipped at 0).
    ``(None, None)`` when undefined: fewer than two groups present, no more trials than
    groups, or ``y`` constant."""
    n = y.size
    counts = np.bincount(codes, minlength=k)
    present = int(np.count_nonzero(counts))
    if present < 2 or n <= present:
        return None, None
    mean = float(y.mean())
    ss_total = float(((y - mean) ** 2).sum())
    if not ss_total > 1e-12 * max(1.0, mean * mean) * n:
        return None, None
    sums = np.bincount(codes, weights=y, minlength=k)
    nz = counts > 0
    group_means = sums[nz] / counts[nz]
    ss_between = float((counts[nz] * (group_means - mean) ** 2).sum())
    ss_within = max(ss_total - ss_between, 0.0)
    eta2 = min(max(ss_between / ss_total, 0.0), 1.0)
    eps2 = (ss_between - (present - 1) * ss_within / (n - present)) / ss_total
    return eta2, min(max(eps2, 0.0), 1.0)


# --- the analysis -------------------------------------------------------------------------


def dedupe(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """One row per configuration, for trials of several runs: measured if any run measured
    it (the geometric mean of the measured times, the best GFLOP/s), else the failure of its
    first trial. Rows keep ``trial_id`` and ``run_id`` of the fastest measurement."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(_key(r["config"]), []).append(r)
    out: list[dict[str, Any]] = []
    for members in groups.values():
        done = [m for m in members if m["state"] == TrialState.DONE and _time(m) is not None]
        if not done:
            out.append(dict(members[0]))
            continue
        fastest = min(done, key=lambda m: (_time(m), m.get("trial_id") or 0))
        row = dict(fastest)
        row["median_s"] = math.exp(sum(math.log(_time(m) or 1.0) for m in done) / len(done))
        g = [float(m["gflops"]) for m in done if m.get("gflops") is not None]
        row["gflops"] = max(g) if g else None
        row["measurements"] = len(done)
        out.append(row)
    out.sort(key=lambda r: (r.get("run_id") or 0, r.get("trial_id") or 0))
    return out


def _time(row: Row) -> float | None:
    t = row.get("median_s")
    if t is None:
        return None
    t = float(t)
    return t if t > 0 and math.isfinite(t) else None


def analyse(
    rows: Sequence[Row],
    *,
    method: str = "auto",
    top: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """The importance report of ``rows`` (finished search trials, one per configuration) as
    JSON-ready data; see the module's docstring for what each number means.

    ``method``: ``variance`` (NumPy only), ``forest`` (raises :class:`ForestUnavailable`
    where scikit-learn is missing) or ``auto`` (forest where it can run; ``forest.reason``
    says why not). ``top``: how many of the fastest configurations the parallel-coordinates
    view sets against the rest. ``seed`` fixes the forest and its sample of the space."""
    if method not in METHODS:
        raise ValueError(f"method {method!r}: use one of {', '.join(METHODS)}")
    missing = forest_available()
    if method == "forest" and missing is not None:
        raise ForestUnavailable(missing)

    configs = [r.get("config") or {} for r in rows]
    names = sorted(str(k) for k in set().union(*configs))
    n_rows = len(rows)
    state = np.array([str(r["state"]) for r in rows] or [""], dtype=object)[:n_rows]
    # None (no time) becomes NaN.
    raw_times = np.array([r.get("median_s") for r in rows], dtype=float)
    gfl = np.array([r.get("gflops") for r in rows], dtype=float)
    with np.errstate(invalid="ignore"):
        measured_mask = (state == TrialState.DONE) & np.isfinite(raw_times) & (raw_times > 0)
    failed_mask = np.isin(state, FAILED_STATES)
    times = np.where(measured_mask, raw_times, 1.0)
    y_all = np.log(times)
    y = y_all[measured_mask] if n_rows else np.zeros(0)
    z = failed_mask.astype(float)

    params: list[dict[str, Any]] = []
    codes_all: dict[str, np.ndarray] = {}
    for name in names:
        # (map and dict built from iterators: these loops run once per trial and parameter,
        # a hundred thousand times on a big run, so they stay in C.)
        raw = list(map(methodcaller("get", name, _ABSENT), configs))
        kinds = set(map(type, raw))
        # One scalar type (the usual case): the values are their own keys (no 1 / 1.0 / True
        # of different types can meet).
        keys = raw if len(kinds) == 1 and kinds <= _SCALARS else list(map(_value_key, raw))
        distinct = dict(zip(keys, raw, strict=True))  # equal keys: equal values
        ordered_keys = sorted(distinct, key=lambda k: _order(distinct[k]))
        ordered = [distinct[k] for k in ordered_keys]
        index = {k: i for i, k in enumerate(ordered_keys)}
        codes = np.fromiter(map(index.__getitem__, keys), dtype=np.int64, count=len(keys))
        k = len(ordered)
        codes_all[name] = codes
        mcodes = codes[measured_mask]
        eta_s, eps_s = between_share(mcodes, y, k)
        eta_v, eps_v = between_share(codes, z, k) if n_rows else (None, None)
        value_rows = []
        for i, v in enumerate(ordered):
            sel = codes == i
            msel = sel & measured_mask
            n = int(sel.sum())
            done = int(msel.sum())
            states = state[sel]
            g = gfl[msel]
            g = g[~np.isnan(g)]
            best_j = int(np.flatnonzero(msel)[np.argmin(times[msel])]) if done else None
            value_rows.append(
                {
                    "value": None if v is _ABSENT else v,
                    "label": label(v),
                    "trials": n,
                    "measured": done,
                    "invalid": int((states == TrialState.INVALID).sum()),
                    "failed": int((states == TrialState.FAILED).sum()),
                    "timed_out": int((states == TrialState.TIMED_OUT).sum()),
                    "fail_rate": (n - done) / n if n else None,
                    "time_s": _quartiles(times[msel]),
                    "gflops": _quartiles(g) if g.size == done and done else None,
                    "best_trial": rows[best_j].get("trial_id") if best_j is not None else None,
                }
            )
        counts = [int((codes[measured_mask] == i).sum()) for i in range(k)]
        measured_n = sum(counts)
        common = max(range(k), key=counts.__getitem__) if k else None
        params.append(
            {
                "name": name,
                "values": value_rows,
                "speed": {"variance": eps_s, "eta2": eta_s, "forest": None, "local": None},
                "validity": {"variance": eps_v, "eta2": eta_v},
                # The value most measured trials share, and their share.
                "concentration": None
                if common is None or not measured_n
                else {"label": label(ordered[common]), "share": counts[common] / measured_n},
                "local_pairs": 0,
            }
        )

    forest: dict[str, Any] = {"fitted": False, "reason": None}
    if method in ("auto", "forest"):
        if missing is not None:
            forest["reason"] = missing
        elif int(measured_mask.sum()) < FOREST_MIN_MEASURED:
            forest["reason"] = (
                f"{int(measured_mask.sum())} measured configurations; the forest needs at "
                f"least {FOREST_MIN_MEASURED}"
            )
        elif not names:
            forest["reason"] = "the configurations have no parameters"
        else:
            try:
                forest = _forest(names, codes_all, measured_mask, y, seed)
            except ForestUnavailable as exc:
                if method == "forest":
                    raise
                forest["reason"] = str(exc)
            else:
                for p in params:
                    p["speed"]["forest"] = forest["importance"].get(p["name"])
                forest.pop("importance")
    else:
        forest["reason"] = "not asked for (--method variance)"

    use_forest = bool(forest.get("fitted"))
    if names and measured_mask.any():
        measured_codes = np.column_stack([codes_all[name][measured_mask] for name in names])
        for p, (effect, pairs) in zip(params, local_effects(measured_codes, y), strict=True):
            p["speed"]["local"], p["local_pairs"] = effect, pairs
    ranked_by, notes = _ranking(params, "forest" if use_forest else "variance")

    def rank(p: dict[str, Any]) -> tuple[float, float, str]:
        main = p["speed"][ranked_by]
        return (
            -(main if main is not None else -1.0),
            -(p["validity"]["variance"] or 0.0),
            p["name"],
        )

    params.sort(key=rank)
    measured_idx = np.flatnonzero(measured_mask)
    by_speed = measured_idx[np.argsort(times[measured_idx], kind="stable")]
    order = [p["name"] for p in params]
    top_n = max(int(top), 0)

    def line(j: int) -> dict[str, Any]:
        return {
            "trial_id": rows[j].get("trial_id"),
            "run_id": rows[j].get("run_id"),
            "codes": [int(codes_all[name][j]) for name in order],
            "median_s": float(times[j]),
            "gflops": None if np.isnan(gfl[j]) else float(gfl[j]),
        }

    rest = by_speed[top_n:]
    if rest.size > MAX_REST_LINES:
        rest = rest[np.linspace(0, rest.size - 1, MAX_REST_LINES).round().astype(int)]
    best = None
    if by_speed.size:
        j = int(by_speed[0])
        best = {
            "trial_id": rows[j].get("trial_id"),
            "run_id": rows[j].get("run_id"),
            "config": rows[j].get("config"),
            "median_s": float(times[j]),
            "gflops": None if np.isnan(gfl[j]) else float(gfl[j]),
        }
    return {
        "method": "forest" if use_forest else "variance",
        "ranked_by": ranked_by,
        "notes": notes,
        "trials": n_rows,
        "measured": int(measured_mask.sum()),
        "invalid": sum(1 for r in rows if r["state"] == TrialState.INVALID),
        "failed": sum(1 for r in rows if r["state"] == TrialState.FAILED),
        "timed_out": sum(1 for r in rows if r["state"] == TrialState.TIMED_OUT),
        "forest": forest,
        "parameters": params,
        "best": best,
        "top": {
            "n": min(top_n, int(by_speed.size)),
            "order": order,
            "lines": [line(int(j)) for j in by_speed[:top_n]],
            "rest": [line(int(j)) for j in rest],
            "rest_total": max(int(by_speed.size) - top_n, 0),
        },
    }


def _concentrated(p: Mapping[str, Any]) -> bool:
    """Whether most measured trials share one value of ``p``: at least :data:`CONCENTRATED`
    of them and twice the value's share in a uniform sample (a switch: nine in ten)."""
    if p["concentration"] is None:
        return False
    k = len(p["values"])
    return bool(p["concentration"]["share"] >= max(CONCENTRATED, min(0.9, 2 / k)))


def _ranking(params: Sequence[dict[str, Any]], method: str) -> tuple[str, list[str]]:
    """Which importance ranks the parameters (``method`` or ``local``), and the report's
    notes on where the search looked (see the module docstring)."""
    varied = [p for p in params if len(p["values"]) > 1]
    concentrated = sorted(
        (p for p in varied if _concentrated(p)),
        key=lambda p: (-p["concentration"]["share"], p["name"]),
    )
    notes = [
        f"{100 * p['concentration']['share']:.0f} % of measured trials share "
        f"{p['name']} = {p['concentration']['label']}: its effect on the whole space is "
        "barely estimable from this sample"
        for p in concentrated
    ]
    if not concentrated:
        return method, notes
    if all(p["local_pairs"] >= LOCAL_MIN_PAIRS for p in varied):
        notes.append(
            "ranked by local effects: the time change of the search's own one-parameter "
            f"moves (the {method} column reflects where the search looked)"
        )
        return "local", notes
    notes.append(
        f"too few one-parameter moves to rank by local effects: the {method} ranking "
        "reflects where the search looked; a run with uniform draws (--technique "
        "PureRandom) estimates effects over the whole space"
    )
    return method, notes


def _forest(
    names: list[str],
    codes_all: Mapping[str, np.ndarray],
    measured_mask: np.ndarray,
    y: np.ndarray,
    seed: int,
) -> dict[str, Any]:
    """Fit the forest on the measured rows and estimate its first-order indices over the
    product of the values the measured rows took (see the module's docstring)."""
    try:
        from sklearn.ensemble import RandomForestRegressor
    except ImportError as exc:
        raise ForestUnavailable(f"scikit-learn does not import: {exc}") from None

    x = np.column_stack([codes_all[n][measured_mask] for n in names]).astype(float)
    n = x.shape[0]
    model = RandomForestRegressor(
        n_estimators=FOREST_TREES,
        min_samples_leaf=2,
        max_samples=min(n, FOREST_MAX_SAMPLES),
        oob_score=True,
        random_state=seed,
        n_jobs=1,
    )
    model.fit(x, y)
    oob = float(model.oob_score_)
    # The domain: per parameter the codes its measured configurations took.
    domains = [np.unique(x[:, i]) for i in range(len(names))]
    size = math.prod(len(d) for d in domains)
    rng = np.random.default_rng(seed)
    if size <= MARGINAL_SAMPLE:
        grids = np.meshgrid(*domains, indexing="ij")
        base = np.column_stack([g.ravel() for g in grids])
    else:
        base = np.column_stack([rng.choice(d, size=MARGINAL_SAMPLE) for d in domains])
    f = model.predict(base)
    total = float(f.var())
    importance: dict[str, float | None] = {}
    if total <= 1e-15:
        importance = {name: None for name in names}
    else:
        # One prediction for every (parameter, value) probe at once: the base sample with
        # that parameter set to that value (the same sample for every value, so the
        # differences between the values' means carry little sampling noise).
        probes, spans = [], []
        for i, d in enumerate(domains):
            for v in d:
                probe = base.copy()
                probe[:, i] = v
                probes.append(probe)
            spans.append(len(d))
        means = model.predict(np.vstack(probes)).reshape(-1, base.shape[0]).mean(axis=1)
        at = 0
        for name, k in zip(names, spans, strict=True):
            share = float(np.var(means[at : at + k])) / total
            importance[name] = min(max(share, 0.0), 1.0)
            at += k
    main = sum(v for v in importance.values() if v is not None)
    return {
        "fitted": True,
        "reason": None,
        "oob_r2": oob,
        "trees": FOREST_TREES,
        "fitted_on": n,
        "space_points": size,
        "sampled_points": int(base.shape[0]),
        "interactions": max(1.0 - main, 0.0) if total > 1e-15 else None,
        "importance": importance,
    }


def report(
    rows: Sequence[Row],
    *,
    run_id: int,
    all_runs: bool = False,
    method: str = "auto",
    top: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """:func:`analyse` of the trials of one run, or of every run of its cache key
    (``all_runs``: one row per configuration, :func:`dedupe`), with ``scope``: the run, whether
    it covers every run of the key, and which runs took part."""
    runs = sorted({int(r["run_id"]) for r in rows if r.get("run_id") is not None})
    data = analyse(dedupe(rows) if all_runs else rows, method=method, top=top, seed=seed)
    data["scope"] = {"run_id": run_id, "all_runs": all_runs, "runs": runs}
    return data
