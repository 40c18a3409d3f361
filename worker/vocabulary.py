"""The worker's own vocabulary, spelled once here: where a held trial is (:class:`Stage`),
how it ended (:class:`Verdict`) and what a child process answers (:class:`ReplyKind`).
The database's states are :mod:`tunefleet.vocabulary`'s."""

from __future__ import annotations

from enum import StrEnum

from tunefleet.vocabulary import TrialState


class Stage(StrEnum):
    """Where a claimed trial is in this worker: ``claimed -> preparing -> prepared ->
    measuring -> finished``, or ``suspect`` (an unexplained error held until the run's next
    verdict on this worker; see :mod:`tunefleet.worker.judge`)."""

    CLAIMED = "claimed"
    PREPARING = "preparing"
    PREPARED = "prepared"
    MEASURING = "measuring"
    FINISHED = "finished"
    SUSPECT = "suspect"


class Verdict(StrEnum):
    """How a finished trial leaves this worker: a completion state, or ``handback`` (an
    environment fault: released uncounted). ``environment`` and ``error`` are the verdicts
    still to be judged (:mod:`tunefleet.worker.judge`): the child's reply said so, and
    whether it is the configuration's fault or this worker's depends on what else the run
    saw here."""

    DONE = TrialState.DONE.value
    INVALID = TrialState.INVALID.value
    FAILED = TrialState.FAILED.value
    TIMED_OUT = TrialState.TIMED_OUT.value
    HANDBACK = "handback"
    ENVIRONMENT = "environment"
    ERROR = "error"


class ReplyKind(StrEnum):
    """What a code-generation or device process answers
    (:class:`tunefleet.worker.supervise.Reply`)."""

    #: The problem of a Prepare or Measure is loaded; what fails after this is the
    #: configuration's fault, what fails before it the environment's.
    STARTED = "started"
    OK = "ok"
    #: InvalidConfiguration: the configuration itself is bad.
    INVALID = TrialState.INVALID.value
    #: This worker cannot run the problem at all (or the child died before loading it).
    ENVIRONMENT = Verdict.ENVIRONMENT.value
    #: Any other exception.
    ERROR = Verdict.ERROR.value
    #: The child exited or was killed by a signal.
    DIED = "died"
    #: We killed it at its deadline.
    TIMEOUT = "timeout"
