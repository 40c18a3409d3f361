"""The in-process search: no database of ours, no files, exact configurations."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunefleet.coordinator.tuner import Tuner, check_techniques
from tunefleet.errors import UsageError
from tunefleet.space import Bool, Choice, IntRange, PowerOfTwo, Space, config_hash

SPACE = Space.of(
    [
        IntRange("x", 0, 31),
        PowerOfTwo("p", 1, 64),
        Bool("flag"),
        Choice("mode", ("a", "b", "c")),
    ]
)
BEST = {"x": 20, "p": 8, "flag": True, "mode": "b"}


def seconds(c):
    if c["x"] == 5:
        return None  # invalid: infinitely slow
    return 1 + (c["x"] - 20) ** 2 + abs(c["p"] - 8) + (not c["flag"]) + (c["mode"] != "b")


def test_the_search_finds_the_optimum_and_never_repeats_a_suggestion():
    tuner = Tuner(SPACE)
    seen: set[str] = set()
    best = None
    for _ in range(60):
        batch = tuner.ask(16)
        for s in batch:
            assert s.config_hash not in seen and s.config_hash == config_hash(s.config)
            assert SPACE.check(s.config) == s.config
            seen.add(s.config_hash)
        outcomes = [(s, seconds(s.config)) for s in batch]
        tuner.tell_many(outcomes)
        for s, t in outcomes:
            if t is not None and (best is None or t < best[0]):
                best = (t, s.config)
        if best and best[1] == BEST:
            break
    tuner.close()
    assert best is not None and best[1] == BEST


def test_learned_outcomes_are_never_suggested_again():
    tuner = Tuner(Space.of([IntRange("x", 0, 9)]))
    tuner.learn([({"x": x}, float(x + 1)) for x in range(8)])
    suggested = []
    for _ in range(20):
        batch = tuner.ask(4)
        suggested += [s.config["x"] for s in batch]
        tuner.tell_many([(s, 100.0) for s in batch])
    assert set(suggested) <= {8, 9}
    assert len(suggested) == len(set(suggested))
    tuner.close()


def test_a_configuration_without_an_outcome_compares_as_infinitely_slow():
    """Regression (seen in the chaos test after a resume): differential evolution compared a
    configuration still in flight, and OpenTuner's comparison raised on its empty results."""
    tuner = Tuner(SPACE)
    try:
        told, in_flight = tuner.ask(2)
        tuner.tell(told, 0.5)
        objective = tuner._driver.objective
        a, b = told.handle.configuration, in_flight.handle.configuration
        assert objective.config_compare(a, b) == -1
        assert objective.config_compare(b, a) == 1
        assert objective.config_compare(b, b) == 0
    finally:
        tuner.close()


def test_unknown_techniques_are_named_with_the_choices():
    assert check_techniques(["PureRandom"]) == ("PureRandom",)
    with pytest.raises(
        UsageError, match=r"unknown search technique 'Magic'; use one of .*PureRandom"
    ):
        check_techniques(["Magic"])


def test_the_search_leaves_the_working_directory_and_logging_alone(tmp_path):
    code = (
        "import logging\n"
        "formatter = logging.Formatter\n"
        "from tunefleet.coordinator.tuner import Tuner\n"
        "from tunefleet.space import Space, IntRange\n"
        "t = Tuner(Space.of([IntRange('x', 0, 50)]))\n"
        "for _ in range(5):\n"
        "    t.tell_many([(s, 1.0 + s.config['x']) for s in t.ask(8)])\n"
        "t.close()\n"
        "assert logging.Formatter is formatter\n"
        "import sys\n"
        "assert 'pyopencl' not in sys.modules and 'loopy' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []
    assert done.stdout == "" and done.stderr == ""
