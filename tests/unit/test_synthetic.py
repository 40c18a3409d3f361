"""The synthetic problem: known optimum, deterministic faults, argument checks."""

from __future__ import annotations

import itertools

import pytest

from tunefleet.devices import HOST_DEVICE
from tunefleet.errors import InvalidConfiguration, ProblemError
from tunefleet.problems.base import Protocol
from tunefleet.problems.registry import get_problem
from tunefleet.problems.synthetic import (
    OPTIMUM,
    OPTIMUM_SECONDS,
    Synthetic,
    fault_of,
    is_lucky,
    objective,
)


def all_configs():
    space = Synthetic().space({})
    names = space.names()
    for combo in itertools.product(*(p.values() for p in space)):
        yield dict(zip(names, combo, strict=True))


def test_registered_and_needs_no_opencl():
    problem = get_problem("synthetic")
    assert isinstance(problem, Synthetic) and problem.needs_opencl is False


def test_documented_optimum_is_the_unique_argmin_of_the_space():
    configs = list(all_configs())
    assert len(configs) == Synthetic().space({}).size() == 512
    times = sorted((objective(c), i) for i, c in enumerate(configs))
    best_time, best = times[0]
    assert configs[best] == OPTIMUM and best_time == pytest.approx(OPTIMUM_SECONDS)
    assert times[1][0] > best_time  # unique


def test_measure_reports_the_objective_with_protocol_and_samples():
    problem = Synthetic()
    args = problem.normalise_args({"duration": 0})
    prepared = problem.prepare(args, dict(OPTIMUM), HOST_DEVICE)
    proto = Protocol(min_launches=4)
    out = problem.measure(prepared, None, proto)
    assert out.state == "done" and len(out.samples_s) == 4
    assert out.median_s == pytest.approx(OPTIMUM_SECONDS) and out.min_s <= out.median_s
    assert out.protocol == proto.to_json() and out.gflops and out.gflops > 0


def test_noise_is_deterministic_per_config_and_seed():
    problem = Synthetic()
    args = problem.normalise_args({"duration": 0, "noise": 0.1, "seed": 3})
    config = next(all_configs())
    a = problem.measure(problem.prepare(args, config, HOST_DEVICE), None, Protocol())
    b = problem.measure(problem.prepare(args, config, HOST_DEVICE), None, Protocol())
    assert a.samples_s == b.samples_s and len(set(a.samples_s)) > 1


def test_a_lucky_configuration_is_fast_once_and_true_on_fresh_inputs():
    problem = Synthetic()
    args = problem.normalise_args({"duration": 0, "lucky_rate": 0.05, "luck": 0.5})
    configs = list(all_configs())
    lucky = [c for c in configs if is_lucky(args, c)]
    assert 0.02 < len(lucky) / len(configs) < 0.09
    assert lucky == [c for c in configs if is_lucky(args, c)]  # deterministic
    config = lucky[0]
    prepared = problem.prepare(args, config, HOST_DEVICE)
    search = problem.measure(prepared, None, Protocol(seed=0))
    again = problem.measure(prepared, None, Protocol(seed=17))
    assert search.median_s == pytest.approx(0.5 * OPTIMUM_SECONDS)  # faster than the optimum
    assert again.median_s == pytest.approx(objective(config))
    assert again.protocol["seed"] == 17
    honest = next(c for c in configs if not is_lucky(args, c))
    prepared = problem.prepare(args, honest, HOST_DEVICE)
    assert problem.measure(prepared, None, Protocol(seed=0)).median_s == pytest.approx(
        problem.measure(prepared, None, Protocol(seed=17)).median_s
    )


def test_fresh_inputs_draw_other_noise():
    problem = Synthetic()
    args = problem.normalise_args({"duration": 0, "noise": 0.1})
    prepared = problem.prepare(args, dict(OPTIMUM), HOST_DEVICE)
    a = problem.measure(prepared, None, Protocol(seed=0))
    b = problem.measure(prepared, None, Protocol(seed=5))
    assert a.samples_s != b.samples_s
    assert all(OPTIMUM_SECONDS <= x < 1.1 * OPTIMUM_SECONDS for x in a.samples_s + b.samples_s)


