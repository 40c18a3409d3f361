"""``tunefleet importance`` on real runs: the synthetic problem tuned by real workers, with an
objective that depends on two known parameters only and one parameter value that makes
configurations invalid. The report must rank the two first for speed and the other for
validity, by both methods; the text, ``--json``, ``--all-runs`` (two runs of one cache key),
the plots, the fallback without scikit-learn and the errors are checked on the same rows.

Commands run in-process through ``tunefleet.cli.main`` (the tunes as real processes).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.helpers.runfill import module_database
from tunefleet.cli import main
from tunefleet.db.engine import connect

#: The objective depends on tile and order only; unroll=8 is invalid.
ARGS = [
    "--arg", "duration=0",
    "--arg", "noise=0.05",
    "--arg", "depends_on=tile,order",
    "--arg", 'invalid_values={"unroll": [8]}',
]  # fmt: skip


def tune(url: str, env: dict[str, str], trials: int, seed: int) -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "tunefleet", "tune", "synthetic", "--db", url,
            "--workers", "2", "--max-trials", str(trials), "--confirm", "0",
            # A uniform sample, as importance wants: the default search piles its
            # trials around the best and blurs the ranking it is tested on.
            "--technique", "PureRandom", "--search-seed", str(seed), *ARGS,
        ],
        env=env, capture_output=True, text=True, timeout=280, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def url(pg_admin_url: str, pg_template: str, tmp_path_factory) -> Iterator[str]:
    with module_database(pg_admin_url, pg_template, "importance") as url:
        env = {
            **os.environ,
            "TUNEFLEET_HOME": str(tmp_path_factory.mktemp("home")),
            "PYTHONUNBUFFERED": "1",
        }
        tune(url, env, 90, seed=1)  # run 1
        tune(url, env, 30, seed=2)  # run 2: the same cache key, partly answered from run 1
        yield url


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def report(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> dict[str, Any]:
    code, out, err = run_cli(capsys, "importance", "1", "--db", url, "--json", *argv)
    assert code == 0, err
    return dict(json.loads(out))


def param(rep: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in rep["parameters"] if p["name"] == name)


@pytest.mark.parametrize("method", ["variance", "forest"])
def test_the_parameters_the_objective_depends_on_rank_first(url, capsys, method):
    rep = report(capsys, url, "--method", method)
    assert rep["method"] == method
    names = [p["name"] for p in rep["parameters"]]
    assert set(names[:2]) == {"tile", "order"}, rep["parameters"]
    speed = {p["name"]: p["speed"][method] for p in rep["parameters"]}
    assert min(speed["tile"], speed["order"]) > 2 * max(speed["unroll"], speed["vector"])
    # unroll=8 is what makes configurations invalid: first for validity, every one of them.
    validity = sorted(rep["parameters"], key=lambda p: -(p["validity"]["variance"] or 0))
    assert validity[0]["name"] == "unroll"
    eight = next(v for v in param(rep, "unroll")["values"] if v["value"] == 8)
    assert eight["trials"] > 0 and eight["fail_rate"] == 1 and eight["invalid"] == eight["trials"]
    assert all(v["fail_rate"] == 0 for v in param(rep, "unroll")["values"] if v["value"] != 8)
    with connect(url) as conn:
        counts = conn.execute(
            "SELECT count(*) AS n, count(*) FILTER (WHERE state = 'done') AS done,"
            "       count(*) FILTER (WHERE state = 'invalid') AS invalid"
            "  FROM tunefleet.results WHERE run_id = 1"
        ).fetchone()
    assert (rep["trials"], rep["measured"], rep["invalid"]) == (
        counts["n"],
        counts["done"],
        counts["invalid"],
    )
    if method == "forest":
        forest = rep["forest"]
        assert forest["fitted"] and forest["oob_r2"] > 0.5 and forest["fitted_on"] == counts["done"]


def test_the_table_ranks_and_lists_every_value(url, capsys):
    code, out, err = run_cli(capsys, "importance", "1", "--db", url, "--top", "3")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("run 1: synthetic ") and "finished configurations" in lines[1]
    assert lines[2].startswith("method: forest (100 trees")
    header = lines.index(next(ln for ln in lines if ln.startswith("PARAMETER")))
    assert "SPEED (FOREST)" in lines[header] and "VALIDITY" in lines[header]
    assert {lines[header + 1].split()[0], lines[header + 2].split()[0]} == {"tile", "order"}
    assert "tile:" in lines and "unroll:" in lines
    fastest = lines.index(
        "the 3 fastest configurations as the search measured them (the run's best, "
        "re-measured: `tunefleet best`):"
    )
    assert len([ln for ln in lines[fastest + 2 :] if ln.strip()]) == 3


def test_all_runs_counts_each_configuration_of_the_cache_key_once(url, capsys):
    rep = report(capsys, url, "--all-runs", "--method", "variance")
    assert rep["scope"] == {"run_id": 1, "all_runs": True, "runs": [1, 2]}
    with connect(url) as conn:
        distinct = conn.execute(
            "SELECT count(DISTINCT config_hash) AS n FROM tunefleet.results"
        ).fetchone()["n"]
        run1 = conn.execute(
            "SELECT count(*) AS n FROM tunefleet.results WHERE run_id = 1"
        ).fetchone()["n"]
    assert rep["trials"] == distinct > run1
    assert set([p["name"] for p in rep["parameters"]][:2]) == {"tile", "order"}
    code, out, _ = run_cli(capsys, "importance", "1", "--db", url, "--all-runs")
    assert code == 0 and out.startswith("runs 1, 2 (every run of run 1's cache key): synthetic")


def _png(path: Path) -> Image.Image:
    image = Image.open(io.BytesIO(path.read_bytes())).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, f"{path} looks blank"
    return image


def test_plots_are_real_pngs_and_the_run_plot_still_works(url, capsys, tmp_path):
    code, _, err = run_cli(
        capsys, "importance", "1", "--db", url, "--plot", str(tmp_path / "imp.png")
    )
    assert code == 0 and f"wrote {tmp_path / 'imp.png'}" in err
    assert _png(tmp_path / "imp.png").width >= 1200
    code, out, err = run_cli(
        capsys, "plot", "1", "--db", url, "-o", str(tmp_path / "run.png"),
        "--importance", str(tmp_path / "run-importance.png"),
    )  # fmt: skip
    assert code == 0, err
    assert _png(tmp_path / "run.png").size == (900, 1000)  # today's plot, unchanged
    _png(tmp_path / "run-importance.png")
    assert out.splitlines()[-1].startswith(f"wrote {tmp_path / 'run-importance.png'}")


def test_without_scikit_learn_it_says_so_and_still_ranks(url, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    code, out, err = run_cli(capsys, "importance", "1", "--db", url)
    assert code == 0
    # said once: in the report's method line, not again as a note
    assert "method: variance (the forest method needs scikit-learn" in out
    assert (out + err).count("the forest method needs scikit-learn") == 1, out + err
    assert "pip install 'tunefleet[importance]'" in out
    code, out, err = run_cli(capsys, "importance", "1", "--db", url, "--json")
    assert code == 0 and json.loads(out)["forest"]["reason"].startswith("the forest method")
    assert len(err.strip().splitlines()) == 1 and err.startswith("tunefleet: note: the forest")
    assert "SPEED (FOREST)" not in out
    code, out, err = run_cli(capsys, "importance", "1", "--db", url, "--method", "forest")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "tunefleet: error: --method forest: the forest method needs scikit-learn: pip install "
        "'tunefleet[importance]' (the variance method needs only NumPy)"
    ]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["importance", "999"], "run 999 does not exist"),
        (["importance", "1", "--top", "0"], "--top 0: use at least 1"),
        (["importance", "1", "--plot", "x.jpg"], "--plot 'x.jpg': the plot is a PNG"),
        (["plot", "1", "-o", "a.png", "--importance", "b.svg"], "--importance 'b.svg': a PNG"),
    ],
)
def test_bad_input_is_one_line_naming_it(url, capsys, argv, expected):
    code, out, err = run_cli(capsys, *argv, "--db", url)
    assert code != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunefleet: error: ") and expected in lines[0]


def test_a_run_without_finished_trials_is_one_line(db, db_url, capsys):
    run = db.execute(
        """INSERT INTO tunefleet.run (problem, problem_args, space, device_class, protocol,
                                      cache_key, state)
           VALUES ('synthetic', '{}', '{"version": 1, "params": []}', 'any', '{}', 'k',
                   'running') RETURNING id"""
    ).fetchone()["id"]
    code, out, err = run_cli(capsys, "importance", str(run), "--db", db_url)
    assert code == 1 and out == ""
    assert err.strip() == (
        f"tunefleet: error: run {run} has no finished trial yet: nothing to rank "
        f"(`tunefleet status {run}` shows its progress)"
    )
