"""feinsum archives in and out of a real PostgreSQL database.

Archives are made here with :mod:`sqlite3` in feinsum's layout (the ``CREATE TABLE`` below is
test data transcribed from feinsum's ``sql_utils``). Runs, trials and measurements of the
feinsum problem are inserted as the coordinator and a worker would leave them.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tunefleet.feinsum_support import archive
from tunefleet.feinsum_support.transfer import export_run, import_archive
from tunefleet.problems.base import Protocol, cache_key
from tunefleet.problems.registry import get_problem
from tunefleet.space import config_hash

FEINSUM_DDL = (
    "CREATE TABLE FEINSUM_TIMING_FACTS ( ID INTEGER PRIMARY KEY AUTOINCREMENT,"
    " subscripts TEXT, index_to_length TEXT, args TEXT, arg_to_dtype TEXT, device_name TEXT,"
    " transform_id TEXT, transform_params TEXT, runtime_in_sec REAL, compiler_version TEXT,"
    " giga_op_info TEXT, timestamp TEXT)"
)
EINSUM = {
    "subscripts": "lk,ilj,lkj -> ki",
    "index_to_length": {"i": 35, "j": 15, "l": 4},
    "args": [["arg_2", "arg_3", "arg_0"], ["arg_2", "arg_3", "arg_1"]],
    "arg_to_dtype": {f"arg_{k}": "float64" for k in range(4)},
}


def fact_row(params: dict[str, Any], runtime: float, **over: Any) -> tuple[Any, ...]:
    row = {
        "subscripts": EINSUM["subscripts"],
        "index_to_length": json.dumps(EINSUM["index_to_length"], sort_keys=True),
        "args": json.dumps(EINSUM["args"]),
        "arg_to_dtype": json.dumps(EINSUM["arg_to_dtype"], sort_keys=True),
        "device_name": "NVIDIA_TITAN_V",
        "transform_id": "ifj_fe_fej_to_ei_v3.py",
        "transform_params": json.dumps(params, sort_keys=True),
        "runtime_in_sec": runtime,
        "compiler_version": "NVIDIA Corporation-550.163.01",
        "giga_op_info": '{"float64": 0.852}',
        "timestamp": "2026_04_08_030859",
    }
    row.update(over)
    return tuple(row[c] for c in archive.FACT_COLUMNS)


def make_archive(path: Path, rows: list[tuple[Any, ...]], ddl: str = FEINSUM_DDL) -> Path:
    conn = sqlite3.connect(path)
    conn.execute(ddl)
    cols = ", ".join(archive.FACT_COLUMNS)
    if rows:
        conn.executemany(
            f"INSERT INTO FEINSUM_TIMING_FACTS ({cols}) VALUES ({', '.join('?' * 11)})",
            rows,
        )
    conn.commit()
    conn.close()
    return path


ROWS = [
    fact_row({"n_e_per_wg_log2": 2, "nwork_items_per_e": 4, "n_i_tile": 1, "n_j_tile": 1}, 2e-4),
    fact_row({"n_e_per_wg_log2": 3, "nwork_items_per_e": 5, "n_i_tile": 2, "n_j_tile": 1}, 1e-4),
    fact_row({"n_e_per_wg_log2": 1, "nwork_items_per_e": 1, "n_i_tile": 1, "n_j_tile": 2}, 4e-4),
]


def counts(db) -> tuple[int, int]:
    row = db.execute(
        "SELECT (SELECT count(*) FROM tunefleet.measurement) AS m,"
        " (SELECT count(*) FROM tunefleet.device) AS d"
    ).fetchone()
    return row["m"], row["d"]


def test_import_makes_imported_measurements_keyed_like_a_run(db, tmp_path):
    path = make_archive(tmp_path / "a.sqlite", ROWS)
    report = import_archive(db, path)
    assert (report.rows, report.inserted, report.skipped) == (3, 3, 0)
    assert report.device_classes == {"nvidia-titan-v": 3}

    # The arguments are exactly what the feinsum problem makes of the same einsum and space,
    # so a run on that device class with feinsum's protocol shares the cache key.
    args = get_problem("feinsum").normalise_args(
        {"space": "feinsum:ifj_fe_fej_to_ei_v3.py", "einsum": json.dumps(EINSUM)}
    )
    key = cache_key("feinsum", args, "nvidia-titan-v", archive.FEINSUM_PROTOCOL)
    assert report.cache_keys == {key}
    rows = db.execute(
        "SELECT m.*, d.device_class, d.name AS device_name, d.vendor, d.driver_version"
        " FROM tunefleet.measurement m JOIN tunefleet.device d ON d.id = m.device_id"
        " ORDER BY m.median_s"
    ).fetchall()
    assert len(rows) == 3
    best = rows[0]
    assert best["source"] == "imported"
    assert best["trial_id"] is None and best["run_id"] is None
    assert best["problem"] == "feinsum" and best["problem_args"] == args
    assert best["cache_key"] == key
    assert best["config"] == {
        "n_e_per_wg_log2": 3,
        "nwork_items_per_e": 5,
        "n_i_tile": 2,
        "n_j_tile": 1,
    }
    assert best["config_hash"] == config_hash(best["config"])
    assert best["median_s"] == best["min_s"] == 1e-4 and best["samples_s"] == [1e-4]
    assert best["gflops"] == pytest.approx(0.852 / 1e-4)
    assert best["flop_count"] == pytest.approx(0.852e9)
    assert best["protocol"] == archive.FEINSUM_PROTOCOL
    assert best["protocol"] != Protocol().to_json()
    assert best["versions"][archive.FACT_KEY]["transform_id"] == "ifj_fe_fej_to_ei_v3.py"
    assert (best["device_class"], best["device_name"], best["vendor"], best["driver_version"]) == (
        "nvidia-titan-v",
        "NVIDIA TITAN V",
        "NVIDIA Corporation",
        "550.163.01",
    )
    assert best["created_at"].isoformat().startswith("2026-04-08T08:08:59")  # Chicago CDT
    # The best-per-problem view sees imported results too.
    view = db.execute("SELECT * FROM tunefleet.best_per_problem_device").fetchone()
    assert view["median_s"] == 1e-4 and view["device_class"] == "nvidia-titan-v"


def test_importing_twice_or_a_copy_adds_nothing(db, tmp_path):
    path = make_archive(tmp_path / "a.sqlite", ROWS)
    import_archive(db, path)
    again = import_archive(db, path)
    assert (again.inserted, again.skipped) == (0, 3)
    # The same facts under other IDs (a copy, re-ordered, plus one new row) add only the new one.
    new = fact_row(
        {"n_e_per_wg_log2": 4, "nwork_items_per_e": 1, "n_i_tile": 1, "n_j_tile": 1}, 3e-4
    )
    copy = make_archive(tmp_path / "b.sqlite", [new, *reversed(ROWS), ROWS[0]])
    third = import_archive(db, copy)
    assert (third.rows, third.inserted) == (5, 1)
    assert counts(db) == (4, 1)


def test_device_selection_and_class_override(db, tmp_path):
    other = fact_row(
        {"n_e_per_wg_log2": 1, "nwork_items_per_e": 1, "n_i_tile": 1, "n_j_tile": 1},
        1e-3,
        device_name="Tesla_V100_SXM2_16GB",
    )
    path = make_archive(tmp_path / "a.sqlite", [*ROWS, other])
    from tunefleet.errors import UsageError

    with pytest.raises(UsageError, match="holds 2"):
        import_archive(db, path, device_class="h200")
    with pytest.raises(UsageError, match="no rows of device 'GPU'"):
        import_archive(db, path, device_name="GPU")
    assert counts(db) == (0, 0)
    report = import_archive(db, path, device_name="Tesla_V100_SXM2_16GB", device_class="v100")
    assert (report.inserted, report.device_classes) == (1, {"v100": 1})
    row = db.execute("SELECT device_class FROM tunefleet.device").fetchone()
    assert row["device_class"] == "v100"


def _run_cli(cli_env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunefleet", *argv],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _bad_archives(tmp: Path) -> dict[str, tuple[Path, str]]:
    junk = tmp / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 50)
    empty = tmp / "empty.sqlite"
    sqlite3.connect(empty).execute("CREATE TABLE other (x)").connection.commit()
    v5 = make_archive(
        tmp / "v5.sqlite",
        [],
        ddl="CREATE TABLE FEINSUM_TIMING_FACTS (ID INTEGER PRIMARY KEY, subscripts TEXT,"
        " index_to_length TEXT, use_matrix TEXT, value_to_dtype TEXT, device_name TEXT,"
        " transform_id TEXT, transform_params TEXT, runtime_in_sec REAL,"
        " compiler_version TEXT, giga_op_info TEXT, timestamp TEXT)",
    )
    bad_json = make_archive(
        tmp / "badjson.sqlite", [*ROWS, fact_row({}, 1e-4, transform_params="{oops")]
    )
    negative = make_archive(tmp / "neg.sqlite", [*ROWS, fact_row({"a": 1}, -1.0)])
    text_time = make_archive(tmp / "text.sqlite", [*ROWS, fact_row({"a": 1}, "fast")])
    bad_einsum = make_archive(tmp / "ein.sqlite", [fact_row({"a": 1}, 1e-4, subscripts="ab")])
    return {
        "missing": (tmp / "absent.sqlite", "does not exist"),
        "junk": (junk, "is not an SQLite database"),
        "no table": (empty, "has no FEINSUM_TIMING_FACTS table"),
        "old layout": (v5, "lacks column(s) args, arg_to_dtype"),
        "bad json": (bad_json, "row ID 4: transform_params is not valid JSON"),
        "negative": (negative, "row ID 4: runtime_in_sec -1.0 is not a positive time"),
        "text time": (text_time, "row ID 4: runtime_in_sec is 'fast', not a number"),
        "bad einsum": (bad_einsum, "row ID 1: einsum subscripts 'ab' need an explicit output"),
    }


def test_malformed_archives_give_one_line_and_change_nothing(db, db_url, cli_env, tmp_path):
    make_archive(tmp_path / "good.sqlite", ROWS)
    assert (
        _run_cli(
            cli_env, "feinsum", "import", str(tmp_path / "good.sqlite"), "--db", db_url
        ).returncode
        == 0
    )
    before = counts(db)
    for label, (path, needle) in _bad_archives(tmp_path).items():
        proc = _run_cli(cli_env, "feinsum", "import", str(path), "--db", db_url)
        assert proc.returncode == 1, (label, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tunefleet: error: "), (label, proc.stderr)
        assert needle in lines[0], (label, lines[0])
        assert counts(db) == before, label


def test_cli_import_reports_what_it_did(db_url, cli_env, tmp_path):
    path = make_archive(tmp_path / "a.sqlite", ROWS)
    first = _run_cli(cli_env, "feinsum", "import", str(path), "--db", db_url)
    assert first.returncode == 0, first.stderr
    assert "imported 3 of 3 rows" in first.stdout and "nvidia-titan-v (3 rows)" in first.stdout
    second = _run_cli(cli_env, "feinsum", "import", str(path), "--db", db_url)
    assert "imported 0 of 3 rows" in second.stdout and "(3 already present)" in second.stdout
    listing = _run_cli(cli_env, "feinsum", "list", str(path), "--json")
    assert listing.returncode == 0, listing.stderr
    (item,) = json.loads(listing.stdout)
    assert item["einsum"] == EINSUM and item["rows"] == 3
    assert item["best_gops"] == pytest.approx(8520.0)


# --- export -----------------------------------------------------------------------------------


def _feinsum_run(db, *, problem: str = "feinsum") -> int:
    """A run with two done trials measured by a worker with feinsum, and one invalid trial."""
    args = get_problem("feinsum").normalise_args(
        {
            "space": "feinsum:ifj_fe_fej_to_ei_v3.py",
            "einsum": "ifj,fe,fej->ei",
            "i": 35,
            "f": 4,
            "j": 15,
            "batch": 2,
            "operands": "L,J,v*",
        }
    )
    protocol = Protocol().to_json()
    key = cache_key(problem, args, "nvidia-h200", protocol)
    run_id = db.execute(
        "INSERT INTO tunefleet.run (problem, problem_args, space, device_class, protocol,"
        " cache_key) VALUES (%s, %s, %s, 'nvidia-h200', %s, %s) RETURNING id",
        (problem, Jsonb(args), Jsonb({"version": 1, "params": []}), Jsonb(protocol), key),
    ).fetchone()["id"]
    device_id = db.execute(
        "INSERT INTO tunefleet.device (fingerprint, device_class, platform, vendor, name,"
        " driver_version) VALUES ('fp', 'nvidia-h200', 'NVIDIA CUDA', 'NVIDIA Corporation',"
        " 'NVIDIA H200', '580.159.03')"
        " ON CONFLICT (fingerprint) DO UPDATE SET name = EXCLUDED.name RETURNING id"
    ).fetchone()["id"]
    # What runtime.prepare records: feinsum's canonical strings for this einsum.
    fact = {
        "subscripts": EINSUM["subscripts"],
        "index_to_length": json.dumps(EINSUM["index_to_length"], sort_keys=True),
        "args": json.dumps(EINSUM["args"]),
        "arg_to_dtype": json.dumps(EINSUM["arg_to_dtype"], sort_keys=True),
        "giga_op_info": '{"float64": 0.852}',
        "device_name": "NVIDIA_H200",
        "compiler_version": "NVIDIA Corporation-580.159.03",
    }
    for k, (state, median) in enumerate([("done", 3e-5), ("done", 2e-5), ("invalid", None)]):
        config = {"n_e_per_wg_log2": k + 1, "nwork_items_per_e": 1, "n_i_tile": 1, "n_j_tile": 1}
        trial_id = db.execute(
            "INSERT INTO tunefleet.trial (run_id, device_class, config, config_hash, state)"
            " VALUES (%s, 'nvidia-h200', %s, %s, %s) RETURNING id",
            (run_id, Jsonb(config), config_hash(config), state),
        ).fetchone()["id"]
        if median is None:
            continue
        db.execute(
            "INSERT INTO tunefleet.measurement (trial_id, run_id, attempt, cache_key, config_hash,"
            " problem, problem_args, config, device_id, median_s, min_s, samples_s, gflops,"
            " flop_count, protocol, versions) VALUES (%s, %s, 1, %s, %s, %s, %s, %s, %s, %s, %s,"
            " %s, %s, %s, %s, %s)",
            (
                trial_id,
                run_id,
                key,
                config_hash(config),
                problem,
                Jsonb(args),
                Jsonb(config),
                device_id,
                median,
                median * 0.9,
                [median, median * 0.9],
                0.852 / median,
                0.852e9,
                Jsonb(protocol),
                Jsonb({"feinsum": "2025.3", archive.FACT_KEY: fact}),
            ),
        )
    return int(run_id)


def test_export_writes_the_runs_measurements_for_feinsum(db, tmp_path):
    run_id = _feinsum_run(db)
    path = tmp_path / "exported.sqlite"
    assert export_run(db, run_id, path) == (2, 0)
    assert export_run(db, run_id, path) == (0, 2)
    facts = archive.read_facts(path)
    assert [f.runtime_in_sec for f in facts] == [3e-5, 2e-5]
    assert {f.subscripts for f in facts} == {EINSUM["subscripts"]}
    assert {f.device_name for f in facts} == {"NVIDIA_H200"}
    assert {f.transform_id for f in facts} == {"ifj_fe_fej_to_ei_v3.py"}
    # Round trip: the exported archive imports back as the same configurations.
    report = import_archive(db, path)
    assert report.inserted == 2
    imported = db.execute(
        "SELECT config_hash FROM tunefleet.measurement WHERE source = 'imported' ORDER BY median_s"
    ).fetchall()
    measured = db.execute(
        "SELECT config_hash FROM tunefleet.measurement WHERE source = 'measured' ORDER BY median_s"
    ).fetchall()
    assert imported == measured


def test_export_refuses_other_problems_and_unknown_runs(db, db_url, cli_env, tmp_path):
    from tunefleet.errors import ArchiveError, RunError

    other = _feinsum_run(db, problem="gemm")
    with pytest.raises(ArchiveError, match="tunes 'gemm', not feinsum"):
        export_run(db, other, tmp_path / "x.sqlite")
    with pytest.raises(RunError, match="run 9999 does not exist"):
        export_run(db, 9999, tmp_path / "x.sqlite")
    assert not (tmp_path / "x.sqlite").exists()
    run_id = _feinsum_run(db)
    proc = _run_cli(
        cli_env, "feinsum", "export", str(run_id), str(tmp_path / "y.sqlite"), "--db", db_url
    )
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 2 rows of run {run_id}" in proc.stderr
    proc = _run_cli(
        cli_env, "feinsum", "export", str(other), str(tmp_path / "z.sqlite"), "--db", db_url
    )
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1


# --- imported rows in the coordinator: warm starts and the cache ------------------------------

# A stand-in for feinsum's shipped ifj_fe_fej_to_ei_v3.py: the same parameters, read statically.
SPACE_V3 = """
import math
import feinsum as fnsm
from feinsum.tuning import IntParameter


