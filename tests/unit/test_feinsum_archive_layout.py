"""The archives we write are the archives feinsum reads.

The expected layout and lookups below are test data transcribed from feinsum's own source
(``feinsum/sql_utils.py`` at the 2025.x archive format v6: the ``CREATE TABLE`` in
``_create_timings_table_if_non_existent``, the ``SELECT`` of ``query``, the string renderings
of ``dump_index_to_length``, ``dump_arg_names``, ``dump_arg_to_dtype``, ``dump_device_name``,
``dump_cl_version`` and the timestamp of ``record_facts``). They are written out here, not
computed with our code, so a drift on either side fails.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime

import pytest

from tunefleet.errors import ArchiveError
from tunefleet.feinsum_support import archive

# (name, declared type, primary key) of every column, in order.
FEINSUM_LAYOUT = [
    ("ID", "INTEGER", 1),
    ("subscripts", "TEXT", 0),
    ("index_to_length", "TEXT", 0),
    ("args", "TEXT", 0),
    ("arg_to_dtype", "TEXT", 0),
    ("device_name", "TEXT", 0),
    ("transform_id", "TEXT", 0),
    ("transform_params", "TEXT", 0),
    ("runtime_in_sec", "REAL", 0),
    ("compiler_version", "TEXT", 0),
    ("giga_op_info", "TEXT", 0),
    ("timestamp", "TEXT", 0),
]
# feinsum's query(): string equality on five columns.
FEINSUM_QUERY = (
    "SELECT transform_id, transform_params, runtime_in_sec, compiler_version, giga_op_info"
    " FROM FEINSUM_TIMING_FACTS WHERE (subscripts = ? AND index_to_length = ? AND args = ?"
    " AND arg_to_dtype = ? AND device_name = ?)"
)
# feinsum's tuner (seed_configurations / query_from_db) also matches these two.
FEINSUM_TUNER_QUERY = (
    "SELECT runtime_in_sec FROM FEINSUM_TIMING_FACTS WHERE (subscripts = ? AND"
    " index_to_length = ? AND args = ? AND arg_to_dtype = ? AND transform_params = ? AND"
    " giga_op_info = ? AND device_name = ?)"
)
# The canonical face-mass einsum of 2 fields as feinsum renders it for the lookup.
LOOKUP = (
    "lk,ilj,lkj -> ki",
    '{"i": 35, "j": 15, "l": 4}',
    '[["arg_2", "arg_3", "arg_0"], ["arg_2", "arg_3", "arg_1"]]',
    '{"arg_0": "float64", "arg_1": "float64", "arg_2": "float64", "arg_3": "float64"}',
)
EINSUM_ARGS = {
    "space": "feinsum:ifj_fe_fej_to_ei_v3.py",
    "einsum": {
        "subscripts": LOOKUP[0],
        "index_to_length": json.loads(LOOKUP[1]),
        "args": json.loads(LOOKUP[2]),
        "arg_to_dtype": json.loads(LOOKUP[3]),
    },
    "long_dim_length": 100_000,
}
DEVICE = {
    "name": "NVIDIA H200 (SXM-5) v1.0@2GHz",
    "vendor": "NVIDIA Corporation",
    "driver_version": "580.159.03",
}


def _measurement(config, median_s=2e-4, **extra):
    return {
        "id": 7,
        "config": config,
        "median_s": median_s,
        "flop_count": 0.852e9,
        "versions": {},
        "created_at": datetime(2026, 7, 1, 17, 30, 5, tzinfo=UTC),
        **extra,
    }


def test_written_table_has_feinsums_exact_layout(tmp_path):
    path = tmp_path / "out.sqlite"
    fact = archive.fact_from_measurement(EINSUM_ARGS, _measurement({"n_i_tile": 3}), DEVICE)
    assert archive.write_facts(path, [fact]) == (1, 0)
    conn = sqlite3.connect(path)
    layout = [(r[1], r[2], r[5]) for r in conn.execute("PRAGMA table_info(FEINSUM_TIMING_FACTS)")]
    assert layout == FEINSUM_LAYOUT
    (ddl,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'FEINSUM_TIMING_FACTS'"
    ).fetchone()
    assert "ID INTEGER PRIMARY KEY AUTOINCREMENT" in ddl
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone()
    types = conn.execute(
        "SELECT typeof(ID), typeof(runtime_in_sec), typeof(timestamp) FROM FEINSUM_TIMING_FACTS"
    ).fetchone()
    assert types == ("integer", "real", "text")


def test_feinsums_lookups_find_exported_rows(tmp_path):
    path = tmp_path / "out.sqlite"
    config = {"n_e_per_wg_log2": 3, "nwork_items_per_e": 5, "n_i_tile": 2, "n_j_tile": [1, True]}
    fact = archive.fact_from_measurement(EINSUM_ARGS, _measurement(config), DEVICE)
    archive.write_facts(path, [fact])
    conn = sqlite3.connect(path)
    # feinsum's dump_device_name: ' ' '-' '(' ')' -> '_', '@' -> 'AT', '.' -> 'DOT'.
    device_name = "NVIDIA_H200__SXM_5__v1DOT0AT2GHz"
    rows = conn.execute(FEINSUM_QUERY, (*LOOKUP, device_name)).fetchall()
    assert rows == [
        (
            "ifj_fe_fej_to_ei_v3.py",
            json.dumps(config, sort_keys=True),
            2e-4,
            "NVIDIA Corporation-580.159.03",
            '{"float64": 0.852}',
        )
    ]
    params = '{"n_e_per_wg_log2": 3, "n_i_tile": 2, "n_j_tile": [1, true], "nwork_items_per_e": 5}'
    tuner = conn.execute(
        FEINSUM_TUNER_QUERY, (*LOOKUP, params, '{"float64": 0.852}', device_name)
    ).fetchall()
    assert tuner == [(2e-4,)]
    # record_facts' timestamp: %Y_%m_%d_%H%M%S in Chicago time (17:30 UTC is 12:30 CDT).
    assert conn.execute("SELECT timestamp FROM FEINSUM_TIMING_FACTS").fetchone() == (
        "2026_07_01_123005",
    )


def test_recorded_canonical_form_wins_over_the_runs_spelling():
    args = {
        "space": "/home/me/space.py",
        "einsum": {
            "subscripts": "ifj,fe,fej -> ei",
            "index_to_length": {"i": 35, "f": 4, "j": 15},
            "args": [["L", "J", "v0"], ["L", "J", "v1"]],
            "arg_to_dtype": dict.fromkeys(["L", "J", "v0", "v1"], "float64"),
        },
        "long_dim_length": 100_000,
    }
    recorded = dict(
        zip(("subscripts", "index_to_length", "args", "arg_to_dtype"), LOOKUP, strict=True)
    )
    recorded.update(giga_op_info='{"float64": 1.0}', compiler_version="X-1", device_name="DEV")
    m = _measurement({"t": 1}, versions={archive.FACT_KEY: recorded})
    fact = archive.fact_from_measurement(args, m, DEVICE)
    assert (fact.subscripts, fact.index_to_length, fact.args, fact.arg_to_dtype) == LOOKUP
    assert (fact.giga_op_info, fact.compiler_version, fact.device_name) == (
        '{"float64": 1.0}',
        "X-1",
        "DEV",
    )
    # A user module is named by its path, as feinsum names modules outside its impls.
    assert fact.transform_id == "/home/me/space.py"


def test_uncanonical_einsum_without_record_cannot_be_exported_without_feinsum():
    from tunefleet.feinsum_support.spaces import feinsum_installed

    if feinsum_installed():
        pytest.skip("feinsum is installed here: it canonicalises")
    args = {**EINSUM_ARGS, "einsum": {**EINSUM_ARGS["einsum"], "arg_to_dtype": {}}}
    args["einsum"] = {
        "subscripts": "ij,j -> i",
        "index_to_length": {"j": 4},
        "args": [["A", "x"]],
        "arg_to_dtype": {"A": "float64", "x": "float64"},
    }
    with pytest.raises(ArchiveError, match="not in feinsum's canonical form"):
        archive.fact_from_measurement(args, _measurement({"t": 1}), DEVICE)


def test_writing_twice_skips_identical_rows(tmp_path):
    path = tmp_path / "out.sqlite"
    facts = [
        archive.fact_from_measurement(EINSUM_ARGS, _measurement({"t": k}), DEVICE) for k in range(3)
    ]
    assert archive.write_facts(path, facts) == (3, 0)
    assert archive.write_facts(path, facts) == (0, 3)
    assert archive.read_facts(path) == facts


def test_writing_into_a_non_archive_changes_nothing(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"definitely not sqlite" * 100)
    fact = archive.fact_from_measurement(EINSUM_ARGS, _measurement({"t": 1}), DEVICE)
    with pytest.raises(ArchiveError, match="not an SQLite database"):
        archive.write_facts(junk, [fact])
    assert junk.read_bytes() == b"definitely not sqlite" * 100
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE FEINSUM_TIMING_FACTS (ID INTEGER PRIMARY KEY, use_matrix TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(ArchiveError, match="lacks column"):
        archive.write_facts(other, [fact])
    conn = sqlite3.connect(other)
    assert conn.execute("SELECT count(*) FROM FEINSUM_TIMING_FACTS").fetchone() == (0,)


def test_device_names_and_timestamps_round_trip():
    dev = archive.device_from_archive("NVIDIA_TITAN_V", "NVIDIA Corporation-3.0-rc2")
    assert (dev.name, dev.vendor, dev.driver_version) == (
        "NVIDIA TITAN V",
        "NVIDIA Corporation",
        "3.0-rc2",
    )
    assert dev.device_class == "nvidia-titan-v"
    assert archive.device_from_archive("Tesla_V100_SXM2_16GB", "x").device_class == (
        "tesla-v100-sxm2-16gb"
    )
    moment = archive.parse_timestamp("2023_02_06_115445")
    assert moment is not None and archive.format_timestamp(moment) == "2023_02_06_115445"
    assert archive.parse_timestamp("yesterday") is None
