"""Batched einsums as data: the command-line forms, validation, and feinsum's archive strings."""

from __future__ import annotations

import json

import pytest

from tunefleet.errors import ProblemError
from tunefleet.feinsum_support.einsum_spec import EinsumSpec, parse_einsum

FACE_MASS = {
    "einsum": "ifj,fe,fej->ei",
    "i": 35,
    "f": 4,
    "j": 15,
    "batch": 3,
    "operands": "L,J,v*",
}
# The face-mass einsum of 4 fields in feinsum's canonical form, as its archive stores it.
CANONICAL = {
    "subscripts": "lk,ilj,lkj -> ki",
    "index_to_length": '{"i": 35, "j": 15, "l": 4}',
    "args": '[["arg_4", "arg_5", "arg_0"], ["arg_4", "arg_5", "arg_1"], '
    '["arg_4", "arg_5", "arg_2"], ["arg_4", "arg_5", "arg_3"]]',
    "arg_to_dtype": json.dumps({f"arg_{k}": "float64" for k in range(6)}, sort_keys=True),
}


def test_compact_form_builds_rows_shared_and_per_row_operands():
    spec, used = parse_einsum(FACE_MASS)
    assert used == {"einsum", "i", "f", "j", "batch", "operands"}
    assert spec.subscripts == "ifj,fe,fej -> ei"
    assert spec.args == (("L", "J", "v0"), ("L", "J", "v1"), ("L", "J", "v2"))
    assert spec.index_to_length == {"f": 4, "i": 35, "j": 15}
    assert spec.long_indices == ["e"]
    assert spec.arg_shape("v1") == (4, "E", 15)
    assert spec.arg_to_dtype == dict.fromkeys(["J", "L", "v0", "v1", "v2"], "float64")


def test_archive_form_round_trips_byte_exact():
    spec = EinsumSpec.from_json(CANONICAL)
    assert spec.archive_key() == (
        CANONICAL["subscripts"],
        CANONICAL["index_to_length"],
        CANONICAL["args"],
        CANONICAL["arg_to_dtype"],
    )
    again, _ = parse_einsum({"einsum": json.dumps(spec.to_json())})
    assert again == spec
    assert again.looks_canonical()


def test_user_names_do_not_look_canonical():
    spec, _ = parse_einsum(FACE_MASS)
    assert not spec.looks_canonical()


def test_dtype_and_default_operands():
    spec, _ = parse_einsum({"einsum": "ij,j->i", "i": 8, "j": 8, "dtype": "float32"})
    assert spec.args == (("a0", "a1"),)
    assert set(spec.arg_to_dtype.values()) == {"float32"}
    batched, _ = parse_einsum({"einsum": "ij,j->i", "j": 8, "batch": 2})
    assert batched.args == (("a0_0", "a1_0"), ("a0_1", "a1_1"))


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({}, "needs einsum="),
        ({"einsum": "ij,j"}, "explicit output"),
        ({"einsum": "iJ,j->i"}, "single lower-case letters"),
        ({"einsum": "ij,j->k"}, "appears in no input"),
        ({"einsum": "ij,j->ii"}, "repeat an output index"),
        ({"einsum": "ij,j->i", "i": 0}, "not a positive integer"),
        ({"einsum": "ij,j->i", "k": 3}, "'k' is not an index"),
        ({"einsum": "ij,j->i", "operands": "A"}, "name 1 operands"),
        ({"einsum": "ij,j->i", "operands": "A,i"}, "clashes with an index"),
        ({"einsum": "ij,j->i", "i": 4, "operands": "A,J"}, "long-dimension"),
        ({"einsum": "ij,jk->i", "operands": "A,A", "i": 2, "j": 3, "k": 4}, "two different"),
        ({"einsum": "ij,j->i", "dtype": "floaty"}, "not a NumPy dtype"),
        ({"einsum": "ij,j->i", "batch": 0}, "batch=0"),
        ({"einsum": "{not json"}, "not valid JSON"),
        ({"einsum": {"subscripts": "i->i"}}, "needs exactly the keys"),
        ({"einsum": json.dumps(CANONICAL), "i": 3}, "drop i"),
    ],
)
def test_bad_einsums_name_the_problem(raw, needle):
    with pytest.raises(ProblemError) as err:
        parse_einsum(raw)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)
