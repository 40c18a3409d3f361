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
