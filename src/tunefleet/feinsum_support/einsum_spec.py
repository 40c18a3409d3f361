"""A feinsum batched einsum as plain data, without feinsum.

A batched einsum is ``b`` einsums that share one subscript string: row ``r`` of ``args``
names the operands of the ``r``-th einsum (an operand shared by several rows, like a
reference matrix, appears in each of them). Indices with an integer length are fixed;
every other index is a *long* dimension (feinsum's ``SizeParam``, e.g. the element count),
set to ``long_dim_length`` when the kernel runs.

Two input forms reach :func:`parse_einsum`:

- compact (command line): ``einsum="ifj,fe,fej->ei"``, one-letter keys for the fixed
  lengths (``i=35, f=4, j=15``), ``batch=4``, ``operands="L,J,v*"`` (a trailing ``*`` makes
  one operand per row: ``v0 .. v3``) and ``dtype=float64``;
- the archive form, a dict ``{"subscripts", "index_to_length", "args", "arg_to_dtype"}``
  exactly as feinsum's ``FEINSUM_TIMING_FACTS`` stores it (JSON-decoded).

:meth:`EinsumSpec.archive_key` renders the four strings feinsum compares when it looks a
result up (``query``/``retrieve``); they are byte-exact only for an einsum in feinsum's
canonical form, which only feinsum can compute (it labels a graph with bliss):
:meth:`EinsumSpec.looks_canonical` is the cheap necessary check we can do here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tunefleet.errors import ProblemError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CANON_ARG = re.compile(r"^arg_(0|[1-9][0-9]*)$")
#: Keys of the archive form, as feinsum's table names its columns.
ARCHIVE_KEYS = ("subscripts", "index_to_length", "args", "arg_to_dtype")


def _indices(spec: str, where: str) -> str:
    text = re.sub(r"\s+", "", spec)
    for ch in text:
        if not ("a" <= ch <= "z"):
            raise ProblemError(
                f"einsum subscripts: {ch!r} in {where} {spec.strip()!r} is not an index; "
                "indices are single lower-case letters, e.g. 'ifj,fe,fej->ei'"
            )
    return text


def _dtype_name(raw: Any, where: str) -> str:
    import numpy as np

    try:
        return str(np.dtype(str(raw)).name)
    except TypeError:
        raise ProblemError(
            f"{where}: {raw!r} is not a NumPy dtype; use e.g. float64 or float32"
        ) from None


@dataclass(frozen=True)
class EinsumSpec:
    """A validated batched einsum (see the module docstring)."""

    inputs: tuple[str, ...]
    output: str
    lengths: tuple[tuple[str, int], ...]
    args: tuple[tuple[str, ...], ...]
    dtypes: tuple[tuple[str, str], ...]

    # --- construction ----------------------------------------------------------------
    @classmethod
    def build(
        cls,
        subscripts: str,
        lengths: Mapping[str, int],
        args: Sequence[Sequence[str]],
        dtypes: Mapping[str, str],
    ) -> EinsumSpec:
        if not isinstance(subscripts, str) or "->" not in subscripts:
            raise ProblemError(
                f"einsum subscripts {subscripts!r} need an explicit output, e.g. 'ij,j->i'"
            )
        lhs, _, rhs = subscripts.partition("->")
        if "->" in rhs:
            raise ProblemError(f"einsum subscripts {subscripts!r} have more than one '->'")
        inputs = tuple(_indices(part, "input") for part in lhs.split(","))
        output = _indices(rhs, "output")
        if len(set(output)) != len(output):
            raise ProblemError(f"einsum subscripts {subscripts!r} repeat an output index")
        used = set("".join(inputs))
        missing = sorted(set(output) - used)
        if missing:
            raise ProblemError(
                f"einsum subscripts {subscripts!r}: output index {missing[0]!r} appears in no input"
            )
        fixed: dict[str, int] = {}
        for idx, value in lengths.items():
            if idx not in used:
                raise ProblemError(
                    f"einsum length {idx}={value!r}: {idx!r} is not an index of {subscripts!r}"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ProblemError(
                    f"einsum length {idx}={value!r} is not a positive integer; "
                    "leave an index out to make it the long dimension"
                )
            fixed[idx] = value
        if not args:
            raise ProblemError("einsum: the batch has no rows of operands")
        rows: list[tuple[str, ...]] = []
        for r, row in enumerate(args):
            if isinstance(row, str) or len(row) != len(inputs):
                raise ProblemError(
                    f"einsum operands row {r} {row!r} does not have {len(inputs)} names "
                    f"(one per input of {subscripts!r})"
                )
            rows.append(tuple(str(name) for name in row))
        long_params = {idx.upper() for idx in used if idx not in fixed}
        spec_of: dict[str, str] = {}
        for row in rows:
            for name, idx_set in zip(row, inputs, strict=True):
                if not _IDENT.match(name):
                    raise ProblemError(f"einsum operand name {name!r} is not an identifier")
                if name in used or name in long_params:
                    raise ProblemError(
                        f"einsum operand {name!r} clashes with an index or a long-dimension "
                        "name; rename the operand"
                    )
                shape = tuple(fixed.get(i, -1) for i in idx_set)
                prev = spec_of.setdefault(name, repr(shape))
                if prev != repr(shape):
                    raise ProblemError(f"einsum operand {name!r} is used with two different shapes")
        all_args = sorted(spec_of)
        unknown = sorted(set(dtypes) - set(all_args))
        if unknown:
            raise ProblemError(f"einsum dtype given for unknown operand {unknown[0]!r}")
        missing_dt = [a for a in all_args if a not in dtypes]
        if missing_dt:
            raise ProblemError(f"einsum operand {missing_dt[0]!r} has no dtype")
        return cls(
            inputs=inputs,
            output=output,
            lengths=tuple(sorted(fixed.items())),
            args=tuple(rows),
            dtypes=tuple(sorted((a, _dtype_name(dtypes[a], f"dtype of {a}")) for a in all_args)),
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EinsumSpec:
        """The archive form (dict with :data:`ARCHIVE_KEYS`; values decoded or JSON text)."""
        if not isinstance(data, Mapping):
            raise ProblemError("einsum must be a subscript string or a JSON object")
        extra = sorted(set(data) - set(ARCHIVE_KEYS))
        absent = [k for k in ARCHIVE_KEYS if k not in data]
        if extra or absent:
            raise ProblemError(
                f"einsum object needs exactly the keys {list(ARCHIVE_KEYS)} "
                f"(missing {absent}, unknown {extra})"
            )
        decoded = {k: _maybe_json(data[k], k) for k in ARCHIVE_KEYS}
        if not isinstance(decoded["index_to_length"], Mapping):
            raise ProblemError("einsum index_to_length must be an object {index: length}")
        if not isinstance(decoded["arg_to_dtype"], Mapping):
            raise ProblemError("einsum arg_to_dtype must be an object {operand: dtype}")
        if not isinstance(decoded["args"], list):
            raise ProblemError("einsum args must be a list of rows of operand names")
        return cls.build(
            decoded["subscripts"],
            decoded["index_to_length"],
            decoded["args"],
            decoded["arg_to_dtype"],
        )

    # --- views -------------------------------------------------------------------------
    @property
    def subscripts(self) -> str:
        """Rendered the way feinsum's ``BatchedEinsum.get_subscripts`` does."""
        return f"{','.join(self.inputs)} -> {self.output}"

    @property
    def b(self) -> int:
        return len(self.args)

    @property
    def index_to_length(self) -> dict[str, int]:
        return dict(self.lengths)

    @property
    def arg_to_dtype(self) -> dict[str, str]:
        return dict(self.dtypes)

    @property
    def indices(self) -> list[str]:
        """Every index in order of first appearance in the inputs."""
        seen: list[str] = []
        for idx in "".join(self.inputs):
            if idx not in seen:
                seen.append(idx)
        return seen

    @property
    def long_indices(self) -> list[str]:
        fixed = self.index_to_length
        return [i for i in self.indices if i not in fixed]

    def arg_shape(self, name: str) -> tuple[int | str, ...]:
        """Shape of an operand: ints, and the upper-cased index for a long dimension."""
        fixed = self.index_to_length
        for row in self.args:
            for arg, idx_set in zip(row, self.inputs, strict=True):
                if arg == name:
                    return tuple(fixed.get(i, i.upper()) for i in idx_set)
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """The archive form, decoded (what problem arguments store)."""
        return {
            "subscripts": self.subscripts,
            "index_to_length": self.index_to_length,
            "args": [list(row) for row in self.args],
            "arg_to_dtype": self.arg_to_dtype,
        }

    def archive_key(self) -> tuple[str, str, str, str]:
        """``(subscripts, index_to_length, args, arg_to_dtype)`` as feinsum's archive stores
        them: ``json.dumps`` with its default separators, dicts with sorted keys."""
        return (
            self.subscripts,
            json.dumps(self.index_to_length, sort_keys=True),
            json.dumps([list(row) for row in self.args]),
            json.dumps(self.arg_to_dtype, sort_keys=True),
        )

    def looks_canonical(self) -> bool:
        """True when the names could be feinsum's canonical ones (operands ``arg_0 ..``,
        indices a run of letters from ``i``). Necessary, not sufficient."""
        names = {a for row in self.args for a in row}
        if not all(_CANON_ARG.match(a) for a in names):
            return False
        if names != {f"arg_{k}" for k in range(len(names))}:
            return False
        letters = [chr((ord("i") - ord("a") + k) % 26 + ord("a")) for k in range(26)]
        return set(self.indices) == set(letters[: len(self.indices)])

    def describe(self) -> str:
        lengths = ", ".join(f"{k}={v}" for k, v in self.lengths)
        return f"{self.subscripts} [{lengths}] x{self.b}"


