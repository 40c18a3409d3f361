"""Reading a feinsum transform-space module's parameter space statically (no feinsum here).

The modules below are written in the styles feinsum's shipped spaces use (``fnsm.tuning.``
prefixes, bare imported names, ``math`` helpers, tuples of parameters, helpers imported from
``feinsum.utils``). Each starts by raising, so a test passes only if nothing imports it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunefleet.errors import ProblemError
from tunefleet.feinsum_support.einsum_spec import parse_einsum
from tunefleet.feinsum_support.static_space import derive_space, space_from_file
from tunefleet.problems.registry import get_problem
from tunefleet.space import Bool, Choice, IntRange, TupleOf

FACE_MASS = {"einsum": "ifj,fe,fej->ei", "i": 35, "f": 4, "j": 15, "batch": 4, "operands": "L,J,v*"}

PREFIXED = """
raise RuntimeError("a static reader must never import this module")
import math
import feinsum as fnsm
from feinsum.tuning import IntParameter, BoolParameter

N_MAX = 32


@fnsm.tuning.einsum_arg("nface", lambda e: e.args[0][2].shape[0])
@fnsm.tuning.einsum_arg("nfields", lambda e: e.b)
@fnsm.tuning.transform_param("n_e_per_wg", lambda e: IntParameter(2, N_MAX))
@fnsm.tuning.transform_param("nwork_items_per_e", lambda e: IntParameter(1, e.args[0][2].shape[2]))
@fnsm.tuning.transform_param("n_stmt_tile", lambda e: IntParameter(1, math.ceil(e.b)))
@fnsm.tuning.transform_param("n_i_tile", lambda e: IntParameter(1, math.ceil(e.shape[1] / 2)))
@fnsm.tuning.transform_param("unroll", lambda e: BoolParameter())
def transform(t_unit, nface, nfields, n_e_per_wg, nwork_items_per_e, n_stmt_tile, n_i_tile,
              unroll, insn_match=None, kernel_name=None):
    return t_unit
