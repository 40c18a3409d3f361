"""Each benchmark script runs end to end with tiny parameters against a real database and
writes a JSON file with the numbers its table shows. No timing is asserted: speed belongs to
the scripts' own output, not to the test suite.

They are marked ``benchmark`` and left out of the default run (``pytest -m benchmark`` runs
them; CI does, after the suite): each starts the script's own processes and servers, a
sixth of the suite's time for what guards the scripts rather than the product."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers.launch import process_alive

pytestmark = [pytest.mark.acceptance, pytest.mark.benchmark]

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(
    name: str, *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``benchmarks/NAME ARGS`` as a user runs it, this checkout importable (``env``: more of
    the environment); it must exit 0."""
    environ = {**os.environ, **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def run_script(name: str, db_url: str, out: Path, *args: str, timeout: float = 240) -> Any:
    proc = run_benchmark(name, "--db", db_url, "--out", str(out), *args, timeout=timeout)
    assert f"wrote {out}" in proc.stdout
    assert "|" in proc.stdout  # the table
    return json.loads(out.read_text())


def run_self_sizing(tmp_path: Path, *args: str, timeout: float) -> Any:
    """``benchmarks/self_sizing.py --suite cpu ARGS`` in its own processes; its JSON."""
    out = tmp_path / "sizing.json"
    run_benchmark("self_sizing.py", "--suite", "cpu", *args, "--out", str(out), timeout=timeout)
    return json.loads(out.read_text())


def test_fleet_scaling_smoke(db_url: str, tmp_path: Path) -> None:
    data = run_script(
        "fleet_scaling.py",
        db_url,
        tmp_path / "fleet.json",
        "--workers", "1,2", "--durations", "0.05", "--ideal-seconds", "0.3",
        "--prepare-workers", "0",
    )  # fmt: skip
    assert [f["workers"] for f in data["fleets"]] == [1, 2]
    for fleet in data["fleets"]:
        (batch,) = fleet["batches"]
        assert batch["trials"] == 6 * fleet["workers"]
        assert batch["done"] == batch["trials"] and batch["not_done"] == 0
        assert 0 < batch["efficiency"] <= 1.5
        # Every trial's overhead came from the worker logs: a claim and a completion each.
        assert batch["overhead_ms"]["n"] == batch["trials"]
        assert batch["statements_ms"]["complete_trial"]["n"] == batch["trials"]
        assert fleet["memory_mib"]["pss_per_worker"] > 0


def test_raw_queue_smoke(db_url: str, tmp_path: Path) -> None:
    data = run_script(
        "raw_queue.py",
        db_url,
        tmp_path / "raw.json",
        "--clients", "1,2", "--batch", "1,3", "--seconds", "0.3", "--repeat", "1",
    )  # fmt: skip
    cells = {(c["batch"], c["clients"]): c for c in data["cells"]}
    assert set(cells) == {(1, 1), (1, 2), (3, 1), (3, 2)}
    for cell in cells.values():
        for mode in ("tunefleet", "raw", "direct"):
            assert cell[mode]["rate"] > 0
            assert cell[mode]["runs"][0]["empty_claims"] == 0
        assert cell["ratio"] == pytest.approx(cell["tunefleet"]["rate"] / cell["raw"]["rate"])
        assert cell["functions_vs_direct"] == pytest.approx(
            cell["raw"]["rate"] / cell["direct"]["rate"]
        )


def test_worker_memory_smoke(db_url: str, tmp_path: Path) -> None:
    data = run_script(
        "worker_memory.py", db_url, tmp_path / "mem.json", "--trials", "20", "--every", "10"
    )
    assert [s["trials"] >= t for s, t in zip(data["samples"], (10, 20), strict=True)] == [
        True,
        True,
    ]
    roles = {p["role"] for p in data["samples"][-1]["processes"]}
    assert {"worker", "device process"} <= roles
    assert data["verdict"] in ("flat", "grows")


def test_coordinator_rate_smoke(db_url: str, tmp_path: Path) -> None:
    data = run_script(
        "coordinator_rate.py",
        db_url,
        tmp_path / "coord.json",
        "--clients", "2", "--trials", "30", "--tuner-batches", "4",
        "--latency-trials", "8", "--latency-clients", "1", "--latency-delay", "0.02",
    )  # fmt: skip
    (alone,) = data["tuner_alone"]
    assert alone["suggestions"] == 30 and alone["suggestions_per_s"] > 0
    (rate,) = data["rate"]
    assert rate["evaluations"] >= 30 and rate["stop_reason"]
    assert rate["ask"]["suggestions"] >= 30
    latency = data["latency"]
    assert latency["evaluations"] >= 8
    # Every completion but the last few is followed by a newly enqueued trial.
    assert latency["latency_ms"]["n"] >= 4
    assert latency["latency_ms"]["median"] >= 0


@pytest.mark.opencl
def test_gpu_tuning_runs_its_gemm_part_on_any_opencl_device(tmp_path: Path) -> None:
    """The GPU script end to end on whatever OpenCL device there is (PoCL here), tiny GEMM:
    a tuning run on its own embedded server, the best configuration timed again, the part's
    JSON written. Without PyTorch the cuBLAS comparison records why it is missing. The run
    ends after 2 evaluations, not after a wall budget: a loaded machine once measured nothing
    in the 12 s this test used to give it."""
    run_benchmark(
        "gpu_tuning.py",
        "--parts",
        "gemm",
        "--budget",
        "240",
        "--max-trials",
        "2",
        "--device-type",
        "any",
        "--gemm-args",
        "n=32,m=32,k=32",
        timeout=300,
        env={"OUT": str(tmp_path)},
    )
    data = json.loads((tmp_path / "gpu_gemm.json").read_text())
    tuning = data["tuning"]
    assert tuning["stop_reason"] == "max_trials" and tuning["workers"] == 1
    assert tuning["evaluations"] == 2 and tuning["states"].get("done", 0) >= 1
    assert data["best_retimed"]["state"] == "done" and data["best_retimed"]["gflops"] > 0
    cublas = data["cublas"]
    assert ("cublas_gflops" in cublas) != ("error" in cublas)
    if "error" in cublas:
        assert data["ratio_to_cublas"] is None


def test_eval_rate_reports_each_arms_timeline_and_a_second_tree(tmp_path: Path) -> None:
    """The evaluation-rate script's README case on PoCL, three trials: a real ``tunefleet
    tune`` with a fresh home, its rate, its devices' timing share and every attempt's
    timeline; ``--tree`` runs another install (here this checkout again) beside it."""
    out = tmp_path / "rate.json"
    proc = run_benchmark(
        "eval_rate.py",
        "--cases",
        "readme",
        "--quick",
        "--tree",
        f"again={ROOT / 'src'}",
        "--out",
        str(out),
        timeout=600,
    )
    data = json.loads(out.read_text())
    assert [a["tree"] for a in data["arms"]] == ["again", "current"]
    for arm in data["arms"]:
        assert arm["exit"] == 0 and arm["evaluations"] >= 1, arm
        assert 0 < arm["timing_share"] <= 1 and arm["median_s"]["timing"] > 0
        assert all(sum(a["timeline"].values()) > 0 for a in arm["attempts"])
    assert "| readme |" in proc.stdout


def test_readme_agreement_quick_checks_the_criterion_and_studies_the_estimators(
    tmp_path: Path,
) -> None:
    """The README-agreement script's smoke run on PoCL (one fresh run, a 64-cube GEMM, three
    trials, each of the top two alone in one fresh process): it reports issue 51's three
    verdicts per run, the confirmation's cost, and the estimator study over every process's
    samples."""
    out = tmp_path / "agreement.json"
    proc = run_benchmark("readme_agreement.py", "--quick", "--out", str(out), timeout=600)
    data = json.loads(out.read_text())
    [run] = data["runs"]
    assert run["final_line"] and run["final_line"].startswith("run 1: best trial")
    assert isinstance(run["headline_ok"], bool) and isinstance(run["top_ok"], bool)
    assert 1 <= len(run["top"]) <= 2
    for row in run["top"]:
        assert len(row["alone_samples"]) == 1 and row["alone_median_s"] > 0
        assert row["in_run_samples"] and row["in_run_samples"][0]["round"] == 0
    assert {"confirmations", "shootout", "shootout_s", "phase_s"} <= set(run["cost"])
    printed = run["process_range_s"] is not None or run["launch_range_s"] is not None
    assert (run["landing_range_s"] is not None) == printed
    assert [e["estimator"] for e in data["estimators"]] == ["median", "q10", "min"]
    assert "issue 51's criterion" in proc.stdout and "| quiet |" in proc.stdout


def test_self_sizing_runs_both_arms_through_tune(tmp_path: Path) -> None:
    """The self-sizing script's code-generation-bound synthetic case, four trials: both arms
    are real ``tunefleet tune`` runs on their own embedded servers, and the second one's
    sizing flags reached its worker (its row says ``flags``)."""
    data = run_self_sizing(
        tmp_path, "--cases", "synthetic-codegen", "--max-trials", "4", timeout=400
    )
    [case] = data["cases"]
    assert case["case"] == "synthetic-codegen" and case["other"] == "today"
    for arm in ("defaults", "today"):
        assert case[arm]["exit"] == 0 and case[arm]["evaluations"] >= 1, case[arm]
        [worker] = case[arm]["workers"]
        assert worker["sizing"] == ("auto" if arm == "defaults" else "flags"), worker
    assert case["today"]["workers"][0]["prepare_workers"] == 1
    assert case["rate_ratio"] > 0
    assert data["machine"]["load_average"] is not None


def test_self_sizing_same_configs_measures_the_search_configurations_with_both_sizings(
    tmp_path: Path,
) -> None:
    """``--same-configs``: the defaults arm searches, then both sizings measure exactly the
    configurations it measured (seed configurations), and the ratio is theirs."""
    data = run_self_sizing(
        tmp_path, "--cases", "synthetic-codegen", "--max-trials", "3", "--same-configs",
        timeout=600,
    )  # fmt: skip
    [case] = data["cases"]
    assert data["same_configs"] is True and case["other"] == "today (same configs)"
    searched = case["search"]["configs"]
    assert len(searched) == case["search_configs"] >= 3
    for arm in ("defaults", "today (same configs)"):
        assert case[arm]["exit"] == 0, case[arm]
        assert case[arm]["evaluations"] == len(searched), case[arm]
        assert sorted(map(json.dumps, case[arm]["configs"])) == sorted(map(json.dumps, searched))
    assert case["today (same configs)"]["workers"][0]["sizing"] == "flags"
    assert case["defaults"]["workers"][0]["sizing"] == "auto"
    assert case["rate_ratio"] > 0


def test_dashboard_api_smoke(db_url: str, tmp_path: Path) -> None:
    data = run_script(
        "dashboard_api.py", db_url, tmp_path / "dashboard.json",
        "--trials", "300", "--workers", "3", "--repeats", "2",
    )  # fmt: skip
    assert data["trials"] == 300
    calls = {c["call"]: c for c in data["calls"]}
    assert len(calls) == 11 and all(c["n"] == 2 and c["bytes"] > 0 for c in calls.values())
    # The big run's charts came back shaped: histogram bins, one timeline row per worker.
    assert calls["speed charts and failures"]["bytes"] > 1000
    assert calls["worker timeline"]["bytes"] > 1000


def test_fleet_sim_smoke(db_url: str, tmp_path: Path) -> None:
    from tests.helpers.pgbouncer import find_pgbouncer

    pooled = find_pgbouncer() is not None
    cells = ["3:0.2:one", "3:0.2:two-listen", "6:0.2:one"]
    cells += ["6:0.2:pooled", "6:0.2:pooled-lease90"] if pooled else []
    data = run_script(
        "fleet_sim.py",
        db_url,
        tmp_path / "sim.json",
        "--cells", ",".join(cells), "--window", "1", "--warmup", "0.5", "--pool-size", "2",
        "--procs", "2", "--ab-workers", "2", "--ab-duration", "0.05", "--ab-ideal", "0.3",
        "--all-cells",  # a loaded machine must not make it skip a cell
    )  # fmt: skip
    got = [(c["workers"], c["shape"], c["sessions_per_worker"]) for c in data["cells"]]
    expected = [(3, "one", 1), (3, "two-listen", 2), (6, "one", 1)]
    assert got == expected + ([(6, "pooled", 1), (6, "pooled-lease90", 1)] if pooled else [])
    # The virtual workers follow the worker's own rule for each shape's lease.
    assert data["worker_model"]["cadence_by_shape"]["pooled-lease90"] == {
        "lease_s": 90.0, "heartbeat_s": 20.0, "reap_s": 45.0, "report_s": 30.0,
    }  # fmt: skip
    for c in data["cells"]:
        assert c["trials"] > 0 and c["trials_per_s"] > 0
        assert 0 < c["efficiency"] <= 1.05
        assert c["claim_ms"]["n"] > 0 and c["complete_ms"]["n"] > 0
        assert c["server_cpu_cores"] > 0
        assert c["activity"]["samples"] > 0 and c["host_lag_ms"]["n"] > 0
        if c["pooled"]:
            # The fleet's server sessions are the pooler's, never more than its pool.
            assert 1 <= c["sessions"]["workers"] <= 2
            assert c["activity"]["pooler"]["samples"] > 0
        else:
            # Every virtual worker's sessions were open while the window was measured.
            assert c["sessions"]["workers"] == c["workers"] * c["sessions_per_worker"]
            assert c["server_memory"]["processes"] > c["sessions"]["workers"]
    # The worker polls: nothing LISTENs, so a NOTIFY wakes nobody; the old shape listens.
    assert data["cells"][0]["notifications_delivered"] == 0
    ab = data["ab"]
    assert ab["real"]["done"] == ab["real"]["trials"] == 2 * 6
    assert ab["simulated"]["done"] == ab["simulated"]["trials"] == 2 * 6
    assert ab["real"]["efficiency"] > 0 and ab["simulated"]["efficiency"] > 0
    with psycopg.connect(db_url, autocommit=True) as conn:
        states = dict(conn.execute("SELECT state, count(*) FROM tunefleet.trial GROUP BY 1"))
        workers = dict(conn.execute("SELECT state, count(*) FROM tunefleet.worker GROUP BY 1"))
        leases = conn.execute("SELECT count(*) FROM tunefleet.device_lease").fetchone()
        measured = conn.execute(
            "SELECT count(*) FROM tunefleet.measurement m JOIN tunefleet.worker w"
            " ON w.id = m.worker_id JOIN tunefleet.device d ON d.id = w.device_id"
            " WHERE d.platform = 'simulated'"
        ).fetchone()
    # Every claim ended: measured, or released at a cell's end and cancelled with its run.
    assert set(states) <= {"done", "cancelled"}, states
    # The virtual workers and the real ones all said goodbye, and gave their devices back.
    assert workers == {"stopped": 6 + 2}, workers
    assert leases is not None and leases[0] == 0
    assert measured is not None and measured[0] >= sum(c["trials"] for c in data["cells"])


def _postmasters(folder: Path) -> dict[Path, int]:
    """The embedded servers whose data directories lie under ``folder``: their pid files."""
    found = {}
    for pid_file in folder.rglob("postmaster.pid"):
        try:
            found[pid_file] = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # being written, or just removed
    return found


@pytest.mark.parametrize(
    "argv",
    [
        ["raw_queue.py", "--clients", "1", "--batch", "1", "--seconds", "60", "--repeat", "1"],
        ["self_sizing.py", "--suite", "cpu", "--quick", "--max-trials", "200"],
    ],
    ids=["own embedded server", "tune's embedded server"],
)
def test_sigterm_stops_the_embedded_server_a_script_started(
    tmp_path: Path, request: pytest.FixtureRequest, argv: list[str]
) -> None:
    """``kill`` (or a batch system's time limit) while a script holds an embedded server: the
    server stops and its temporary folder goes, instead of running on as a daemon."""
    # A short TMPDIR of its own: the servers' Unix sockets go under it, and a socket path is
    # limited to ~107 bytes (a parallel session's tmp_path is too deep for one).
    scratch = Path(tempfile.mkdtemp(prefix="tf-sigterm-"))
    request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    env = dict(os.environ, TMPDIR=str(scratch))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    out = tmp_path / "out.json"
    script = [sys.executable, str(ROOT / "benchmarks" / argv[0]), *argv[1:], "--out", str(out)]
    proc = subprocess.Popen(
        script, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        servers: dict[Path, int] = {}
        # Up and migrated: the script's own run has begun (a trial row exists).
        while time.monotonic() < deadline and proc.poll() is None:
            servers = _postmasters(scratch)
            if servers and _has_a_trial(scratch):
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert servers, "no embedded server started under TMPDIR within 180 s"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    try:
        assert proc.returncode != 0, output  # stopped, not finished
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(process_alive(pid) for pid in servers.values()):
            time.sleep(0.2)
        assert not [pid for pid in servers.values() if process_alive(pid)], output
        assert not list(scratch.iterdir()), (sorted(scratch.rglob("*"))[:10], output)
    finally:
        for pid in servers.values():  # a failed run must not leave its daemon behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)


def _has_a_trial(scratch: Path) -> bool:
    """Some embedded server under ``scratch`` holds a trial: its script is past start-up."""
    from tunefleet.db.embedded import EmbeddedServer
    from tunefleet.errors import TunefleetError

    for pid_file in scratch.rglob("postmaster.pid"):
        try:
            url = EmbeddedServer(pid_file.parent).local_url()
            with psycopg.connect(url, connect_timeout=5) as conn:
                if conn.execute("SELECT to_regclass('tunefleet.trial')").fetchone() == (None,):
                    continue
                if conn.execute("SELECT EXISTS (SELECT FROM tunefleet.trial)").fetchone() == (
                    True,
                ):
                    return True
        except (OSError, psycopg.Error, TunefleetError):
            continue
    return False


def test_budget_overrun_smoke(db_url: str, tmp_path: Path) -> None:
    """One short budget through ``tunefleet tune``: the script times it and reads the run."""
    data = run_script(
        "budget_overrun.py", db_url, tmp_path / "budget.json",
        "--budgets", "8", "--prepare-duration", "0.5", "--duration", "0.5",
    )  # fmt: skip
    [case] = data["cases"]
    assert case["exit"] == 0, case
    assert case["wall_s"] > 0 and "overrun" in case and case["search_done"] >= 1
    assert data["machine"]["load_average"] is not None


def test_cpu_isolation_times_each_configuration_under_each_condition(tmp_path: Path) -> None:
    """benchmarks/cpu_isolation.py on PoCL, tiny: two configurations of a small GEMM, alone
    and beside paused code generation; every condition has a ratio per configuration."""
    out = tmp_path / "iso.json"
    run_benchmark(
        "cpu_isolation.py",
        "--configs",
        "2",
        "--size",
        "m=64,n=64,k=64",
        "--conditions",
        "alone,paused",
        "--procs",
        "1",
        "--out",
        str(out),
        timeout=600,
    )
    data = json.loads(out.read_text())
    assert [r["condition"] for r in data["rows"]] == ["alone", "paused"]
    assert all(len(r["ratios"]) == len(data["configs"]) == 2 for r in data["rows"])
    assert data["rows"][0]["median_ratio"] == 1.0


def test_reproduce_runs_tune_then_each_top_configuration_alone(tmp_path: Path) -> None:
    """benchmarks/reproduce.py on the synthetic problem: one run as a user starts it, its two
    best configurations by their reproduce command in two fresh processes each; in-run
    against alone per configuration."""
    out = tmp_path / "reproduce.json"
    proc = run_benchmark(
        "reproduce.py",
        "--runs",
        "1",
        "--top",
        "2",
        "--alone",
        "2",
        "--export",
        "--out",
        str(out),
        "--",
        "synthetic",
        "--arg",
        "duration=0.01",
        "--max-trials",
        "6",
        timeout=300,
    )
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert run["exit"] == 0 and len(run["trials"]) >= 6
    assert [t["rank"] for t in run["top"]] == [1, 2]
    for t in run["top"]:
        assert len(t["alone"]) == 2 and all(a["state"] == "done" for a in t["alone"])
        # The synthetic problem measures its analytic time: alone equals in-run exactly.
        assert t["alone_over_in_run"] == 1.0
    assert "alone/in-run" in proc.stdout
    # The run's status as users see it: its rate and its devices' timing share.
    assert "evaluations/min" in run["status"] and "% timing of" in run["status"], run["status"]


def test_codegen_variants_times_one_configuration_under_several_seeds(tmp_path: Path) -> None:
    """benchmarks/codegen_variants.py on PoCL, a small GEMM under two hash seeds: each seed's
    process generates and times its kernel; the table counts the distinct sources: one."""
    out = tmp_path / "variants.json"
    run_benchmark(
        "codegen_variants.py",
        "--args",
        '{"m": 64, "n": 64, "k": 64}',
        "--seeds",
        "0",
        "3",
        "--out",
        str(out),
        timeout=300,
    )
    (entry,) = json.loads(out.read_text())["configs"]
    assert [v["seed"] for v in entry["variants"]] == ["0", "3"]
    assert all(v["state"] == "done" and len(v["sha256"]) == 64 for v in entry["variants"])
    assert entry["distinct_sources"] == 1  # seeds 0 and 3 nested GEMM's register tile apart


def test_gemm_variants_times_each_transformation_alone_against_the_default(tmp_path: Path) -> None:
    """benchmarks/gemm_variants.py --quick on PoCL: the default and three variants (a's tile
    unpadded, the previous default, the best H100 configuration with a's tile padded), each
    in a fresh process; each is done, with one source of its own, and a ratio to the default.
    With --problem face_mass: its default against its previous default's nest."""
    out = tmp_path / "gemm_variants.json"
    proc = run_benchmark("gemm_variants.py", "--quick", "--out", str(out), timeout=600)
    assert f"wrote {out}" in proc.stdout and "time/default" in proc.stdout
    data = json.loads(out.read_text())
    entries = {e["name"]: e for e in data["variants"]}
    assert list(entries) == ["default", "unpadded", "previous default", "best"]
    assert entries["default"]["changes"] == {} and entries["default"]["over_default"] == 1.0
    assert entries["unpadded"]["changes"] == {"pad_a": 0}
    assert entries["previous default"]["changes"] == {
        "wg_i": 8, "wg_j": 32, "nest": "reg_i,reg_j,vec_i,vec_j"
    }  # fmt: skip
    for entry in entries.values():
        assert [r["state"] for r in entry["runs"]] == ["done"], entry["runs"]
        assert len(entry["sources"]) == 1 and entry["over_default"] > 0
    assert len({e["sources"][0] for e in entries.values()}) == 4

    out = tmp_path / "face_mass_variants.json"
    run_benchmark(
        "gemm_variants.py", "--quick", "--problem", "face_mass", "--out", str(out), timeout=600
    )
    data = json.loads(out.read_text())
    assert data["problem"] == "face_mass" and data["problem_args"]["n_elements"] == 512
    entries = {e["name"]: e for e in data["variants"]}
    assert entries["previous default"]["changes"] == {"nest": "i,k,e"}
    assert entries["default"]["config"]["nest"] == "k,e,i"
    for entry in entries.values():
        assert [r["state"] for r in entry["runs"]] == ["done"], entry["runs"]
    assert entries["default"]["sources"] != entries["previous default"]["sources"]