@fnsm.tuning.transform_param("n_e_per_wg_log2", lambda e: IntParameter(1, 5))
@fnsm.tuning.transform_param("nwork_items_per_e", lambda e: IntParameter(1, e.args[0][2].shape[2]))
@fnsm.tuning.transform_param("n_i_tile", lambda e: IntParameter(1, math.ceil(e.shape[1] / 2)))
@fnsm.tuning.transform_param(
    "n_j_tile", lambda e: IntParameter(1, math.ceil(e.args[0][2].shape[2] / 2))
)
def transform(t_unit, n_e_per_wg_log2, nwork_items_per_e, n_i_tile, n_j_tile, insn_match=None,
              kernel_name=None):
    return t_unit
"""


@pytest.mark.parametrize(
    ("protocol", "expected"),
    [
        # feinsum's own timing: the same cache key as the archive rows, answered at once
        ({"statistic": "feinsum-wall-mean"}, {("done", "cache"): 3}),
        # tunefleet's protocol: different numbers, so the archive only seeds the search
        ({}, {("pending", "seed"): 3}),
    ],
)
def test_imported_rows_warm_start_and_answer_runs_with_feinsums_timing(
    db, db_url, tmp_path, monkeypatch, protocol, expected
):
    from tunefleet.coordinator.budget import Budget
    from tunefleet.coordinator.create import create_run
    from tunefleet.coordinator.settings import CoordinatorSettings

    impls = tmp_path / "impls"
    impls.mkdir()
    (impls / "ifj_fe_fej_to_ei_v3.py").write_text(SPACE_V3)
    monkeypatch.setenv("TUNEFLEET_FEINSUM_IMPLS", str(impls))
    import_archive(db, make_archive(tmp_path / "a.sqlite", ROWS))
    settings = CoordinatorSettings.build(
        problem="feinsum",
        problem_args={"space": "feinsum:ifj_fe_fej_to_ei_v3.py", "einsum": json.dumps(EINSUM)},
        device_class="nvidia-titan-v",
        protocol=protocol,
        warm_start_from="nvidia-titan-v",
        budget=Budget(max_trials=10),
    )
    run_id = create_run(settings, db_url)
    rows = db.execute(
        "SELECT state, source, count(*) AS n FROM tunefleet.trial WHERE run_id = %s"
        " GROUP BY state, source",
        (run_id,),
    ).fetchall()
    assert {(r["state"], r["source"]): r["n"] for r in rows} == expected
    if protocol:
        best = db.execute(
            "SELECT median_s, config FROM tunefleet.best_per_run WHERE run_id = %s", (run_id,)
        ).fetchone()
        assert best["median_s"] == 1e-4 and best["config"]["n_e_per_wg_log2"] == 3


def test_front_door_export_writes_feinsum_archives(db, db_url, cli_env, tmp_path):
    run_id = _feinsum_run(db)
    target = tmp_path / "front.sqlite"
    argv = ["export", str(run_id), "--format", "feinsum-sqlite", "--db", db_url]
    proc = _run_cli(cli_env, *argv, "-o", str(target))
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 2 rows of run {run_id}" in proc.stderr
    # The old spelling of `feinsum export`: one line says so, first.
    assert proc.stderr.splitlines()[0] == (
        "tunefleet: note: `export --format feinsum-sqlite -o PATH` is deprecated and goes in "
        "the next release; use `tunefleet feinsum export RUN PATH`"
    )
    assert [f.runtime_in_sec for f in archive.read_facts(target)] == [3e-5, 2e-5]
    again = _run_cli(cli_env, *argv, "-o", str(target))
    assert "2 identical rows were already there" in again.stderr
    missing = _run_cli(cli_env, *argv)
    assert missing.returncode == 2 and "give -o PATH.sqlite" in missing.stderr
    assert missing.stderr.count("\n") == 1


def test_old_feinsum_spellings_still_work_with_a_one_line_notice(db, db_url, cli_env, tmp_path):
    """``import-feinsum``, ``export-feinsum`` and ``import --device``: the same effect as
    ``feinsum import``, ``feinsum export`` and ``--archive-device``, after one notice line."""
    path = make_archive(tmp_path / "a.sqlite", ROWS)
    old = _run_cli(cli_env, "import-feinsum", str(path), "--db", db_url, "--device", "nobody")
    lines = old.stderr.strip().splitlines()
    assert lines[:2] == [
        "tunefleet: note: `tunefleet import-feinsum` is deprecated and goes in the next "
        "release; use `tunefleet feinsum import`",
        "tunefleet: note: `--device NAME` is deprecated and goes in the next release; use "
        "`--archive-device NAME`",
    ]
    # The old flag reached the filter: no archive row is of device "nobody".
    assert old.returncode == 2 and "has no rows of device 'nobody'" in lines[2], old.stderr
    assert counts(db)[0] == 0
    old = _run_cli(
        cli_env, "import-feinsum", str(path), "--db", db_url, "--device", "NVIDIA_TITAN_V"
    )
    assert old.returncode == 0 and "imported 3 of 3 rows" in old.stdout, old.stderr
    assert counts(db)[0] == 3
    new = _run_cli(
        cli_env, "feinsum", "import", str(path), "--db", db_url,
        "--archive-device", "NVIDIA_TITAN_V",
    )  # fmt: skip
    assert new.returncode == 0 and new.stderr == "", new.stderr
    assert "imported 0 of 3 rows" in new.stdout

    run_id = _feinsum_run(db)
    target = tmp_path / "old.sqlite"
    proc = _run_cli(cli_env, "export-feinsum", str(run_id), str(target), "--db", db_url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == (
        "tunefleet: note: `tunefleet export-feinsum` is deprecated and goes in the next "
        "release; use `tunefleet feinsum export`"
    )
    assert [f.runtime_in_sec for f in archive.read_facts(target)] == [3e-5, 2e-5]
    help_text = _run_cli(cli_env, "--help").stdout
    assert "import-feinsum" not in help_text and "export-feinsum" not in help_text