"""

BARE = '''
raise RuntimeError("never imported")
import math
from math import ceil
from feinsum.tuning import IntParameter, einsum_arg, transform_param
from feinsum.utils import get_n_redn_dim


def n_out_tiles(ensm):
    """A helper with a single return."""
    return min(ensm.ndim, 4)


@einsum_arg("ensm", lambda ensm: ensm)
@transform_param(
    "perm",
    lambda ensm: IntParameter(0, math.perm(ensm.ndim, min(ensm.ndim, 4)) - 1),
)
@transform_param(
    "log2_tiles",
    lambda ensm: tuple(IntParameter(1, 5) for _ in range(n_out_tiles(ensm))),
)
@transform_param(
    "log2_redn", lambda ensm: tuple(IntParameter(0, 5) for i in range(get_n_redn_dim(ensm)))
)
@transform_param(
    var_name="pair", func=lambda ensm: (IntParameter(0, 1), (IntParameter(1, ceil(7 / 2)),))
)
@transform_param(
    "wg",
    lambda ensm: IntParameter(
        1, ensm.index_to_dim_length["j"] if "j" in ensm.all_indices else 1
    ),
)
def transform(t_unit, ensm, perm, log2_tiles, log2_redn, pair, wg, insn_match=None,
              kernel_name=None):
    return t_unit
'''


def _spec(raw):
    return parse_einsum(raw)[0]


def test_prefixed_decorators_give_the_box_in_source_order():
    space = derive_space(PREFIXED, "prefixed.py", _spec(FACE_MASS))
    assert space.names() == ["n_e_per_wg", "nwork_items_per_e", "n_stmt_tile", "n_i_tile", "unroll"]
    assert space.param("n_e_per_wg") == IntRange("n_e_per_wg", 2, 32)
    # args[0][2] is v0 of shape (f, e, j): its last axis has length j = 15.
    assert space.param("nwork_items_per_e") == IntRange("nwork_items_per_e", 1, 15)
    assert space.param("n_stmt_tile") == IntRange("n_stmt_tile", 1, 4)
    assert space.param("n_i_tile") == IntRange("n_i_tile", 1, 18)
    assert space.param("unroll") == Bool("unroll")
    assert space.size() == 31 * 15 * 4 * 18 * 2


def test_bare_names_helpers_tuples_and_keywords():
    space = derive_space(BARE, "bare.py", _spec({"einsum": "ij,jk->ik", "i": 64, "j": 32, "k": 64}))
    assert space.param("perm") == IntRange("perm", 0, 1)
    tiles = space.param("log2_tiles")
    assert isinstance(tiles, TupleOf) and len(tiles.items) == 2
    redn = space.param("log2_redn")
    assert isinstance(redn, TupleOf) and [p.to_json()["high"] for p in redn.items] == [5]
    pair = space.param("pair")
    assert isinstance(pair, TupleOf)
    assert pair.default() == [0, [1]]
    assert space.param("wg") == IntRange("wg", 1, 32)
    # A configuration is JSON: tuples travel as lists and round-trip through the space.
    config = space.default()
    assert space.check(json.loads(json.dumps(config))) == config


def test_an_empty_tuple_parameter_has_the_single_value_empty():
    space = derive_space(BARE, "bare.py", _spec({"einsum": "ij->ij", "i": 4, "j": 4}))
    assert space.param("log2_redn") == Choice("log2_redn", ([],))


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("lambda e: IntParameter(1, e.shape[0] // 2)", "arithmetic on the long dimension E"),
        ("lambda e: IntParameter(1, open('x').read())", "name 'open' is not known"),
        ("lambda e: IntParameter(1, e.__class__)", "attribute .__class__"),
        ("lambda e: IntParameter(1, e.shape[9])", "IndexError"),
        ("lambda e: 3", "not an IntParameter"),
        ("lambda e: IntParameter(1, 2.5)", "not an integer"),
        ("lambda e: IntParameter(5, 1)", "empty integer range"),
        ("lambda e: IntParameter(1, 2 ** 1000)", "exponent too large"),
        ("lambda e: tuple(IntParameter(1, 2) for _ in range(10**7))", "too large"),
        ("undefined_helper", "not known statically"),
    ],
)
def test_unsupported_or_wrong_parameter_functions_name_parameter_and_line(body, needle):
    source = (
        "import math\nfrom feinsum.tuning import IntParameter, transform_param\n"
        f"@transform_param('tile', {body})\ndef transform(t_unit, tile):\n    return t_unit\n"
    )
    with pytest.raises(ProblemError) as err:
        derive_space(source, "space.py", _spec(FACE_MASS))
    message = str(err.value)
    assert needle in message
    assert "'tile'" in message and "space.py" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("def transform(:\n", "not valid Python"),
        ("def other(t):\n    return t\n", "no top-level `def transform"),
        ("def transform(t):\n    return t\n", "nothing to tune"),
        (
            "from feinsum.tuning import transform_param\n"
            "@transform_param\ndef transform(t):\n  pass\n",
            "needs (NAME, FUNC)",
        ),
        (
            "from feinsum.tuning import transform_param\nname = 'x'\n"
            "@transform_param(name, lambda e: 1)\ndef transform(t):\n  pass\n",
            "string literal",
        ),
    ],
)
def test_modules_that_are_not_transform_spaces(source, needle):
    with pytest.raises(ProblemError) as err:
        derive_space(source, "space.py", _spec(FACE_MASS))
    assert needle in str(err.value)


def test_missing_file_is_a_problem_error(tmp_path):
    with pytest.raises(ProblemError, match="cannot read transform space"):
        space_from_file(tmp_path / "absent.py", _spec(FACE_MASS))


# --- the problem plugin ---------------------------------------------------------------------


@pytest.fixture
def impls(tmp_path, monkeypatch) -> Path:
    """A directory standing in for feinsum's shipped tuning/impls."""
    d = tmp_path / "impls"
    d.mkdir()
    (d / "face_mass.py").write_text(PREFIXED)
    monkeypatch.setenv("TUNEFLEET_FEINSUM_IMPLS", str(d))
    return d


