"""How a held trial ends (tunefleet.worker.results): each reply of a child becomes a verdict
with a reason, and whatever a problem's ``measure`` returns becomes a measurement row or a
failure that names what was wrong. No processes, no database."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tunefleet import __version__
from tunefleet.problems.base import Outcome, Protocol
from tunefleet.queries.queue import ClaimedTrial
from tunefleet.worker.results import Ending, Held, ending, measurement_row, outcome_ending
from tunefleet.worker.supervise import Reply
from tunefleet.worker.vocabulary import ReplyKind, Stage, Verdict

PROTOCOL = Protocol(min_launches=3).to_json()


def claim(trial_id: int = 1, run_id: int = 10) -> ClaimedTrial:
    return ClaimedTrial(
        trial_id=trial_id,
        run_id=run_id,
        attempt=1,
        max_attempts=3,
        config={"x": 1},
        config_hash="h",
        timeout_s=None,
        device_class="any",
        problem="synthetic",
        problem_args={},
        protocol=PROTOCOL,
        cache_key="k",
        lease_token="t",
    )


def done(**kw: Any) -> Outcome:
    return Outcome(
        **{"state": "done", "median_s": 0.003, "min_s": 0.002, "samples_s": (0.003,)} | kw
    )


@pytest.mark.parametrize(
    ("kind", "preparing", "verdict", "error"),
    [
        (ReplyKind.INVALID, True, Verdict.INVALID, "m"),
        (ReplyKind.TIMEOUT, True, Verdict.TIMED_OUT, "code generation m and was killed"),
        (ReplyKind.TIMEOUT, False, Verdict.TIMED_OUT, "evaluation m and was killed"),
        (ReplyKind.DIED, False, Verdict.FAILED, "evaluation process m"),
        (ReplyKind.ENVIRONMENT, True, Verdict.ENVIRONMENT, "code generation: m"),
        (ReplyKind.ERROR, False, Verdict.ERROR, "evaluation raised m"),
    ],
)
def test_each_reply_ends_a_trial_with_its_verdict_and_phase(
    kind: ReplyKind, preparing: bool, verdict: Verdict, error: str
) -> None:
    assert ending(claim(), Reply(kind, message="m"), preparing) == Ending(verdict, error)


def test_a_good_outcome_becomes_a_plain_measurement_row() -> None:
    outcome = Outcome(
        state="done",
        median_s=np.float32(0.003),
        min_s=np.float64(0.002),
        samples_s=tuple(np.array([0.002, 0.003], dtype=np.float32)),
        gflops=np.float32(1.5),
        validation={"passed": np.bool_(True), "err": float("nan"), "shape": (np.int64(4), 5)},
        versions={"loopy": "2025.2"},
        code=123,  # type: ignore[arg-type]
    )
    got = ending(claim(), Reply(ReplyKind.OK, outcome), preparing=False)
    assert got.verdict == Verdict.DONE and got.error is None
    row = got.measurement
    assert row is not None
    assert type(row.median_s) is float and row.median_s == pytest.approx(0.003)
    assert all(type(x) is float for x in row.samples_s)
    assert row.validation == {"passed": True, "err": None, "shape": [4, 5]}
    assert row.versions == {"tunefleet": __version__, "loopy": "2025.2"}
    assert row.protocol == PROTOCOL  # the claim's, as the problem reported none
    assert row.code == "123"
    own = measurement_row(claim(), done(protocol={"launches": np.int64(7)}))
    assert own.protocol == {"launches": 7}


@pytest.mark.parametrize(
    ("outcome", "verdict", "error"),
    [
        ("not an outcome", Verdict.FAILED, "measure returned str, not an Outcome"),
        (Outcome(state="invalid", error="wrong numbers"), Verdict.INVALID, "wrong numbers"),
        (Outcome(state="invalid"), Verdict.INVALID, "invalid configuration"),
        (Outcome(state="weird"), Verdict.FAILED, "measure returned an outcome in state 'weird'"),
        (done(median_s="fast"), Verdict.FAILED, "measure returned numbers that are not numbers"),
        (Outcome(state="done"), Verdict.FAILED, "measure returned unusable timings: median_s"),
        (done(samples_s=()), Verdict.FAILED, "unusable timings: no timing samples"),
        (done(min_s=-1.0), Verdict.FAILED, "min_s=-1.0 is not a positive finite number"),
    ],
)
def test_a_misbehaving_measure_fails_or_invalidates_the_trial_with_the_reason(
    outcome: Any, verdict: Verdict, error: str
) -> None:
    got = outcome_ending(claim(), outcome)
    assert got.verdict == verdict and got.measurement is None
    assert got.error is not None and error in got.error


def test_finishing_a_held_trial_lets_go_of_its_child_and_kernel() -> None:
    held = Held(claim(), stage=Stage.MEASURING, prepared=object(), child=object())  # type: ignore[arg-type]
    held.finish(Verdict.FAILED, "boom")
    assert (held.stage, held.state, held.error) == (Stage.FINISHED, Verdict.FAILED, "boom")
    assert held.child is None and held.prepared is None and held.measurement is None
