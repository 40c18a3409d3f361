"""The importance analysis on data whose answer is known: the synthetic objective (every
configuration, or a search-like sample of them) made to depend on chosen parameters only,
invalid configurations decided by chosen values, and the corner cases (nothing measured, one
value, several runs of one configuration)."""

from __future__ import annotations

import itertools
import math
import random
import sys
from typing import Any

import numpy as np
import pytest

from tunefleet import importance
from tunefleet.problems.synthetic import PARAMETERS, Synthetic, invalid_by_value, objective


def synthetic_rows(
    depends_on: tuple[str, ...] = PARAMETERS,
    invalid_values: dict[str, list[Any]] | None = None,
    noise: float = 0.0,
    sample: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Trials of the synthetic space: every configuration, or ``sample`` of them drawn around
    the optimum like a search would (most near it, a few anywhere)."""
    space = Synthetic().space({})
    configs = [
        dict(zip(space.names(), combo, strict=True))
        for combo in itertools.product(*(p.values() for p in space))
    ]
    rng = random.Random(seed)
    if sample is not None:
        # Biased like a search: configurations close to the optimum are more likely.
        weights = [1.0 / objective(c) ** 3 for c in configs]
        configs = list({id(c): c for c in rng.choices(configs, weights, k=sample)}.values())
    args = {"invalid_values": invalid_values or {}}
    rows = []
    for i, c in enumerate(configs, start=1):
        if invalid_by_value(args, c):
            rows.append({"run_id": 1, "trial_id": i, "config": c, "state": "invalid"})
            continue
        t = objective(c, depends_on) * (1 + noise * rng.random())
        rows.append(
            {
                "run_id": 1,
                "trial_id": i,
                "config": c,
                "state": "done",
                "median_s": t,
                "gflops": 2e6 / t / 1e9,
            }
        )
    return rows


def ranked(report: dict[str, Any], key: str = "speed") -> list[str]:
    return (
        [p["name"] for p in report["parameters"]]
        if key == "speed"
        else [
            p["name"]
            for p in sorted(report["parameters"], key=lambda p: -(p["validity"]["variance"] or 0))
        ]
    )


def share(report: dict[str, Any], name: str, method: str) -> float | None:
    return next(p for p in report["parameters"] if p["name"] == name)["speed"][method]


@pytest.mark.parametrize("method", ["variance", "forest"])
def test_on_every_configuration_the_parameters_the_time_depends_on_rank_first(method):
    rows = synthetic_rows(depends_on=("tile", "order"))
    report = importance.analyse(rows, method=method)
    assert report["method"] == method
    assert set(ranked(report)[:2]) == {"tile", "order"}
    for name in ("unroll", "vector"):
        assert share(report, name, method) < 0.02, report["parameters"]
    assert share(report, "tile", method) > 0.25 and share(report, "order", method) > 0.25


@pytest.mark.parametrize("depends_on", [("unroll",), ("vector", "tile"), ("order", "unroll")])
def test_on_a_search_like_sample_with_noise_the_chosen_parameters_rank_first(depends_on):
    rows = synthetic_rows(depends_on=depends_on, noise=0.05, sample=150, seed=len(depends_on))
    for method in ("variance", "forest"):
        report = importance.analyse(rows, method=method)
        assert set(ranked(report)[: len(depends_on)]) == set(depends_on), (method, report)


def test_on_every_configuration_variance_is_the_exact_first_order_index():
    """Uniform data: eta-squared is the Sobol first-order index, computed here by hand from
    the objective's conditional means; the forest's estimate lands near it."""
    rows = synthetic_rows()
    report = importance.analyse(rows, method="forest")
    y = np.log([r["median_s"] for r in rows])
    for name in PARAMETERS:
        groups: dict[Any, list[float]] = {}
        for r, v in zip(rows, y, strict=True):
            groups.setdefault(r["config"][name], []).append(v)
        exact = np.var([np.mean(g) for g in groups.values()]) / np.var(y)
        p = next(p for p in report["parameters"] if p["name"] == name)
        assert p["speed"]["eta2"] == pytest.approx(exact, rel=1e-9)
        assert p["speed"]["forest"] == pytest.approx(exact, abs=0.05)
    forest = report["forest"]
    assert forest["fitted"] and forest["oob_r2"] > 0.9 and forest["space_points"] == 512
    # log time is nearly additive in this objective: little is left for interactions.
    assert 0 <= forest["interactions"] < 0.1


def test_chance_alone_gets_little_importance_after_the_correction():
    """Noise only: with 8 values on 40 trials eta-squared is about 7/39 by chance; the
    corrected share averages near zero."""
    rng = np.random.default_rng(3)
    eta, eps = [], []
    for _ in range(200):
        codes = rng.integers(0, 8, 40)
        e, c = importance.between_share(codes, rng.normal(size=40), 8)
        eta.append(e)
        eps.append(c)
    assert np.mean(eta) == pytest.approx(7 / 39, abs=0.03)
    assert np.mean(eps) < 0.05


def test_validity_ranks_the_parameter_whose_values_make_configurations_invalid():
    rows = synthetic_rows(depends_on=("tile",), invalid_values={"unroll": [7, 8]})
    report = importance.analyse(rows, method="variance")
    assert ranked(report, "validity")[0] == "unroll"
    unroll = next(p for p in report["parameters"] if p["name"] == "unroll")
    rates = {v["value"]: v["fail_rate"] for v in unroll["values"]}
    assert rates == {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 1, 8: 1}
    assert unroll["validity"]["variance"] > 0.9
    # Invalid configurations are counted, never timed: unroll=7 has no time at all.
    seven = next(v for v in unroll["values"] if v["value"] == 7)
    assert (seven["trials"], seven["measured"], seven["invalid"], seven["time_s"]) == (
        64,
        0,
        64,
        None,
    )
    assert report["invalid"] == 128 and report["measured"] == 384
    # The speed ranking sees only measured configurations: tile still decides it.
    assert ranked(report)[0] == "tile"
    for p in report["parameters"]:
        if p["name"] != "unroll":
            assert p["validity"]["variance"] == 0.0


def test_values_counts_quartiles_and_the_top_against_the_rest():
    rows = synthetic_rows(depends_on=("tile", "order"))
    rows[0]["state"], rows[1]["state"], rows[2]["state"] = "failed", "timed_out", "invalid"
    for r in rows[:3]:
        del r["median_s"], r["gflops"]
    report = importance.analyse(rows, method="variance", top=5)
    for p in report["parameters"]:
        assert sum(v["trials"] for v in p["values"]) == 512
        assert sum(v["measured"] for v in p["values"]) == 509
        for v in p["values"]:
            if v["time_s"]:
                t = v["time_s"]
                assert t["min"] <= t["q1"] <= t["median"] <= t["q3"] <= t["max"]
                g = v["gflops"]
                assert g["max"] == pytest.approx(2e6 / t["min"] / 1e9)
    tile = next(p for p in report["parameters"] if p["name"] == "tile")
    assert [v["value"] for v in tile["values"]] == [1, 2, 4, 8, 16, 32, 64, 128]
    order = next(p for p in report["parameters"] if p["name"] == "order")
    assert [v["label"] for v in order["values"]] == ["ijk", "ikj", "jik", "jki"]
    top = report["top"]
    assert top["n"] == 5 and len(top["lines"]) == 5 and top["rest_total"] == 504
    assert len(top["rest"]) == importance.MAX_REST_LINES
    times = [ln["median_s"] for ln in top["lines"]]
    assert times == sorted(times) and times[0] == report["best"]["median_s"]
    assert max(times) <= min(ln["median_s"] for ln in top["rest"])
    # The codes index each parameter's values, in the report's order of parameters.
    best = top["lines"][0]
    values = {p["name"]: p["values"] for p in report["parameters"]}
    config = {n: values[n][c]["value"] for n, c in zip(top["order"], best["codes"], strict=True)}
    assert config == report["best"]["config"]
    assert (report["failed"], report["timed_out"], report["invalid"]) == (1, 1, 1)


def test_nothing_measured_or_one_value_gives_no_importance_but_counts():
    rows = [
        {"run_id": 1, "trial_id": i, "config": {"a": i % 2, "b": "x"}, "state": "invalid"}
        for i in range(6)
    ]
    report = importance.analyse(rows, method="auto")
    assert report["measured"] == 0 and report["best"] is None and report["top"]["lines"] == []
    for p in report["parameters"]:
        assert p["speed"] == {"variance": None, "eta2": None, "forest": None, "local": None}
    assert not report["forest"]["fitted"] and "measured" in report["forest"]["reason"]
    b = next(p for p in report["parameters"] if p["name"] == "b")
    assert b["values"][0]["trials"] == 6 and b["validity"]["variance"] is None


def test_a_parameter_missing_from_some_configurations_is_its_own_value():
    rows = [
        {"config": {"a": 1, "b": 2}, "state": "done", "median_s": 1.0},
        {"config": {"a": 2}, "state": "done", "median_s": 2.0},
        {"config": {"a": 1, "b": [1, 2]}, "state": "done", "median_s": 3.0},
    ]
    report = importance.analyse(rows, method="variance")
    b = next(p for p in report["parameters"] if p["name"] == "b")
    assert [v["label"] for v in b["values"]] == ["2", "[1,2]", "(missing)"]


def test_dedupe_keeps_one_row_per_configuration_across_runs():
    c1, c2, c3 = {"a": 1}, {"a": 2}, {"a": 3}
    rows = [
        {"run_id": 1, "trial_id": 1, "config": c1, "state": "done", "median_s": 1.0, "gflops": 4.0},
        {"run_id": 2, "trial_id": 7, "config": c1, "state": "done", "median_s": 4.0, "gflops": 1.0},
        {"run_id": 1, "trial_id": 2, "config": c2, "state": "invalid"},
        {"run_id": 2, "trial_id": 8, "config": c2, "state": "done", "median_s": 2.0},
        {"run_id": 2, "trial_id": 9, "config": c3, "state": "timed_out"},
    ]
    out = {r["config"]["a"]: r for r in importance.dedupe(rows)}
    assert out[1]["median_s"] == pytest.approx(2.0)  # geometric mean of 1 and 4
    assert (out[1]["trial_id"], out[1]["gflops"], out[1]["measurements"]) == (1, 4.0, 2)
    assert out[2]["state"] == "done" and out[2]["run_id"] == 2
    assert out[3]["state"] == "timed_out"
    report = importance.report(rows, run_id=2, all_runs=True, method="variance")
    assert report["scope"] == {"run_id": 2, "all_runs": True, "runs": [1, 2]}
    assert report["trials"] == 3


def test_without_scikit_learn_auto_falls_back_and_forest_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    reason = importance.forest_available()
    assert reason is not None and "tunefleet[importance]" in reason
    rows = synthetic_rows(depends_on=("tile",))
    report = importance.analyse(rows, method="auto")
    assert report["method"] == "variance" and report["forest"]["reason"] == reason
    assert ranked(report)[0] == "tile"
    with pytest.raises(importance.ForestUnavailable, match="scikit-learn"):
        importance.analyse(rows, method="forest")


def test_the_report_is_plain_json():
    import json

    rows = synthetic_rows(sample=60)
    report = importance.analyse(rows, method="forest")
    text = json.dumps(report, allow_nan=False)
    assert math.isfinite(json.loads(text)["forest"]["oob_r2"])


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100])
def test_quartiles_interpolate_as_numpy_does(n):
    values = np.random.default_rng(n).random(n)
    q = importance._quartiles(values)
    assert q is not None
    assert list(q.values()) == pytest.approx(list(np.quantile(values, [0, 0.25, 0.5, 0.75, 1])))