def test_faults_are_deterministic_and_follow_the_rates():
    args = Synthetic().normalise_args({"invalid_rate": 0.2, "fail_rate": 0.1, "hang_rate": 0.1})
    configs = list(all_configs())
    faults = [fault_of(args, c) for c in configs]
    assert faults == [fault_of(args, c) for c in configs]
    share = {f: faults.count(f) / len(faults) for f in ("invalid", "fail", "hang", "none")}
    assert 0.14 < share["invalid"] < 0.26 and 0.05 < share["fail"] < 0.15
    assert 0.05 < share["hang"] < 0.15 and 0.5 < share["none"] < 0.7
    other_seed = {**args, "seed": 1}
    assert faults != [fault_of(other_seed, c) for c in configs]
    every = Synthetic().normalise_args({"fail_rate": 1.0})
    assert {fault_of(every, c) for c in configs} == {"fail"}


def test_invalid_configurations_raise_in_prepare():
    problem = Synthetic()
    args = problem.normalise_args({"invalid_rate": 1.0})
    with pytest.raises(InvalidConfiguration, match="invalid by construction"):
        problem.prepare(args, dict(OPTIMUM), HOST_DEVICE)
    with pytest.raises(InvalidConfiguration, match="outside the space"):
        problem.prepare(problem.normalise_args({}), {**OPTIMUM, "tile": 3}, HOST_DEVICE)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"speed": 1}, "unknown argument"),
        ({"duration": -1}, "duration"),
        ({"fail_rate": 1.5}, "fail_rate"),
        ({"fail_rate": 0.6, "hang_rate": 0.6}, "exceeds 1"),
        ({"fault_phase": "later"}, "fault_phase"),
        ({"seed": "x"}, "seed"),
        ({"noise": float("nan")}, "noise"),
        ({"lucky_rate": 2}, "lucky_rate"),
        ({"luck": 0}, "luck=0"),
    ],
)
def test_bad_arguments_are_named(raw, message):
    with pytest.raises(ProblemError, match=message):
        Synthetic().normalise_args(raw)


def test_without_the_new_options_the_arguments_and_times_are_as_before():
    args = Synthetic().normalise_args({})
    assert "depends_on" not in args and "invalid_values" not in args
    c = {"tile": 2, "unroll": 7, "vector": False, "order": "jki"}
    expected = OPTIMUM_SECONDS * (1 + 0.15 * 9 + 0.05 * 9 + 0.5 + 1.2)
    assert objective(c) == pytest.approx(expected)


def test_depends_on_leaves_the_other_parameters_without_effect():
    problem = Synthetic()
    args = problem.normalise_args({"duration": 0, "depends_on": "order, tile"})
    assert args["depends_on"] == ["tile", "order"]
    times = {}
    for c in all_configs():
        out = problem.measure(problem.prepare(args, c, HOST_DEVICE), None, Protocol())
        times.setdefault((c["tile"], c["order"]), set()).add(round(out.median_s, 12))
    # Every (tile, order) pair has one time whatever unroll and vector are...
    assert all(len(t) == 1 for t in times.values())
    # ... and tile and order each change it.
    assert len({t for (tile, _), (t,) in times.items() if tile == 16}) == 4
    assert len({t for (_, order), (t,) in times.items() if order == "ikj"}) == 5  # (log2 - 4)^2


def test_invalid_values_reject_exactly_those_configurations():
    problem = Synthetic()
    args = problem.normalise_args({"invalid_values": {"unroll": [7, 8], "vector": [False]}})
    rejected = 0
    for c in all_configs():
        try:
            problem.prepare(args, c, HOST_DEVICE)
        except InvalidConfiguration as exc:
            assert c["unroll"] in (7, 8) or c["vector"] is False, c
            assert "invalid_values" in str(exc)
            rejected += 1
    assert rejected == 512 - 6 * 8 * 4  # the valid ones: unroll 1-6, vector True


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"depends_on": ["tile", "speed"]}, "depends_on names \\['speed'\\]"),
        ({"depends_on": 3}, "depends_on=3 must be a list"),
        ({"invalid_values": {"tile": 1}}, "invalid_values=.* must map"),
        ({"invalid_values": {"size": [1]}}, "invalid_values names \\['size'\\]"),
    ],
)
def test_bad_new_options_are_named(raw, message):
    with pytest.raises(ProblemError, match=message):
        Synthetic().normalise_args(raw)
