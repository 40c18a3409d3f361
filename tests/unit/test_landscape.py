"""Device-free landscapes: seeded, the gemm space's shape and rules, a known optimum and a
deceptive basin at 0.82 of it, answered by replays and by ``tunefleet replay``."""

from __future__ import annotations

import random

import pytest

from tunefleet.cli import main
from tunefleet.coordinator.landscape import Landscape, LandscapeSettings, from_source
from tunefleet.coordinator.replay import replay
from tunefleet.errors import UsageError
from tunefleet.problems.registry import get_problem
from tunefleet.settings import DEFAULT_TECHNIQUE


@pytest.fixture(scope="module")
def landscape():
    return Landscape(LandscapeSettings(variant=0))


def test_a_variant_is_the_same_landscape_every_time_and_variants_differ(landscape):
    again = Landscape(LandscapeSettings(variant=0))
    other = Landscape(LandscapeSettings(variant=1))
    assert (again.optimum, again.centre, again.keys) == (
        landscape.optimum,
        landscape.centre,
        landscape.keys,
    )
    assert (other.optimum, other.centre) != (landscape.optimum, landscape.centre)
    config = landscape.space.sample(random.Random(5))
    assert again.seconds(config) == landscape.seconds(config)


def test_the_space_and_rules_are_the_gemm_problems(landscape):
    gemm = get_problem("gemm")
    space = gemm.space(landscape.problem_args)
    later = ("nest", "pad_a")  # parameters added after its publication
    assert landscape.space.params == tuple(p for p in space if p.name not in later)
    assert landscape.space.size() == 567_000
    rng = random.Random(2)
    sample = [landscape.space.sample(rng) for _ in range(2000)]
    rejected = sum(not landscape.legal(c) for c in sample) / len(sample)
    assert 0.25 <= rejected <= 0.45  # as the gemm rules reject uniform proposals


@pytest.mark.parametrize("variant", [0, 1, 2])
def test_the_optimum_is_known_and_the_deceptive_floor_runs_at_0_82_of_it(variant):
    land = Landscape(LandscapeSettings(variant=variant))
    assert land.legal(land.optimum) and land.legal(land.centre)
    assert land.seconds(land.optimum) == land.best_s
    floor = land.best_s / land.seconds(land.centre)
    assert 0.82 / 1.03 <= floor <= 0.82
    rng = random.Random(variant)
    sample = [c for c in (land.space.sample(rng) for _ in range(3000)) if land.legal(c)]
    ratios = [land.best_s / land.seconds(c) for c in sample]
    assert max(ratios) < 1.0  # nothing beats the optimum
    # Broad and deceptive: almost every configuration is slower than the floor, and only a
    # sliver of the space is within 5 % of the optimum.
    assert sum(r > 0.95 for r in ratios) / len(ratios) < 0.02
    assert sum(r > 0.7 for r in ratios) / len(ratios) < 0.1


def test_a_replay_answers_every_configuration_from_the_landscape(landscape):
    curve = replay(landscape, ["PureRandom"], seed=1, evaluations=40)
    assert len(curve.best_s) == 40 and curve.missing == 0
    assert curve.rejected > 0  # the rules reject as in a live run
    assert 0.0 < curve.ratio(landscape.best_s, 40) <= 1.0


def test_a_bad_landscape_source_or_setting_is_one_line(capsys):
    assert from_source("recording.json") is None
    with pytest.raises(UsageError, match="landscape:0"):
        from_source("landscape:deep")
    with pytest.raises(UsageError, match="basin"):
        LandscapeSettings(basin=1.5)
    assert main(["replay", "landscape:x", "--seeds", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "landscape:x" in err and len(err.splitlines()) == 1


def test_the_replay_command_takes_a_landscape(capsys):
    assert main(["replay", "landscape:1", "--seeds", "2", "--evals", "10,20"]) == 0
    out = capsys.readouterr().out
    assert "landscape:1: gemm, 567000 configurations" in out
    assert DEFAULT_TECHNIQUE in out


def test_a_variant_draws_its_global_basin_on_as_many_key_tiles_as_told():
    two = Landscape(LandscapeSettings(variant=3, keys=2))
    assert len(two.keys) == 2 and set(two.keys) <= {"wg_i", "wg_j", "reg_i", "reg_j", "tile_k"}
    assert len(Landscape(LandscapeSettings(variant=3)).keys) == 3  # the published shape
    assert two.seconds(two.optimum) == two.best_s
    with pytest.raises(UsageError, match="keys"):
        LandscapeSettings(keys=0)
