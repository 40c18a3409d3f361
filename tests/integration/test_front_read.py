"""The read-side commands (status, runs, best, show, export, plot) against a filled database.

Commands run in-process through ``tunefleet.cli.main`` with ``--db`` pointing at a fresh
test database that ``runfill.fill`` filled the way a fleet would.
"""

from __future__ import annotations

import csv
import io
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.runfill import ARGS, CODE, Filled, fill, module_database
from tunefleet.cli import build_parser, main
from tunefleet.options.args import raw_problem_args
from tunefleet.queries import report


@pytest.fixture
def filled(db: Any) -> Filled:
    """A filled database of its own, for tests that change rows."""
    return fill(db)


@pytest.fixture(scope="module")
def ro_url(pg_admin_url: str, pg_template: str) -> Iterator[str]:
    """One filled database shared by the tests that only read (filling is the slow part)."""
    with module_database(pg_admin_url, pg_template, "front_read") as url:
        yield url


@pytest.fixture(scope="module")
def ro(ro_url: str) -> Filled:
    with _conn(ro_url) as conn:
        return fill(conn)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_runs_lists_every_run_with_its_counts(ro_url, ro, capsys):
    code, out, _ = run_cli(capsys, "runs", "--db", ro_url, "--json")
    assert code == 0
    runs = {r["run_id"]: r for r in json.loads(out)}
    assert set(runs) == {ro.cpu_run, ro.gpu_run}
    cpu = runs[ro.cpu_run]
    assert (cpu["done"], cpu["invalid"], cpu["failed"], cpu["timed_out"]) == (6, 2, 1, 1)
    assert (cpu["running"], cpu["pending"], cpu["cancelled"]) == (1, 2, 1)
    assert cpu["best_gflops"] == pytest.approx(ro.best_gflops)
    assert runs[ro.gpu_run]["best_gflops"] == pytest.approx(410.0)

    code, out, _ = run_cli(capsys, "runs", "--db", ro_url)
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["RUN", "PROBLEM", "ARGS"]
    assert len(lines) == 3  # header + two runs, newest first
    assert lines[1].split()[0] == str(ro.gpu_run)


def test_runs_on_an_empty_database_says_how_to_start(db_url, capsys):
    code, out, _ = run_cli(capsys, "runs", "--db", db_url)
    assert code == 0
    assert "no runs yet" in out and "tunefleet tune" in out


def test_status_overview_shows_active_runs_and_live_and_lost_workers(db, db_url, filled, capsys):
    # node-b stops heartbeating: killed without a goodbye.
    db.execute(
        "UPDATE tunefleet.worker SET heartbeat_at = now() - interval '10 minutes' WHERE id = %s",
        (filled.workers[1],),
    )
    code, out, _ = run_cli(capsys, "status", "--db", db_url)
    assert code == 0
    assert out.startswith("active runs:")
    run_lines = [ln for ln in out.splitlines() if ln.split()[:2] == [str(filled.cpu_run), "gemm"]]
    assert len(run_lines) == 1 and "12.5" in run_lines[0]
    # the finished GPU run is not active
    assert not any(ln.split()[:2] == [str(filled.gpu_run), "gemm"] for ln in out.splitlines())
    assert "workers: 2 alive" in out
    states = {
        ln.split()[1]: ln
        for ln in out.splitlines()
        if ln[:8] in {str(w)[:8] for w in filled.workers}
    }
    assert "lost" in states["node-b"]
    assert "idle" in states["node-a"] and "idle" in states["gpu-node"]


def test_status_of_one_run_shows_counts_best_and_failure_reasons(ro_url, ro, capsys):
    code, out, _ = run_cli(capsys, "status", str(ro.cpu_run), "--db", ro_url)
    assert code == 0
    assert f"run {ro.cpu_run}: gemm dtype=float32 n=256" in out
    assert (
        "10/40 finished (6 done, 2 invalid, 1 failed, 1 timed out), 1 running, 2 pending, "
        "1 cancelled" in out
    )
    assert "best      12.5 GFLOP/s" in out
    assert "2 invalid: work-group size 512 exceeds the device limit 256" in out
    assert "1 failed: worker lost" in out
    # the filled run is 'running' but no coordinator heartbeats it
    assert (
        f"no coordinator is driving it; continue with `tunefleet tune --resume {ro.cpu_run}`" in out
    )
    # only the CPU workers served this run (the GPU worker is another class)
    assert "node-a" in out and "node-b" in out and "gpu-node" not in out


