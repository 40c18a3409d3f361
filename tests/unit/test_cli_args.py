"""Problem arguments on the command line, and their rendering back into flags."""

from __future__ import annotations

import shlex

import pytest

from tunefleet.busy import busy_shares
from tunefleet.cli import build_parser
from tunefleet.errors import UsageError
from tunefleet.options.args import command_line_args, problem_sizes, raw_problem_args
from tunefleet.text.output import Column, seconds, table


def parse(*argv: str):
    return build_parser().parse_args(["measure", "gemm", *argv])


def test_sizes_dtype_and_args_merge_into_raw_arguments():
    ns = parse(
        "--size",
        "n=256,k=64",
        "--size",
        "m=128",
        "--dtype",
        "float64",
        "--arg",
        "batch=[1,2]",
        "--arg",
        "mode=fast",
    )
    assert raw_problem_args(ns) == {
        "n": 256,
        "k": 64,
        "m": 128,
        "dtype": "float64",
        "batch": [1, 2],
        "mode": "fast",
    }


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--size", "256", "is not NAME=VALUE"),
        ("--size", "n=", "is not NAME=VALUE"),
        ("--size", "n=-3", "not a positive integer"),
        ("--size", "n=big", "not a positive integer"),
        ("--size", "n=2.5", "not a positive integer"),
        ("--arg", "noequals", "is not NAME=VALUE"),
    ],
)
def test_malformed_problem_flags_name_the_flag_and_the_fix(flag, value, message):
    with pytest.raises(UsageError, match=message) as info:
        raw_problem_args(parse(flag, value))
    assert "e.g." in str(info.value)


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--size", "n=2147483648", "--size n=2147483648 is above the limit 2147483647"),
        ("--size", "n=99999999999999999999", "is above the limit 2147483647 .kernels index"),
        ("--arg", "duration=Infinity", "--arg duration='Infinity' is not a finite number"),
        ("--arg", "duration=1e400", "--arg duration='1e400' is not a finite number"),
        ("--arg", "shape=[1, NaN]", "is not a finite number"),
        ("--arg", "seed=99999999999999999999", "has an integer above the limit 9007199254740992"),
    ],
)
def test_values_nothing_can_hold_are_refused_with_the_limit(flag, value, message):
    with pytest.raises(UsageError, match=message):
        raw_problem_args(parse(flag, value))
    assert raw_problem_args(parse("--size", "n=2147483647")) == {"n": 2147483647}


@pytest.mark.parametrize(
    "args",
    [
        {"n": 256, "dtype": "float32"},
        {"nelements": 4096, "nfields": 3, "dtype": "float64"},
        {"label": "3", "scale": 0.5, "flag": True, "shape": [4, 4], "name": "x y"},
        {"zero": 0},
    ],
)
def test_stored_arguments_round_trip_through_the_command_line(args):
    words = command_line_args(args)
    assert raw_problem_args(parse(*words)) == args


def test_busy_merges_overlaps_and_uses_the_fleet_window():
    rows = [
        {"worker_id": "a", "start_s": 0.0, "end_s": 4.0},
        {"worker_id": "a", "start_s": 2.0, "end_s": 6.0},  # pipelined: overlaps the first
        {"worker_id": "a", "start_s": 8.0, "end_s": 10.0},
        {"worker_id": "b", "start_s": 5.0, "end_s": 10.0},  # joined late
    ]
    assert busy_shares(rows) == {"a": pytest.approx(0.8), "b": pytest.approx(0.5)}
    assert busy_shares([]) == {}


def test_durations_and_tables_read_well():
    assert [seconds(v) for v in (2.5e-5, 0.00273, 1.25, 185, 7300)] == [
        "25.0 us",
        "2.73 ms",
        "1.2 s",
        "3m05s",
        "2h01m",
    ]
    text = table(
        [{"a": 1, "b": None}, {"a": 100, "b": "x"}],
        [Column("A", "a", right=True), Column("B", "b")],
    )
    assert text.splitlines() == ["  A  B", "  1  -", "100  x"]


def test_only_the_problems_sizes_print_as_size_flags():
    """An integer ``--arg`` (a seed, a batch count) prints as ``--arg``: as ``--size`` it
    would read as a size, and one above the size limit would not parse at all."""
    args = {"n": 256, "batch": 4, "seed": 3_000_000_000, "dtype": "float32"}
    words = command_line_args(args, sizes={"n"})
    assert words == [
        "--arg",
        "batch=4",
        "--dtype",
        "float32",
        "--size",
        "n=256",
        "--arg",
        "seed=3000000000",
    ]
    assert raw_problem_args(parse(*words)) == args
    # A problem not known here: integers --size accepts are taken for sizes, no other.
    unknown = command_line_args(args)
    assert unknown[unknown.index("n=256") - 1] == "--size"
    assert unknown[unknown.index("seed=3000000000") - 1] == "--arg"
    assert raw_problem_args(parse(*unknown)) == args


def test_a_builtin_problem_names_its_sizes_and_a_user_problem_is_not_loaded(tmp_path):
    assert problem_sizes("gemm") == {"n", "m", "k"}
    assert problem_sizes("synthetic") == frozenset()  # duration, seed, ...: no sizes
    assert problem_sizes("feinsum") == frozenset()  # its index sizes live in its einsum
    marker = tmp_path / "ran"
    user = tmp_path / "mine.py"
    user.write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert problem_sizes(str(user)) is None
    assert not marker.exists()  # printing a command line runs no user code


def test_the_reproduce_command_prints_an_integer_argument_as_it_was_given():
    from tunefleet.text.render import reproduce_command

    run = {
        "problem": "synthetic",
        "problem_args": {"duration": 0.005, "seed": 3},
        "device_class": "any",
        "protocol": {},
    }
    words = shlex.split(reproduce_command(run, {"config": {"x": 1}, "protocol": {}}))
    assert words[words.index("seed=3") - 1] == "--arg"
    assert "--size" not in words
