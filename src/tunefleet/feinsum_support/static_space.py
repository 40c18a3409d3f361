"""The parameter space of a feinsum transform-space module, read without importing it.

A transform-space module defines ``transform`` and decorates it with
``transform_param(NAME, FUNC)`` (one tunable argument; ``FUNC(einsum)`` returns an
``IntParameter(low, high)``, a ``BoolParameter()`` or a tuple of those) and
``einsum_arg(NAME, FUNC)`` (an argument derived from the einsum, not tuned). Importing the
module needs feinsum and loopy; the coordinator has neither, so we parse the source with
:mod:`ast` and evaluate each ``FUNC`` body with a small interpreter against
:class:`EinsumView`, a stand-in for feinsum's ``BatchedEinsum`` built from an
:class:`~tunefleet.feinsum_support.einsum_spec.EinsumSpec`.

What the interpreter understands (everything the shipped spaces use, and a bit more):
literals, tuples/lists, arithmetic and comparisons, ``x if c else y``, comprehensions and
generator expressions, ``min max len range tuple list int abs sum round sorted``, the
functions of :mod:`math` (``import math`` / ``from math import ceil``), feinsum's
``IntParameter BoolParameter TupleParameter`` and ``feinsum.utils.get_n_redn_dim`` under any
import alias (``fnsm.tuning.IntParameter``), module-level constants, and module-level helper
functions whose body is a single ``return``. The einsum attributes are those of
``BatchedEinsum``: ``b n shape ndim args in_idx_sets out_idx_set index_to_dim_length
arg_to_shape arg_to_dtype sum_indices all_args all_indices all_size_params`` and
``get_subscripts()``; operands have ``name shape dtype ndim``. A long dimension is a
symbol: arithmetic on it is an error, as it is in feinsum. Anything else raises a
:class:`~tunefleet.errors.ProblemError` that names the parameter, the line and the construct.

feinsum evaluates these functions on the *canonical* form of the einsum; so do we when the
einsum is given in that form (an imported archive's, or one listed by ``tunefleet feinsum
list``). For another spelling of the same einsum a position-based lambda such as
``e.args[0][2].shape[0]`` can read a different operand; the worker then checks every
configuration against feinsum's own evaluation and reports points outside it as invalid.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunefleet.errors import ProblemError
from tunefleet.feinsum_support.einsum_spec import EinsumSpec
from tunefleet.space import Bool, Choice, IntRange, Param, Space, TupleOf

_MAX_ITEMS = 10_000


class _Unsupported(Exception):
    """Raised inside the interpreter; turned into a ProblemError with context."""

    def __init__(self, message: str, node: ast.AST | None = None) -> None:
        super().__init__(message)
        self.node = node


# --- feinsum's tuning parameters, as data ------------------------------------------------


@dataclass(frozen=True)
class IntParameter:
    low: int
    high: int


@dataclass(frozen=True)
class BoolParameter:
    pass


@dataclass(frozen=True)
class TupleParameter:
    items: tuple[Any, ...]


def _int_parameter(low: Any, high: Any) -> IntParameter:
    for label, value in (("low", low), ("high", high)):
        if not isinstance(value, int):
            raise _Unsupported(f"IntParameter {label}={value!r} is not an integer")
    return IntParameter(int(low), int(high))


def _tuple_parameter(items: Any) -> TupleParameter:
    return TupleParameter(tuple(items))


# --- the einsum stand-in -----------------------------------------------------------------


@dataclass(frozen=True)
class LongDim:
    """A long (parametric) axis length, like feinsum's ``SizeParam``: a symbol only."""

    name: str


@dataclass(frozen=True)
class ArrayView:
    name: str
    shape: tuple[int | LongDim, ...]
    dtype: Any

    @property
    def ndim(self) -> int:
        return len(self.shape)


