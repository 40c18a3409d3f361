"""The environment-fault policy: is what went wrong the configuration's fault or this
worker's? Pure decision logic: the judge sees plain data (the trial that ended, with its
verdict, and what else the worker holds) and answers with a :class:`Decision`; the loop
(:mod:`tunefleet.worker.loop`) executes it against the database. No I/O, no clock.

An outcome is about the configuration (``invalid``, a crash or a timeout of its kernel:
counted against the trial) or about this worker's environment: the problem does not load
here, a dependency is missing (``ImportError``, ``ProblemError``), a child process dies
before it has loaded the problem (the three arrive as the verdict ``environment``), or the
same unexplained error (the verdict ``error``) on ``stand_aside_after`` configurations of one
run in a row before any configuration of that run reached a verdict here.

An environment fault hands the trial back uncounted (the attempt row says ``released`` with
the reason) and the worker stands aside from the run: it hands back what it holds of the run
that is not being worked on (a trial in a child finishes there and is judged when it ends, a
code generation that finishes is handed back untimed), records why (the ``stand_aside``
table), and claims nothing of that run again; it goes on serving others.

While an unexplained error might still be either, its trial is held as a *suspect* (its
lease heartbeated, outside the prefetch count) until one of these settles it:

* a verdict of its run on this worker (done, invalid, timed out): this environment runs the
  problem, so the error is the configuration's (``failed``, counted), and so is every later
  error of that run here;
* another unexplained error of the run with a different text: not one fault after all
  (``failed``);
* the streak reaching ``stand_aside_after``: first the trials that another worker already
  handed back for this same error are counted (an error that follows configurations from
  worker to worker is theirs, or a few configurations that always raise the same exception
  would make every worker of the fleet stand aside in turn); if the streak still holds, the
  environment's fault: every trial of it is handed back and the worker stands aside;
* nothing left to compare with (nothing more of any run can be claimed and the worker holds
  nothing else): ``failed``, since the streak rule needs ``stand_aside_after`` configurations
  to call it the environment's.

With ``stand_aside_after = 0`` every unexplained error is the configuration's.
A worker that holds nothing and finds work only in runs it stands aside from cannot serve
anything (:func:`cannot_serve`): it exits with status 1 and that reason.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from .vocabulary import Stage, Verdict

#: Stages of the trials a worker hands back when it stands aside from their run: they wait
#: (in no child) or are suspects. A trial in a child is judged when it ends.
WAITING = (Stage.CLAIMED, Stage.PREPARED, Stage.SUSPECT)
#: Verdicts that say this environment runs the run's problem.
CONFIGURATION_VERDICTS = (Verdict.DONE, Verdict.INVALID, Verdict.TIMED_OUT)
#: The note logged for a suspect whose error another worker met on the same trial.
FOLLOWED = "another worker handed it back for the same error; it is the configuration's"


@dataclass(frozen=True)
class Trial:
    """What the judge sees of one held trial."""

    trial_id: int
    run_id: int
    stage: Stage
    #: How it ended, once it did (``environment`` and ``error`` are what is judged).
    verdict: Verdict | None = None
    error: str | None = None


@dataclass(frozen=True)
class Counted:
    """A trial counted as failed (its own error is the reason); ``note`` says why, for the
    log (``None``: nothing to add)."""

    trial_id: int
    note: str | None = None


@dataclass(frozen=True)
class Suspicion:
    """The judged trial is held as a suspect: ``streak`` trials of its run (itself included)
    ended with its error here, of the ``of`` that make it the environment's."""

    trial_id: int
    streak: int
    of: int


@dataclass(frozen=True)
class StandAside:
    """This worker stands aside from ``run_id`` from now on, for ``reason``."""

    run_id: int
    reason: str


@dataclass(frozen=True)
class Decision:
    """What the loop does after a judgement. It applies ``suspect``, ``failed`` and
    ``handed_back`` to its held trials, records ``stand_aside``, and when ``ask`` is not
    empty asks the database which of those trials other workers handed back for the same
    error, and hands the answer to :meth:`Judge.weigh`."""

    failed: tuple[Counted, ...] = ()
    #: Trial id -> the reason it is handed back (released uncounted).
    handed_back: Mapping[int, str] = field(default_factory=dict)
    suspect: Suspicion | None = None
    stand_aside: StandAside | None = None
    #: A streak that reached ``stand_aside_after``: its trials, to be weighed.
    ask: tuple[Trial, ...] = ()


