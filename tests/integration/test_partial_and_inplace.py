"""Kernels that write part of an output, or update an argument in place, on a real OpenCL
device (PoCL is enough).

The user problems here are the examples of ``docs/problems.md``, copied verbatim into a file
(so the documentation is what is tested); their planted bugs are one-line edits of that text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tunefleet.problems import kernel
from tunefleet.problems.base import Protocol
from tunefleet.problems.jacobi import Jacobi
from tunefleet.problems.kernel import RESTORED_KEY, KernelProblem
from tunefleet.problems.registry import get_problem

pytestmark = pytest.mark.opencl

PROTOCOL = Protocol(warmup=2, min_launches=3, min_seconds=0.0, max_launches=5, seed=1)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "problems.md"
#: The stencil's target size. Its reference there is affordable, so it is validated at this
#: size (its documented small validation size, 20 x (2 * wg + 5) = 20 x 69, serves only where
#: the target size's reference is too costly).
STENCIL = {"n": 30, "m": 100}


@pytest.fixture(scope="module")
def session() -> Any:
    pytest.importorskip("pyopencl")
    from tunefleet.worker.device import list_devices, open_session

    devices = list_devices()
    if not devices:
        pytest.skip("no OpenCL device")
    return open_session(devices[0])


def doc_example(class_name: str) -> str:
    """The ``python`` block of docs/problems.md that defines ``class_name``."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    (block,) = [b for b in blocks if f"class {class_name}(KernelProblem)" in b]
    return block


def user_problem(tmp_path: Path, text: str, *edits: tuple[str, str]) -> KernelProblem:
    for old, new in edits:
        assert text.count(old) == 1, f"the documented example no longer contains {old!r}"
        text = text.replace(old, new)
    path = tmp_path / "user_problem.py"
    path.write_text(text)
    problem = get_problem(str(path))
    assert isinstance(problem, KernelProblem)
    return problem


def evaluate(problem: KernelProblem, session: Any, args: dict[str, Any]) -> Any:
    full = problem.normalise_args(args)
    prepared = problem.prepare(full, problem.default_config(full), session.info)
    return problem.measure(prepared, session, PROTOCOL)


# --- unchecked elements: a stencil that writes only the interior -----------------------------


def test_documented_stencil_writes_only_the_interior_validates_and_is_timed(session, tmp_path):
    problem = user_problem(tmp_path, doc_example("Smooth"))
    outcome = evaluate(problem, session, STENCIL)
    assert outcome.state == "done", outcome.error
    assert len(outcome.samples_s) >= PROTOCOL.min_launches and outcome.median_s > 0
    assert outcome.validation["args"] == STENCIL
    # Validation checked the interior only, and so did the check after timing.
    assert outcome.validation["outputs"]["out"]["checked"] == 28 * 98
    assert outcome.validation["outputs"]["out"]["elements"] == 3000
    assert outcome.validation["target_checked"] == {"out": {"checked": 28 * 98, "elements": 3000}}
    assert outcome.protocol == PROTOCOL.to_json()  # nothing restored: nothing recorded


def test_a_stencil_skipping_one_interior_element_is_invalid(session, tmp_path):
    # i + j > 2 leaves out exactly (1, 1), an element the reference has a number for.
    problem = user_problem(
        tmp_path, doc_example("Smooth"), ("1 <= j < m - 1}", "1 <= j < m - 1 and i + j > 2}")
    )
    outcome = evaluate(problem, session, STENCIL)
    assert outcome.state == "invalid"
    assert outcome.error == (
        "at the target size, out: 1 of 2744 checked outputs are NaN or infinite (not written, "
        "or a wrong computation)"
    )
    assert outcome.validation["outputs"]["out"]["checked"] == 28 * 98
    assert not outcome.samples_s


def test_a_stencil_skipping_interior_elements_only_at_the_target_size_is_invalid(session, tmp_path):
    # At the small validation size (m = 69) i + j stays below 110: the gap opens only at
    # m = 100, where this configuration is validated before it is timed.
    problem = user_problem(
        tmp_path, doc_example("Smooth"), ("1 <= j < m - 1}", "1 <= j < m - 1 and i + j < 110}")
    )
    outcome = evaluate(problem, session, STENCIL)
    assert outcome.state == "invalid"
    i, j = np.meshgrid(np.arange(1, 29), np.arange(1, 99), indexing="ij")
    skipped = int((i + j >= 110).sum())
    assert skipped == 153
    assert outcome.error == (
        f"at the target size, out: {skipped} of {28 * 98} checked outputs are NaN or infinite "
        "(not written, or a wrong computation)"
    )
    assert not outcome.validation["passed"] and not outcome.samples_s


def test_a_wrong_number_next_to_unchecked_elements_is_still_caught(session, tmp_path):
    problem = user_problem(tmp_path, doc_example("Smooth"), (') / 4",', ') / 4 + 0.01",'))
    outcome = evaluate(problem, session, STENCIL)
    assert outcome.state == "invalid"
    assert re.fullmatch(
        r"at the target size, out: wrong numbers \(max error .*float32 tolerance 0.0001\)",
        outcome.error,
    )