class EinsumView:
    """The attributes of feinsum's ``BatchedEinsum`` that parameter functions read."""

    ATTRS = frozenset(
        {
            "b",
            "n",
            "shape",
            "ndim",
            "args",
            "in_idx_sets",
            "out_idx_set",
            "index_to_dim_length",
            "arg_to_shape",
            "arg_to_dtype",
            "sum_indices",
            "all_args",
            "all_indices",
            "all_size_params",
            "get_subscripts",
        }
    )

    def __init__(self, spec: EinsumSpec) -> None:
        import numpy as np

        fixed = spec.index_to_length
        self.index_to_dim_length: dict[str, int | LongDim] = {
            i: fixed.get(i, LongDim(i.upper())) for i in spec.indices
        }
        self.in_idx_sets = tuple(tuple(s) for s in spec.inputs)
        self.out_idx_set = tuple(spec.output)
        dtypes = spec.arg_to_dtype
        self.args = tuple(
            tuple(
                ArrayView(
                    name,
                    tuple(self.index_to_dim_length[i] for i in idx_set),
                    np.dtype(dtypes[name]),
                )
                for name, idx_set in zip(row, spec.inputs, strict=True)
            )
            for row in spec.args
        )
        self.b = len(self.args)
        self.n = len(self.in_idx_sets)
        self.shape = tuple(self.index_to_dim_length[i] for i in self.out_idx_set)
        self.ndim = len(self.shape)
        self.arg_to_shape = {a.name: a.shape for row in self.args for a in row}
        self.arg_to_dtype = {a.name: a.dtype for row in self.args for a in row}
        self.sum_indices = tuple(i for i in spec.indices if i not in self.out_idx_set)
        self.all_args = frozenset(self.arg_to_shape)
        self.all_indices = frozenset(self.index_to_dim_length)
        self.all_size_params = frozenset(
            v for v in self.index_to_dim_length.values() if isinstance(v, LongDim)
        )
        self._subscripts = spec.subscripts

    def get_subscripts(self) -> str:
        return self._subscripts


def _n_redn_dim(einsum: Any) -> int:
    if not isinstance(einsum, EinsumView):
        raise _Unsupported("get_n_redn_dim expects the einsum")
    return len(einsum.sum_indices)


# --- the interpreter -----------------------------------------------------------------------


class _Namespace:
    """An imported module (feinsum under an alias, or math): attribute chains resolve by
    their last component."""

    def __init__(self, name: str, members: Mapping[str, Any], nested: bool) -> None:
        self.name = name
        self.members = members
        self.nested = nested

    def get(self, attr: str) -> Any:
        if attr in self.members:
            return self.members[attr]
        if self.nested:
            return _Namespace(f"{self.name}.{attr}", self.members, True)
        raise _Unsupported(f"{self.name}.{attr} is not supported")


_MATH = {
    name: getattr(math, name)
    for name in (
        "ceil",
        "floor",
        "perm",
        "comb",
        "factorial",
        "gcd",
        "lcm",
        "isqrt",
        "log2",
        "log",
        "sqrt",
        "prod",
        "trunc",
        "pi",
        "e",
        "inf",
    )
}
_FEINSUM = {
    "IntParameter": _int_parameter,
    "BoolParameter": BoolParameter,
    "TupleParameter": _tuple_parameter,
    "get_n_redn_dim": _n_redn_dim,
}


def _safe_range(*args: Any) -> range:
    r = range(*args)
    if len(r) > _MAX_ITEMS:
        raise _Unsupported(f"range of {len(r)} items is too large")
    return r


_BUILTINS: dict[str, Any] = {
    "min": min,
    "max": max,
    "len": len,
    "range": _safe_range,
    "tuple": tuple,
    "list": list,
    "int": int,
    "abs": abs,
    "sum": sum,
    "round": round,
    "sorted": sorted,
    "bool": bool,
    "True": True,
    "False": False,
    "None": None,
}
_CALLABLE = frozenset(_BUILTINS.values()) | frozenset(_MATH.values()) | frozenset(_FEINSUM.values())
_METHODS = {
    dict: {"items", "keys", "values", "get"},
    tuple: {"index", "count"},
    list: {"index", "count"},
    str: {"upper", "lower"},
}
_DTYPE_ATTRS = {"name", "itemsize", "kind"}

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


@dataclass(frozen=True)
class _Helper:
    """A module-level ``def f(x, ...): return EXPR``."""

    name: str
    params: tuple[str, ...]
    body: ast.expr


