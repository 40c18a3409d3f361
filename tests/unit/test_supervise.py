"""Supervised children: answers, invalid points, crashes, hangs, restarts (real processes)."""

from __future__ import annotations

import multiprocessing.connection
from pathlib import Path

import pytest

from tunefleet.devices import HOST_DEVICE
from tunefleet.problems.base import Outcome, Protocol
from tunefleet.problems.synthetic import OPTIMUM, OPTIMUM_SECONDS
from tunefleet.worker.supervise import Child, Describe, Measure, Open, Prepare, describe_exit

PROTO = Protocol(min_launches=2).to_json()


def measure(args, config=OPTIMUM, **kw):
    return Measure("synthetic", args, dict(config), HOST_DEVICE, PROTO, inline_prepare=True, **kw)


def wait_reply(child, timeout=30.0):
    while True:
        multiprocessing.connection.wait(child.waitables(), timeout=0.2)
        reply = child.poll()
        if reply is not None:
            return reply
        timeout -= 0.2
        assert timeout > 0, "no reply"


def test_device_child_measures_then_survives_invalid_crash_and_hang():
    child = Child("device")
    try:
        assert child.call(Open(HOST_DEVICE), 30).kind == "ok"
        ok = child.call(measure({"duration": 0}), 30)
        assert ok.kind == "ok" and isinstance(ok.value, Outcome)
        assert ok.value.median_s == pytest.approx(OPTIMUM_SECONDS)

        bad = child.call(measure({"invalid_rate": 1.0}), 30)
        assert bad.kind == "invalid" and "invalid by construction" in bad.message
        assert child.starts == 1  # an invalid point does not cost the process

        crash = child.call(measure({"fail_rate": 1.0, "duration": 0}), 30)
        assert crash.kind == "died" and "SIGSEGV" in crash.message
        assert not child.alive

        child.submit(measure({"hang_rate": 1.0, "duration": 0}), timeout_s=0.5)
        pid = child.proc.pid
        hung = wait_reply(child)
        assert hung.kind == "timeout" and "0.5 s" in hung.message
        assert child.proc is None and pid  # killed, not leaked

        again = child.call(measure({"duration": 0}), 30)  # restarted on demand
        assert again.kind == "ok" and child.starts == 3
    finally:
        child.close()
    assert child.proc is None


def test_prepare_in_one_child_measure_in_another_and_errors_are_one_line():
    codegen, device = Child("codegen"), Child("device")
    try:
        args = {"duration": 0, "prepare_duration": 0}
        prepared = codegen.call(Prepare("synthetic", args, dict(OPTIMUM), HOST_DEVICE), 30)
        assert prepared.kind == "ok" and prepared.value["fault"] == "none"
        out = device.call(
            Measure("synthetic", args, dict(OPTIMUM), HOST_DEVICE, PROTO, prepared.value), 30
        )
        assert out.kind == "ok" and out.value.state == "done"

        broken = codegen.call(Prepare("synthetic", args, {"tile": 16}, HOST_DEVICE), 30)
        assert broken.kind == "invalid" and "missing" in broken.message
        unknown = codegen.call(Prepare("no_such_problem", args, {}, HOST_DEVICE), 30)
        assert unknown.kind == "environment" and "unknown problem" in unknown.message
        assert "\n" not in unknown.message
        raised = codegen.call(
            Prepare("synthetic", {"no_such_arg": 1}, dict(OPTIMUM), HOST_DEVICE), 30
        )
        assert raised.kind == "environment" and "unknown argument" in raised.message

        host = device.call(Describe("host"), 30)
        assert host.kind == "ok" and host.value == HOST_DEVICE
    finally:
        codegen.close()
        device.close()


def test_exit_descriptions():
    assert describe_exit(-11) == "killed by SIGSEGV"
    assert "out of memory" in describe_exit(-9)
    assert describe_exit(3) == "exited with status 3"


