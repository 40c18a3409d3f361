"""Problem arguments on the command line, and their rendering back into flags."""

from __future__ import annotations

import pytest

from tunefleet.cli import build_parser
from tunefleet.cli.args import command_line_args, raw_problem_args
from tunefleet.cli.output import Column, seconds, table
from tunefleet.cli.plot import utilisation
from tunefleet.errors import UsageError


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


def test_utilisation_merges_overlaps_and_uses_the_fleet_window():
    rows = [
        {"worker_id": "a", "start_s": 0.0, "end_s": 4.0},
        {"worker_id": "a", "start_s": 2.0, "end_s": 6.0},  # pipelined: overlaps the first
        {"worker_id": "a", "start_s": 8.0, "end_s": 10.0},
        {"worker_id": "b", "start_s": 5.0, "end_s": 10.0},  # joined late
    ]
    assert utilisation(rows) == {"a": pytest.approx(0.8), "b": pytest.approx(0.5)}
    assert utilisation([]) == {}


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
