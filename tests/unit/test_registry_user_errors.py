"""A user problem whose own code fails while being loaded (its constructor, its module's
import) gives a ProblemError naming the problem, never a raw exception (which the command line
would show as a traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunefleet.errors import ProblemError
from tunefleet.problems.registry import get_problem

HERE = Path(__file__).resolve().parents[1] / "acceptance"


def test_a_constructor_that_raises_is_a_problem_error():
    with pytest.raises(ProblemError, match=r"NeedsSetup\(\) raised RuntimeError: set DOUBLER"):
        get_problem(f"{HERE / 'bad_input_problems.py'}:NeedsSetup")


def test_a_module_whose_import_raises_is_a_problem_error():
    with pytest.raises(ProblemError, match="importing it raised RuntimeError: this module"):
        get_problem("tests.acceptance.raises_on_import:P")


def test_a_missing_module_still_names_the_import_error():
    with pytest.raises(ProblemError, match="No module named 'no_such_module_xyz'"):
        get_problem("no_such_module_xyz:P")


@pytest.mark.parametrize(
    ("source", "line", "what"),
    [
        ("import math\nclass P(Problem:\n    pass\n", 2, "class P(Problem:"),
        ("import math\n\nx = undefined_name + 1\n", 3, "NameError: name 'undefined_name'"),
    ],
    ids=["syntax error", "raises while importing"],
)
def test_a_broken_problem_file_is_one_line_naming_file_line_and_fix(
    source, line, what, tmp_path, monkeypatch, capsys
):
    from tunefleet.cli import main

    monkeypatch.setenv("TUNEFLEET_HOME", str(tmp_path / "home"))
    bad = tmp_path / "my_problem.py"
    bad.write_text(source)
    # Nowhere to connect: the file is checked before any database is touched.
    code = main(["tune", str(bad), "--db", "postgresql://nobody@127.0.0.1:1/none"])
    err = capsys.readouterr().err
    assert code != 0
    (message,) = err.splitlines()
    assert message.startswith(f"tunefleet: error: problem file {str(bad)!r}"), message
    assert f"line {line}" in message and what in message, message
    assert "fix" in message and "run again" in message, message
    assert "Error(" not in message, "no Python repr of the exception"
