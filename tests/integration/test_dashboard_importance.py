"""The dashboard's importance answer (``/api/runs/RUN/importance``) over real HTTP, connected
as the reader role: a run of every synthetic configuration timed by an objective of tile and
order only (unroll=8 invalid), and a second run of the same cache key."""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.helpers.importance_fill import add_trial, insert_run, synthetic_trials
from tests.helpers.roles import drop_roles, unique_prefix
from tests.helpers.runfill import module_database
from tunefleet.dashboard.server import DashboardServer
from tunefleet.dashboard.settings import DashboardSettings
from tunefleet.db.engine import connect
from tunefleet.db.roles import RolesSettings, setup_roles


@pytest.fixture(scope="module")
def runs(pg_admin_url: str, pg_template: str) -> Iterator[tuple[str, int, int]]:
    with module_database(pg_admin_url, pg_template, "dash_importance") as url:
        with psycopg.connect(url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
            trials = synthetic_trials(("tile", "order"), {"unroll": [8]}, seed=1)
            first = insert_run(conn, trials[:300], name="first")
            second = insert_run(conn, trials[200:], name="second")  # 100 in common
        yield url, first, second


@pytest.fixture(scope="module")
def server(runs, tmp_path_factory) -> Iterator[DashboardServer]:
    url = runs[0]
    roles = RolesSettings(prefix=unique_prefix(), pgpass=tmp_path_factory.mktemp("roles") / "pg")
    setup_roles(url, roles)
    reader = make_conninfo(url, user=roles.role("reader"))
    s = DashboardServer(DashboardSettings(port=0), lambda: connect(reader)).start()
    try:
        yield s
    finally:
        s.close()
        drop_roles(url, roles.prefix)


def get(server: DashboardServer, path: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_the_run_s_importance_ranks_tile_and_order_first(server, runs):
    _, first, _ = runs
    code, data = get(server, f"/api/runs/{first}/importance")
    assert code == 200, data
    rep = data["importance"]
    assert data["forest_missing"] is None and rep["method"] == "variance"
    assert rep["scope"] == {"run_id": first, "all_runs": False, "runs": [first]}
    assert {p["name"] for p in rep["parameters"][:2]} == {"tile", "order"}
    assert rep["trials"] == 300 and rep["invalid"] == sum(
        v["invalid"] for v in rep["parameters"][0]["values"]
    )
    unroll = next(p for p in rep["parameters"] if p["name"] == "unroll")
    assert [v["fail_rate"] for v in unroll["values"]] == [0] * 7 + [1]
    assert len(rep["top"]["lines"]) == 10 and rep["top"]["order"][0] in ("tile", "order")


def test_the_cache_key_scope_counts_each_configuration_once(server, runs):
    _, first, second = runs
    code, data = get(server, f"/api/runs/{second}/importance?scope=key&top=3")
    assert code == 200, data
    rep = data["importance"]
    assert rep["scope"] == {"run_id": second, "all_runs": True, "runs": [first, second]}
    assert rep["trials"] == 512 and rep["top"]["n"] == 3


def test_the_forest_is_fitted_once_while_the_trials_stay_the_same(server, runs):
    _, first, _ = runs
    code, a = get(server, f"/api/runs/{first}/importance?method=forest")
    assert code == 200, a
    assert a["cached"] is False and a["importance"]["method"] == "forest"
    assert a["importance"]["forest"]["oob_r2"] > 0.8
    assert {p["name"] for p in a["importance"]["parameters"][:2]} == {"tile", "order"}
    code, b = get(server, f"/api/runs/{first}/importance?method=forest")
    assert code == 200 and b["cached"] is True and b["importance"] == a["importance"]


def test_without_scikit_learn_the_forest_answer_says_why(server, runs, monkeypatch):
    _, first, _ = runs
    monkeypatch.setitem(sys.modules, "sklearn", None)
    code, data = get(server, f"/api/runs/{first}/importance?method=forest")
    assert code == 200 and data["importance"] is None
    assert "pip install 'tunefleet[importance]'" in data["forest_missing"]
    code, data = get(server, f"/api/runs/{first}/importance")
    assert code == 200 and data["importance"]["method"] == "variance"
    assert "scikit-learn" in data["forest_missing"]


@pytest.mark.parametrize(
    ("query", "names"),
    [("scope=all", "scope='all'"), ("method=tree", "method='tree'"), ("top=0", "top='0'")],
)
def test_bad_parameters_are_a_400_naming_them(server, runs, query, names):
    code, data = get(server, f"/api/runs/{runs[1]}/importance?{query}")
    assert code == 400 and names in data["error"]


def test_a_run_that_does_not_exist_is_a_404(server):
    code, data = get(server, "/api/runs/424242/importance")
    assert code == 404 and "run 424242 does not exist" in data["error"]


def test_a_kept_report_is_computed_again_once_a_trial_finishes(server, runs):
    url = runs[0]
    with psycopg.connect(url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        trials = synthetic_trials(("tile",), seed=5)
        live = insert_run(conn, trials[:30], name="live", problem_args={"live": 1})
        path = f"/api/runs/{live}/importance"
        first = get(server, path)[1]
        again = get(server, path)[1]
        assert (first["cached"], again["cached"]) == (False, True)
        assert again["importance"] == first["importance"]
        config, _, _ = trials[30]
        new = add_trial(conn, live, config, 1e-6)  # the fastest of all
    after = get(server, path)[1]
    assert after["cached"] is False and after["importance"]["trials"] == 31
    assert after["importance"]["best"]["trial_id"] == new
