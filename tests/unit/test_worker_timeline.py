"""The timeline of a held trial (worker.timeline.Marks): every second from the claim to the
send lands in exactly one phase, whatever way the trial went (prepared then timed, prepared
inline by the device process, killed in code generation, dead while timing), and what a
child reports is only believed as far as the span this worker saw."""

from __future__ import annotations

import math

import pytest

from tunefleet.timeline import DEVICE_PHASES, Phase, clean, timing_share
from tunefleet.worker.supervise import Reply
from tunefleet.worker.timeline import Marks
from tunefleet.worker.vocabulary import ReplyKind


def _total(phases: dict[str, float]) -> float:
    return sum(phases.values())


def test_a_prepared_then_timed_trial_splits_its_whole_span():
    m = Marks(claimed=100.0)
    m.prepare_sent = 100.5  # waited 0.5 s for a code-generation process
    m.replied(True, Reply(ReplyKind.OK, seconds=2.0, phases={"prebuild": 0.4}), now=102.7)
    m.measure_sent = 103.0
    device = {"setup": 0.05, "build": 0.01, "validation": 0.1, "timing": 0.6, "check": 0.04}
    m.replied(False, Reply(ReplyKind.OK, seconds=0.85, phases=device), now=104.0)
    phases = m.phases(now=104.25)
    assert phases == pytest.approx(
        {
            "wait_codegen": 0.5,
            "codegen": 1.6,
            "prebuild": 0.4,
            "handoff": 0.2 + 0.15,
            "wait_device": 0.3,
            "setup": 0.05,
            "build": 0.01,
            "validation": 0.1,
            "timing": 0.6,
            "check": 0.04,
            "device_other": 0.05,
            "report": 0.25,
        }
    )
    assert _total(phases) == pytest.approx(4.25)
    assert list(phases) == [p.value for p in Phase if p.value in phases]  # phase order


def test_a_trial_prepared_inline_by_the_device_process():
    m = Marks(claimed=10.0)
    m.measure_sent = 10.2
    reply = Reply(ReplyKind.OK, seconds=2.8, phases={"codegen": 2.0, "timing": 0.7})
    m.replied(False, reply, now=13.1)
    phases = m.phases(now=13.1)
    assert phases["wait_device"] == pytest.approx(0.2)
    assert phases["codegen"] == pytest.approx(2.0)
    assert phases["timing"] == pytest.approx(0.7)
    assert phases["device_other"] == pytest.approx(0.1)
    assert phases["handoff"] == pytest.approx(0.1)
    assert _total(phases) == pytest.approx(3.1)


@pytest.mark.parametrize("kind", [ReplyKind.TIMEOUT, ReplyKind.DIED])
def test_a_child_killed_or_dead_is_charged_its_whole_span(kind):
    m = Marks(claimed=0.0)
    m.prepare_sent = 1.0
    m.replied(True, Reply(kind, message="gone"), now=31.0)  # the parent made this reply
    phases = m.phases(now=31.5)
    assert phases == pytest.approx({"wait_codegen": 1.0, "codegen": 30.0, "report": 0.5})

    m = Marks(claimed=0.0)
    m.measure_sent = 0.5
    m.replied(False, Reply(kind, message="gone"), now=5.5)
    assert m.phases(now=6.0) == pytest.approx(
        {"wait_device": 0.5, "device_other": 5.0, "report": 0.5}
    )


def test_a_child_that_claims_more_than_it_was_seen_to_spend_is_cut_to_the_span():
    """A problem is user code: its phases (or its clock) may say anything; the timeline still
    adds up to the wall this worker saw."""
    m = Marks(claimed=0.0)
    m.measure_sent = 0.0
    lies = {"timing": 50.0, "check": -3.0, "validation": math.nan, "nonsense": 4.0}
    m.replied(False, Reply(ReplyKind.OK, seconds=60.0, phases=lies), now=2.0)
    phases = m.phases(now=2.0)
    assert phases == pytest.approx({"timing": 2.0})


def test_a_device_process_may_not_report_the_workers_own_waits():
    m = Marks(claimed=0.0)
    m.measure_sent = 0.0
    told = {"wait_device": 1.0, "report": 1.0, "timing": 0.5}
    m.replied(False, Reply(ReplyKind.OK, seconds=1.0, phases=told), now=1.0)
    assert m.phases(now=1.0) == pytest.approx({"timing": 0.5, "device_other": 0.5})


def test_clean_and_the_timing_share():
    assert clean({"timing": 1, "check": "0.5", "x": 1, "build": True, "report": math.inf}) == {
        "timing": 1.0,
        "check": 0.5,
    }
    assert clean({"report": 1.0, "timing": 2.0}, DEVICE_PHASES) == {"timing": 2.0}
    assert timing_share(30.0, 60.0) == 0.5
    assert timing_share(1.0, 0.0) is None
    assert timing_share(70.0, 60.0) == 1.0
