"""Supervised evaluation: long-lived child processes that run one request at a time, and the
parent-side handle that gives each request a deadline and kills, reports and restarts a child
that hangs or dies.

Two roles use the same machinery: the *device process* (discovers and opens the OpenCL device,
then times prepared configurations; it is the only process of a worker that launches kernels)
and the *code-generation processes* (``Problem.prepare``; with prebuild on, they also open a
context on the same device and compile there, never launch, so that the device process's
build is a cache hit). Children are started with the ``spawn`` method: OpenCL and driver state
never cross a ``fork``.

A child ignores SIGINT and SIGTERM (a Ctrl-C or a batch system's SIGTERM to the whole process
group must not count as a crashed evaluation; the parent decides what to do) and asks the
kernel to SIGKILL it when the parent dies, so a hung kernel never outlives its worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tunefleet.devices import DeviceInfo
from tunefleet.errors import InvalidConfiguration, ProblemError, TunefleetError
from tunefleet.problems.base import COLD_KEY, Outcome
from tunefleet.processes import die_with_parent
from tunefleet.timeline import Phase

from .vocabulary import ReplyKind

log = logging.getLogger("tunefleet.worker")

_CONTEXT = multiprocessing.get_context("spawn")

# --- requests and replies ----------------------------------------------------------------------


@dataclass(frozen=True)
class Describe:
    """Find the device a pattern selects (OpenCL discovery happens in the child)."""

    pattern: str | None


@dataclass(frozen=True)
class Open:
    """Open the device session that every later Measure uses."""

    device: DeviceInfo


@dataclass(frozen=True)
class Prepare:
    """Generate code for one configuration; with ``prebuild`` also compile it on the device
    in this process (see :meth:`~tunefleet.problems.base.Problem.prebuild`).

    ``keep``: the first half of a cold build (:mod:`tunefleet.worker.cold`): this child opens
    the device itself, prepares, builds, readies the measurement of ``protocol`` (inputs,
    reference: :meth:`~tunefleet.problems.base.Problem.ready`) and keeps it all for the
    ``Measure(kept=True)`` that follows; the reply carries no value."""

    problem: str
    args: dict[str, Any]
    config: dict[str, Any]
    device: DeviceInfo
    prebuild: bool = False
    keep: bool = False
    protocol: dict[str, Any] | None = None


@dataclass(frozen=True)
class Measure:
    """Time one configuration. With ``inline_prepare`` the child prepares it first (no
    code-generation processes); otherwise ``prepared`` is what a Prepare returned. ``cold``:
    a one-shot child started with caches of its own (:func:`cold_environment`), which opens
    the device itself and records the cold build in the measurement's protocol."""

    problem: str
    args: dict[str, Any]
    config: dict[str, Any]
    device: DeviceInfo
    protocol: dict[str, Any]
    prepared: Any = None
    inline_prepare: bool = False
    cold: bool = False
    #: Time what this child's ``Prepare(keep=True)`` kept.
    kept: bool = False
    #: Race the timing above this many seconds a launch (a kernel far slower than the run's
    #: best gets a couple of launches, not the protocol's count); ``None``: time in full.
    race_above_s: float | None = None


@dataclass(frozen=True)
class Reply:
    """``ok`` (``value``), ``invalid`` (InvalidConfiguration), ``environment`` (this worker
    cannot run the problem at all: see :data:`ENVIRONMENT_ERRORS`, or the child died before
    its problem was loaded), ``error`` (any other exception), ``died`` (the child
    exited or was killed by a signal) or ``timeout`` (killed by us).

    A child also sends ``started`` (no value) once the problem of a Prepare or Measure is
    loaded, before it works on the configuration: what happens before that is about the
    worker's environment, what happens after it about the configuration. The parent side
    (:meth:`Child.poll`) consumes it."""

    kind: ReplyKind
    value: Any = None
    message: str = ""
    seconds: float = 0.0
    #: Where ``seconds`` went, by :class:`~tunefleet.timeline.Phase` name, as far as the
    #: child knows: a Prepare's ``prebuild``, a Measure's own split (its outcome's
    #: phases, and ``codegen`` when it prepared inline).
    phases: dict[str, float] = field(default_factory=dict)


#: Exceptions from a problem's ``prepare`` or ``measure`` that say this worker's environment
#: cannot run the problem (a missing module, a problem that does not load here, bad problem
#: arguments for this node's version of it), never that one configuration is bad: the trial
#: is handed back uncounted and the worker stands aside from the run. A problem signals the
#: same on purpose by raising :class:`~tunefleet.errors.ProblemError`.
ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (ImportError, ProblemError)


class NeedsDevice(ProblemError):
    """A problem timed on OpenCL reached a worker that serves the host pseudo-device."""


