"""Front-door failure modes: each is one line on stderr that names the fix, non-zero exit."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tunefleet.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tunefleet: error:")
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("command", [["runs"], ["status"], ["best", "1"], ["export", "1"]])
def test_unreachable_database(capsys, command):
    # port 1 on localhost: nothing listens there
    code, out, err = run_cli(capsys, *command, "--db", "postgresql://nobody@127.0.0.1:1/none")
    assert_one_line_error(code, err, "cannot connect to the database at 127.0.0.1:1/none", "--db")
    assert out == ""


def test_database_without_the_schema_names_the_upgrade_command(capsys, empty_db_url):
    code, _, err = run_cli(capsys, "runs", "--db", empty_db_url)
    assert_one_line_error(code, err, "no tunefleet schema", "tunefleet db upgrade")


def test_a_url_that_is_not_postgresql(capsys):
    code, _, err = run_cli(capsys, "runs", "--db", "mysql://x@y/z")
    assert_one_line_error(code, err, "is not a PostgreSQL URL")
    assert code == 2


HOST_PROBLEM = textwrap.dedent(
    """
    from tunefleet.errors import InvalidConfiguration, ProblemError
    from tunefleet.problems.base import Outcome, Problem
    from tunefleet.space import IntRange, Space


    class Parabola(Problem):
        name = "parabola"
        description = "f(x) = (x - n)^2 + 1, evaluated on the host"
        needs_opencl = False

        def normalise_args(self, raw):
            args = {"n": 8, "dtype": "float32", **raw}
            if args["dtype"] not in ("float32", "float64"):
                raise ProblemError(
                    f"dtype {args['dtype']!r} is not supported; use float32 or float64"
                )
            return args

        def space(self, args):
            return Space.of([IntRange("x", 0, 16)])

        def prepare(self, args, config, device):
            if config["x"] == 13:
                raise InvalidConfiguration("x = 13 is unlucky")
            return (args["n"], config["x"])

        def measure(self, prepared, session, protocol):
            n, x = prepared
            t = ((x - n) ** 2 + 1) * 1e-3
            return Outcome(state="done", median_s=t, min_s=t, samples_s=(t,), gflops=1e-3 / t,
                           code=f"// x = {x}")
    """
)


@pytest.fixture
def problem_file(tmp_path: Path) -> str:
    path = tmp_path / "parabola.py"
    path.write_text(HOST_PROBLEM)
    return str(path)


def test_measure_reproduces_one_configuration_without_a_database(capsys, problem_file):
    code, out, _ = run_cli(
        capsys, "measure", problem_file, "--size", "n=5", "--config", '{"x": 7}', "--code"
    )
    assert code == 0
    assert "on host-cpu" in out
    assert "0.20 GFLOP/s" in out  # 1e-3 / ((7-5)^2+1)e-3 s = 0.2 GFLOP/s
    assert "// x = 7" in out


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["measure", "no-such-problem"], ["unknown problem 'no-such-problem'", "built-ins are"]),
        (["measure", "{file}", "--dtype", "int7"], ["dtype 'int7' is not supported"]),
        (["measure", "{file}", "--size", "n=0"], ["--size n='0' is not a positive integer"]),
        (["measure", "{file}", "--config", '{"x": 99}'], ["x=99 is outside the space"]),
        (["measure", "{file}", "--config", "{x"], ["--config is not valid JSON"]),
        (["measure", "{file}", "--config", '{"x": 13}'], ["invalid: x = 13 is unlucky"]),
        (["measure", "missing/problem.py"], ["does not exist; check the path"]),
    ],
)
def test_bad_problem_arguments_are_one_line_errors(capsys, problem_file, argv, needles):
    code, _, err = run_cli(capsys, *[a.replace("{file}", problem_file) for a in argv])
    assert_one_line_error(code, err, *needles)


def test_device_pattern_that_matches_nothing(capsys, problem_file):
    pytest.importorskip("pyopencl")
    code, _, err = run_cli(capsys, "measure", problem_file, "--device", "no-such-gpu-anywhere")
    # the host problem needs no OpenCL, but an explicit pattern is honoured
    assert_one_line_error(code, err, "no OpenCL device matches --device 'no-such-gpu-anywhere'")


@pytest.mark.opencl
def test_devices_lists_the_pocl_cpu_device(capsys):
    pytest.importorskip("pyopencl")
    code, out, _ = run_cli(capsys, "devices", "--json")
    import json

    devices = json.loads(out)
    assert code == 0 and devices, "no OpenCL device: is PoCL installed?"
    assert any("cpu" in d["extra"]["type"] for d in devices)
    code, out, _ = run_cli(capsys, "devices")
    assert out.splitlines()[0].split()[:3] == ["#", "NAME", "TYPE"]
    assert devices[0]["device_class"] in out
    # Its limits, which the coordinator rules configurations out by, as the JSON gives them.
    first = out.splitlines()[1]
    assert f"{devices[0]['local_mem_bytes'] // 1024} KiB" in first
    assert f" {devices[0]['max_work_group_size']} " in first


def test_no_opencl_device_is_a_one_line_error(capsys, monkeypatch):
    # A machine without any OpenCL platform: discovery finds nothing.
    from tunefleet.worker import device as worker_device

    monkeypatch.setattr(worker_device, "list_devices", lambda: [])
    code, _, err = run_cli(capsys, "devices")
    assert_one_line_error(code, err, "no OpenCL device found", "tunefleet[pocl]")


def test_problems_lists_every_builtin(capsys):
    from tunefleet.problems.registry import builtin_names

    code, out, _ = run_cli(capsys, "problems", "--json")
    import json

    rows = json.loads(out)
    assert code == 0
    assert [r["name"] for r in rows] == builtin_names()
    # every built-in loads and describes its space (a broken one would carry "error")
    assert [r["name"] for r in rows if "error" in r] == []
    described = [r for r in rows if not r.get("space_error")]
    assert all(r["space_size"] >= 1 and r["parameters"] for r in described)
    # Only the feinsum problem may lack a space: its default space ships with feinsum, which
    # a machine may not have; the row says how to get it.
    unknown = {r["name"]: r["space_error"] for r in rows if r.get("space_error")}
    assert set(unknown) <= {"feinsum"}
    assert all("install tunefleet[feinsum]" in e for e in unknown.values())


def test_read_commands_use_the_embedded_database_by_default(cli_env):
    def tf(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tunefleet", *argv], env=cli_env, capture_output=True, text=True, timeout=120
        )

    try:
        proc = tf("runs")
        assert proc.returncode == 0, proc.stderr
        assert "no runs yet" in proc.stdout
        proc = tf("best", "3")
        assert_one_line_error(proc.returncode, proc.stderr, "run 3 does not exist")
        assert Path(cli_env["TUNEFLEET_HOME"], "postgres", "data", "PG_VERSION").exists()
    finally:
        tf("db", "stop")