def test_best_prints_configuration_gflops_and_a_reproduce_command(ro_url, ro, capsys):
    code, out, _ = run_cli(capsys, "best", str(ro.cpu_run), "--db", ro_url)
    assert code == 0
    assert f"best: trial {ro.best_trial}, 12.5 GFLOP/s" in out
    assert f"tunefleet show {ro.cpu_run} {ro.best_trial} --code" in out
    line = out.splitlines()[out.splitlines().index("reproduce:") + 1].strip()
    words = shlex.split(line)
    assert words[:3] == ["tunefleet", "measure", "gemm"]
    # The printed command parses and carries exactly the stored arguments and configuration.
    ns = build_parser().parse_args(words[1:])
    assert raw_problem_args(ns) == ARGS
    best = report.best_trials(_conn(ro_url), ro.cpu_run)[0]
    assert json.loads(ns.config) == best["config"]
    assert ns.device == "pthread-Intel(R) Xeon(R) Processor"
    assert ns.protocol is None  # the run used the default protocol


def test_reproduce_command_carries_protocol_settings_not_what_a_measurement_recorded():
    from tunefleet.problems.base import Protocol
    from tunefleet.text.render import reproduce_command

    run = {"problem": "axpy", "problem_args": {"n": 4096}, "device_class": "cpu", "protocol": {}}
    recorded = {**Protocol(min_launches=20).to_json(), "restored_before_each_launch": ["u"]}
    best = {"config": {"wg": 64}, "device_name": "cpu0", "protocol": recorded}
    words = shlex.split(reproduce_command(run, best))
    assert words[words.index("--protocol") + 1] == '{"min_launches":20}'
    best["protocol"] = {**Protocol().to_json(), "restored_before_each_launch": ["u"]}
    assert "--protocol" not in shlex.split(reproduce_command(run, best))


def _conn(url: str) -> Any:
    from tunefleet.db.engine import connect

    return connect(url)


def test_best_top_k_in_json_is_sorted_fastest_first(ro_url, ro, capsys):
    code, out, _ = run_cli(capsys, "best", str(ro.cpu_run), "--top", "3", "--json", "--db", ro_url)
    assert code == 0
    data = json.loads(out)
    assert [b["gflops"] for b in data["best"]] == [12.5, 11.0, 9.0]
    assert all(b["reproduce"].startswith("tunefleet measure gemm") for b in data["best"])


def test_best_of_a_run_without_a_successful_trial_is_a_one_line_error(db, db_url, filled, capsys):
    db.execute("DELETE FROM tunefleet.measurement WHERE run_id = %s", (filled.gpu_run,))
    db.execute("UPDATE tunefleet.trial SET state = 'invalid' WHERE run_id = %s", (filled.gpu_run,))
    code, out, err = run_cli(capsys, "best", str(filled.gpu_run), "--db", db_url)
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "no successful trial yet" in err and f"tunefleet status {filled.gpu_run}" in err


def test_show_code_prints_the_stored_opencl_source(ro_url, ro, capsys):
    code, out, _ = run_cli(
        capsys, "show", str(ro.cpu_run), str(ro.best_trial), "--code", "--db", ro_url
    )
    assert code == 0
    assert out == CODE % 3  # the best trial is the fourth one written (n = 3)


def test_show_trial_lists_measurement_and_attempts(ro_url, ro, capsys):
    failed = ro.trials["failed"][0]
    code, out, _ = run_cli(capsys, "show", str(ro.cpu_run), str(failed), "--json", "--db", ro_url)
    assert code == 0
    data = json.loads(out)
    assert data["state"] == "failed" and data["measurement_id"] is None
    assert [a["outcome"] for a in data["attempts"]] == ["failed"]
    assert data["attempts"][0]["worker_host"] == "node-a"

    code, out, _ = run_cli(capsys, "show", str(ro.cpu_run), str(ro.best_trial), "--db", ro_url)
    assert "GFLOP/s     12.5" in out and "5 samples" in out and "add --code" in out


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["show", "{cpu}", "{invalid}", "--code"], "has no stored code"),
        (["show", "{gpu}", "{invalid}"], "has no trial"),
        (["show", "999999", "1"], "run 999999 does not exist"),
        (["best", "999999"], "run 999999 does not exist"),
        (["status", "999999"], "run 999999 does not exist"),
        (["export", "999999"], "run 999999 does not exist"),
        (["plot", "999999", "-o", "x.png"], "run 999999 does not exist"),
    ],
)
def test_missing_runs_and_trials_are_one_line_errors(ro_url, ro, capsys, argv, expected):
    ids = {"cpu": ro.cpu_run, "gpu": ro.gpu_run, "invalid": ro.trials["invalid"][0]}
    code, _out, err = run_cli(capsys, *[a.format(**ids) for a in argv], "--db", ro_url)
    assert code != 0
    assert expected in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("tunefleet: error:")
    if "does not exist" in expected:
        assert "tunefleet runs" in err  # names the fix


