"""Finding problems: built-ins by name, user problems by file path or ``module:attr``.

``get_problem("gemm")`` returns a built-in; ``get_problem("my_space.py")`` or
``get_problem("my_space.py:Stencil")`` loads a user file; ``get_problem("pkg.mod:Problem")``
imports a module. A user file exposes either one :class:`Problem` subclass or instance, or a
module-level ``problem`` attribute. The spec string is what runs store in ``run.problem``, so a
worker on another node resolves the same problem (user files must be reachable there too).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunefleet.errors import ProblemError, TunefleetError, first_line
from tunefleet.problems.base import Problem

#: Built-in problems: name -> "module:class". Modules are imported only when asked for.
BUILTINS: dict[str, str] = {
    "synthetic": "tunefleet.problems.synthetic:Synthetic",
    "gemm": "tunefleet.problems.gemm:Gemm",
    "dg_diff": "tunefleet.problems.dg:DGDiff",
    "face_mass": "tunefleet.problems.dg:FaceMass",
    "transpose": "tunefleet.problems.transpose:Transpose",
    "jacobi": "tunefleet.problems.jacobi:Jacobi",
    "axpy": "tunefleet.problems.axpy:Axpy",
    "feinsum": "tunefleet.feinsum_support.problem:FeinsumProblem",
}


def builtin_names() -> list[str]:
    return sorted(BUILTINS)


@dataclass(frozen=True)
class ProblemInfo:
    """What ``tunefleet problems`` shows about one problem."""

    name: str
    description: str
    #: One dict per argument: name, default, help (and choices / minimum when declared).
    args: tuple[dict[str, Any], ...]
    needs_opencl: bool
    space_size: int | None = None
    #: Why the problem could not be loaded (a missing optional dependency, say).
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "args": [dict(a) for a in self.args],
            "needs_opencl": self.needs_opencl,
            "space_size": self.space_size,
            "error": self.error,
        }


def problem_info(spec: str) -> ProblemInfo:
    """Describe one problem (built-in name, file path or ``module:attr``). Its space size is
    computed for the default arguments."""
    problem = get_problem(spec)
    defaults = problem.normalise_args({})
    if problem.arguments:
        args = tuple(a.to_json() for a in problem.arguments)
    else:  # a problem without declared arguments: show what its defaults are
        args = tuple({"name": k, "default": v, "help": ""} for k, v in defaults.items())
    try:
        size: int | None = problem.space(defaults).size()
    except TunefleetError:
        size = None
    return ProblemInfo(
        name=problem.name or spec,
        description=problem.description,
        args=args,
        needs_opencl=problem.needs_opencl,
        space_size=size,
    )


def list_problems() -> list[ProblemInfo]:
    """Every built-in problem, sorted by name. One that cannot be loaded is listed with its
    error instead of hiding the others."""
    out = []
    for name in builtin_names():
        try:
            out.append(problem_info(name))
        except (TunefleetError, ImportError) as exc:
            out.append(
                ProblemInfo(name=name, description="", args=(), needs_opencl=True, error=str(exc))
            )
    return out


def get_problem(spec: str) -> Problem:
    """Resolve a problem spec to an instance, or raise ProblemError naming the fix."""
    spec = spec.strip()
    if spec in BUILTINS:
        try:
            target = _import_attr(BUILTINS[spec])
        except (ImportError, AttributeError) as exc:
            raise ProblemError(f"built-in problem {spec!r} cannot be loaded: {exc}") from None
        return _instantiate(target, spec)
    file_part, sep, attr = spec.partition(":")
    if _is_path(file_part):
        return _load_file(Path(file_part), attr or None, spec)
    if sep:
        try:
            target = _import_attr(spec)
        except (ImportError, AttributeError) as exc:
            raise ProblemError(f"cannot load problem {spec!r}: {exc}") from None
        except Exception as exc:  # the module's own code failed while importing
            raise ProblemError(
                f"cannot load problem {spec!r}: importing it raised {type(exc).__name__}: {exc}"
            ) from None
        return _instantiate(target, spec)
    raise ProblemError(
        f"unknown problem {spec!r}; built-ins are {', '.join(builtin_names())} "
        "(or give a path/to/problem.py or module:attr)"
    )


def _is_path(text: str) -> bool:
    return text.endswith(".py") or "/" in text


def _import_attr(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


def _load_file(path: Path, attr: str | None, spec: str) -> Problem:
    if not path.is_file():
        raise ProblemError(f"problem file {str(path)!r} does not exist; check the path")
    # A stable module name per file: every process that loads the file gets the same classes'
    # qualified names, and a second load in one process reuses the first.
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    name = f"tunefleet_user_problem_{digest}"
    module = sys.modules.get(name)
    if module is None:
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ProblemError(f"cannot import {str(path)!r} as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise ProblemError(_import_failure(path, exc)) from None
    if attr:
        if not hasattr(module, attr):
            raise ProblemError(f"problem file {str(path)!r} has no attribute {attr!r}")
        return _instantiate(getattr(module, attr), spec)
    if hasattr(module, "problem"):
        return _instantiate(module.problem, spec)
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, Problem)
        and obj is not Problem
        and obj.__module__ == module.__name__
        and not inspect.isabstract(obj)
    ]
    if len(found) != 1:
        raise ProblemError(
            f"problem file {str(path)!r} defines {len(found)} Problem classes; "
            "name one with PATH.py:ClassName or define `problem = ...`"
        )
    return _instantiate(found[0], spec)


#: Most characters of a user's source line quoted in an error.
_QUOTED = 60


def _import_failure(path: Path, exc: Exception) -> str:
    """Why a user's problem file did not import, as one line naming the file, the line and
    what to do (the exception's repr is a tuple of offsets nobody should have to read)."""
    where = f"problem file {str(path)!r}"
    if isinstance(exc, SyntaxError):
        text = (exc.text or "").strip()
        quoted = f" (`{text[:_QUOTED]}`)" if text else ""
        elsewhere = "" if _same_file(exc.filename, path) else f" in {exc.filename}"
        return (
            f"{where}{elsewhere}, line {exc.lineno}: {exc.msg}{quoted}; fix the Python syntax "
            "there and run again"
        )
    line = _last_line_in(path, exc)
    at = "" if line is None else f" at line {line}"
    return (
        f"{where} failed to import{at}: {type(exc).__name__}: {first_line(exc)}; fix the file "
        "(or what it imports there) and run again"
    )


def _same_file(filename: str | None, path: Path) -> bool:
    return filename is not None and Path(filename).resolve() == path.resolve()


def _last_line_in(path: Path, exc: BaseException) -> int | None:
    """The line of ``path`` that was running when ``exc`` was raised (its innermost frame in
    that file: the import statement when the failure is in a module it imports)."""
    lines = [
        frame.lineno
        for frame in traceback.extract_tb(exc.__traceback__)
        if _same_file(frame.filename, path)
    ]
    return lines[-1] if lines else None


def _instantiate(obj: Any, spec: str) -> Problem:
    if inspect.isclass(obj) and issubclass(obj, Problem):
        try:
            obj = obj()
        except TunefleetError:
            raise
        except Exception as exc:  # user code: one line, not a traceback
            raise ProblemError(
                f"problem {spec!r}: {obj.__name__}() raised {type(exc).__name__}: {exc}"
            ) from None
    if not isinstance(obj, Problem):
        raise ProblemError(f"{spec!r} is not a tunefleet Problem (got {type(obj).__name__})")
    return obj
