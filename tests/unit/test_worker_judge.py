"""The worker's environment-fault policy (tunefleet.worker.judge), case by case: plain data in,
decisions out; no processes, no database, no clock.

Most of these cases ran as real worker processes against PostgreSQL before
(tests/acceptance/test_stand_aside.py keeps the end-to-end ones): the broken node (a problem
that does not import, a missing module, the same error on every configuration, a process
dying as it loads the problem), a worker standing aside from one run serving the others,
errors of some configurations counted against them only, fewer erring configurations than the
streak, and an error that follows configurations from worker to worker. :class:`Desk` below
executes decisions as the loop does (``Worker._execute``), so sequences read like the runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from tunefleet.problems.base import Protocol
from tunefleet.queries.queue import ClaimedTrial
from tunefleet.worker.judge import (
    FOLLOWED,
    Counted,
    Decision,
    Judge,
    StandAside,
    Suspicion,
    Trial,
    cannot_serve,
)
from tunefleet.worker.results import ending
from tunefleet.worker.supervise import Reply
from tunefleet.worker.vocabulary import ReplyKind, Stage, Verdict

RUN, OTHER = 10, 20
ERR = "evaluation raised RuntimeError: libfoo.so.1: cannot open shared object file"


class Desk:
    """What one worker holds, with its judge; decisions are executed as the loop does."""

    def __init__(self, k: int = 3) -> None:
        self.judge = Judge(k)
        self.held: dict[int, Trial] = {}
        self.stood_aside: list[StandAside] = []
        self.asked: list[tuple[int, ...]] = []

    def claim(self, *trial_ids: int, run: int = RUN, stage: Stage = Stage.CLAIMED) -> None:
        for t in trial_ids:
            self.held[t] = Trial(t, run, stage)

    def end(
        self,
        trial_id: int,
        verdict: Verdict,
        error: str | None = None,
        elsewhere: Mapping[int, set[str]] | None = None,
    ) -> list[Decision]:
        """Trial ``trial_id`` ended in its child; ``elsewhere`` is what the database would
        answer about other workers' hand-backs (only asked for when a streak is full)."""
        t = self.held[trial_id]
        ended = Trial(t.trial_id, t.run_id, Stage.FINISHED, verdict, error)
        self.held[trial_id] = ended
        first = self.judge.judge(ended, list(self.held.values()))
        self.execute(first)
        decisions = [first]
        if first.ask:
            self.asked.append(tuple(x.trial_id for x in first.ask))
            second = self.judge.weigh(first.ask, elsewhere or {}, list(self.held.values()))
            self.execute(second)
            decisions.append(second)
        return decisions

    def settle(self, why: str = "nothing left") -> Decision:
        decision = self.judge.settle(list(self.held.values()), why)
        self.execute(decision)
        return decision

    def execute(self, d: Decision) -> None:
        if d.suspect is not None:
            t = self.held[d.suspect.trial_id]
            self.held[t.trial_id] = Trial(t.trial_id, t.run_id, Stage.SUSPECT, t.verdict, t.error)
        for c in d.failed:
            t = self.held[c.trial_id]
            self.held[t.trial_id] = Trial(
                t.trial_id, t.run_id, Stage.FINISHED, Verdict.FAILED, t.error
            )
        for tid, reason in d.handed_back.items():
            t = self.held[tid]
            self.held[tid] = Trial(tid, t.run_id, Stage.FINISHED, Verdict.HANDBACK, reason)
        if d.stand_aside is not None:
            self.stood_aside.append(d.stand_aside)

    def send(self) -> dict[int, tuple[Verdict | None, str | None]]:
        """Complete what is finished (as step_complete does): it leaves the desk."""
        done = {t: (x.verdict, x.error) for t, x in self.held.items() if x.stage == Stage.FINISHED}
        for t in done:
            del self.held[t]
        return done

    def verdicts(self) -> dict[int, Verdict | None]:
        return {t: x.verdict for t, x in self.held.items() if x.stage == Stage.FINISHED}

    def stage(self, trial_id: int) -> Stage:
        return self.held[trial_id].stage


