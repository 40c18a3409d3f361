"""The dispatch stage alone (``tunefleet.worker.dispatch``): which process gets which held
trial, and the limits of each request. The processes are stand-ins that record what they
were sent (no child starts, no device): the order and the requests are what is under test.

Failure modes named here: a search trial sent to a busy code-generation process; a search
trial timed before a prepared confirmation that a time budget waits for; two kernels timed at
once (a cold build and the device process); a timing that gets the whole limit again after
a slow code generation; a confirmation raced; a cold build whose process died before it was
timed left holding the trial; a dead device process sent a request without being reopened."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Any

import pytest

from tunefleet.devices import HOST_DEVICE
from tunefleet.problems.base import COLD_KEY
from tunefleet.queries.queue import ClaimedTrial
from tunefleet.worker.cold import ColdBuilds, _Cold
from tunefleet.worker.dispatch import RACE_FACTOR, Dispatch
from tunefleet.worker.heartbeat import Liveness
from tunefleet.worker.holding import Holding
from tunefleet.worker.pool import CodegenPool
from tunefleet.worker.results import Held
from tunefleet.worker.settings import WorkerSettings
from tunefleet.worker.sizing import Resources
from tunefleet.worker.supervise import Measure, Prepare, Reply
from tunefleet.worker.vocabulary import ReplyKind, Stage, Verdict


@dataclass
class Sent:
    request: Any
    timeout_s: float
    limit_s: float | None


@dataclass
class StandIn:
    """A child process as dispatch sees it: busy while a request is in flight."""

    name: str
    alive: bool = True
    busy: bool = False
    starts: int = 0
    sent: list[Sent] = field(default_factory=list)

    def submit(
        self, request: Any, timeout_s: float, tag: Any = None, limit_s: float | None = None
    ) -> None:
        assert not self.busy, f"{self.name} was sent a request while busy"
        self.busy = True
        self.sent.append(Sent(request, timeout_s, limit_s))

    def start(self) -> None:
        self.alive, self.starts = True, self.starts + 1

    def done(self) -> None:
        self.busy = False


class StandInColds(ColdBuilds):
    """Cold builds whose fresh processes are stand-ins."""

    def start(self, trial_id: int) -> Any:
        child = StandIn(f"cold {trial_id}")
        self._active[trial_id] = _Cold(child, tempfile.mkdtemp())  # type: ignore[arg-type]
        return child


def claim(trial_id: int, *, run_id: int = 1, cold: bool = False, timeout_s: float | None = None):
    return ClaimedTrial(
        trial_id=trial_id, run_id=run_id, attempt=1, max_attempts=3, config={"x": trial_id},
        config_hash=f"h{trial_id}", timeout_s=timeout_s, device_class="any",
        problem="synthetic", problem_args={}, protocol={COLD_KEY: True} if cold else {},
        cache_key="k", lease_token="t",
    )  # fmt: skip


class Rig:
    """A dispatch over ``workers`` stand-in code-generation processes (0: the device process
    prepares and times in one request) on a worker with ``cores`` cores."""

    def __init__(self, workers: int = 2, cores: float = 2.0, timeout_s: float = 60.0) -> None:
        self.settings = WorkerSettings.build(db="postgresql:///x", timeout_s=timeout_s)
        self.holding = Holding()
        self.pool = CodegenPool(Resources(cores), workers, 1, 0.0)
        self.pool.children = [StandIn(f"codegen-{i}") for i in range(workers)]  # type: ignore[misc]
        self.colds = StandInColds()
        self.device = StandIn("device")
        self.best_s: dict[int, float] = {}
        self.opened = 0
        self.replies: list[tuple[int, Reply]] = []
        self.dispatch = Dispatch(
            self.settings, self.holding, self.pool, self.colds, self.device,  # type: ignore[arg-type]
            Liveness(30.0), self.best_s, open_device=self._open,
            on_reply=lambda held, reply: self.replies.append((held.claim.trial_id, reply)),
        )  # fmt: skip
        self.dispatch.device = HOST_DEVICE

    def _open(self) -> None:
        self.opened += 1

    def hold(self, *claims: ClaimedTrial) -> list[Held]:
        return self.holding.take(list(claims))

    def prepared(self, held: Held, spent_s: float = 0.0) -> None:
        """``held``'s code generation replied (as the loop's ``collect`` records it)."""
        assert held.child is not None
        held.child.done()  # type: ignore[attr-defined]
        held.stage, held.prepared, held.child = Stage.PREPARED, "kernel", None
        held.spent_s = spent_s


def test_claimed_trials_go_to_idle_code_generation_processes_one_each_in_claim_order() -> None:
    rig = Rig(workers=2)
    a, b, c = rig.hold(claim(1), claim(2), claim(3))
    rig.dispatch.step()
    assert (a.stage, b.stage, c.stage) == (Stage.PREPARING, Stage.PREPARING, Stage.CLAIMED)
    assert a.child is rig.pool.children[0] and b.child is rig.pool.children[1]
    assert [s.request.config for s in rig.pool.children[0].sent] == [{"x": 1}]  # type: ignore[attr-defined]
    rig.dispatch.step()  # both busy: the third waits, nobody is sent two requests
    assert c.stage == Stage.CLAIMED
    rig.prepared(a)
    rig.dispatch.step()  # the freed process takes the third; the device takes the first
    assert c.child is rig.pool.children[0] and a.stage == Stage.MEASURING
    assert isinstance(rig.device.sent[0].request, Measure)
    assert rig.device.sent[0].request.prepared == "kernel"


def test_a_prepared_confirmation_is_timed_before_prepared_search_trials() -> None:
    rig = Rig(workers=2, cores=2.0)
    search, confirmation = rig.hold(claim(1), claim(2, cold=True))
    rig.dispatch.step()
    cold_child = rig.colds.child(2)
    assert confirmation.stage == Stage.PREPARING and confirmation.child is cold_child
    assert isinstance(cold_child.sent[0].request, Prepare)  # type: ignore[union-attr]
    assert cold_child.sent[0].request.keep  # type: ignore[union-attr]
    rig.device.busy = True  # something else is being timed meanwhile
    rig.prepared(search)
    rig.prepared(confirmation)
    rig.dispatch.step()
    assert search.stage == confirmation.stage == Stage.PREPARED  # the device was busy
    rig.device.done()
    rig.dispatch.step()
    assert confirmation.stage == Stage.MEASURING and search.stage == Stage.PREPARED
    assert confirmation.child is cold_child and cold_child.busy  # type: ignore[union-attr]
    measure = cold_child.sent[-1].request  # type: ignore[union-attr]
    assert measure.kept and measure.cold and measure.race_above_s is None


def test_nothing_else_is_timed_while_a_cold_build_holds_the_device() -> None:
    rig = Rig(workers=1)
    confirmation, search = rig.hold(claim(1, cold=True), claim(2))
    rig.dispatch.step()
    rig.prepared(confirmation)
    rig.prepared(search)
    rig.dispatch.step()
    assert confirmation.stage == Stage.MEASURING and rig.dispatch.device_busy()
    for _ in range(3):
        rig.dispatch.step()
    assert search.stage == Stage.PREPARED and rig.device.sent == []
    confirmation.child.done()  # type: ignore[union-attr]
    confirmation.finish(Verdict.DONE)
    rig.dispatch.step()
    assert search.stage == Stage.MEASURING and len(rig.device.sent) == 1


def test_timing_gets_what_code_generation_left_of_the_evaluations_limit() -> None:
    rig = Rig(workers=1, timeout_s=60.0)
    slow, quick = rig.hold(claim(1, timeout_s=30.0), claim(2, timeout_s=30.0))
    rig.dispatch.step()
    assert rig.pool.children[0].sent[0].timeout_s == 60.0  # type: ignore[attr-defined]
    rig.prepared(slow, spent_s=45.0)
    rig.dispatch.step()
    sent = rig.device.sent[0]
    assert sent.timeout_s == pytest.approx(15.0) and sent.limit_s == 60.0
    rig.device.done()
    slow.finish(Verdict.DONE)
    rig.prepared(quick, spent_s=2.0)
    rig.dispatch.step()
    sent = rig.device.sent[1]
    assert sent.timeout_s == 30.0 and sent.limit_s == 30.0  # its own limit, not the rest


def test_a_search_trial_is_raced_against_its_runs_best_and_a_confirmation_never() -> None:
    rig = Rig(workers=0)
    rig.best_s[1] = 0.002
    first, other_run = rig.hold(claim(1, run_id=1), claim(2, run_id=2))
    rig.dispatch.step()  # no code-generation processes: prepared and timed in one request
    measure = rig.device.sent[0].request
    assert measure.inline_prepare and measure.race_above_s == pytest.approx(RACE_FACTOR * 0.002)
    rig.device.done()
    first.finish(Verdict.DONE)
    rig.dispatch.step()
    assert rig.device.sent[1].request.race_above_s is None  # nothing measured of run 2 yet
    assert other_run.stage == Stage.MEASURING


def test_a_cold_build_whose_process_died_before_timing_ends_with_a_reply() -> None:
    rig = Rig(workers=1)
    (confirmation,) = rig.hold(claim(1, cold=True))
    rig.dispatch.step()
    child = rig.colds.child(1)
    rig.prepared(confirmation)
    child.alive = False  # type: ignore[union-attr]
    rig.dispatch.step()
    assert [(t, r.kind) for t, r in rig.replies] == [(1, ReplyKind.DIED)]
    assert not rig.dispatch.device_busy() and rig.device.sent == []


def test_a_dead_device_process_is_restarted_and_opened_before_it_times() -> None:
    rig = Rig(workers=1)
    rig.device.alive = False
    (held,) = rig.hold(claim(1))
    rig.dispatch.step()
    rig.prepared(held)
    rig.dispatch.step()
    assert rig.device.starts == 1 and rig.opened == 1 and held.stage == Stage.MEASURING