def test_export_csv_and_json_contain_every_finished_trial(ro_url, ro, capsys, tmp_path):
    finished = {t for s in ("done", "invalid", "failed", "timed_out") for t in ro.trials[s]}
    code, out, _ = run_cli(capsys, "export", str(ro.cpu_run), "--format", "csv", "--db", ro_url)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {int(r["trial_id"]) for r in rows} == finished
    best = next(r for r in rows if int(r["trial_id"]) == ro.best_trial)
    assert float(best["gflops"]) == pytest.approx(12.5)
    assert (
        json.loads(best["config"]) == report.best_trials(_conn(ro_url), ro.cpu_run)[0]["config"]
    )  # JSON in a cell
    assert len(json.loads(best["samples_s"])) == 5

    target = tmp_path / "run.json"
    code, out, err = run_cli(
        capsys, "export", str(ro.cpu_run), "--format", "json", "-o", str(target), "--db", ro_url
    )
    assert code == 0 and out == ""
    assert f"wrote {len(finished)} trials" in err
    data = json.loads(target.read_text())
    assert {r["trial_id"] for r in data} == finished
    assert {r["state"] for r in data} == {"done", "invalid", "failed", "timed_out"}
    assert next(r for r in data if r["trial_id"] == ro.best_trial)["config"] == json.loads(
        best["config"]
    )


def _png_pixels(path: Path) -> np.ndarray:
    """The image as an (height, width, channels) uint8 array, after checking the signature."""
    from PIL import Image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    with Image.open(path) as img:
        assert img.format == "PNG"
        return np.asarray(img.convert("RGB"))


def test_plot_writes_a_real_png_of_the_run(ro_url, ro, capsys, tmp_path):
    cpu_png, gpu_png = tmp_path / "cpu.png", tmp_path / "gpu.png"
    code, out, _ = run_cli(capsys, "plot", str(ro.cpu_run), "-o", str(cpu_png), "--db", ro_url)
    assert code == 0
    assert f"{ro.finished} evaluations, best 12.5 GFLOP/s (unconfirmed), 2 workers" in out
    pixels = _png_pixels(cpu_png)
    assert pixels.shape == (1000, 900, 3)
    assert pixels.var() > 100, "the image is blank"
    # blue best-so-far line and green 'done' bars are drawn
    assert _has_colour(pixels, (0x1C, 0x7E, 0xD6)) and _has_colour(pixels, (0x2B, 0x8A, 0x3E))

    code, out, _ = run_cli(capsys, "plot", str(ro.gpu_run), "-o", str(gpu_png), "--db", ro_url)
    assert "3 evaluations, best 410 GFLOP/s (unconfirmed), 1 worker" in out
    assert not np.array_equal(_png_pixels(gpu_png), pixels)  # another run, another picture


def _has_colour(pixels: np.ndarray, rgb: tuple[int, int, int]) -> bool:
    return bool((pixels == np.array(rgb, dtype=np.uint8)).all(axis=-1).any())


def test_plot_refuses_a_file_that_is_not_png(ro_url, ro, capsys, tmp_path):
    code, _, err = run_cli(
        capsys, "plot", str(ro.cpu_run), "-o", str(tmp_path / "x.pdf"), "--db", ro_url
    )
    assert code == 2 and "FILE.png" in err


def test_report_series_and_intervals_follow_the_rows(ro_url, ro):
    db = _conn(ro_url)
    series = report.progress_series(db, ro.cpu_run)
    assert [r["n"] for r in series] == list(range(1, ro.finished + 1))
    best = [r["best_gflops"] for r in series]
    assert best == sorted(best) and best[-1] == pytest.approx(12.5)
    assert all(r["gflops"] is None for r in series if r["state"] != "done")
    intervals = report.worker_intervals(db, ro.gpu_run)
    assert len(intervals) == 3 and {i["worker_host"] for i in intervals} == {"gpu-node"}
    assert all(i["end_s"] - i["start_s"] == pytest.approx(9.0) for i in intervals)
    from tunefleet.busy import busy_shares

    # three 9 s trials over 5..34 s: 27 s busy of 29 s
    assert busy_shares(intervals) == {str(ro.workers[2]): pytest.approx(27 / 29)}