def test_problem_normalises_args_and_derives_the_space_without_feinsum(impls):
    problem = get_problem("feinsum")
    args = problem.normalise_args({**FACE_MASS, "space": "feinsum:face_mass.py"})
    assert args == {
        "space": "feinsum:face_mass.py",
        "einsum": _spec(FACE_MASS).to_json(),
        "long_dim_length": 100_000,
    }
    # Normalising the stored form again changes nothing (resume, cache keys).
    assert problem.normalise_args(json.loads(json.dumps(args))) == args
    space = problem.space(args)
    assert space.names()[0] == "n_e_per_wg"
    by_path = problem.normalise_args({**FACE_MASS, "space": str(impls / "face_mass.py")})
    assert by_path["space"] == str((impls / "face_mass.py").resolve())
    assert problem.space(by_path) == space


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({**FACE_MASS}, "needs space="),
        ({**FACE_MASS, "space": "feinsum:../x.py"}, "feinsum:NAME.py"),
        ({**FACE_MASS, "space": "module"}, "not a Python file"),
        (
            {**FACE_MASS, "space": "feinsum:face_mass.py", "tile": 4},
            "does not take argument(s) tile",
        ),
        ({**FACE_MASS, "space": "feinsum:face_mass.py", "n": 4}, "'n' is not an index"),
        ({**FACE_MASS, "space": "feinsum:face_mass.py", "long_dim_length": 0}, "long_dim_length"),
    ],
)
def test_problem_rejects_bad_arguments(impls, raw, needle):
    with pytest.raises(ProblemError) as err:
        get_problem("feinsum").normalise_args(raw)
    assert needle in str(err.value)


def test_unknown_shipped_space_and_missing_user_file(impls, tmp_path):
    problem = get_problem("feinsum")
    args = problem.normalise_args({**FACE_MASS, "space": "feinsum:nope.py"})
    with pytest.raises(ProblemError, match="not among feinsum's shipped spaces"):
        problem.space(args)
    args = problem.normalise_args({**FACE_MASS, "space": str(tmp_path / "gone.py")})
    with pytest.raises(ProblemError, match="does not exist on this machine"):
        problem.space(args)


def test_worker_side_without_feinsum_says_how_to_install(impls):
    from tunefleet.feinsum_support.spaces import feinsum_installed

    if feinsum_installed():
        pytest.skip("feinsum is installed here")
    problem = get_problem("feinsum")
    args = problem.normalise_args({**FACE_MASS, "space": "feinsum:face_mass.py"})
    from tunefleet.devices import DeviceInfo

    device = DeviceInfo(platform="p", vendor="v", name="n", driver_version="d")
    with pytest.raises(ProblemError, match=r"install tunefleet\[feinsum\] on Python >= 3.12"):
        problem.prepare(args, problem.space(args).default(), device)


def test_without_einsum_and_space_the_problem_is_the_face_mass_demo(impls):
    from tunefleet.feinsum_support.problem import DEMO

    problem = get_problem("feinsum")
    demo = problem.normalise_args({})
    assert demo["space"] == DEMO["space"] == "feinsum:ifj_fe_fej_to_ei_v3.py"
    assert demo["einsum"]["subscripts"] == "ifj,fe,fej -> ei"
    assert demo["einsum"]["index_to_length"] == {"f": 4, "i": 35, "j": 15}
    assert len(demo["einsum"]["args"]) == 4
    smaller = problem.normalise_args({"i": 20, "long_dim_length": 1000})
    assert smaller["einsum"]["index_to_length"]["i"] == 20 and smaller["long_dim_length"] == 1000
    with pytest.raises(ProblemError, match="needs space="):
        problem.normalise_args({"einsum": "ij,j->i"})


def test_feinsums_own_timing_is_a_protocol_statistic():
    from tunefleet.feinsum_support import archive
    from tunefleet.problems.base import Protocol

    assert Protocol.from_json(archive.FEINSUM_PROTOCOL).statistic == "feinsum-wall-mean"
    assert archive.FEINSUM_PROTOCOL == Protocol(statistic="feinsum-wall-mean").to_json()
    with pytest.raises(ProblemError, match="feinsum-wall-mean"):
        Protocol(statistic="mean")
