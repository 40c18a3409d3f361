"""The timeline of one held trial in this worker: the moments it passed (claimed, sent to a
code-generation process, prepared, sent to the device, measured) and what each child said it
spent, turned into the phases of :mod:`tunefleet.timeline` when the result is sent.

Every second from the claim's return to the send lands in exactly one phase: the waits
(``wait_codegen``, ``wait_device``, ``report``) come from this process's clock, the work from
the children's own accounts, and what a child's account leaves of its request's span is the
``handoff`` between processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tunefleet.timeline import DEVICE_PHASES, Phase, clean

from .supervise import Reply
from .vocabulary import ReplyKind

#: Replies this process makes up itself (the child said nothing about its time).
_UNTOLD = (ReplyKind.TIMEOUT, ReplyKind.DIED)
#: What a code-generation process may report of its request beside code generation (the rest
#: of its time is code generation): its prebuild, and a cold build's readying.
PREPARE_PHASES = (Phase.PREBUILD, Phase.READY)


@dataclass
class Marks:
    """The moments (``time.monotonic()``) one held trial passed, and the children's own
    accounts of their requests."""

    claimed: float
    prepare_sent: float | None = None
    prepared: float | None = None
    #: The code-generation process's whole request, and what in it was not code generation.
    prepare_child_s: float = 0.0
    preparation: dict[str, float] = field(default_factory=dict)
    measure_sent: float | None = None
    measured: float | None = None
    measure_child_s: float = 0.0
    #: The device process's own split of its request (``Reply.phases``).
    device: dict[str, float] = field(default_factory=dict)

    def replied(self, preparing: bool, reply: Reply, now: float) -> None:
        """A child answered the request this trial was in."""
        sent = self.prepare_sent if preparing else self.measure_sent
        # A timeout or a death is told by this process: the whole span was the child's.
        told = reply.seconds if reply.kind not in _UNTOLD else now - (sent or now)
        if preparing:
            self.prepared, self.prepare_child_s = now, told
            self.preparation = clean(reply.phases, PREPARE_PHASES)
        else:
            self.measured, self.measure_child_s = now, told
            self.device = clean(reply.phases, DEVICE_PHASES)

    def phases(self, now: float) -> dict[str, float]:
        """The timeline from the claim to ``now`` (the moment the result is sent)."""
        acc: dict[Phase, float] = {}
        cursor = self.claimed
        if self.prepare_sent is not None:
            cursor = _request(
                acc, cursor, self.prepare_sent, self.prepared, self.prepare_child_s,
                self.preparation, Phase.WAIT_CODEGEN, Phase.CODEGEN, now,
            )  # fmt: skip
        if self.measure_sent is not None:
            cursor = _request(
                acc, cursor, self.measure_sent, self.measured, self.measure_child_s,
                self.device, Phase.WAIT_DEVICE, Phase.DEVICE_OTHER, now,
            )  # fmt: skip
        _add(acc, Phase.REPORT, now - cursor)
        return {p.value: round(acc[p], 6) for p in Phase if p in acc}


def _add(acc: dict[Phase, float], phase: Phase, seconds: float) -> None:
    if seconds > 0:
        acc[phase] = acc.get(phase, 0.0) + seconds


def _request(
    acc: dict[Phase, float],
    cursor: float,
    sent: float,
    answered: float | None,
    child_s: float,
    told: dict[str, float],
    wait: Phase,
    rest: Phase,
    now: float,
) -> float:
    """Book one request to a child from ``cursor`` (when the trial was last seen here): the
    wait until it was ``sent``, then its span, split as the child ``told`` (what it leaves of
    its ``child_s`` is ``rest``) and the hand-off around it; a request never answered (the
    child killed or dead) is all ``rest`` until ``now``. Returns where the span ended."""
    _add(acc, wait, sent - cursor)
    end = answered if answered is not None else now
    span = end - sent
    child = min(child_s, span) if answered is not None else span
    left = child
    for name, seconds in told.items():
        share = min(seconds, left)
        _add(acc, Phase(name), share)
        left -= share
    _add(acc, rest, left)
    _add(acc, Phase.HANDOFF, span - child)
    return end