# --- environment failures ---------------------------------------------------------------------


def claim_of(trial_id: int) -> ClaimedTrial:
    return ClaimedTrial(
        trial_id, RUN, 1, 3, {"x": 0}, "h", None, "any", "p", {}, Protocol().to_json(), "k", "t"
    )


@pytest.mark.parametrize(
    ("reply", "preparing", "reason"),
    [
        # The user problem file does not import on this node (the code-generation process
        # loads it).
        (
            "loading the problem failed: problem file '/x/environment_problem.py' failed to "
            'import: ModuleNotFoundError("No module named '
            "'tunefleet_test_module_missing_on_this_node'\")",
            True,
            "tunefleet_test_module_missing_on_this_node",
        ),
        # prepare raises a missing-module error for every configuration (feinsum's case).
        ("ModuleNotFoundError: No module named 'libfoo'", False, "No module named 'libfoo'"),
        # The device process dies as it loads the problem.
        (
            "the device process killed by SIGSEGV loading the problem",
            False,
            "evaluation: the device process killed by SIGSEGV loading the problem",
        ),
    ],
)
def test_an_environment_failure_hands_the_trial_back_and_stands_aside_from_the_run(
    reply: str, preparing: bool, reason: str
) -> None:
    desk = Desk()
    desk.claim(1)
    desk.claim(2, 3, stage=Stage.CLAIMED)
    desk.claim(4, stage=Stage.PREPARED)
    desk.claim(5, stage=Stage.PREPARING)  # in a child: judged when it ends there
    desk.claim(6, run=OTHER)
    e = ending(claim_of(1), Reply(ReplyKind.ENVIRONMENT, message=reply), preparing)
    assert e.verdict == Verdict.ENVIRONMENT
    [d] = desk.end(1, e.verdict, e.error)
    assert e.error is not None and reason in e.error
    assert d.stand_aside == StandAside(RUN, e.error)
    # Nothing counted: the trial itself and the run's waiting trials go back uncounted.
    assert d.failed == () and d.suspect is None
    assert d.handed_back == {1: e.error, 2: e.error, 3: e.error, 4: e.error}
    assert desk.stage(5) == Stage.PREPARING and desk.stage(6) == Stage.CLAIMED
    assert desk.judge.excluded == {RUN: e.error}
    # The code generation in flight finishes: it is handed back with the reason, not timed.
    assert desk.judge.aside_from(RUN) == e.error
    assert desk.judge.aside_from(OTHER) is None


def test_any_later_failure_of_a_run_stood_aside_from_goes_back_with_the_first_reason() -> None:
    desk = Desk()
    desk.claim(1, 2, 3, stage=Stage.MEASURING)
    desk.end(1, Verdict.ENVIRONMENT, "code generation: no libfoo")
    [env] = desk.end(2, Verdict.ENVIRONMENT, "evaluation: something else")
    [err] = desk.end(3, Verdict.ERROR, ERR)
    assert env == Decision(handed_back={2: "code generation: no libfoo"})
    assert err == Decision(handed_back={3: "code generation: no libfoo"})
    assert len(desk.stood_aside) == 1


def test_a_configuration_verdict_of_a_run_stood_aside_from_is_still_sent() -> None:
    """A trial that was being timed when the worker stood aside finishes and is recorded."""
    desk = Desk()
    desk.claim(1, 2, stage=Stage.MEASURING)
    desk.end(1, Verdict.ENVIRONMENT, "evaluation: gone")
    assert desk.end(2, Verdict.DONE) == [Decision()]
    assert desk.verdicts()[2] == Verdict.DONE


