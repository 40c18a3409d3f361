"""The worker's main loop: a short state machine of named steps, and their I/O.

Start-up (``step_start``): find the device (in the device process), connect (one session for
the worker's whole life, whatever sits on the route: :mod:`tunefleet.db.pooler`), register
device and worker, take the device's lease, open the device session, start the heartbeat
thread (on the same session).

Then, until done, each turn of the loop runs these steps in order::

    collect -> abandon_lost -> start_next -> complete -> reap -> claim -> dispatch -> isolate
    -> stop -> size -> wait

``collect`` comes first so that a result that is already in is always sent: a zombie's
result is then refused by the fence, visibly, rather than silently thrown away.
``start_next`` hands an idle, live device process the next trial it already holds before the
results are written, so the device never waits on the database; a device process that must be
restarted first is left to ``dispatch``, after the results (restarting takes a moment).

and every held trial moves through its own stages::

    claimed -> preparing -> prepared -> measuring -> finished -> (completed: forgotten)
              (code-generation process)   (device process)     (fenced write)

With ``prepare_workers = 0`` a claimed trial goes straight to the device process, which
prepares and measures it in one request. At most ``1 + prefetch`` trials are held; timing is
never concurrent (one device process, one request at a time).

Shutdown: a signal asks for a graceful stop (:mod:`tunefleet.worker.signals`): claiming and
dispatching end, ``stop`` releases every held trial that is not being timed, the one being
timed finishes and is recorded, then the worker exits 0.

What this module decides itself is only the order of things and the database's answers
(a lost lease, a zombie's completion). The rest lives beside it:

``holding``  the held trials, in claim order, and their leases: the one place a trial is
             taken and forgotten
``claims``   the claim stage: how many to claim, a refused claim (one bad row), nothing to
             claim (drained, stood aside from every open run), ``--max-trials``
``dispatch`` the dispatch stage: which process works on which held trial (code generation,
             a cold build, the device), and the limits of each request
``results``  a held trial (:class:`~tunefleet.worker.results.Held`) and how a child's reply
             ends it (verdict, error, measurement row)
``outbox``   what a finished trial leaves in the database (the fenced completion, a
             hand-back, a stand-aside row) and the books of what was written (``complete``)
``cold``     a confirmation's cold build: a fresh process that prepares beside the device's
             work and then times what it kept
``timeline`` the moments a held trial passed here, and the phases they add up to
``judge``    whether an error is the configuration's or this worker's environment's (a
             trial may be held as a *suspect*; the worker may stand aside from a run): pure,
             the loop executes its decisions
``pool``     the code-generation processes and the books their sizing is decided from
             (``size``; the decisions are ``sizing``'s)
``signals``  the stop request (SIGTERM, SIGINT, SIGUSR1) and the wake-up pipe
``wake``     when to claim next (polling with jittered backoff) and whether to LISTEN
             meanwhile (only while the device waits, and only on a route that keeps a
             session)
``quiet``    the code-generation processes stopped while a CPU device times (``isolate``)
``heartbeat`` the heartbeat thread on the worker's one session, and the main loop's liveness
             (a stuck loop stops its heartbeats, so its leases expire)
"""

from __future__ import annotations

import logging
import math
import multiprocessing.connection
import os
import random
import socket
import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID, uuid4

import psycopg

from tunefleet.db import pooler
from tunefleet.db.engine import connect
from tunefleet.db.pooler import Route
from tunefleet.devices import HOST_DEVICE, DeviceInfo
from tunefleet.errors import DatabaseProblem, DeviceError, TunefleetError
from tunefleet.queries import queue
from tunefleet.timeline import timing_share
from tunefleet.version import __version__
from tunefleet.vocabulary import ANY_DEVICE_CLASS, TrialState

from . import results
from .claims import Claims
from .cold import ColdBuilds
from .dispatch import DEVICE_START_TIMEOUT_S, Dispatch
from .heartbeat import Heartbeat, Liveness
from .holding import BEFORE_CODE, Holding
from .judge import Decision, Judge, Trial
from .link import DatabaseDown, Link
from .outbox import Outbox, Sent
from .pool import CodegenPool
from .quiet import Quiet, shares_host_cores
from .results import Held
from .settings import WorkerSettings
from .signals import Signals
from .sizing import Sizing, detect_resources
from .supervise import Child, Describe, Open, Reply
from .vocabulary import ReplyKind, Stage, Verdict
from .wake import Wakeups