def test_a_child_that_dies_loading_the_problem_is_an_environment_fault(monkeypatch):
    """Before the child says it has loaded the problem no configuration has run: its death
    is the environment's; after that, the configuration's."""
    problem = ENVIRONMENT_PROBLEM
    child = Child("device")
    try:
        monkeypatch.setenv("TUNEFLEET_TEST_BROKEN", "die")
        died = child.call(
            Measure(problem, {}, {"x": 1}, HOST_DEVICE, PROTO, inline_prepare=True), 60
        )
        assert died.kind == "environment", died
        assert died.message == "the device process killed by SIGSEGV loading the problem"
        monkeypatch.delenv("TUNEFLEET_TEST_BROKEN")
        crash = child.call(measure({"fail_rate": 1.0, "duration": 0}), 60)
        assert crash.kind == "died" and "SIGSEGV" in crash.message
    finally:
        child.close()


class _ReadBeforeItSpoke:
    """The parent's end of a child's pipe whose first ``poll`` finds nothing, as when the
    parent read the pipe a moment before its child spoke (a parent descheduled under load);
    everything after that is the real pipe."""

    def __init__(self, conn):
        self.conn, self.first = conn, True

    def poll(self, timeout=0.0):
        if self.first:
            self.first = False
            return False
        return self.conn.poll(timeout)

    def __getattr__(self, name):
        return getattr(self.conn, name)


def test_a_crash_right_after_loading_is_the_configurations_even_if_read_late():
    """The child loads the problem, says so and crashes in the configuration, all between
    the parent's read of the pipe and its look at whether the child lives: still the
    configuration's crash, never an environment fault (which makes a worker stand aside
    from the run; under load a drain worker then exited 1)."""
    child = Child("device")
    try:
        assert child.call(Open(HOST_DEVICE), 30).kind == "ok"
        child.submit(measure({"fail_rate": 1.0, "duration": 0}), timeout_s=60)
        child.proc.join(30)  # loaded, said so and died: all before the parent looks
        assert child.proc.exitcode is not None and child.proc.exitcode < 0
        child.conn = _ReadBeforeItSpoke(child.conn)
        crash = child.poll()
        assert crash is not None and crash.kind == "died", crash
        assert crash.message == "killed by SIGSEGV"
    finally:
        child.close()


ENVIRONMENT_PROBLEM = str(
    Path(__file__).resolve().parents[1] / "acceptance" / "environment_problem.py"
)


@pytest.mark.parametrize(
    ("mode", "where", "kind", "fragments"),
    [
        # The problem file does not import on this node.
        (
            "import",
            "codegen",
            "environment",
            ("loading the problem failed: ", "tunefleet_test_module_missing_on_this_node"),
        ),
        # prepare raises a missing-module error (feinsum's case): known as the environment's.
        (
            "needs_module",
            "device",
            "environment",
            ("ModuleNotFoundError", "No module named 'libfoo'"),
        ),
        # The same unexplained error for every configuration: the fault policy decides.
        ("same_error", "codegen", "error", ("RuntimeError: libfoo.so.1: cannot open shared",)),
    ],
)
def test_a_broken_node_answers_environment_or_error(monkeypatch, mode, where, kind, fragments):
    """What the children of a broken node answer (tests/acceptance/environment_problem.py);
    tests/unit/test_worker_judge.py takes it from there."""
    monkeypatch.setenv("TUNEFLEET_TEST_BROKEN", mode)
    child = Child(where)
    try:
        if where == "codegen":
            request: Prepare | Measure = Prepare(ENVIRONMENT_PROBLEM, {}, {"x": 1}, HOST_DEVICE)
        else:
            request = Measure(
                ENVIRONMENT_PROBLEM, {}, {"x": 1}, HOST_DEVICE, PROTO, inline_prepare=True
            )
        reply = child.call(request, 60)
    finally:
        child.close()
    assert reply.kind == kind, reply
    assert all(f in reply.message for f in fragments), reply.message
    assert reply.message.startswith(fragments[0]), reply.message