class _Interpreter:
    def __init__(self, module_env: Mapping[str, Any]) -> None:
        self.module_env = module_env
        self.depth = 0

    def call_function(self, params: Sequence[str], body: ast.expr, args: Sequence[Any]) -> Any:
        if len(args) != len(params):
            raise _Unsupported(f"called with {len(args)} arguments, expects {len(params)}")
        self.depth += 1
        if self.depth > 20:
            raise _Unsupported("helper functions nest too deeply")
        try:
            return self.eval(body, dict(zip(params, args, strict=True)))
        finally:
            self.depth -= 1

    def lookup(self, name: str, scope: Mapping[str, Any], node: ast.AST) -> Any:
        if name in scope:
            return scope[name]
        if name in self.module_env:
            return self.module_env[name]
        if name in _BUILTINS:
            return _BUILTINS[name]
        raise _Unsupported(f"name {name!r} is not known statically", node)

    def eval(self, node: ast.expr, scope: dict[str, Any]) -> Any:
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise _Unsupported(f"{type(node).__name__} expressions are not supported", node)
        try:
            return method(node, scope)
        except _Unsupported as exc:
            if exc.node is None:
                exc.node = node
            raise
        except (TypeError, ValueError, ZeroDivisionError, IndexError, KeyError) as exc:
            raise _Unsupported(f"{type(exc).__name__}: {exc}", node) from None

    # literals and containers
    def _Constant(self, node: ast.Constant, scope: dict[str, Any]) -> Any:
        return node.value

    def _Tuple(self, node: ast.Tuple, scope: dict[str, Any]) -> Any:
        return tuple(self._items(node.elts, scope))

    def _List(self, node: ast.List, scope: dict[str, Any]) -> Any:
        return list(self._items(node.elts, scope))

    def _items(self, elts: Sequence[ast.expr], scope: dict[str, Any]) -> list[Any]:
        out: list[Any] = []
        for elt in elts:
            if isinstance(elt, ast.Starred):
                out.extend(self.eval(elt.value, scope))
            else:
                out.append(self.eval(elt, scope))
        return out

    def _Name(self, node: ast.Name, scope: dict[str, Any]) -> Any:
        return self.lookup(node.id, scope, node)

    def _Attribute(self, node: ast.Attribute, scope: dict[str, Any]) -> Any:
        base = self.eval(node.value, scope)
        attr = node.attr
        if isinstance(base, _Namespace):
            return base.get(attr)
        if isinstance(base, EinsumView) and attr in EinsumView.ATTRS:
            return getattr(base, attr)
        if isinstance(base, ArrayView) and attr in {"name", "shape", "dtype", "ndim"}:
            return getattr(base, attr)
        if isinstance(base, LongDim) and attr == "name":
            return base.name
        if type(base).__name__.startswith("dtype") and attr in _DTYPE_ATTRS:
            return getattr(base, attr)
        for kind, names in _METHODS.items():
            if isinstance(base, kind) and attr in names:
                return getattr(base, attr)
        raise _Unsupported(f"attribute .{attr} of {type(base).__name__} is not supported")

    def _Subscript(self, node: ast.Subscript, scope: dict[str, Any]) -> Any:
        base = self.eval(node.value, scope)
        key = self.eval(node.slice, scope)
        if not isinstance(base, tuple | list | dict | str):
            raise _Unsupported(f"cannot index a {type(base).__name__}")
        return base[key]

    def _Slice(self, node: ast.Slice, scope: dict[str, Any]) -> Any:
        parts = [None if p is None else self.eval(p, scope) for p in (node.lower, node.upper)]
        step = None if node.step is None else self.eval(node.step, scope)
        return slice(parts[0], parts[1], step)

    # operators
    def _BinOp(self, node: ast.BinOp, scope: dict[str, Any]) -> Any:
        left, right = self.eval(node.left, scope), self.eval(node.right, scope)
        for value in (left, right):
            if isinstance(value, LongDim):
                raise _Unsupported(
                    f"arithmetic on the long dimension {value.name} (its length is only "
                    "known at run time)"
                )
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise _Unsupported(f"operator {type(node.op).__name__} is not supported")
        if isinstance(node.op, ast.Pow) and isinstance(right, int | float) and abs(right) > 64:
            raise _Unsupported("exponent too large")
        if isinstance(node.op, ast.Mult) and isinstance(left, tuple | list | str):
            if isinstance(right, int) and len(left) * right > _MAX_ITEMS:
                raise _Unsupported("sequence too large")
        return op(left, right)

    def _UnaryOp(self, node: ast.UnaryOp, scope: dict[str, Any]) -> Any:
        value = self.eval(node.operand, scope)
        if isinstance(node.op, ast.USub):
            return -value
        if isinstance(node.op, ast.UAdd):
            return +value
        if isinstance(node.op, ast.Not):
            return not value
        raise _Unsupported(f"operator {type(node.op).__name__} is not supported")

    def _BoolOp(self, node: ast.BoolOp, scope: dict[str, Any]) -> Any:
        value: Any = None
        for sub in node.values:
            value = self.eval(sub, scope)
            if isinstance(node.op, ast.And) and not value:
                return value
            if isinstance(node.op, ast.Or) and value:
                return value
        return value

    def _Compare(self, node: ast.Compare, scope: dict[str, Any]) -> Any:
        left = self.eval(node.left, scope)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = self.eval(comp, scope)
            fn = _CMPOPS.get(type(op))
            if fn is None:
                raise _Unsupported(f"comparison {type(op).__name__} is not supported")
            if not fn(left, right):
                return False
            left = right
        return True

    def _IfExp(self, node: ast.IfExp, scope: dict[str, Any]) -> Any:
        if self.eval(node.test, scope):
            return self.eval(node.body, scope)
        return self.eval(node.orelse, scope)

    # comprehensions
    def _comprehension(
        self, elt: ast.expr, generators: list[ast.comprehension], scope: dict[str, Any]
    ) -> list[Any]:
        results: list[Any] = []

        def loop(level: int, env: dict[str, Any]) -> None:
            if level == len(generators):
                results.append(self.eval(elt, env))
                if len(results) > _MAX_ITEMS:
                    raise _Unsupported("comprehension too large")
                return
            gen = generators[level]
            if gen.is_async:
                raise _Unsupported("async comprehensions are not supported")
            for item in self.eval(gen.iter, env):
                inner = dict(env)
                self._bind(gen.target, item, inner)
                if all(self.eval(cond, inner) for cond in gen.ifs):
                    loop(level + 1, inner)

        loop(0, dict(scope))
        return results

    def _bind(self, target: ast.expr, value: Any, env: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, ast.Tuple | ast.List):
            values = list(value)
            if len(values) != len(target.elts):
                raise _Unsupported("cannot unpack in a comprehension target", target)
            for t, v in zip(target.elts, values, strict=True):
                self._bind(t, v, env)
        else:
            raise _Unsupported("comprehension target is not a name", target)

    def _GeneratorExp(self, node: ast.GeneratorExp, scope: dict[str, Any]) -> Any:
        return tuple(self._comprehension(node.elt, node.generators, scope))

    def _ListComp(self, node: ast.ListComp, scope: dict[str, Any]) -> Any:
        return self._comprehension(node.elt, node.generators, scope)

    # calls and functions
    def _Lambda(self, node: ast.Lambda, scope: dict[str, Any]) -> Any:
        params = _simple_params(node.args, "lambda")
        return _Helper("<lambda>", params, node.body)

    def _Call(self, node: ast.Call, scope: dict[str, Any]) -> Any:
        func = self.eval(node.func, scope)
        args = self._items(node.args, scope)
        kwargs: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise _Unsupported("**kwargs in a call is not supported", node)
            kwargs[kw.arg] = self.eval(kw.value, scope)
        if isinstance(func, _Helper):
            if kwargs:
                raise _Unsupported(f"keyword arguments to {func.name}() are not supported")
            return self.call_function(func.params, func.body, args)
        bound_owner = getattr(func, "__self__", None)
        if bound_owner is not None and not isinstance(bound_owner, type(math)):
            # A whitelisted method (dict.items, tuple.index, EinsumView.get_subscripts).
            return func(*args, **kwargs)
        if func in _CALLABLE:
            return func(*args, **kwargs)
        raise _Unsupported(f"calling {getattr(func, '__name__', func)!r} is not supported")