def test_cache_hits_are_results_but_nobody_s_work(db, filled):
    """A trial answered from the cache (a copy of another run's measurement, no attempt) shows
    in the run's results and best-so-far, but not in any worker's timeline or tally."""
    w3 = filled.workers[2]
    before = {r["worker_id"]: r["measured"] for r in report.fleet(db, run_id=filled.gpu_run)}
    db.execute(
        """WITH t AS (
             INSERT INTO tunefleet.trial (run_id, device_class, config, config_hash, state,
                                          source, reported, started_at, finished_at)
             SELECT run_id, device_class, '{"tile": 64}', 'cached-1', 'done', 'cache', true,
                    now(), now()
               FROM tunefleet.trial WHERE run_id = %(run)s LIMIT 1
             RETURNING id, run_id)
           INSERT INTO tunefleet.measurement (trial_id, run_id, attempt, cache_key, config_hash,
                  problem, problem_args, config, device_id, worker_id, median_s, min_s,
                  samples_s, gflops, protocol)
           SELECT t.id, t.run_id, NULL, m.cache_key, 'cached-1', m.problem, m.problem_args,
                  m.config, m.device_id, m.worker_id, m.median_s, m.min_s, m.samples_s,
                  m.gflops, m.protocol
             FROM t, tunefleet.measurement m WHERE m.run_id = %(run)s LIMIT 1""",
        {"run": filled.gpu_run},
    )
    assert len(report.progress_series(db, filled.gpu_run)) == 4
    intervals = report.worker_intervals(db, filled.gpu_run)
    assert len(intervals) == 3 and {i["worker_id"] for i in intervals} == {w3}
    after = {r["worker_id"]: r["measured"] for r in report.fleet(db, run_id=filled.gpu_run)}
    assert after == before == {w3: 3}


def test_a_noisy_best_is_flagged_by_the_views_best_and_the_dashboard(db, db_url, filled, capsys):
    from tunefleet import agreement
    from tunefleet.queries import dashboard

    def best_row() -> Any:
        return db.execute(
            "SELECT measured_noise, noisy FROM tunefleet.best_per_run WHERE run_id = %s",
            (filled.cpu_run,),
        ).fetchone()

    median = db.execute(
        "SELECT median_s FROM tunefleet.measurement WHERE trial_id = %s", (filled.best_trial,)
    ).fetchone()["median_s"]
    quiet = [median * f for f in (0.99, 1.0, 1.0, 1.01, 1.0, 1.02, 0.98, 1.0, 1.0, 1.0)]
    noisy = [median * f for f in (0.6, 1.0, 1.4, 1.0, 2.0, 0.8, 1.0, 1.3, 0.7, 1.0)]
    for samples, flagged in ((quiet, False), (noisy, True)):
        db.execute(
            "UPDATE tunefleet.measurement SET samples_s = %s WHERE trial_id = %s",
            (samples, filled.best_trial),
        )
        row = best_row()
        # The view's SQL and the worker's statistic are one definition.
        assert row["measured_noise"] == pytest.approx(agreement.noise(samples))
        assert row["noisy"] is flagged
        result = db.execute(
            "SELECT noisy FROM tunefleet.results WHERE trial_id = %s", (filled.best_trial,)
        ).fetchone()
        assert result["noisy"] is flagged
        code, out, _ = run_cli(capsys, "best", str(filled.cpu_run), "--db", db_url)
        assert code == 0
        assert ("\nnoisy: the search measurement's IQR/median is" in out) is flagged, out
        assert dashboard.best(db, filled.cpu_run)["noisy"] is flagged


def test_runs_counts_rule_rejections_apart_from_invalid_as_tune_does(db, db_url, filled, capsys):
    """``tune`` said "0 invalid, ... 1 ruled out by the rules" where ``runs`` said INVALID 1
    for the same run: a configuration the problem's rules rejected before any worker saw it
    is counted apart from invalid in both."""
    import re

    from tunefleet.queries.search import insert_invalid_trials
    from tunefleet.text.output import trial_counts

    config = {"tile": 128, "unroll": False}
    insert_invalid_trials(
        db,
        filled.cpu_run,
        "pthread-intel-r-xeon-r-processor",
        [{"config": config, "config_hash": "ruled-out-1", "error": "tile=128: too big"}],
    )
    progress = report.run_progress(db, filled.cpu_run)
    assert progress is not None and progress["ruled_out"] == 1
    said = re.search(r"(\d+) invalid, .*, (\d+) ruled out by the rules$", trial_counts(progress))
    assert said is not None, trial_counts(progress)

    code, out, _ = run_cli(capsys, "runs", "--db", db_url)
    assert code == 0
    header, *rows = (re.split(r"\s{2,}", line.strip()) for line in out.splitlines())
    (row,) = [dict(zip(header, r, strict=True)) for r in rows if r[0] == str(filled.cpu_run)]
    assert row["INVALID"] == said.group(1), out
    assert row.get("RULED OUT") == said.group(2), out
