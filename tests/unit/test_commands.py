"""The top level of ``tunefleet --help``: one command per action, each with a one-line
purpose; old spellings still parse but are not listed (CHANGELOG.md names them)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from tunefleet.cli import build_parser, main

#: 19 before the feinsum archive commands became one group (``tunefleet feinsum ...``).
MOST_COMMANDS = 17
#: Old spelling -> the ``tunefleet feinsum`` action it stands for.
OLD_SPELLINGS = {"import-feinsum": "import", "export-feinsum": "export"}


def _subcommands(parser: argparse.ArgumentParser) -> Any:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_help_lists_each_command_once_with_a_one_line_purpose(
    capsys: pytest.CaptureFixture[str],
) -> None:
    listed = {a.dest: a.help for a in _subcommands(build_parser())._choices_actions}
    assert len(listed) <= MOST_COMMANDS, sorted(listed)
    assert {"tune", "coordinator", "worker", "feinsum"} <= set(listed)
    for name, purpose in listed.items():
        assert purpose and "\n" not in purpose, name
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    for name in listed:
        assert f"\n    {name}" in shown, name
    for old in OLD_SPELLINGS:
        assert old not in shown


def test_old_spellings_still_parse_beside_the_group() -> None:
    commands = _subcommands(build_parser())
    feinsum = _subcommands(commands.choices["feinsum"])
    for old, new in OLD_SPELLINGS.items():
        assert old in commands.choices and new in feinsum.choices
        old_flags = {o for a in commands.choices[old]._actions for o in a.option_strings}
        new_flags = {o for a in feinsum.choices[new]._actions for o in a.option_strings}
        assert old_flags == new_flags, old