def _simple_params(args: ast.arguments, what: str) -> tuple[str, ...]:
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs or args.defaults:
        raise _Unsupported(f"{what} must take plain positional parameters")
    return tuple(a.arg for a in args.args)


# --- reading a module ----------------------------------------------------------------------


@dataclass(frozen=True)
class Decorator:
    """One ``transform_param`` / ``einsum_arg`` decorator of ``transform``."""

    kind: str
    name: str
    func: ast.expr
    lineno: int


def _module_env(tree: ast.Module) -> dict[str, Any]:
    """Names a parameter function may use: imports of math/feinsum, helpers, constants."""
    env: dict[str, Any] = {}
    constants: list[tuple[str, ast.expr]] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                top = alias.name.split(".")[0]
                bound = alias.asname or top
                if alias.name == "math":
                    env[bound] = _Namespace("math", _MATH, nested=False)
                elif top == "feinsum":
                    env[bound] = _Namespace(alias.asname or top, _FEINSUM, nested=True)
        elif isinstance(stmt, ast.ImportFrom) and stmt.module:
            for alias in stmt.names:
                bound = alias.asname or alias.name
                if stmt.module == "math" and alias.name in _MATH:
                    env[bound] = _MATH[alias.name]
                elif stmt.module.split(".")[0] == "feinsum":
                    if alias.name in _FEINSUM:
                        env[bound] = _FEINSUM[alias.name]
                    else:
                        env[bound] = _Namespace(f"{stmt.module}.{alias.name}", _FEINSUM, True)
        elif isinstance(stmt, ast.FunctionDef):
            body = [
                s
                for s in stmt.body
                if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            ]
            if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value:
                try:
                    params = _simple_params(stmt.args, stmt.name)
                except _Unsupported:
                    continue
                env[stmt.name] = _Helper(stmt.name, params, body[0].value)
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                constants.append((target.id, stmt.value))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if stmt.value is not None:
                constants.append((stmt.target.id, stmt.value))
    interp = _Interpreter(env)
    for name, value in constants:
        try:
            env[name] = interp.eval(value, {})
        except _Unsupported:
            env.pop(name, None)  # not a constant we can read; using it is an error later
    return env