def _maybe_json(value: Any, key: str) -> Any:
    if isinstance(value, str) and key != "subscripts":
        try:
            return json.loads(value)
        except ValueError:
            raise ProblemError(f"einsum {key} {value!r} is not valid JSON") from None
    return value


def _operand_rows(operands: Any, n_inputs: int, batch: int) -> list[list[str]]:
    if operands is None:
        # Without names, every operand is its own array in every row.
        names: list[str] = [f"a{j}_*" if batch > 1 else f"a{j}" for j in range(n_inputs)]
    elif isinstance(operands, str):
        names = [p.strip() for p in operands.split(",")]
    elif isinstance(operands, list) and all(isinstance(p, str) for p in operands):
        names = [p.strip() for p in operands]
    else:
        raise ProblemError(f"operands {operands!r} must be comma-separated names, e.g. L,J,v*")
    if len(names) != n_inputs:
        raise ProblemError(
            f"operands {','.join(names)!r} name {len(names)} operands but the einsum has "
            f"{n_inputs} inputs"
        )
    rows: list[list[str]] = []
    for r in range(batch):
        rows.append([n[:-1] + str(r) if n.endswith("*") else n for n in names])
    return rows


def parse_einsum(raw: Mapping[str, Any]) -> tuple[EinsumSpec, set[str]]:
    """Read an einsum from raw problem arguments. Returns the spec and the keys it used."""
    if "einsum" not in raw:
        raise ProblemError(
            "feinsum needs einsum=SUBSCRIPTS (e.g. --arg einsum='ifj,fe,fej->ei' "
            "--size i=35,f=4,j=15 --arg batch=4 --arg operands=L,J,v*)"
        )
    value = raw["einsum"]
    letters = {k for k in raw if len(k) == 1 and "a" <= k <= "z"}
    compact_keys = {"batch", "operands", "dtype"} & set(raw)
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            raise ProblemError(f"einsum {value!r} is not valid JSON") from None
    if isinstance(value, Mapping):
        if letters or compact_keys:
            given = sorted(letters | compact_keys)
            raise ProblemError(
                f"einsum is a full object already; drop {', '.join(given)} (they only "
                "go with the compact einsum=SUBSCRIPTS form)"
            )
        return EinsumSpec.from_json(value), {"einsum"}
    if not isinstance(value, str):
        raise ProblemError(f"einsum {value!r} must be a subscript string like 'ij,j->i'")
    batch = raw.get("batch", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise ProblemError(f"batch={batch!r} is not a positive integer")
    n_inputs = len(value.split("->")[0].split(","))
    rows = _operand_rows(raw.get("operands"), n_inputs, batch)
    dtype = _dtype_name(raw.get("dtype", "float64"), "dtype")
    names: Iterable[str] = {a for row in rows for a in row}
    spec = EinsumSpec.build(
        value,
        {k: raw[k] for k in sorted(letters)},
        rows,
        dict.fromkeys(names, dtype),
    )
    return spec, {"einsum"} | letters | compact_keys
