"""What the ``problem`` argument of :func:`tunefleet.tune` may be, turned into the spec string
a run stores (``run.problem``) and every worker resolves with
:func:`tunefleet.problems.registry.get_problem`.

A built-in name, a ``path/to/problem.py[:Attr]`` or ``module:attr`` string is the spec
itself. A :class:`~tunefleet.problems.base.Problem` subclass, or an instance bound to a
module-level name, travels as the absolute path of the file that defines it plus that name:
workers are other processes (other machines, even) and can only import a problem from a file.
A problem defined in ``__main__`` (the script being run, an interactive session, a notebook)
or inside a function has no such path, and is refused with one line saying what to do.
"""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

from tunefleet.errors import UsageError
from tunefleet.problems.base import Problem
from tunefleet.problems.registry import BUILTINS

_MOVE_IT = (
    "workers import a problem from a file: move it into a module next to your script "
    "(e.g. my_problem.py) and import it from there"
)


def problem_spec(problem: object) -> str:
    """The stored spec of ``problem``; UsageError (one line) when it cannot travel."""
    if isinstance(problem, str):
        if not problem.strip():
            raise UsageError("problem='': give a built-in name, a path/to/problem.py or a class")
        return problem.strip()
    if isinstance(problem, os.PathLike):
        return os.fspath(problem)  # type: ignore[arg-type]
    if inspect.isclass(problem) and issubclass(problem, Problem):
        cls: type[Problem] = problem
        attr = cls.__qualname__
        what = f"problem class {cls.__name__}"
    elif isinstance(problem, Problem):
        cls = type(problem)
        what = f"problem instance of {cls.__name__}"
        module = sys.modules.get(cls.__module__)
        names = [k for k, v in vars(module).items() if v is problem] if module else []
        if not names:
            raise UsageError(
                f"{what} is not bound to a module-level name, so workers cannot rebuild it; "
                f"pass the class {cls.__name__} itself, or define `problem = "
                f"{cls.__name__}(...)` in its module and pass that"
            )
        attr = "problem" if "problem" in names else names[0]
    else:
        raise UsageError(
            f"problem={problem!r}: give a built-in name (see `tunefleet problems`), a "
            "path/to/problem.py, or a tunefleet.Problem subclass"
        )
    builtin = f"{cls.__module__}:{cls.__qualname__}"
    for name, target in BUILTINS.items():
        if target == builtin and inspect.isclass(problem):
            return name
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if cls.__module__ == "__main__" or path is None:
        raise UsageError(f"{what} is defined in __main__ (a script run directly, or an "
                         f"interactive session); {_MOVE_IT}")  # fmt: skip
    if "<locals>" in attr or "." in attr:
        raise UsageError(f"{what} is defined inside a function or class; {_MOVE_IT}")
    return f"{Path(path).resolve()}:{attr}"
