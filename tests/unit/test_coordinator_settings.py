"""Coordinator settings: flags, then TUNEFLEET_* variables, then defaults; bad input named."""

from __future__ import annotations

import pytest

from tunefleet.coordinator.budget import FLAGS, KEYWORDS, Budget
from tunefleet.coordinator.confirm import fresh_input_seed
from tunefleet.coordinator.settings import CoordinatorSettings, parse_seed_configs
from tunefleet.errors import UsageError


def test_flags_beat_environment_beats_defaults(monkeypatch):
    monkeypatch.setenv("TUNEFLEET_MAX_TRIALS", "50")
    monkeypatch.setenv("TUNEFLEET_QUEUE_FACTOR", "3")
    s = CoordinatorSettings.build(problem="synthetic", budget=Budget.build(max_trials=7))
    assert (s.budget.max_trials, s.depth_factor, s.min_depth, s.budget.patience) == (
        7,
        3.0,
        1,
        None,
    )
    assert CoordinatorSettings.build(problem="synthetic").budget.max_trials == 50


def test_bad_environment_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("TUNEFLEET_PATIENCE", "-2")
    with pytest.raises(UsageError, match="TUNEFLEET_PATIENCE='-2' is not valid"):
        CoordinatorSettings.build(problem="synthetic")
    monkeypatch.delenv("TUNEFLEET_PATIENCE")
    monkeypatch.setenv("TUNEFLEET_MAX_TRIALS", "99999999999")
    limit = (
        r"TUNEFLEET_MAX_TRIALS='99999999999' is not valid: must be a whole number from 1 to "
        r"2147483647"
    )
    with pytest.raises(UsageError, match=limit):
        CoordinatorSettings.build(problem="synthetic")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({}, "name a PROBLEM to tune, or --resume RUN"),
        ({"resume": -3}, "--resume -3 is not a run id"),
        ({"problem": "synthetic", "confirm": -1}, "--confirm -1 must be between 0 .off. and"),
        ({"problem": "synthetic", "confirm": 10**6}, "--confirm 1000000 must be between"),
        ({"problem": "synthetic", "techniques": ["Nope"]}, "unknown search technique 'Nope'"),
    ],
)
def test_bad_settings_are_one_line_errors(kw, match):
    with pytest.raises(UsageError, match=match):
        CoordinatorSettings.build(**kw)


@pytest.mark.parametrize(
    ("field", "value", "flag", "keyword"),
    [
        ("max_trials", 0, "--max-trials 0: use at least 1", "max_trials=0: give a whole number"),
        (
            "max_trials",
            99999999999,
            "--max-trials 99999999999 is above the limit 2147483647",
            "max_trials=99999999999: give a whole number from 1 to 2147483647",
        ),
        ("max_trials", 2.5, "--max-trials 2.5 is not a whole", "max_trials=2.5 is not a whole"),
        ("max_seconds", -1.0, "--max-time -1: use a positive number", "max_time=-1.0: give a"),
        ("max_seconds", float("inf"), "--max-time inf: use a finite", "max_time=inf: give a"),
        ("max_seconds", True, "--max-time True is not a number", "max_time=True is not a"),
        (
            "target_gflops",
            2e12,
            "--target 2e+12 is above the limit",
            "target_gflops=2000000000000.0: give",
        ),
        ("patience", 0, "--patience 0: use at least 1", "patience=0: give a whole number"),
    ],
)
def test_the_budget_is_checked_in_one_place_and_spelled_as_each_door_spells_it(
    field, value, flag, keyword
):
    # One check (tunefleet.coordinator.budget.checked) behind every front door: the command
    # line's flags and tunefleet.tune()'s keywords name the same value their own way.
    with pytest.raises(UsageError) as raised:
        Budget.build(**{field: value}, spelling=FLAGS)
    assert str(raised.value).startswith(flag)
    with pytest.raises(UsageError) as raised:
        Budget.build(**{field: value}, spelling=KEYWORDS)
    assert str(raised.value).startswith(keyword)


def test_a_budget_is_one_value_handed_down_whole(monkeypatch):
    monkeypatch.setenv("TUNEFLEET_MAX_SECONDS", "90")
    budget = Budget.build(max_trials=20)
    assert budget == Budget(max_trials=20, max_seconds=90.0)  # the environment fills the rest
    assert CoordinatorSettings.build(problem="synthetic", budget=budget).budget is budget
    with pytest.raises(AttributeError):
        budget.max_trials = 3  # type: ignore[misc]


def test_seed_configs_come_as_json_object_list_or_file(tmp_path):
    assert parse_seed_configs('{"x": 1}') == [{"x": 1}]
    assert parse_seed_configs('[{"x": 1}, {"x": 2}]') == [{"x": 1}, {"x": 2}]
    path = tmp_path / "seeds.json"
    path.write_text('[{"x": 3}]')
    assert parse_seed_configs(str(path)) == [{"x": 3}]
    with pytest.raises(UsageError, match="is not valid JSON"):
        parse_seed_configs('{"x": }')
    with pytest.raises(UsageError, match="item 2 is int, expected a JSON object"):
        parse_seed_configs('[{"x": 1}, 5]')
    with pytest.raises(UsageError, match="neither JSON nor a file"):
        parse_seed_configs(str(tmp_path / "missing.json"))


def test_confirm_defaults_to_three_and_reads_its_variable(monkeypatch):
    assert CoordinatorSettings.build(problem="synthetic").confirm == 3
    monkeypatch.setenv("TUNEFLEET_CONFIRM", "0")
    assert CoordinatorSettings.build(problem="synthetic").confirm == 0
    assert CoordinatorSettings.build(problem="synthetic", confirm=5).confirm == 5
    monkeypatch.setenv("TUNEFLEET_CONFIRM", "many")
    with pytest.raises(UsageError, match="TUNEFLEET_CONFIRM='many' is not valid: must be a whole"):
        CoordinatorSettings.build(problem="synthetic")


@pytest.mark.parametrize("measured", [0, 5, 2**31 - 2, 2**31 - 1])
@pytest.mark.parametrize("trial_id", [1, 7, 2**31 - 2, 2**31 - 1, 2**40])
def test_a_confirmation_never_reuses_the_original_inputs(measured, trial_id):
    seed = fresh_input_seed(measured, trial_id)
    assert seed != measured and 0 <= seed < 2**31
    assert seed == fresh_input_seed(measured, trial_id)  # a revived one draws the same inputs