log = logging.getLogger("tunefleet.worker")

#: A worker of the same host counts as sharing its cores while its heartbeat is this fresh.
PEER_ALIVE_S = 60.0
#: Stages of the held trials a graceful stop releases (all but the one being timed).
RELEASED_ON_STOP = (Stage.CLAIMED, Stage.PREPARING, Stage.PREPARED, Stage.SUSPECT)


class Worker:
    def __init__(self, settings: WorkerSettings, url: str) -> None:
        self.settings = settings
        self.url = url
        self.worker_id: UUID = uuid4()
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.device_id: int | None = None
        #: The trials this worker holds, and their leases (which the heartbeat renews).
        self.held = Holding()
        self.leases = self.held.leases
        self.device_child = Child("device")
        #: The cold builds (confirmations) in progress, each a one-shot child with caches
        #: of its own (:mod:`tunefleet.worker.cold`).
        self.colds = ColdBuilds()
        #: Stops the code-generation pool while a CPU device times (enabled once the device
        #: is known).
        self.quiet = Quiet(False)
        self.pool = CodegenPool(
            detect_resources(settings.cores, peers=settings.peers),
            settings.prepare_workers,
            settings.prefetch,
            time.monotonic(),
        )
        self.last_report_at = -math.inf
        self.reported: Sizing | None = None
        #: Whether the main loop moves (its heartbeats stop when it does not).
        self.liveness = Liveness(settings.lease_s)
        self.link = Link(
            url,
            settings.db,
            "main",
            on_connect=self._on_connect,
            on_call_done=self.liveness.stamp,
        )
        #: What sits between this worker and PostgreSQL (found on the first connection).
        self.route: Route | None = None
        self.wake = Wakeups(settings.poll_s, listen=settings.listen, rng=random.Random())
        #: This worker holds its device's lease (every worker but a host one).
        self.holds_device = False
        self.heartbeat: Heartbeat | None = None
        self.signals = Signals(settings.lease_s, self._children)
        self.judge = Judge(settings.stand_aside_after)
        #: A graceful stop has checked its leases once (:meth:`_beat_for_stop`).
        self._stop_beaten = False
        #: The finished trials' writes, and the books of them: outcomes, seconds timed, the
        #: fastest median per run (the racing bound of ``dispatch``).
        self.outbox = Outbox(self.link, self.worker_id)
        #: The stages with books of their own: claiming, and handing trials to processes.
        self.claims = Claims(
            settings,
            self.link,
            self.wake,
            self.judge,
            self.held,
            self.worker_id,
            self.host,
            settle=self._settle_suspects,
        )
        self.dispatch = Dispatch(
            settings,
            self.held,
            self.pool,
            self.colds,
            self.device_child,
            self.liveness,
            self.outbox.best_s,
            open_device=self._open_device,
            on_reply=self._on_reply,
        )
        self.next_reap_at = 0.0
        self.exit_code = 0

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        """Run until drained, ``max_trials`` reached or stopped by a signal; return the exit
        status. Fatal problems (device taken, device lost) raise a TunefleetError after the
        held trials were released."""
        self.signals.install()
        try:
            self.step_start()
            while not self.step_done():
                self.liveness.stamp()
                self.step_collect()
                self.step_abandon_lost()
                self.step_start_next()
                self.step_complete()
                self.step_reap()
                self.step_claim()
                self.step_dispatch()
                self.step_isolate()
                self.step_stop()
                self.step_size()
                self.step_wait()
            self.step_finish()
            return self.exit_code
        except TunefleetError:
            self._give_back_everything()
            raise
        finally:
            self.quiet.release()  # whatever ended the loop, nothing of ours stays stopped
            self._teardown()

    @property
    def worker_secret(self) -> str:
        """Returned by registration; claims, the worker heartbeat and the stop present it."""
        return self.claims.secret

    @worker_secret.setter
    def worker_secret(self, secret: str) -> None:
        self.claims.secret = secret

    @property
    def device(self) -> DeviceInfo:
        """The device served (the host until start-up has found it)."""
        return self.dispatch.device

    @device.setter
    def device(self, device: DeviceInfo) -> None:
        self.dispatch.device = device

    @property
    def classes(self) -> list[str]:
        """The device classes this worker claims trials of."""
        return self.claims.classes

    @classes.setter
    def classes(self, classes: list[str]) -> None:
        self.claims.classes = classes

    @property
    def stopping(self) -> bool:
        """A graceful stop was asked for (:mod:`tunefleet.worker.signals`)."""
        return self.signals.stopping

    @property
    def capacity(self) -> int:
        """Most trials held at once: the one being timed plus the prefetched ones."""
        return self.pool.sizing.capacity

    @property
    def is_host(self) -> bool:
        return self.device.platform == HOST_DEVICE.platform

    # --- start-up ------------------------------------------------------------------------------
    def step_start(self) -> None:
        pattern = self.settings.device
        if pattern is not None and pattern.strip().lower() == "host":
            self.device = HOST_DEVICE
        else:
            reply = self.device_child.call(Describe(pattern), DEVICE_START_TIMEOUT_S)
            if reply.kind != ReplyKind.OK:
                raise DeviceError(_device_failure("finding the device", reply))
            self.device = reply.value
        self.quiet = Quiet(self.settings.pause_codegen and shares_host_cores(self.device))
        self.classes = sorted({self.device.device_class, ANY_DEVICE_CLASS})
        conn = self.link.connect_now()  # finds the route (on_connect)
        try:
            self.device_id = queue.register_device(conn, self.device)
            self.worker_secret = queue.register_worker(
                conn,
                worker_id=self.worker_id,
                host=self.host,
                pid=self.pid,
                device_id=self.device_id,
                device_class=self.device.device_class,
                version=__version__,
                capacity=self.capacity,
            )
        except psycopg.errors.InsufficientPrivilege as exc:
            # A role without EXECUTE on the queue's functions, or a session whose timeouts
            # are above the role's: nothing was written.
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DatabaseProblem(
                f"the database refused to register this worker ({reason}); connect as the "
                "worker role that `tunefleet db roles` sets up (run it again after every "
                "`tunefleet db upgrade`)"
            ) from None
        if not self.is_host:
            # Many synthetic workers may share a machine; real devices get one worker each.
            self._take_device(conn)
        self._report(conn, initial=True)
        self._open_device()
        self.heartbeat = Heartbeat(
            self.link,
            worker_id=self.worker_id,
            worker_secret=self.worker_secret,
            lease_s=self.settings.lease_s,
            interval_s=self.settings.heartbeat_s,
            held=self.leases,
            on_lost=self.signals.wake,
            liveness=self.liveness,
            holds_device=self.holds_device,
            on_device_lost=self.signals.wake,
        )
        self.heartbeat.start()
        log.info(
            "worker %s (pid %s on %s) serving %s [%s], classes %s, lease %g s, %s",
            self.worker_id,
            self.pid,
            self.host,
            self.device.name,
            self.device.platform,
            ", ".join(self.classes),
            self.settings.lease_s,
            "polling, listening while idle" if self.wake.listen else "polling",
        )
        r, sizing = self.pool.resources, self.pool.sizing
        log.info(
            "sizing (%s): %s code-generation process(es), prefetch %s; %g cores (%s) "
            "shared by %s worker(s) of this host, ceiling %s",
            sizing.source,
            sizing.prepare_workers,
            sizing.prefetch,
            r.cores,
            r.source,
            r.peers,
            sizing.ceiling,
        )

    def _on_connect(self, conn: psycopg.Connection[Any]) -> None:
        # A new session listens to nothing; the first one also finds the route (a pooler in
        # transaction mode keeps no LISTEN: the worker polls there).
        self.wake.lost_session()
        if self.route is not None:
            return
        self.route = pooler.detect(
            conn, lambda: connect(self.url, self.settings.db, connect_timeout=5)
        )
        self.wake.listen = self.settings.listen and self.route.keeps_session
        log.info("database route: %s", self.route.describe())
        if self.settings.listen and not self.route.keeps_session:
            log.warning("--listen ignored: LISTEN does not work through this pooler; polling")
        if self.route.pooler:
            timeout = queue.session_timeout(conn)
            if not timeout:
                log.warning(
                    "the connection pooler drops the session's statement_timeout and this "
                    "role sets none: give the worker role its timeouts (`tunefleet db roles`, "
                    "or ALTER ROLE ... SET statement_timeout), or set the pooler's "
                    "query_timeout"
                )

    def _take_device(self, conn: psycopg.Connection[Any]) -> None:
        """Take this device's lease, or stop with one line naming who holds it. A holder
        whose process no longer runs on this host (it crashed) keeps the device until its
        lease runs out: wait for that, once, rather than refuse a restart."""
        deadline: float | None = None
        while True:
            got = queue.take_device(
                conn,
                worker_id=self.worker_id,
                secret=self.worker_secret,
                index=self.device.index,
                lease_s=self.settings.lease_s,
            )
            if got.taken:
                self.holds_device = True
                return
            left = got.holder_expires_in_s or 0.0
            if deadline is None and not _process_alive(got.holder_pid):
                deadline = time.monotonic() + left + 1.0
                log.warning(
                    "device %s on %s is leased to worker %s (pid %s), which no longer runs "
                    "here: waiting %.0f s for its lease to run out",
                    self.device.index,
                    self.host,
                    got.holder,
                    got.holder_pid,
                    left,
                )
            if deadline is None or time.monotonic() > deadline:
                queue.stop_worker(conn, self.worker_id, self.worker_secret)
                raise DeviceError(
                    f"device {self.device.index} ({self.device.name}, {self.device.platform}) "
                    f"on {self.host} is already used by another tunefleet worker (pid "
                    f"{got.holder_pid}); two workers timing one device corrupt each other's "
                    "numbers: stop the other worker or choose another device with --device"
                )
            ready = multiprocessing.connection.wait(
                [self.signals.waitable], timeout=min(max(left, 0.1), 1.0)
            )
            if ready:
                self.signals.drain()
            if self.stopping:
                queue.stop_worker(conn, self.worker_id, self.worker_secret)
                raise DeviceError("stopped while waiting for the device's lease")

    def _open_device(self) -> None:
        reply = self.device_child.call(Open(self.device), DEVICE_START_TIMEOUT_S)
        if reply.kind != ReplyKind.OK:
            raise DeviceError(_device_failure(f"opening {self.device.name}", reply))

    # --- steps ---------------------------------------------------------------------------------
    def step_done(self) -> bool:
        if self.held:
            return False
        if self.stopping:
            return True
        if self.claims.exhausted:
            log.info("reached --max-trials %s", self.settings.max_trials)
            return True
        return self.claims.drained

    def step_collect(self) -> None:
        now = time.monotonic()
        for child in self._children():
            held = self.held.of_child(child)
            reply = child.poll(now)
            if reply is not None and held is not None:
                self._on_reply(held, reply)
        self._sweep_colds()

    def step_abandon_lost(self) -> None:
        """Drop trials whose lease the heartbeat could not extend (someone else's now); stop
        once the device's lease is gone (another worker times on it now)."""
        if self.heartbeat is not None and self.heartbeat.device_lost:
            raise DeviceError(
                f"device {self.device.index} ({self.device.name}) on {self.host}: this "
                "worker lost its lease on the device (it could not renew it for a whole "
                f"lease, {self.settings.lease_s:g} s, and another worker took the device or "
                "its worker row was stopped); exiting without timing anything more"
            )
        for lost in self.leases.take_lost():
            held = self.held.get(lost.trial_id)
            if held is None or held.key != lost or held.stage == Stage.FINISHED:
                continue  # a finished result is still sent: the fence decides
            if held.child is not None:
                held.child.kill()  # the evaluation is someone else's business now
            self.held.forget(held)
            self.outbox.outcomes["lost"] += 1

    def step_start_next(self) -> None:
        if self.device_child.alive and not self.dispatch.device_busy():
            self.step_dispatch()

    def step_complete(self) -> None:
        """Send every finished trial: its result through the fenced completion, or, after an
        environment fault, the trial itself back uncounted."""
        if not self.outbox.record_stand_asides(self.worker_secret):
            return
        for held in self.held.in_stages(Stage.FINISHED):
            if not self.link.ready():
                return
            handback = held.state == Verdict.HANDBACK
            sent = self.outbox.hand_back(held) if handback else self.outbox.send(held)
            if sent is Sent.LATER:
                return  # the database went away: tried again after reconnecting
            if sent is Sent.GONE:
                self.held.forget(held)
                self.claims.due()  # room for another trial

    def step_reap(self) -> None:
        now = time.monotonic()
        if self.stopping or now < self.next_reap_at or not self.link.ready():
            return
        self.next_reap_at = now + self.settings.reap_s
        try:
            reaped = self.link.run(queue.reap_expired_leases)
        except DatabaseDown:
            return
        for r in reaped or ():
            log.warning(
                "reaper: trial %s attempt %s of worker %s lost its lease -> %s",
                r.trial_id,
                r.attempt,
                r.previous_owner,
                r.state,
            )
            if r.state == TrialState.PENDING:
                self.claims.due()

    def step_claim(self) -> None:
        if self.stopping:
            return
        now = time.monotonic()
        if self.claims.step(self.capacity) and self.pool.first_claim_at is None:
            self.pool.first_claim_at = now

    def step_dispatch(self) -> None:
        if not self.stopping:  # stopping: the trial being timed finishes; nothing new starts
            self.dispatch.step()

    def _sweep_colds(self) -> None:
        """End the cold builds whose trial has finished here or is no longer held."""
        self.colds.sweep([h.claim.trial_id for h in self.held.unfinished()])

    def step_isolate(self) -> None:
        """While the device process holds a request on a CPU device, the code-generation
        processes stand still (:mod:`tunefleet.worker.quiet`); once it is idle they run."""
        self.quiet.hold(self.dispatch.device_busy(), [*self.pool.children, *self.colds.preparing()])

    def step_stop(self) -> None:
        """While stopping: give back every held trial that is not being timed. If the database
        stays unreachable for a whole lease, give up on what is left (the leases expire)."""
        if not self.stopping:
            return
        if not self._stop_beaten:
            self._stop_beaten = True
            self._beat_for_stop()
        waiting = self.held.in_stages(*RELEASED_ON_STOP)
        deadline = self.signals.stop_deadline
        if deadline is not None and time.monotonic() > deadline:
            unsent = [h for h in self.held if h.stage != Stage.MEASURING]
            if unsent and not self.link.ready():
                log.warning(
                    "giving up on %s held trial(s): database unreachable; their leases expire "
                    "within %g s",
                    len(unsent),
                    self.settings.lease_s,
                )
                for held in unsent:
                    if held.child is not None:
                        held.child.kill()
                    self.held.forget(held)
                self.exit_code = 1
                return
        if not waiting or not self.link.ready():
            return
        for held in waiting:
            if held.child is not None:
                held.child.kill()
                held.child = None
        try:
            released = self.link.run(
                queue.release_trials, worker_id=self.worker_id, held=[h.key for h in waiting]
            )
        except DatabaseDown:
            return
        for held in waiting:
            if held.claim.trial_id in released:
                log.info("released trial %s (back to pending)", held.claim.trial_id)
                self.outbox.outcomes["released"] += 1
            self.held.forget(held)

    def _beat_for_stop(self) -> None:
        """A graceful stop lets the trial being timed finish, unless it is no longer ours:
        one heartbeat now (not at the next interval) finds a trial its run handed back (a
        time budget's deadline cancels what is in flight), and ``abandon_lost`` then drops it
        at once instead of timing it to the end for a result the fence would refuse."""
        if self.heartbeat is None or self.held.first(Stage.MEASURING) is None:
            return
        self.heartbeat.beat()

    def step_size(self) -> None:
        """Book the time since the last turn under what the device was doing then; when the
        window is full, let the controller resize the pool and report the sizing."""
        now = time.monotonic()
        starved = not self.stopping and self.held.any_in(*BEFORE_CODE)
        self.pool.book(now, busy=self.dispatch.device_busy(), starved=starved)
        self.pool.retire(self.held.children())
        device = [self.device_child.proc.pid] if self.device_child.proc is not None else []
        ended = self.pool.end_window(now, [self.pid, *device])
        if ended is None:
            return
        window, whole = ended
        if whole and not self.stopping and self.pool.control(window, self.held.children()):
            self.claims.due()  # a larger prefetch claims at once
        if self.link.ready():
            try:
                self.link.run(self._report)
            except DatabaseDown:
                pass

    def step_wait(self) -> None:
        if self.wake.listening:
            self.claims.pump_notifications()
        now = time.monotonic()
        # Turn at least every half of the liveness allowance: a loop that waits longer
        # looks stuck to the heartbeat thread.
        deadlines = [now + self.liveness.allowance_s / 2]
        if not self.stopping:
            deadlines.append(self.next_reap_at)
        if not self.stopping and len(self.held) < self.capacity:
            deadlines.append(self.claims.next_at)
        for child in self._children():
            if child.busy and child.deadline is not None:
                deadlines.append(child.deadline)
        if not self.link.up:
            wait = self.link.wait_s()
            if wait is not None:
                deadlines.append(now + wait)
        if self.held.any_in(Stage.FINISHED) and self.link.up:
            deadlines.append(now)
        if self.stopping and self.signals.stop_deadline is not None:
            deadlines.append(self.signals.stop_deadline)
        if self.stopping and not self.held:
            deadlines.append(now)  # nothing left to hand back: exit now, not a poll later
        timeout = max(0.0, min([*deadlines, now + self.settings.poll_s]) - now)
        waitables: list[Any] = [self.signals.waitable]
        for child in self._children():
            waitables.extend(child.waitables())
        db = self.link.conn if self.link.up and self.wake.listening else None
        if db is not None:
            waitables.append(db)
        ready = multiprocessing.connection.wait(waitables, timeout=timeout)
        if self.signals.waitable in ready:
            self.signals.drain()
        if db is not None and db in ready:
            self.claims.pump_notifications()

    def step_finish(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        try:
            self.link.run(self._report, force=True)  # the final busy fraction, for status
            self.link.run(queue.stop_worker, self.worker_id, self.worker_secret)
        except DatabaseDown:
            log.warning("could not mark worker %s stopped: database unreachable", self.worker_id)
        outcomes = sorted(self.outbox.outcomes.items())
        summary = ", ".join(f"{k} {v}" for k, v in outcomes) or "nothing"
        log.info("worker %s exiting: %s", self.worker_id, summary)

    # --- replies from the children, and the fault policy -------------------------------------
    def _on_reply(self, held: Held, reply: Reply) -> None:
        preparing = held.stage == Stage.PREPARING
        held.marks.replied(preparing, reply, time.monotonic())
        if reply.kind == ReplyKind.OK:
            self.pool.timed(preparing, reply.seconds)
        if reply.kind == ReplyKind.OK and preparing:
            aside = self.judge.aside_from(held.claim.run_id)
            if aside is not None:  # stood aside meanwhile: it is not timed here
                held.finish(Verdict.HANDBACK, aside)
            else:
                held.spent_s = held.child.spent_s if held.child is not None else 0.0
                held.stage, held.prepared, held.child = Stage.PREPARED, reply.value, None
            return
        ended = results.ending(held.claim, reply, preparing)
        held.finish(ended.verdict, ended.error, ended.measurement)
        decision = self.judge.judge(held.seen(), self.held.seen())
        self._execute(decision)
        if decision.ask:
            elsewhere = self._handed_back_elsewhere(decision.ask)
            self._execute(self.judge.weigh(decision.ask, elsewhere, self.held.seen()))
        if held.stage == Stage.FINISHED and held.state not in (
            Verdict.DONE,
            Verdict.INVALID,
            Verdict.HANDBACK,
        ):
            log.warning("trial %s: %s: %s", held.claim.trial_id, held.state, held.error)

    def _execute(self, decision: Decision) -> None:
        """Carry out what the judge decided about the held trials."""
        if decision.suspect is not None:
            s = decision.suspect
            held = self.held[s.trial_id]
            held.stage = Stage.SUSPECT
            log.info(
                "trial %s: %s (held: %s of %s in a row before this worker stands aside from "
                "run %s)",
                s.trial_id,
                held.error,
                s.streak,
                s.of,
                held.claim.run_id,
            )
        for counted in decision.failed:
            held = self.held[counted.trial_id]
            if counted.note is not None:
                log.info("trial %s: %s", counted.trial_id, counted.note)
            held.finish(Verdict.FAILED, held.error)
        for trial_id, reason in decision.handed_back.items():
            self.held[trial_id].finish(Verdict.HANDBACK, reason)
        if decision.stand_aside is not None:
            run, reason = decision.stand_aside.run_id, decision.stand_aside.reason
            self.outbox.unrecorded[run] = reason
            log.warning(
                "standing aside from run %s: worker %s on %s cannot run this problem: %s",
                run,
                self.worker_id,
                self.host,
                reason,
            )
            self.claims.due()

    def _settle_suspects(self, why: str) -> None:
        self._execute(self.judge.settle(self.held.seen(), why))

    def _handed_back_elsewhere(self, streak: Sequence[Trial]) -> dict[int, set[str]] | None:
        """Which of the streak's trials other workers handed back, for which errors
        (``None``: the database is away, no evidence either way)."""
        try:
            return self.link.run(  # type: ignore[no-any-return]
                queue.handed_back_elsewhere,
                worker_id=self.worker_id,
                trial_ids=[t.trial_id for t in streak],
            )
        except DatabaseDown:
            return None

    # --- the sizing report ---------------------------------------------------------------------
    def _report(
        self, conn: psycopg.Connection[Any], initial: bool = False, force: bool = False
    ) -> None:
        """Write the sizing (when it changed, or every ``settings.report_s``) and learn how many
        workers share this host; at start-up a larger count resizes the pool before any
        code-generation process has started."""
        now = time.monotonic()
        sizing = self.pool.sizing
        if (
            not (initial or force)
            and sizing == self.reported
            and now - self.last_report_at < self.settings.report_s
        ):
            return
        peers = queue.report_worker_sizing(
            conn,
            self.worker_id,
            self.worker_secret,
            capacity=self.capacity,
            prepare_workers=sizing.prepare_workers,
            prefetch=sizing.prefetch,
            sizing=sizing.source,
            device_busy=self._timing_share(now),
            peer_alive_s=PEER_ALIVE_S,
        )
        self.reported, self.last_report_at = sizing, now
        if self.pool.share_with(max(peers, self.settings.peers), initial):
            self.reported = None
            self._report(conn)

    def _timing_share(self, now: float) -> float | None:
        """The share of the time since the first claim that the device spent timing kernels
        (what ``status`` shows as TIMING; the pool's own books size the pool)."""
        first = self.pool.first_claim_at
        if first is None or now <= first:
            return None
        return timing_share(self.outbox.timed_s, now - first)

    # --- shutdown ------------------------------------------------------------------------------
    def _give_back_everything(self) -> None:
        """After a fatal error: stop timing, release what we hold, mark the worker stopped."""
        self.device_child.kill()
        self.colds.kill()
        for child in self.pool.children:
            child.kill()
        unfinished = self.held.unfinished()
        try:
            if unfinished:
                self.link.run(
                    queue.release_trials,
                    worker_id=self.worker_id,
                    held=[h.key for h in unfinished],
                    reason="released by the worker after a fatal error",
                )
            self.step_complete()
            self.link.run(queue.stop_worker, self.worker_id, self.worker_secret)
        except (DatabaseDown, TunefleetError, psycopg.Error):
            pass

    def close(self) -> None:
        """Stop the children and close the connections (``run`` does this itself)."""
        self._teardown()

    def _teardown(self) -> None:
        if self.heartbeat is not None and self.heartbeat.is_alive():
            self.heartbeat.stop()
        for child in [*self.pool.children, self.device_child]:
            child.close()
        self.colds.close()
        self.link.close()
        self.signals.close()

    # --- helpers ---------------------------------------------------------------------------------
    def _children(self) -> list[Child]:
        return [*self.pool.children, self.device_child, *self.colds.children()]


def _process_alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs on this machine (unknown counts as alive)."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists but is not ours (EPERM)
    return True


def _device_failure(what: str, reply: Reply) -> str:
    if reply.kind == ReplyKind.ERROR:
        return f"{what} failed: {reply.message}"
    return f"{what} failed: the device process {reply.message}"
