"""A held trial and how it ends: :class:`Held` (a claimed trial and where it is in this
worker), the child's final reply turned into an :class:`Ending` (verdict, error text,
measurement row), and a problem's :class:`~tunefleet.problems.base.Outcome` checked and
normalised into the :class:`~tunefleet.queries.queue.MeasurementRow` the completion stores.

A problem is user code: whatever its ``measure`` returns (not an Outcome, a state of its own,
numbers that are not numbers, unusable timings, numpy values, NaN in its validation dict)
ends as a verdict with a reason, never as an exception in the worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tunefleet import jsonvalues
from tunefleet.problems.base import COLD_KEY, Outcome, Protocol
from tunefleet.queries.queue import ClaimedTrial, MeasurementRow
from tunefleet.version import __version__
from tunefleet.vocabulary import TrialState

from .heartbeat import Key
from .judge import Trial
from .supervise import Child, Reply
from .timeline import Marks
from .vocabulary import ReplyKind, Stage, Verdict


@dataclass
class Held:
    """One claimed trial and where it is in this worker."""

    claim: ClaimedTrial
    # claimed | preparing | prepared | measuring | finished, or suspect (an unexplained error
    # held until the run's next verdict on this worker: tunefleet.worker.judge)
    stage: Stage = Stage.CLAIMED
    prepared: Any = None
    child: Child | None = None
    # The outcome once finished: done | invalid | failed | timed_out, or handback (an
    # environment fault: released uncounted, ``error`` the reason)
    state: Verdict | None = None
    error: str | None = None
    measurement: MeasurementRow | None = None
    sends: int = 0
    # Seconds its code generation spent of the evaluation's one limit (timing gets the rest)
    spent_s: float = 0.0
    # The moments it passed here, for its timeline (set when claimed)
    marks: Marks = field(default_factory=lambda: Marks(time.monotonic()))

    @property
    def key(self) -> Key:
        return self.claim.key

    @property
    def cold(self) -> bool:
        """The claim asks for a cold build (a confirmation): a fresh process, no shared
        caches (:mod:`tunefleet.worker.cold`)."""
        return bool(self.claim.protocol.get(COLD_KEY))

    def finish(
        self, state: Verdict, error: str | None = None, measurement: MeasurementRow | None = None
    ) -> None:
        """The one way a held trial ends here: what is left is sending it (or handing it
        back); its child and prepared kernel are no longer its own."""
        self.stage, self.state, self.error, self.measurement = (
            Stage.FINISHED,
            state,
            error,
            measurement,
        )
        self.child = None
        self.prepared = None

    def seen(self) -> Trial:
        """What the fault policy sees of this trial."""
        return Trial(self.claim.trial_id, self.claim.run_id, self.stage, self.state, self.error)


@dataclass(frozen=True)
class Ending:
    """How a trial ended in its child, before the fault policy has judged it."""

    verdict: Verdict
    error: str | None = None
    measurement: MeasurementRow | None = None


def ending(claim: ClaimedTrial, reply: Reply, preparing: bool) -> Ending:
    """The ending of a trial on its child's final reply (every reply but a code generation
    that worked, which makes the trial ``prepared``). ``environment`` and ``error`` are still
    to be judged."""
    phase = "code generation" if preparing else "evaluation"
    if reply.kind == ReplyKind.OK:
        return outcome_ending(claim, reply.value)
    if reply.kind == ReplyKind.INVALID:
        return Ending(Verdict.INVALID, reply.message)
    if reply.kind == ReplyKind.TIMEOUT:
        return Ending(Verdict.TIMED_OUT, f"{phase} {reply.message} and was killed")
    if reply.kind == ReplyKind.DIED:
        return Ending(Verdict.FAILED, f"{phase} process {reply.message}")
    if reply.kind == ReplyKind.ENVIRONMENT:
        return Ending(Verdict.ENVIRONMENT, f"{phase}: {reply.message}")
    return Ending(Verdict.ERROR, f"{phase} raised {reply.message}")


def outcome_ending(claim: ClaimedTrial, outcome: Any) -> Ending:
    """What ``measure`` returned, checked: a ``done`` outcome with usable numbers becomes a
    measurement row; anything else fails the trial with the reason."""
    if not isinstance(outcome, Outcome):
        return Ending(Verdict.FAILED, f"measure returned {type(outcome).__name__}, not an Outcome")
    if outcome.state == TrialState.INVALID:
        return Ending(Verdict.INVALID, outcome.error or "invalid configuration")
    if outcome.state != TrialState.DONE:
        return Ending(Verdict.FAILED, f"measure returned an outcome in state {outcome.state!r}")
    try:
        row = measurement_row(claim, outcome)
    except (TypeError, ValueError) as exc:
        return Ending(Verdict.FAILED, f"measure returned numbers that are not numbers: {exc}")
    bad = row.problems()
    if bad:
        return Ending(Verdict.FAILED, "measure returned unusable timings: " + "; ".join(bad))
    return Ending(Verdict.DONE, None, row)


def measurement_row(claim: ClaimedTrial, outcome: Outcome) -> MeasurementRow:
    """The outcome as the row the completion stores: plain floats, JSON values (numpy's
    included), the claim's protocol when the problem did not report its own."""
    protocol = outcome.protocol or Protocol.from_json(claim.protocol).to_json()
    return MeasurementRow(
        median_s=_number(outcome.median_s),  # type: ignore[arg-type]
        min_s=_number(outcome.min_s),  # type: ignore[arg-type]
        samples_s=[float(x) for x in outcome.samples_s],
        protocol=jsonvalues.storable(protocol),
        gflops=_number(outcome.gflops),
        gbps=_number(outcome.gbps),
        flop_count=_number(outcome.flop_count),
        byte_count=_number(outcome.byte_count),
        compile_s=_number(outcome.compile_s),
        validation=jsonvalues.storable(dict(outcome.validation)),
        versions=jsonvalues.storable({"tunefleet": __version__, **outcome.versions}),
        code=None if outcome.code is None else str(outcome.code),
    )


def _number(value: Any) -> float | None:
    """A float PostgreSQL accepts (numpy scalars included); ``None`` stays ``None``."""
    return None if value is None else float(value)
