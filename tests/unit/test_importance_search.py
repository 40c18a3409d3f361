"""Importance after a search: a planted landscape whose speed two register tiles decide
(tests/helpers/planted.py), searched device-free for 300 trials, must name both among its
first three parameters: after the default search (which spends a share of its proposals
spreading over the space, so the forest sees every parameter's effect, and its last 15 %
next to the best, so the report ranks by local effects), and after a local
search that looked in one place (NeighbourhoodSearch, the default before), where the report
says which parameters the search kept at one value and ranks by local effects."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.helpers import planted
from tunefleet import importance
from tunefleet.cli import importance as cli_importance


def first_three(report):
    return [p["name"] for p in report["parameters"]][:3]


LOCAL = ["NeighbourhoodSearch"]


def test_the_default_search_names_both_decisive_parameters_among_its_first_three():
    # 16 workers: the same search as one worker's, asked for a fleet (and faster here).
    report = importance.analyse(planted.search(0, workers=16), seed=0)
    assert set(planted.DECISIVE) <= set(first_three(report)), first_three(report)
    # The forest alone names them too: the spread share moves every parameter across its
    # range. The end game spends the last 15 % of the trials next to the best, which
    # concentrates the sample (62 % of it shares reg_j = 4 here), so the report ranks by
    # local effects, and says so.
    by_forest = sorted(report["parameters"], key=lambda p: -p["speed"]["forest"])
    assert set(planted.DECISIVE) <= {p["name"] for p in by_forest[:3]}
    assert report["forest"]["oob_r2"] > 0.5
    assert report["ranked_by"] == "local"
    assert report["notes"][-1].startswith("ranked by local effects")


# Seeds 2, 5 and 6: the forest alone ranked a decisive tile 4th or lower.
@pytest.mark.parametrize("seed", [0, 2, 5, 6])
def test_a_local_search_names_both_decisive_parameters_among_its_first_three(seed):
    report = importance.analyse(planted.search(seed, techniques=LOCAL), seed=0)
    assert set(planted.DECISIVE) <= set(first_three(report)), first_three(report)
    assert report["ranked_by"] == "local"
    notes = report["notes"]
    assert any("of measured trials share reg_" in n for n in notes), notes
    assert notes[-1].startswith("ranked by local effects")


def test_a_spread_sample_is_ranked_by_the_forest_without_notes():
    rng = random.Random(1)
    rows = []
    for _ in range(600):
        c = planted.SPACE.sample(rng)
        t = planted.seconds(c)
        rows.append({"config": c, "state": "done" if t else "invalid", "median_s": t})
    report = importance.analyse(rows, seed=0)
    assert (report["ranked_by"], report["notes"]) == ("forest", [])
    assert set(first_three(report)) >= set(planted.DECISIVE)


def test_local_effects_average_the_pairs_that_differ_in_one_parameter_alone():
    codes = np.array([[0, 0], [1, 0], [2, 0], [0, 1], [1, 1]])
    y = np.array([0.0, 1.0, 3.0, 0.5, 5.0])
    # Column 0: pairs within rows {0,1,2} (|1|, |3|, |2|) and {3,4} (|4.5|).
    # Column 1: pairs {0,3} (0.5) and {1,4} (4.0); row 2 has no partner.
    assert importance.local_effects(codes, y) == [(pytest.approx(10.5 / 4), 4), (2.25, 2)]
    assert importance.local_effects(codes[:1], y[:1]) == [(None, 0), (None, 0)]


def test_the_text_report_carries_the_notes_and_the_local_column():
    data = importance.analyse(planted.search(2, techniques=LOCAL), seed=0)
    data["run"] = {"run_id": 1, "problem": "planted", "problem_args": {}, "device_class": "any"}
    data["scope"] = {"run_id": 1, "all_runs": False, "runs": [1]}
    text = cli_importance.text(data)
    assert "note: " in text and "% of measured trials share reg_" in text
    assert "LOCAL EFFECT" in text


def test_local_effects_equal_a_pair_by_pair_count():
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 3, size=(60, 3))
    y = rng.random(60)
    for j, (effect, pairs) in enumerate(importance.local_effects(codes, y)):
        diffs = [
            abs(y[a] - y[b])
            for a in range(60)
            for b in range(a + 1, 60)
            if all(codes[a, k] == codes[b, k] for k in range(3) if k != j)
        ]
        assert (effect, pairs) == (pytest.approx(float(np.mean(diffs))), len(diffs))