def cold_environment(cache_dir: str) -> dict[str, str]:
    """The environment of a cold build: every cache that could carry code from the search
    into this process (loopy's and pytools' persistent dictionaries, pyopencl's binaries,
    PoCL's kernels, NVIDIA's compute cache) is an empty directory of its own or off."""
    return {
        "XDG_CACHE_HOME": cache_dir,
        "POCL_CACHE_DIR": os.path.join(cache_dir, "pocl"),
        "POCL_KERNEL_CACHE": "0",
        "CUDA_CACHE_PATH": os.path.join(cache_dir, "nv"),
        "CUDA_CACHE_DISABLE": "1",
    }


# --- the child side ----------------------------------------------------------------------------


@dataclass
class _ChildState:
    session: Any = None
    #: Why a code-generation process could not open its own device session (then it only
    #: generates code).
    session_error: str | None = None
    problems: dict[str, Any] = field(default_factory=dict)
    #: The request in hand's phases so far (:class:`Reply.phases`).
    phases: dict[str, float] = field(default_factory=dict)
    #: What a ``Prepare(keep=True)`` prepared, for the ``Measure(kept=True)`` that follows.
    kept: Any = None

    def problem(self, spec: str) -> Any:
        if spec not in self.problems:
            from tunefleet.problems.registry import get_problem

            self.problems[spec] = get_problem(spec)
        return self.problems[spec]


def child_main(conn: multiprocessing.connection.Connection, parent_pid: int) -> None:
    """Entry point of a child: serve requests until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Not Linux: the pipe's EOF still ends an idle child.
    die_with_parent(parent_pid, signal.SIGKILL, exit_code=0)
    state = _ChildState()
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        started = time.perf_counter()
        state.phases = {}
        try:
            if isinstance(request, Prepare | Measure):
                try:
                    state.problem(request.problem)
                except BaseException as exc:
                    raise _LoadFailed(exc) from exc
                conn.send(Reply(ReplyKind.STARTED))
            reply = Reply(ReplyKind.OK, _handle(state, request))
        except InvalidConfiguration as exc:
            reply = Reply(ReplyKind.INVALID, message=str(exc))
        except _LoadFailed as exc:
            reply = Reply(ReplyKind.ENVIRONMENT, message=f"loading the problem failed: {exc}")
        except ENVIRONMENT_ERRORS as exc:
            reply = Reply(ReplyKind.ENVIRONMENT, message=_environment_text(exc))
        except BaseException as exc:
            reply = Reply(ReplyKind.ERROR, message=describe_exception(exc))
        if reply.kind == ReplyKind.OK and isinstance(reply.value, Outcome):
            state.phases.update(reply.value.phases)
        reply = Reply(
            reply.kind, reply.value, reply.message, time.perf_counter() - started, state.phases
        )
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return
        except Exception as exc:  # an unpicklable result: report it instead
            conn.send(Reply(ReplyKind.ERROR, message=f"result cannot be sent back: {exc!r}"))


class _LoadFailed(Exception):
    """The problem of a request could not be loaded in this process."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(_environment_text(cause))


def _environment_text(exc: BaseException) -> str:
    """Our own errors are written to be read as they are; anything else with its type and
    place."""
    if isinstance(exc, TunefleetError):
        return " ".join(str(exc).split())
    return describe_exception(exc)


def _handle(state: _ChildState, request: Any) -> Any:
    if isinstance(request, Describe):
        from .device import select_device

        return select_device(request.pattern)
    if isinstance(request, Open):
        from .device import open_session

        state.session = open_session(request.device)
        return None
    if isinstance(request, Prepare):
        problem = state.problem(request.problem)
        if request.keep and problem.needs_opencl and state.session is None:
            from .device import open_session

            state.session = open_session(request.device)
        prepared = problem.prepare(request.args, request.config, request.device)
        if (request.prebuild or request.keep) and problem.needs_opencl:
            prepared = _prebuild(state, problem, prepared, request.device)
        if not request.keep:
            return prepared
        from tunefleet.problems.base import Protocol

        started = time.perf_counter()
        problem.ready(prepared, state.session, Protocol.from_json(request.protocol or {}))
        state.phases[Phase.READY] = time.perf_counter() - started
        state.kept = prepared
        return None
    if isinstance(request, Measure):
        from tunefleet.problems.base import Protocol

        problem = state.problem(request.problem)
        if request.cold and problem.needs_opencl and state.session is None:
            from .device import open_session

            state.session = open_session(request.device)
        prepared = request.prepared
        if request.kept:
            prepared, state.kept = state.kept, None
        elif request.inline_prepare:
            started = time.perf_counter()
            prepared = problem.prepare(request.args, request.config, request.device)
            state.phases[Phase.CODEGEN] = time.perf_counter() - started
        if state.session is not None:
            state.session.race_above_s = request.race_above_s
        if problem.needs_opencl and state.session is None:
            raise NeedsDevice(
                f"problem {request.problem!r} needs an OpenCL device, but this worker serves "
                "the host pseudo-device (start it with --device PATTERN)"
            )
        outcome = problem.measure(prepared, state.session, Protocol.from_json(request.protocol))
        if request.cold and isinstance(outcome, Outcome):
            outcome = dataclasses.replace(outcome, protocol={**outcome.protocol, COLD_KEY: True})
        return outcome
    raise TypeError(f"unknown request {type(request).__name__}")