def test_standing_aside_from_one_run_leaves_the_others_alone() -> None:
    desk = Desk()
    desk.claim(1, 2)
    desk.claim(3, 4, run=OTHER)
    desk.end(1, Verdict.ENVIRONMENT, "code generation: No module named 'libfoo'")
    assert desk.verdicts() == {1: Verdict.HANDBACK, 2: Verdict.HANDBACK}
    assert desk.end(3, Verdict.DONE) == [Decision()]
    # That run works here: its errors are its configurations'.
    assert desk.end(4, Verdict.ERROR, ERR) == [Decision(failed=(Counted(4),))]
    assert set(desk.judge.excluded) == {RUN} and desk.judge.proven == {OTHER}


def test_a_worker_that_can_serve_nothing_says_why_for_every_run() -> None:
    text = cannot_serve("w-1", "node7", {20: "b", 10: "a"})
    assert text == (
        "worker w-1 on node7 cannot serve any run with work: it stands aside from every one "
        "(run 10: a; run 20: b)"
    )


# --- unexplained errors: suspects and the streak ----------------------------------------------


def test_an_unexplained_error_is_held_as_a_suspect_until_the_run_proves_the_environment() -> None:
    desk = Desk()
    desk.claim(1, 2, 3)
    [d] = desk.end(1, Verdict.ERROR, ERR)
    assert d == Decision(suspect=Suspicion(1, 1, 3))
    assert desk.stage(1) == Stage.SUSPECT
    [d] = desk.end(2, Verdict.DONE)
    # The run works here: the suspect's error was its configuration's.
    assert d == Decision(failed=(Counted(1),))
    assert desk.verdicts() == {1: Verdict.FAILED, 2: Verdict.DONE}
    assert desk.held[1].error == ERR  # its own error is the reason
    # From now on an error of this run is counted at once.
    assert desk.end(3, Verdict.ERROR, ERR) == [Decision(failed=(Counted(3),))]


@pytest.mark.parametrize("verdict", [Verdict.DONE, Verdict.INVALID, Verdict.TIMED_OUT])
def test_done_invalid_and_timed_out_prove_the_run(verdict: Verdict) -> None:
    desk = Desk()
    desk.claim(1, 2)
    desk.claim(3, run=OTHER)
    desk.end(1, Verdict.ERROR, ERR)
    desk.end(3, Verdict.ERROR, ERR)
    [d] = desk.end(2, verdict, None if verdict == Verdict.DONE else "x")
    assert d.failed == (Counted(1),)  # only its own run's suspects
    assert desk.judge.proven == {RUN} and desk.stage(3) == Stage.SUSPECT


def test_a_crash_proves_nothing() -> None:
    """A kernel that killed its process is the configuration's (failed), but says nothing
    about whether the run's problem works here."""
    desk = Desk()
    desk.claim(1, 2)
    desk.end(1, Verdict.ERROR, ERR)
    assert desk.end(2, Verdict.FAILED, "evaluation process killed by SIGSEGV") == [Decision()]
    assert desk.stage(1) == Stage.SUSPECT and desk.judge.proven == set()


def test_a_different_error_of_the_run_means_it_was_not_one_fault() -> None:
    desk = Desk()
    desk.claim(1, 2, 3)
    desk.end(1, Verdict.ERROR, ERR)
    desk.end(2, Verdict.ERROR, ERR)
    [d] = desk.end(3, Verdict.ERROR, "evaluation raised KeyError: 'tile'")
    assert d == Decision(failed=(Counted(1), Counted(2)), suspect=Suspicion(3, 1, 3))