class _BoundaryKept(Jacobi):
    """The built-in stencil with ``out`` starting as a copy of ``u``: the boundary the kernel
    leaves alone keeps those contents, and the reference checks every element."""

    start = "copy"

    def make_inputs(self, args: Any, rng: np.random.Generator) -> dict[str, Any]:
        inputs = super().make_inputs(args, rng)
        start = inputs["u"].copy() if self.start == "copy" else np.zeros_like(inputs["u"])
        return {**inputs, "out": start}

    def reference(self, args: Any, inputs: Any) -> dict[str, Any]:
        out = super().reference(args, inputs)["out"]
        u = inputs["u"].astype(np.float64)
        return {"out": np.where(np.isnan(out), u, out)}


def test_starting_contents_of_a_write_only_output_are_where_validation_starts(session):
    problem = _BoundaryKept()
    outcome = evaluate(problem, session, {"n": 300, "m": 200})
    assert outcome.state == "done", outcome.error
    verdict = outcome.validation["outputs"]["out"]
    assert verdict["checked"] == verdict["elements"]  # the boundary is checked now
    # A write-only output is never restored, so nothing is recorded.
    assert RESTORED_KEY not in outcome.protocol

    zeros = _BoundaryKept()
    zeros.start = "zeros"  # the boundary starts as 0, the reference expects u there
    outcome = evaluate(zeros, session, {"n": 300, "m": 200})
    assert outcome.state == "invalid" and "out: wrong numbers" in outcome.error


def test_the_builtin_stencil_is_validated_and_timed_at_its_target_size(session):
    problem = get_problem("jacobi")
    outcome = evaluate(problem, session, {"n": 300, "m": 200})
    assert outcome.state == "done", outcome.error
    assert (outcome.validation["args"]["n"], outcome.validation["args"]["m"]) == (300, 200)
    assert outcome.validation["outputs"]["out"]["checked"] == 298 * 198
    assert outcome.validation["target_checked"] == {
        "out": {"checked": 298 * 198, "elements": 60000}
    }


# --- updates in place -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1000, 5000])  # under and over its small validation size
def test_documented_in_place_update_validates_from_its_starting_contents(session, tmp_path, n):
    problem = user_problem(tmp_path, doc_example("Relax"))
    outcome = evaluate(problem, session, {"n": n})
    assert outcome.state == "done", outcome.error
    assert outcome.validation["args"]["n"] == n
    assert outcome.validation["outputs"]["u"]["checked"] == n
    assert outcome.protocol == {**PROTOCOL.to_json(), RESTORED_KEY: ["u"]}


def test_an_in_place_kernel_that_ignores_the_starting_contents_is_invalid(session, tmp_path):
    problem = user_problem(
        tmp_path, doc_example("Relax"), ('"u[i] = scale * u[i] + v[i]"', '"u[i] = v[i]"')
    )
    outcome = evaluate(problem, session, {"n": 1000})
    assert outcome.state == "invalid"
    assert outcome.error.startswith("at the target size, u: wrong numbers")


@pytest.mark.parametrize("n", [1000, 5000])
def test_repeated_timing_launches_of_an_in_place_update_do_the_same_work(
    session, tmp_path, monkeypatch, n
):
    """u = 1e30 u + v overflows float32 on its second application: the check after timing
    (3 warm-up and timed launches at least) finds every element finite only because u is
    restored before each launch; without the restore it is not."""
    problem = user_problem(tmp_path, doc_example("Relax"))
    outcome = evaluate(problem, session, {"n": n, "scale": 1e30})
    assert outcome.state == "done", outcome.error
    assert outcome.validation["target_checked"] == {"u": {"checked": n, "elements": n}}

    monkeypatch.setattr(kernel._KernelArrays, "restore", lambda self: None)
    outcome = evaluate(problem, session, {"n": n, "scale": 1e30})
    assert outcome.state == "invalid"
    assert re.fullmatch(
        rf"at the target size, u: \d+ of {n} outputs are NaN or infinite \(not written, or "
        r"a wrong computation\)",
        outcome.error,
    )


def test_the_builtin_in_place_update_is_timed_from_restored_contents(session):
    problem = get_problem("axpy")
    outcome = evaluate(problem, session, {"n": 100_000, "alpha": 0.25})
    assert outcome.state == "done", outcome.error
    assert outcome.protocol[RESTORED_KEY] == ["u"]
    assert outcome.gbps and outcome.gbps > 0


def test_in_place_argument_without_starting_contents_names_the_fix(session, tmp_path):
    problem = user_problem(
        tmp_path,
        doc_example("Relax"),
        ('"u": rng.uniform(-1, 1, args["n"]).astype(np.float32),  # u\'s starting contents\n', ""),
    )
    with pytest.raises(KeyError, match=r"'u' is read and written .* make_inputs must return"):
        evaluate(problem, session, {"n": 1000})


def test_starting_contents_of_the_wrong_size_name_the_argument(session, tmp_path):
    problem = user_problem(
        tmp_path,
        doc_example("Relax"),
        ('"u": rng.uniform(-1, 1, args["n"])', '"u": rng.uniform(-1, 1, args["n"] + 1)'),
    )
    with pytest.raises(ValueError, match=r"starting contents of 'u' are float32 \(1001,\)"):
        evaluate(problem, session, {"n": 1000})
