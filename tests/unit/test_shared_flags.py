"""One definition per flag: ``tune``, ``coordinator`` and ``worker`` take the shared flags
with the same help and the same checks, problem flags parse the same everywhere, ``tune``
hands its worker flags to the workers it starts, and out-of-range values are one-line errors
before anything runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tunefleet.cli import build_parser, main
from tunefleet.options import flags
from tunefleet.options.args import raw_problem_args

ROOT = Path(__file__).resolve().parents[2]


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]  # type: ignore[no-any-return]


def action(parser: argparse.ArgumentParser, option: str) -> argparse.Action:
    return next(a for a in parser._actions if option in a.option_strings)


@pytest.mark.parametrize(
    ("flag", "commands"),
    [
        *[(f, ("tune", "coordinator")) for f in (*flags.SEARCH_FLAGS, *flags.SEED_FLAGS)],
        *[(f, ("tune", "worker")) for f in flags.WORKER_FLAGS],
    ],
    ids=lambda v: v.names[0] if isinstance(v, flags.Flag) else "-".join(v),
)
def test_a_shared_flag_is_the_same_on_every_command(flag, commands):
    actions = [action(subcommand(c), flag.names[0]) for c in commands]
    first = actions[0]
    for other in actions[1:]:
        assert (other.help, other.type, other.metavar, other.dest) == (
            first.help,
            first.type,
            first.metavar,
            first.dest,
        )


@pytest.mark.parametrize("command", ["tune", "coordinator", "measure"])
def test_problem_flags_mean_the_same_on_every_command(command):
    ns = build_parser().parse_args(
        [command, "gemm", "--size", "n=256,k=64", "--arg", "batch=[1,2]", "--dtype", "float64"]
    )
    assert raw_problem_args(ns) == {"n": 256, "k": 64, "batch": [1, 2], "dtype": "float64"}


def test_tune_hands_its_worker_flags_to_its_workers():
    ns = build_parser().parse_args(
        ["tune", "face_mass", "--prefetch", "8", "--prepare-workers", "12", "--timeout", "30",
         "--cores", "14", "--no-prebuild", "--patience", "40"]
    )  # fmt: skip
    assert flags.worker_argv(ns) == [
        "--timeout", "30", "--prefetch", "8", "--prepare-workers", "12", "--cores", "14",
        "--no-prebuild",
    ]  # fmt: skip
    assert flags.worker_argv(build_parser().parse_args(["tune", "gemm"])) == []
    # The worker reads them back as given.
    w = build_parser().parse_args(["worker", *flags.worker_argv(ns)])
    assert (w.prefetch, w.prepare_workers, w.timeout, w.cores, w.prebuild) == (
        8,
        12,
        30.0,
        14.0,
        False,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["worker", "--max-trials", "99999999999"], "--max-trials 99999999999 is above the limit"),
        (["worker", "--prefetch", "1001"], "--prefetch 1001 is above the limit 1000"),
        (["worker", "--timeout", "inf"], "--timeout inf: use a finite number, at most 86400"),
        (["worker", "--lease", "-1"], "--lease -1: use a positive number"),
        (["worker", "--cores", "0"], "--cores 0: use a positive number"),
        (["worker", "--poll", "x"], "--poll 'x' is not a number; write e.g. --poll 60"),
        (["coordinator", "synthetic", "--resume", "0"], "--resume 0: use at least 1"),
        (["coordinator", "synthetic", "--target", "inf"], "--target inf: use a finite number"),
        (["tune", "synthetic", "--max-trials", "ten"], "--max-trials 'ten' is not a whole number"),
    ],
)
def test_values_out_of_range_are_one_line_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tunefleet: error: "), err
    assert message in err[0]


@pytest.mark.parametrize("command", ["tune", "coordinator"])
def test_technique_help_names_the_default_the_coordinator_uses(command, monkeypatch):
    from tunefleet.coordinator.settings import default_techniques

    monkeypatch.delenv("TUNEFLEET_TECHNIQUE", raising=False)
    (default,) = default_techniques()
    text = " ".join(action(subcommand(command), "--technique").help.split())
    assert f"default {default}" in text, text
    # No other technique is named the default (the help once said NeighbourhoodBandit).
    assert text.count("default ") == 1, text


def test_timeout_help_and_the_manual_say_one_limit_bounds_the_whole_evaluation():
    """The worker bounds code generation and timing together with one limit
    (``worker.loop``'s evaluation limit); the help and docs/tuning.md say so in one wording."""
    text = " ".join(flags.TIMEOUT.help.split())
    assert "whole evaluation" in text and "code generation" in text and "timing" in text, text
    assert "at least this long" not in text, "code generation has no limit of its own"
    manual = " ".join((ROOT / "docs" / "tuning.md").read_text().split())
    first = text.split(" (")[0]
    assert f"`--timeout SECONDS` ({first}" in manual, first
