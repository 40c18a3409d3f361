"""Replays: the coordinator's real search against recorded spaces, exactly repeatable."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from tunefleet.cli import main
from tunefleet.coordinator.replay import Answers, problem_rules, replay, summarise
from tunefleet.coordinator.tuner import Tuner
from tunefleet.devices import DeviceLimits
from tunefleet.errors import UsageError
from tunefleet.problems.registry import get_problem
from tunefleet.recording import FORMAT, from_json, load, to_json
from tunefleet.space import Bool, Choice, PowerOfTwo, Space

PUBLISHED = Path(__file__).resolve().parents[2] / "benchmarks" / "published"
FACE_MASS = PUBLISHED / "recording_face_mass.json"
GEMM = PUBLISHED / "recording_gemm.json"

# Computed once (NeighbourhoodSearch, seed 7, 2 virtual workers, 60 evaluations): the
# evaluations at which the best improved and the best median seconds from then on.
EXPECTED_STEPS = [
    (1, 0.0006833280000000001),
    (2, 0.0006782560000000001),
    (10, 0.00048256000000000004),
    (22, 0.00037644800000000004),
    (31, 0.000322816),
    (32, 0.000322656),
]


def _steps(best_s):
    return [(i + 1, b) for i, b in enumerate(best_s) if i == 0 or b != best_s[i - 1]]


@pytest.fixture(scope="module")
def face_mass():
    rec = load(FACE_MASS)
    return Answers(rec, problem_rules(rec))


def test_a_seeded_replay_of_a_recorded_space_gives_the_exact_curve(face_mass):
    curve = replay(face_mass, ["NeighbourhoodSearch"], seed=7, evaluations=60, workers=2)
    assert _steps(curve.best_s) == EXPECTED_STEPS
    assert len(curve.best_s) == len(curve.at_s) == 60
    assert list(curve.at_s) == sorted(curve.at_s) and curve.at_s[0] > 0
    assert (curve.missing, curve.rejected) == (60, 16)
    # What the search itself cost (timings: two curves of one seed still compare equal).
    assert 0 < curve.slowest_ask_s <= curve.search_s


def test_the_same_seed_repeats_whatever_else_the_process_draws(face_mass):
    first = replay(face_mass, ["AUCBanditMetaTechniqueA"], seed=3, evaluations=40)
    random.seed(12345)  # the process's own draws must not leak into the search
    random.random()
    again = replay(face_mass, ["AUCBanditMetaTechniqueA"], seed=3, evaluations=40)
    other = replay(face_mass, ["AUCBanditMetaTechniqueA"], seed=4, evaluations=40)
    assert again == first
    assert other != first


def test_a_seeded_tuner_leaves_the_process_random_state_alone():
    space = Space.of([PowerOfTwo("p", 1, 64), Bool("b")])
    random.seed(99)
    expected = [random.random() for _ in range(3)]
    random.seed(99)
    tuner = Tuner(space, ["PureRandom"], seed=1)
    for sug in tuner.ask(4):
        tuner.tell(sug, 1.0)
    tuner.close()
    assert [random.random() for _ in range(3)] == expected


# --- a small recording of our own ----------------------------------------------------------
SPACE = Space.of([PowerOfTwo("p", 1, 64), Choice("mode", ("a", "b", "c")), Bool("flag")])


def _recording(rows):
    return from_json(
        {
            "format": FORMAT,
            "problem": "not-a-registered-problem",
            "space": SPACE.to_json(),
            "params": ["p", "mode", "flag"],
            "columns": ["values", "state", "median_s", "compile_s", "timing_s"],
            "rows": rows,
        },
        source="test recording",
    )


def test_a_missing_configuration_is_answered_by_its_nearest_recorded_neighbour():
    rec = _recording(
        [
            [[1, "a", False], "done", 4.0, 1.0, 0.5],
            [[16, "b", True], "done", 1.0, 2.0, 0.5],
            [[64, "c", True], "invalid", None, None, None],
        ]
    )
    answers = Answers(rec)
    row, exact = answers.answer({"p": 16, "mode": "b", "flag": True})
    assert exact and row.median_s == 1.0
    # p 32 is one doubling from 16 and one halving from 64; "c" matches the invalid row's
    # mode and flag: 1 step against 1 step + 1 differing choice.
    row, exact = answers.answer({"p": 32, "mode": "b", "flag": True})
    assert not exact and row.median_s == 1.0
    row, exact = answers.answer({"p": 64, "mode": "c", "flag": False})
    assert not exact and row.state == "invalid"
    # A recorded configuration without its cost costs the recording's median.
    assert answers.cost_s(rec.rows[2]) == 2.0


def test_rule_rejected_proposals_cost_no_evaluation_and_no_time():
    # The rules reject mode "c". Its configurations are recorded as the fastest: were one
    # ever evaluated, the best would be 0.001 s.
    rows = []
    for p in (1, 2, 4, 8, 16, 32, 64):
        for mode in ("a", "b", "c"):
            for flag in (False, True):
                fast = mode == "c"
                rows.append([[p, mode, flag], "done", 0.001 if fast else 1.0 + p, 1.0, 0.0])
    answers = Answers(_recording(rows), rules=lambda c: c["mode"] != "c")
    curve = replay(answers, ["PureRandom"], seed=1, evaluations=20)
    assert len(curve.best_s) == 20
    assert curve.rejected > 0
    assert min(curve.best_s) > 0.001
    assert curve.at_s[-1] == pytest.approx(20.0)  # 1 s each: rejections took no time
    assert curve.missing == 0


def test_a_space_exhausted_ends_the_replay_early():
    rows = [[[p, "a", False], "done", float(p), 1.0, 0.0] for p in (1, 2, 4, 8, 16, 32, 64)]
    answers = Answers(_recording(rows), rules=lambda c: c["mode"] == "a" and not c["flag"])
    curve = replay(answers, ["PureRandom"], seed=2, evaluations=50)
    assert len(curve.best_s) == 7 and curve.best_s[-1] == 1.0
    summary = summarise("PureRandom", [curve], 1.0, [5, 50])
    assert summary.at[50] == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"format": "other/1"}, "format"),
        ({"rows": [[[1, "a", False], "running", None, None, None]]}, "state"),
        ({"rows": [[[3, "a", False], "done", 1.0, 1.0, 0.0]]}, "outside the space"),
        ({"rows": [[[1, "a", False], "done", None, 1.0, 0.0]]}, "without median_s"),
        ({"rows": [[[1, "a", False], "done", -1.0, 1.0, 0.0]]}, "median_s"),
        ({"rows": [[[1, "a", False], "invalid", None, None, None]]}, "no row was measured"),
        ({"params": ["p"]}, "params"),
        ({"device_limits": [49152]}, "device_limits .* is not an object"),
        ({"device_limits": {"local_mem": 49152}}, "device_limits .* is not an object"),
        ({"device_limits": {"local_mem_bytes": "48K"}}, "not a positive integer"),
        ({"device_limits": {"max_work_group_size": 0}}, "not a positive integer"),
        ({"device_limits": {"max_work_item_sizes": [1024, -1]}}, "not a positive integer"),
    ],
)
def test_a_broken_recording_is_refused_naming_what_is_wrong(change, said):
    data = {
        "format": FORMAT,
        "problem": "x",
        "space": SPACE.to_json(),
        "params": ["p", "mode", "flag"],
        "columns": ["values", "state", "median_s", "compile_s", "timing_s"],
        "rows": [[[1, "a", False], "done", 1.0, 1.0, 0.0]],
    } | change
    with pytest.raises(UsageError, match=said):
        from_json(data, source="r.json")


def test_a_recording_that_knows_its_devices_limits_rules_out_what_exceeds_them():
    """The replay rules out what the coordinator would: a configuration whose footprint
    exceeds the recorded device's limits costs no evaluation. The dense H100 recordings
    carry the limits their invalid rows name."""
    transpose = get_problem("transpose")
    args = transpose.normalise_args({"n": 256, "m": 256})
    space = transpose.space(args)
    small = {**transpose.default_config(args), "wg_0": 8, "wg_1": 8, "via_local": False}
    big = {**small, "tile_i": 128, "tile_j": 128, "wg_0": 64, "wg_1": 32}  # 2,048 work-items
    local = {**small, "tile_i": 128, "tile_j": 128, "via_local": True}  # 66,048 bytes
    data = {
        "format": FORMAT,
        "problem": "transpose",
        "problem_args": args,
        "space": space.to_json(),
        "params": space.names(),
        "columns": ["values", "state", "median_s", "compile_s", "timing_s"],
        "rows": [
            [[c[n] for n in space.names()], "done", 1.0, 1.0, 0.0] for c in (small, big, local)
        ],
    }
    unknown = problem_rules(from_json(data))
    assert unknown is not None and all(map(unknown, (small, big, local)))
    h100 = {"local_mem_bytes": 49152, "max_work_group_size": 1024}
    recording = from_json({**data, "device_limits": h100})
    assert to_json(recording)["device_limits"] == {**h100}
    rules = problem_rules(recording)
    assert rules is not None
    assert [rules(c) for c in (small, big, local)] == [True, False, False]
    for name in ("gemm", "face_mass", "transpose"):
        published = load(PUBLISHED / f"recording_{name}_region_h100.json.gz")
        assert published.device_limits == DeviceLimits(49152, 1024)


# --- the command ----------------------------------------------------------------------------
def test_the_command_prints_the_table_and_saves_the_curves(tmp_path, capsys):
    out = tmp_path / "replay.json"
    code = main(
        [
            "replay",
            str(FACE_MASS),
            "--technique",
            "PureRandom",
            "--seeds",
            "2",
            "--evals",
            "10,5",
            "--save",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "PureRandom" in text and "5: median / worst / best" in text
    saved = json.loads(out.read_text())
    assert saved["evals"] == [5, 10] and saved["seeds"] == 2
    curves = saved["techniques"]["PureRandom"]["curves"]
    assert len(curves) == 2 and all(len(c) == 10 and max(c) <= 1.0 for c in curves)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["replay", "no-such-file.json"], "is not a file"),
        (["replay", str(GEMM), "--evals", "10,x"], "--evals"),
        (["replay", str(GEMM), "--evals", "0"], "--evals"),
        (["replay", str(GEMM), "--seeds", "0"], "--seeds"),
        (["replay", str(GEMM), "--technique", "NoSuchSearch"], "unknown search technique"),
        (["replay", str(GEMM), "--save", "/no/such/folder/x.json"], "--save"),
    ],
)
def test_bad_input_is_one_line_and_a_usage_exit(argv, said, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1


def test_a_file_that_is_not_a_recording_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    assert main(["replay", str(bad)]) == 2
    assert "is not JSON" in capsys.readouterr().err


# --- the live run's seed ---------------------------------------------------------------------
def test_the_search_seed_comes_from_the_flag_then_the_environment(monkeypatch):
    from tunefleet.coordinator.settings import CoordinatorSettings

    monkeypatch.setenv("TUNEFLEET_SEARCH_SEED", "42")
    assert CoordinatorSettings.build(problem="synthetic").search_seed == 42
    assert CoordinatorSettings.build(problem="synthetic", search_seed=7).search_seed == 7
    monkeypatch.setenv("TUNEFLEET_SEARCH_SEED", "-3")
    with pytest.raises(UsageError, match="TUNEFLEET_SEARCH_SEED"):
        CoordinatorSettings.build(problem="synthetic")
    monkeypatch.delenv("TUNEFLEET_SEARCH_SEED")
    assert CoordinatorSettings.build(problem="synthetic").search_seed is None


def test_a_bad_search_seed_is_one_line(capsys):
    assert main(["tune", "synthetic", "--search-seed", "x"]) == 2
    assert "--search-seed 'x' is not a whole number" in capsys.readouterr().err


def test_the_python_api_refuses_a_bad_search_seed_before_anything_runs():
    import tunefleet

    with pytest.raises(UsageError, match="search_seed=-1"):
        tunefleet.tune("synthetic", search_seed=-1, progress=False)


def test_a_gzipped_recording_loads_as_the_json_it_holds(tmp_path):
    packed = tmp_path / "recording_face_mass.json.gz"
    packed.write_bytes(gzip.compress(FACE_MASS.read_bytes()))
    assert load(packed).rows == load(FACE_MASS).rows
    # A file named .gz that is not gzip data (or is cut short) is one line, not a traceback.
    broken = tmp_path / "cut.json.gz"
    broken.write_bytes(packed.read_bytes()[:200])
    with pytest.raises(UsageError, match="is not JSON"):
        load(broken)
    plain = tmp_path / "plain.json.gz"
    plain.write_bytes(FACE_MASS.read_bytes())
    with pytest.raises(UsageError, match="is not JSON"):
        load(plain)