class Judge:
    """The fault policy of one worker (see the module docstring). It remembers the runs this
    worker stands aside from and the runs it has seen a configuration verdict of; the held
    trials it is shown are the loop's."""

    def __init__(self, stand_aside_after: int) -> None:
        self.stand_aside_after = stand_aside_after
        #: Runs this worker stands aside from, with the reason.
        self.excluded: dict[int, str] = {}
        #: Runs with a configuration verdict (done, invalid, timed out) on this worker: its
        #: environment runs their problem, so their errors are about configurations.
        self.proven: set[int] = set()

    def aside_from(self, run_id: int) -> str | None:
        """Why this worker stands aside from ``run_id`` (``None``: it serves it). A trial of
        such a run whose code generation finished is handed back with this, not timed."""
        return self.excluded.get(run_id)

    def judge(self, ended: Trial, held: Sequence[Trial]) -> Decision:
        """``ended`` just ended in its child with ``ended.verdict``; ``held`` is what the
        worker holds (``ended`` itself may be among it)."""
        run, error = ended.run_id, ended.error or ""
        others = [t for t in held if t.trial_id != ended.trial_id]
        suspects = [t for t in others if t.stage == Stage.SUSPECT and t.run_id == run]
        if ended.verdict in (Verdict.ENVIRONMENT, Verdict.ERROR) and run in self.excluded:
            return Decision(handed_back={ended.trial_id: self.excluded[run]})
        if ended.verdict == Verdict.ENVIRONMENT:
            return self._stand_aside(run, error, others, {ended.trial_id: error})
        if ended.verdict == Verdict.ERROR:
            k = self.stand_aside_after
            if run in self.proven or k == 0:
                return Decision(failed=(Counted(ended.trial_id),))
            streak = (*(t for t in suspects if t.error == ended.error), ended)
            return Decision(
                # Another error of the run: not one fault after all.
                failed=tuple(Counted(t.trial_id) for t in suspects if t.error != ended.error),
                suspect=Suspicion(ended.trial_id, len(streak), k),
                ask=streak if len(streak) >= k else (),
            )
        if ended.verdict in CONFIGURATION_VERDICTS:
            self.proven.add(run)
            return Decision(failed=tuple(Counted(t.trial_id) for t in suspects))
        return Decision()

    def weigh(
        self,
        streak: Sequence[Trial],
        elsewhere: Mapping[int, Collection[str]] | None,
        held: Sequence[Trial],
    ) -> Decision:
        """Decide a streak that reached ``stand_aside_after``. ``elsewhere`` is, for each of
        its trials, the errors for which other workers handed it back (``None``: unknown,
        the database being away; then the streak stands)."""
        known = elsewhere or {}
        followed = [t for t in streak if t.error in known.get(t.trial_id, ())]
        kept = [t for t in streak if t not in followed]
        failed = tuple(Counted(t.trial_id, FOLLOWED) for t in followed)
        if not kept or len(kept) < self.stand_aside_after:
            return Decision(failed=failed)
        error = kept[-1].error or ""
        reason = f"the same error on {len(kept)} configurations in a row: {error}"
        decided = {t.trial_id for t in streak}
        others = [t for t in held if t.trial_id not in decided]
        decision = self._stand_aside(
            kept[-1].run_id, reason, others, {t.trial_id: t.error or "" for t in kept}
        )
        return Decision(
            failed=failed, handed_back=decision.handed_back, stand_aside=decision.stand_aside
        )

    def settle(self, held: Sequence[Trial], why: str) -> Decision:
        """Nothing more can be claimed (``why``): when the worker holds nothing but suspects,
        no later trial can settle them, so they are the configurations' faults."""
        if any(t.stage != Stage.SUSPECT for t in held):
            return Decision()
        note = f"counted as failed ({why})"
        return Decision(failed=tuple(Counted(t.trial_id, note) for t in held))

    def _stand_aside(
        self, run: int, reason: str, others: Sequence[Trial], handed_back: dict[int, str]
    ) -> Decision:
        """Hand back ``handed_back`` and, unless this worker already stands aside from
        ``run``, stand aside from it: its waiting trials among ``others`` go back too."""
        if run in self.excluded:
            return Decision(handed_back=handed_back)
        self.excluded[run] = reason
        for t in others:
            if t.run_id == run and t.stage in WAITING:
                handed_back.setdefault(t.trial_id, reason)
        return Decision(handed_back=handed_back, stand_aside=StandAside(run, reason))


def cannot_serve(worker: str, host: str, excluded: Mapping[int, str]) -> str:
    """Why a worker that finds work only in runs it stands aside from exits."""
    reasons = "; ".join(f"run {run}: {why}" for run, why in sorted(excluded.items()))
    return (
        f"worker {worker} on {host} cannot serve any run with work: it stands aside from "
        f"every one ({reasons})"
    )
