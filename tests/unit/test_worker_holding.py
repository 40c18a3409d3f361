"""The held trials of one worker (``tunefleet.worker.holding``): a trial and its lease come
and go together, claim order is kept, and the questions the stages ask are answered from the
stages. Failure modes named here: a forgotten trial whose lease the heartbeat still renews; a
trial held without its lease; a later claim dispatched before an earlier one; a suspect
counted against the capacity; a device reported waiting while a prepared trial is held."""

from __future__ import annotations

from tunefleet.problems.base import COLD_KEY
from tunefleet.queries.queue import ClaimedTrial
from tunefleet.worker.holding import Holding
from tunefleet.worker.vocabulary import Stage


def claim(trial_id: int, cold: bool = False) -> ClaimedTrial:
    return ClaimedTrial(
        trial_id=trial_id, run_id=1, attempt=2, max_attempts=3, config={}, config_hash="h",
        timeout_s=None, device_class="any", problem="synthetic", problem_args={},
        protocol={COLD_KEY: True} if cold else {}, cache_key="k", lease_token=f"t{trial_id}",
    )  # fmt: skip


def test_a_trial_and_its_lease_are_held_and_forgotten_together() -> None:
    holding = Holding()
    a, b = holding.take([claim(7), claim(3)], at=10.0)
    assert holding.leases.snapshot() == sorted([a.key, b.key])
    assert a.marks.claimed == 10.0 and len(holding) == 2 and holding[7] is a
    holding.forget(a)
    assert holding.leases.snapshot() == [b.key] and holding.get(7) is None
    holding.forget(a)  # twice: nothing else goes
    assert [h.claim.trial_id for h in holding] == [3]


def test_claim_order_decides_which_trial_comes_first_in_a_stage() -> None:
    holding = Holding()
    late, early_cold, early = holding.take([claim(9), claim(2, cold=True), claim(5)])
    assert holding.first(Stage.CLAIMED) is late  # claim order, not trial id
    assert holding.first(Stage.CLAIMED, cold=True) is early_cold
    assert holding.first(Stage.CLAIMED, cold=False) is late
    late.stage = Stage.PREPARING
    assert holding.first(Stage.CLAIMED, cold=False) is early


def test_the_stages_answer_capacity_readiness_and_starvation() -> None:
    holding = Holding()
    a, b, c = holding.take([claim(1), claim(2), claim(3)])
    assert holding.ready_for_device() == 0 and holding.any_in(Stage.CLAIMED, Stage.PREPARING)
    a.stage, b.stage, c.stage = Stage.SUSPECT, Stage.PREPARED, Stage.FINISHED
    assert [h.claim.trial_id for h in holding.counted()] == [2, 3]  # the suspect waits free
    assert holding.ready_for_device() == 1
    assert not holding.any_in(Stage.CLAIMED, Stage.PREPARING)
    assert [h.claim.trial_id for h in holding.unfinished()] == [1, 2]
    assert [t.trial_id for t in holding.seen()] == [1, 2, 3]