def test_the_same_error_on_three_configurations_in_a_row_is_the_environment() -> None:
    desk = Desk()
    desk.claim(*range(1, 9))
    desk.claim(9, stage=Stage.PREPARED)
    desk.claim(10, stage=Stage.MEASURING)
    desk.claim(11, run=OTHER)
    desk.end(1, Verdict.ERROR, ERR)
    assert desk.end(2, Verdict.ERROR, ERR)[0].suspect == Suspicion(2, 2, 3)
    first, second = desk.end(3, Verdict.ERROR, ERR, elsewhere={})
    assert first.suspect == Suspicion(3, 3, 3) and desk.asked == [(1, 2, 3)]
    reason = f"the same error on 3 configurations in a row: {ERR}"
    assert second.stand_aside == StandAside(RUN, reason)
    assert second.failed == ()
    # The streak goes back with its own error, the rest of the run with the reason; the
    # trial being timed finishes first, the other run is not touched.
    assert second.handed_back == {1: ERR, 2: ERR, 3: ERR} | dict.fromkeys(
        [4, 5, 6, 7, 8, 9], reason
    )
    assert desk.stage(10) == Stage.MEASURING and desk.stage(11) == Stage.CLAIMED


def test_the_streak_is_counted_per_run() -> None:
    desk = Desk()
    desk.claim(1, 2)
    desk.claim(3, run=OTHER)
    desk.end(1, Verdict.ERROR, ERR)
    desk.end(3, Verdict.ERROR, ERR)
    [d] = desk.end(2, Verdict.ERROR, ERR)
    assert d.suspect == Suspicion(2, 2, 3) and not d.ask


def test_the_streak_length_is_a_setting_and_zero_turns_it_off() -> None:
    short = Desk(k=1)
    short.claim(1)
    _, d = short.end(1, Verdict.ERROR, ERR)
    assert d.stand_aside == StandAside(RUN, f"the same error on 1 configurations in a row: {ERR}")
    off = Desk(k=0)
    off.claim(1, 2, 3)
    for t in (1, 2, 3):
        assert off.end(t, Verdict.ERROR, ERR) == [Decision(failed=(Counted(t),))]
    assert off.stood_aside == []


def test_an_error_that_followed_the_configuration_from_another_worker_is_its_own() -> None:
    desk = Desk()
    desk.claim(1, 2, 3, 4)
    desk.end(1, Verdict.ERROR, ERR)
    desk.end(2, Verdict.ERROR, ERR)
    elsewhere = {2: {ERR}, 3: {"evaluation raised OSError"}}  # 3: another reason elsewhere
    _, d = desk.end(3, Verdict.ERROR, ERR, elsewhere=elsewhere)
    assert d == Decision(failed=(Counted(2, FOLLOWED),))
    # Two left of three: no stand-aside; they wait for the next verdict.
    assert desk.stage(1) == Stage.SUSPECT and desk.stage(3) == Stage.SUSPECT
    assert desk.stood_aside == []
    _, d = desk.end(4, Verdict.ERROR, ERR, elsewhere={})
    assert d.stand_aside is not None and set(d.handed_back) == {1, 3, 4}


def test_without_the_database_the_streak_stands() -> None:
    """The loop passes ``None`` when the database is away: no evidence either way."""
    judge = Judge(2)
    streak = [Trial(t, RUN, Stage.SUSPECT, Verdict.ERROR, ERR) for t in (1, 2)]
    d = judge.weigh(streak, None, streak)
    assert d.stand_aside is not None and d.handed_back == {1: ERR, 2: ERR}


def test_suspects_are_counted_when_nothing_else_can_settle_them() -> None:
    desk = Desk()
    desk.claim(1, 2, 3)
    desk.end(1, Verdict.ERROR, ERR)
    desk.end(2, Verdict.ERROR, ERR)
    # Something else is still held: it may settle them yet.
    assert desk.settle() == Decision()
    desk.end(3, Verdict.INVALID, "bad tile")
    desk.send()
    desk.claim(4, 5, run=OTHER)
    desk.end(4, Verdict.ERROR, ERR)
    desk.end(5, Verdict.ERROR, ERR)
    desk.send()
    d = desk.settle("no other trial of the run to compare with")
    note = "counted as failed (no other trial of the run to compare with)"
    assert d == Decision(failed=(Counted(4, note), Counted(5, note)))
    assert desk.send() == {4: (Verdict.FAILED, ERR), 5: (Verdict.FAILED, ERR)}
    assert desk.stood_aside == []


