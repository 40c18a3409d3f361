"""feinsum's canonical form of an einsum, and the archive strings feinsum renders for it.

Shared by :mod:`~tunefleet.feinsum_support.runtime` (the worker side, which builds kernels on
the canonical form and records these strings with every measurement) and
:mod:`~tunefleet.feinsum_support.archive` (which needs them to export a measurement whose
einsum was not given, or recorded, in canonical form). Only feinsum can compute them: it is
imported inside the functions, and a missing feinsum is a one-line
:class:`~tunefleet.errors.ProblemError`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from tunefleet.errors import ProblemError
from tunefleet.feinsum_support import INSTALL_HINT
from tunefleet.feinsum_support.einsum_spec import EinsumSpec
from tunefleet.space import canonical_json


def require_feinsum() -> Any:
    """The feinsum module, or a ProblemError that says how to get it."""
    try:
        import feinsum
    except ImportError as exc:
        raise ProblemError(f"the feinsum problem needs feinsum ({exc}); {INSTALL_HINT}") from None
    except SyntaxError:
        raise ProblemError(f"feinsum does not run on this Python; {INSTALL_HINT}") from None
    return feinsum


def build_einsum(spec: EinsumSpec) -> Any:
    """feinsum's ``BatchedEinsum`` for a spec (long dimensions as size parameters)."""
    fe = require_feinsum()
    dtypes = spec.arg_to_dtype
    rows = [
        [fe.array(name, spec.arg_shape(name), dtypes[name]) for name in row] for row in spec.args
    ]
    return fe.batched_einsum(spec.subscripts, rows)


@functools.lru_cache(maxsize=16)
def canonical_of_json(einsum_json: str) -> Any:
    """The canonical form of the einsum ``canonical_json(spec.to_json())`` (cached by that
    text: equal specs share one entry)."""
    fe = require_feinsum()
    return fe.canonicalize_einsum(build_einsum(EinsumSpec.from_json(json.loads(einsum_json))))


def canonical_einsum(spec: EinsumSpec) -> Any:
    """feinsum's canonical form of ``spec`` (the form transform spaces are written against)."""
    return canonical_of_json(canonical_json(spec.to_json()))


def archive_strings(canonical: Any) -> dict[str, str]:
    """The four einsum columns of an archive row, rendered by feinsum itself."""
    from feinsum import sql_utils

    return {
        "subscripts": canonical.get_subscripts(),
        "index_to_length": sql_utils.dump_index_to_length(canonical),
        "args": sql_utils.dump_arg_names(canonical),
        "arg_to_dtype": sql_utils.dump_arg_to_dtype(canonical),
    }


def canonical_archive_key(spec: EinsumSpec) -> tuple[str, str, str, str]:
    """``(subscripts, index_to_length, args, arg_to_dtype)`` of the canonical form."""
    s = archive_strings(canonical_einsum(spec))
    return (s["subscripts"], s["index_to_length"], s["args"], s["arg_to_dtype"])