def _prebuild(state: _ChildState, problem: Any, prepared: Any, device: DeviceInfo) -> Any:
    """Compile on the device from this code-generation process, so the device process's own
    build is a cache hit and the device spends its time timing. Never fails the trial: the
    device process builds (and reports) anyway."""
    if state.session is None and state.session_error is None:
        from .device import open_session

        try:
            state.session = open_session(device)
        except Exception as exc:
            state.session_error = describe_exception(exc)
            log.warning(
                "code generation cannot open the device, so builds stay with the "
                "device process: %s",
                state.session_error,
            )
    if state.session is None:
        return prepared
    started = time.perf_counter()
    try:
        return problem.prebuild(prepared, state.session)
    except Exception as exc:
        log.debug("prebuild failed (the device process will build): %s", exc)
        return prepared
    finally:
        state.phases[Phase.PREBUILD] = time.perf_counter() - started


def describe_exception(exc: BaseException) -> str:
    """One line: the exception and where it was raised."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().replace("\n", " ")
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"
    return text


def describe_exit(exitcode: int | None) -> str:
    """How a child ended, for the attempt's error text."""
    if exitcode is None:
        return "vanished"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (out of memory?)" if -exitcode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with status {exitcode}"


# --- the parent side ---------------------------------------------------------------------------


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment for the block (a spawned child inherits the
    environment of the moment it starts); the previous values afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Child:
    """One supervised child process, started lazily, restarted after a kill or a death.

    At most one request is in flight; ``tag`` remembers what it is about (the trial).
    """

    def __init__(self, name: str, environment: dict[str, str] | None = None) -> None:
        self.name = name
        #: The child starts with these on top of the parent's environment.
        self.environment = environment or {}
        self.proc: Any = None
        self.conn: multiprocessing.connection.Connection | None = None
        self.deadline: float | None = None
        self.timeout_s: float = 0.0
        #: The limit a timeout names: the whole evaluation's when this request has only the
        #: rest of it (code generation ran elsewhere first), else ``timeout_s``.
        self.limit_s: float = 0.0
        #: Seconds the last request counted against its deadline (start-up included, time
        #: stood still with SIGSTOP left out), set once it ended.
        self.spent_s: float = 0.0
        self.tag: Any = None
        self.busy = False
        self.starts = 0
        #: The request in flight loads a problem, and the child said it has loaded it.
        self.loads = False
        self.loaded = False
        #: When this child was stopped with SIGSTOP (:meth:`pause`); None while it runs.
        self.paused_at: float | None = None
        #: The child has spoken since it started, so it has asked for its parent-death
        #: SIGKILL (its first act): only then may it be stopped, or a worker killed meanwhile
        #: would leave it stopped for good.
        self.armed = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def start(self) -> None:
        parent_conn, child_conn = _CONTEXT.Pipe(duplex=True)
        proc = _CONTEXT.Process(
            target=child_main, args=(child_conn, os.getpid()), name=f"tunefleet-{self.name}"
        )
        with _environment(self.environment):
            proc.start()  # spawn: a new interpreter with this process's environment now
        child_conn.close()
        self.proc, self.conn = proc, parent_conn
        self.busy, self.deadline, self.tag = False, None, None
        self.armed = False
        self.starts += 1
        log.debug("%s process started (pid %s)", self.name, proc.pid)

    def submit(
        self, request: Any, timeout_s: float, tag: Any = None, limit_s: float | None = None
    ) -> None:
        """Send ``request``, to be killed after ``timeout_s``; ``limit_s`` is the limit a
        timeout message names when ``timeout_s`` is what is left of a larger one."""
        if self.busy:
            raise RuntimeError(f"{self.name} process is busy")
        if not self.alive:
            self._discard()
            self.start()
        assert self.conn is not None
        self.conn.send(request)
        self.loads, self.loaded = isinstance(request, Prepare | Measure), False
        self.busy, self.tag, self.timeout_s = True, tag, float(timeout_s)
        self.limit_s = float(timeout_s if limit_s is None else limit_s)
        self.deadline = time.monotonic() + float(timeout_s)
        if self.paused_at is not None:
            # Sent to a stopped child: its deadline has stood still only since now.
            self.paused_at = time.monotonic()

    def waitables(self) -> list[Any]:
        if not self.busy or self.conn is None or self.proc is None:
            return []
        return [self.conn, self.proc.sentinel]

    def poll(self, now: float | None = None) -> Reply | None:
        """The reply of the request in flight if it ended (answered, died or timed out).

        A child that dies before it has loaded the request's problem (no ``started`` yet)
        ends it as ``environment``: no configuration has run."""
        if not self.busy:
            return None
        assert self.conn is not None and self.proc is not None
        now = time.monotonic() if now is None else now
        reply, gone = self._read()
        dead = gone or (reply is None and not self.proc.is_alive())
        if dead and not gone:
            # It may have spoken, then died, after the read above (a parent descheduled
            # under load): everything it sent is in the pipe now. Read it before judging
            # how it ended, or a crash after loading reads as a death while loading. Its
            # liveness is asked once: a child that dies after that is judged next poll.
            reply, gone = self._read()
        if reply is not None:
            self._ended(now)
            return reply
        loading = self.loads and not self.loaded
        if dead:
            self.proc.join(2.0)
            if self.proc.is_alive():  # closed its pipe but lingers: finish it
                self.proc.kill()
                self.proc.join(5.0)
            reason = describe_exit(self.proc.exitcode)
            self._discard()
            if loading:
                return Reply(
                    ReplyKind.ENVIRONMENT,
                    message=f"the {self.name} process {reason} loading the problem",
                )
            return Reply(ReplyKind.DIED, message=reason)
        if self.paused_at is None and self.deadline is not None and now >= self.deadline:
            # Still a timeout while loading: a fresh process's start-up counts in the trial's
            # limit, and a slow start on a loaded node is no reason to stand aside.
            self.kill()
            return Reply(ReplyKind.TIMEOUT, message=f"exceeded the {self.limit_s:g} s timeout")
        return None

    def _read(self) -> tuple[Reply | None, bool]:
        """What the child has sent so far: its reply if it answered (noting a ``started``
        on the way), and whether the pipe closed (the child is exiting)."""
        assert self.conn is not None
        try:
            while self.conn.poll(0):
                reply = self.conn.recv()
                self.armed = True
                if reply.kind == ReplyKind.STARTED:
                    self.loaded = True
                    continue
                return reply, False
        except (EOFError, OSError):
            return None, True
        return None, False

    def _ended(self, now: float) -> None:
        """The request in flight answered: note what it spent of its limit."""
        if self.deadline is not None:
            self.spent_s = max(0.0, now - (self.deadline - self.timeout_s))
        self.busy, self.deadline = False, None

    def call(self, request: Any, timeout_s: float) -> Reply:
        """Submit and wait for the reply (used for Describe and Open)."""
        self.submit(request, timeout_s)
        while True:
            remaining = max((self.deadline or 0.0) - time.monotonic(), 0.0)
            multiprocessing.connection.wait(self.waitables(), timeout=min(remaining, 1.0))
            reply = self.poll()
            if reply is not None:
                return reply

    def pause(self) -> None:
        """Stop the child with SIGSTOP (it keeps its request; its deadline waits too).
        Nothing to do for a child that is not running or not yet :attr:`armed`. The caller
        must :meth:`resume` it; should the caller die first, the child's parent-death SIGKILL
        still ends it (SIGKILL reaches a stopped process)."""
        if self.paused_at is not None or not self.armed:
            return
        if self.proc is None or not self.proc.is_alive():
            return
        try:
            os.kill(self.proc.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        self.paused_at = time.monotonic()

    def resume(self) -> None:
        """SIGCONT a paused child and move its deadline on by the time it stood still."""
        if self.paused_at is None:
            return
        stood = time.monotonic() - self.paused_at
        self.paused_at = None
        if self.deadline is not None:
            self.deadline += stood
        # A reaped child's pid may be someone else's by now: signal only a live one.
        if self.proc is not None and self.proc.is_alive():
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """Kill the child at once (a hung or abandoned evaluation); it restarts on demand."""
        self.resume()  # SIGKILL reaches a stopped process too; this clears the books
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5.0)
        self._discard()

    def close(self) -> None:
        """Stop the child: politely when idle (EOF ends its loop), else kill it."""
        if self.proc is None:
            return
        self.resume()  # a stopped child would never see the EOF
        if not self.busy and self.conn is not None:
            self.conn.close()
            self.proc.join(2.0)
        self.kill()

    def _discard(self) -> None:
        self.resume()
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
        self.proc, self.conn = None, None
        self.busy, self.deadline, self.tag = False, None, None
        self.loads = self.loaded = False