# --- whole runs, as the acceptance tests ran them ---------------------------------------------


def run_through(
    desk: Desk,
    trials: Sequence[tuple[int, int, Verdict, str | None]],
    capacity: int = 2,
    elsewhere: Mapping[int, set[str]] | None = None,
) -> dict[int, Verdict | None]:
    """Claim ``capacity`` trials at a time (suspects outside it) in order, end each as
    listed, skip those of runs stood aside from, settle what is left; the verdicts sent."""
    queue = list(trials)
    sent: dict[int, Verdict | None] = {}
    ends = {t: (v, e) for t, _, v, e in trials}
    while True:
        queue = [q for q in queue if q[1] not in desk.judge.excluded]
        busy = [t for t, x in desk.held.items() if x.stage != Stage.SUSPECT]
        while queue and len(busy) < capacity:
            t, run, _, _ = queue.pop(0)
            desk.claim(t, run=run)
            busy.append(t)
        waiting = [t for t, x in desk.held.items() if x.stage == Stage.CLAIMED]
        if not waiting:
            if not queue:
                desk.settle()
            sent |= {t: v for t, (v, _) in desk.send().items()}
            if not desk.held:
                return sent
            continue
        verdict, error = ends[waiting[0]]
        desk.end(waiting[0], verdict, error, elsewhere)
        sent |= {t: v for t, (v, _) in desk.send().items()}


def test_errors_of_some_configurations_count_against_them_only() -> None:
    """x = 6 and 7 raise the same error on every node; x = 0 worked first."""
    desk = Desk()
    trials = [(x, RUN, Verdict.DONE, None) for x in range(6)]
    trials += [(x, RUN, Verdict.ERROR, ERR) for x in (6, 7)]
    sent = run_through(desk, trials)
    assert sent == dict.fromkeys(range(6), Verdict.DONE) | {6: Verdict.FAILED, 7: Verdict.FAILED}
    assert desk.stood_aside == []


def test_fewer_erring_configurations_than_the_streak_are_counted_once_nothing_is_left() -> None:
    desk = Desk()
    sent = run_through(desk, [(6, RUN, Verdict.ERROR, ERR), (7, RUN, Verdict.ERROR, ERR)])
    assert sent == {6: Verdict.FAILED, 7: Verdict.FAILED} and desk.stood_aside == []


def test_a_broken_node_stands_aside_after_the_streak_and_hands_everything_back() -> None:
    desk = Desk()
    sent = run_through(desk, [(x, RUN, Verdict.ERROR, ERR) for x in range(8)])
    assert set(sent.values()) == {Verdict.HANDBACK} and len(sent) <= 8
    assert desk.stood_aside == [
        StandAside(RUN, f"the same error on 3 configurations in a row: {ERR}")
    ]
    assert cannot_serve("w", "h", desk.judge.excluded).endswith(
        f"(run {RUN}: {desk.stood_aside[0].reason})"
    )


def test_an_error_that_follows_configurations_to_another_worker_is_theirs() -> None:
    """With a streak of 2, configurations 6 and 7 queued first make the first worker stand
    aside; the second meets the same error on the same trials the first handed back, so it
    counts them (and does not stand aside in turn), then measures the rest."""
    trials = [(x, RUN, Verdict.ERROR, ERR) for x in (6, 7)]
    trials += [(x, RUN, Verdict.DONE, None) for x in range(6)]
    first = Desk(k=2)
    sent = run_through(first, trials, capacity=1)
    assert first.stood_aside and set(sent.values()) == {Verdict.HANDBACK}
    handed_back = {t: {ERR} for t in (6, 7)}  # what the database says of the first worker
    second = Desk(k=2)
    sent = run_through(second, trials, capacity=1, elsewhere=handed_back)
    assert sent == {6: Verdict.FAILED, 7: Verdict.FAILED} | dict.fromkeys(range(6), Verdict.DONE)
    assert second.stood_aside == []