def _decorator_kind(node: ast.expr) -> str | None:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        name = target.id
    elif isinstance(target, ast.Attribute):
        name = target.attr
    else:
        return None
    return name if name in {"transform_param", "einsum_arg"} else None


def read_decorators(source: str, filename: str) -> tuple[list[Decorator], ast.Module]:
    """The ``transform_param`` and ``einsum_arg`` decorators of ``transform``, top down
    (the order feinsum keeps them in)."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise ProblemError(
            f"transform space {filename} is not valid Python (line {exc.lineno}: {exc.msg})"
        ) from None
    funcs = [
        s
        for s in tree.body
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == "transform"
    ]
    if not funcs:
        raise ProblemError(
            f"transform space {filename} defines no top-level `def transform(...)`; "
            "point --arg space at a feinsum transform-space module"
        )
    found: list[Decorator] = []
    for deco in funcs[-1].decorator_list:
        kind = _decorator_kind(deco)
        if kind is None:
            continue
        if not isinstance(deco, ast.Call):
            raise ProblemError(f"{filename} line {deco.lineno}: @{kind} needs (NAME, FUNC)")
        args = list(deco.args)
        kw = {k.arg: k.value for k in deco.keywords if k.arg}
        name_node = args[0] if args else kw.get("var_name")
        func_node = args[1] if len(args) > 1 else kw.get("func")
        if not (isinstance(name_node, ast.Constant) and isinstance(name_node.value, str)):
            raise ProblemError(
                f"{filename} line {deco.lineno}: @{kind} needs a string literal as its name"
            )
        if func_node is None:
            raise ProblemError(f"{filename} line {deco.lineno}: @{kind} has no function")
        found.append(Decorator(kind, name_node.value, func_node, deco.lineno))
    return found, tree


def _to_param(name: str, value: Any) -> Param:
    if isinstance(value, IntParameter):
        return IntRange(name, value.low, value.high)
    if isinstance(value, BoolParameter):
        return Bool(name)
    if isinstance(value, TupleParameter):
        value = value.items
    if isinstance(value, tuple):
        if not value:
            # feinsum gives such a parameter the value () and nothing to tune.
            return Choice(name, ([],))
        return TupleOf(name, tuple(_to_param(f"{name}[{i}]", v) for i, v in enumerate(value)))
    raise _Unsupported(
        f"returned {value!r}, not an IntParameter, a BoolParameter or a tuple of them"
    )


def derive_space(source: str, filename: str, einsum: EinsumSpec) -> Space:
    """The :class:`Space` of a transform-space module's source for ``einsum``."""
    decorators, tree = read_decorators(source, filename)
    params = [d for d in decorators if d.kind == "transform_param"]
    if not params:
        raise ProblemError(
            f"transform space {filename} has no @transform_param decorators: nothing to tune"
        )
    interp = _Interpreter(_module_env(tree))
    view = EinsumView(einsum)
    out: list[Param] = []
    for deco in params:
        try:
            func = interp.eval(deco.func, {})
            if not isinstance(func, _Helper):
                raise _Unsupported("the parameter function is not a lambda or helper", deco.func)
            value = interp.call_function(func.params, func.body, [view])
            out.append(_to_param(deco.name, value))
        except _Unsupported as exc:
            line = getattr(exc.node, "lineno", deco.lineno)
            raise ProblemError(
                f"cannot read transform_param {deco.name!r} of {filename} (line {line}) "
                f"statically: {exc}"
            ) from None
        except ProblemError as exc:
            raise ProblemError(f"transform_param {deco.name!r} of {filename}: {exc}") from None
    return Space.of(out)


def space_from_file(path: Path, einsum: EinsumSpec) -> Space:
    try:
        source = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProblemError(f"cannot read transform space {str(path)!r}: {exc.strerror}") from None
    return derive_space(source, str(path), einsum)
