"""``tunefleet dashboard`` against a filled database, connected as the reader role only.

``runfill.fill`` writes two runs the way a fleet would (trials in every state, measurements,
code, three workers); one worker stands aside from the CPU run. The dashboard is served from
a thread of this process with connections of the reader role (SELECT on the views, nothing
else), and every check reads what it answers over real HTTP.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.helpers.roles import drop_roles, unique_prefix
from tests.helpers.runfill import ARGS, CODE, Filled, fill, module_database
from tunefleet.dashboard.server import DashboardServer
from tunefleet.dashboard.settings import DashboardSettings
from tunefleet.db.engine import connect
from tunefleet.db.roles import RolesSettings, setup_roles

TOKEN = "a-token-of-some-length-0123"


@pytest.fixture(scope="module")
def dash_url(pg_admin_url: str, pg_template: str) -> Iterator[str]:
    with module_database(pg_admin_url, pg_template, "dashboard") as url:
        yield url


@pytest.fixture(scope="module")
def filled(dash_url: str) -> Filled:
    with psycopg.connect(dash_url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        f = fill(conn)
        # The first CPU worker cannot run the CPU run's problem: it stands aside from it.
        conn.execute(
            "INSERT INTO tunefleet.stand_aside (worker_id, run_id, reason) VALUES (%s, %s, %s)",
            (f.workers[0], f.cpu_run, "problem gemm does not import: No module named 'loopy'"),
        )
        return f


@pytest.fixture
def alive(dash_url: str, filled: Filled) -> None:
    """The filled workers' heartbeats made fresh: the module's other tests (processes among
    them) can outlast the 60 s that a heartbeat keeps a worker alive."""
    with psycopg.connect(dash_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE tunefleet.worker SET heartbeat_at = now() WHERE id = ANY(%s)",
            (list(filled.workers),),
        )


@pytest.fixture(scope="module")
def reader_url(
    dash_url: str, filled: Filled, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    settings = RolesSettings(
        prefix=unique_prefix(), pgpass=tmp_path_factory.mktemp("roles") / "pgpass"
    )
    setup_roles(dash_url, settings)
    try:
        yield make_conninfo(dash_url, user=settings.role("reader"))
    finally:
        drop_roles(dash_url, settings.prefix)


@pytest.fixture(scope="module")
def server(reader_url: str) -> Iterator[DashboardServer]:
    s = DashboardServer(DashboardSettings(port=0), lambda: connect(reader_url)).start()
    try:
        yield s
    finally:
        s.close()


def request(
    server: DashboardServer,
    path: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def get_json(server: DashboardServer, path: str, status: int = 200) -> Any:
    code, headers, body = request(server, path)
    assert code == status, body
    assert headers["content-type"] == "application/json"
    return json.loads(body)


# --- the JSON API ------------------------------------------------------------------------


def test_runs_lists_both_runs_with_progress_best_and_live_workers(server, filled, alive):
    runs = {r["run_id"]: r for r in get_json(server, "/api/runs")["runs"]}
    assert list(runs) == [filled.gpu_run, filled.cpu_run]  # newest first
    cpu = runs[filled.cpu_run]
    counts = {k: cpu[k] for k in ("done", "invalid", "failed", "timed_out", "running")}
    assert counts == {"done": 6, "invalid": 2, "failed": 1, "timed_out": 1, "running": 1}
    assert (cpu["pending"], cpu["cancelled"], cpu["trials"]) == (2, 1, 14)
    assert cpu["best_gflops"] == filled.best_gflops
    assert cpu["run_state"] == "running" and cpu["max_trials"] == 40
    assert cpu["problem_args"] == ARGS
    # Two live CPU workers, one of which stands aside from this run.
    assert (cpu["live_workers"], cpu["standing_aside"]) == (1, 1)
    assert cpu["evaluations_per_minute"] == pytest.approx(10 / cpu["elapsed_s"] * 60, rel=1e-3)
    gpu = runs[filled.gpu_run]
    assert (gpu["run_state"], gpu["done"], gpu["best_gflops"]) == ("finished", 3, 410.0)


def test_one_run_has_its_best_configuration_and_its_reproduce_command(server, filled):
    assert get_json(server, f"/api/runs/{filled.cpu_run}")["run"]["run_id"] == filled.cpu_run
    best = get_json(server, f"/api/runs/{filled.cpu_run}/best")["best"]
    assert (best["trial_id"], best["gflops"]) == (filled.best_trial, filled.best_gflops)
    assert best["reproduce"] == (
        "tunefleet measure gemm --dtype float32 --size n=256 "
        f"--config '{json.dumps(best['config'], sort_keys=True, separators=(',', ':'))}' "
        "--device 'pthread-Intel(R) Xeon(R) Processor'"
    )


def test_charts_are_shaped_by_the_database(server, filled):
    c = get_json(server, f"/api/runs/{filled.cpu_run}/charts")
    # The six done trials finish at 30, 55, 80, 105, 130, 155 s with GFLOP/s 3.5, 7.25, 5,
    # 12.5, 9, 11: the best rises at the 1st, 2nd and 4th evaluation only.
    assert [(p["n"], p["gflops"]) for p in c["best_so_far"]] == [(1, 3.5), (2, 7.25), (4, 12.5)]
    assert [p["elapsed_s"] for p in c["best_so_far"]] == pytest.approx([30, 55, 105])
    bins = c["histogram"]
    assert len(bins) == 30 and sum(b["trials"] for b in bins) == 6
    assert (bins[0]["low"], bins[-1]["high"]) == pytest.approx((3.5, 12.5))
    assert (bins[0]["trials"], bins[-1]["trials"]) == (1, 1)  # the slowest and the fastest
    # Worker 1 held three 20 s trials and four 5 s failures; worker 2 three 20 s trials and
    # the running one (up to now): the bins draw the held time over the run's span.
    t = get_json(server, f"/api/runs/{filled.cpu_run}/timeline")
    timeline = {w["worker_id"]: w for w in t["timeline"]}
    w1, w2 = (timeline[str(w)] for w in filled.workers[:2])
    assert (w1["host"], w2["host"]) == ("node-a", "node-b")
    assert w1["held_s"] == pytest.approx(80.0)
    assert sum(w1["busy"]) * w1["span_s"] / t["timeline_bins"] == pytest.approx(80.0, rel=1e-6)
    assert len(w1["busy"]) == t["timeline_bins"] and max(w1["busy"]) <= 1.0
    assert w2["held_s"] > 60.0 + 300  # the running trial counts up to now
    assert str(filled.workers[2]) not in timeline  # the GPU worker never served this run
    assert [(f["state"], f["trials"]) for f in c["failures"]] == [
        ("invalid", 2),
        ("failed", 1),
        ("timed_out", 1),
    ]
    assert c["failures"][0]["error"] == "work-group size 512 exceeds the device limit 256"


def test_configuration_table_sorts_and_pages(server, filled):
    path = f"/api/runs/{filled.cpu_run}/trials"
    data = get_json(server, path)
    assert data["total"] == filled.finished == 10
    speeds = [t["gflops"] for t in data["trials"]]
    assert speeds[:6] == sorted(speeds[:6], reverse=True) == [12.5, 11.0, 9.0, 7.25, 5.0, 3.5]
    assert speeds[6:] == [None] * 4  # failures have no speed: last
    asc = get_json(server, path + "?sort=median_s&order=asc&limit=2&offset=1")
    assert [t["gflops"] for t in asc["trials"]] == [11.0, 9.0]  # fastest time = most GFLOP/s
    by_id = get_json(server, path + "?sort=trial_id&order=asc")
    ids = [t["trial_id"] for t in by_id["trials"]]
    assert ids == sorted(ids) and len(ids) == 10


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("sort=code", "sort='code'"),
        ("sort=gflops;drop", "sort='gflops;drop'"),
        ("order=sideways", "order='sideways'"),
        ("limit=0", "limit='0'"),
        ("limit=501", "limit='501'"),
        ("offset=-1", "offset='-1'"),
    ],
)
def test_bad_table_parameters_are_a_400_naming_them(server, filled, query, names):
    data = get_json(server, f"/api/runs/{filled.cpu_run}/trials?{query}", status=400)
    assert names in data["error"]


def test_one_trial_has_its_samples_code_and_reproduce_command(server, filled):
    data = get_json(server, f"/api/runs/{filled.cpu_run}/trials/{filled.best_trial}")
    t = data["trial"]
    assert (t["trial_id"], t["state"], t["gflops"]) == (filled.best_trial, "done", 12.5)
    assert t["code"] == CODE % 3 and len(t["samples_s"]) == 5
    assert data["reproduce"].startswith("tunefleet measure gemm --dtype float32 --size n=256")
    running = filled.trials["running"][0]
    t = get_json(server, f"/api/runs/{filled.cpu_run}/trials/{running}")["trial"]
    assert (t["state"], t["gflops"], t["worker_id"]) == ("running", None, str(filled.workers[1]))


def test_fleet_shows_workers_what_they_hold_serve_and_stand_aside_from(server, filled, alive):
    data = get_json(server, "/api/fleet")
    workers = {w["worker_id"]: w for w in data["workers"]}
    w1, w2, w3 = (workers[str(w)] for w in filled.workers)
    assert all(w["alive"] and w["state"] == "active" for w in (w1, w2, w3))
    assert (w2["holding"], w2["current_trial"], w2["holding_runs"]) == (
        1,
        filled.trials["running"][0],
        [filled.cpu_run],
    )
    assert (w1["holding"], w1["holding_runs"]) == (0, [])
    assert w1["serves"] == [] and [a["run_id"] for a in w1["stands_aside"]] == [filled.cpu_run]
    assert "No module named 'loopy'" in w1["stands_aside"][0]["reason"]
    assert w2["serves"] == [filled.cpu_run] and w2["stands_aside"] == []
    assert w3["serves"] == []  # its class's only run has finished
    assert (w3["device_name"], w3["host"]) == ("NVIDIA H200", "gpu-node")
    assert "secret_hash" not in w1


# --- bad requests: 404, 405, never a traceback --------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/999999",
        "/api/runs/999999/charts",
        "/api/runs/999999/best",
        "/api/runs/999999/timeline",
        "/api/runs/999999/trials",
        "/api/runs/0",
        "/api/runs/abc",
        "/api/runs/99999999999999999999",  # beyond bigint
        "/api/runs/1%27%20OR%201=1",
        "/api/nothing",
    ],
)
def test_a_bad_run_id_or_path_under_api_is_a_json_404(server, path):
    data = get_json(server, path, status=404)
    assert "error" in data and "Traceback" not in data["error"]


def test_a_trial_of_another_run_is_a_404_naming_both(server, filled, dash_url):
    with psycopg.connect(dash_url) as conn:
        gpu_trial = conn.execute(
            "SELECT min(id) FROM tunefleet.trial WHERE run_id = %s", (filled.gpu_run,)
        ).fetchone()[0]  # type: ignore[index]
    data = get_json(server, f"/api/runs/{filled.cpu_run}/trials/{gpu_trial}", status=404)
    assert data["error"] == f"run {filled.cpu_run} has no trial {gpu_trial}"


@pytest.mark.parametrize("path", ["/runs/999999", "/runs/abc", "/static/nope.js", "/elsewhere"])
def test_a_bad_page_is_an_html_404(server, path):
    code, headers, body = request(server, path)
    assert code == 404 and headers["content-type"].startswith("text/html")
    assert b"404 Not Found" in body and b"Traceback" not in body


def test_pages_and_assets_are_served_from_the_package(server, filled):
    for path in ("/", f"/runs/{filled.cpu_run}", "/fleet"):
        code, headers, body = request(server, path)
        assert code == 200 and headers["content-type"].startswith("text/html")
        assert b'<script src="/static/app.js"></script>' in body
        assert b'content="2"' in body  # the refresh interval reached the page
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        code, headers, body = request(server, f"/static/{name}")
        assert code == 200 and headers["content-type"].startswith(kind) and len(body) > 1000
        # Nothing is fetched from elsewhere (the SVG namespace is a name, not an address).
        own = body.replace(b"http://www.w3.org/2000/svg", b"")
        assert b"http://" not in own and b"https://" not in own and b"//cdn" not in own


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_every_writing_method_is_refused(server, filled, method, dash_url):
    code, headers, body = request(server, f"/api/runs/{filled.cpu_run}", method=method)
    assert code == 405 and headers["allow"] == "GET, HEAD"
    assert "read-only" in json.loads(body)["error"]


# --- the reader role, and read-only sessions ---------------------------------------------


def test_the_dashboard_s_connections_can_read_views_only_and_write_nothing(
    server, filled, dash_url
):
    """The pool's connections are the reader role's: the tables behind the views are closed
    to them and every write fails, so everything above was answered from views alone."""
    with psycopg.connect(dash_url) as admin:
        before = admin.execute("SELECT count(*), max(state) FROM tunefleet.trial").fetchone()
    with server.pool.connection() as conn:
        for statement in (
            "SELECT * FROM tunefleet.trial LIMIT 1",
            "UPDATE tunefleet.run SET state = 'stopped'",
            "DELETE FROM tunefleet.trial",
            "INSERT INTO tunefleet.stand_aside (worker_id, run_id, reason) "
            "SELECT worker_id, run_id, 'x' FROM tunefleet.standing_aside",
            "SELECT tunefleet.reap_expired_leases(1)",
        ):
            with pytest.raises(
                (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction)
            ):
                conn.execute(statement)
        assert conn.execute("SELECT current_setting('transaction_read_only')").fetchone() == {
            "current_setting": "on"
        }
    with psycopg.connect(dash_url) as admin:
        assert admin.execute("SELECT count(*), max(state) FROM tunefleet.trial").fetchone() == (
            before
        )


def test_even_an_administrator_s_url_cannot_write_through_the_dashboard(dash_url, filled):
    s = DashboardServer(DashboardSettings(port=0), lambda: connect(dash_url))
    try:
        with s.pool.connection() as conn, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("UPDATE tunefleet.run SET name = 'changed'")
    finally:
        s.close()
    with psycopg.connect(dash_url) as admin:
        names = admin.execute("SELECT count(*) FROM tunefleet.run WHERE name = 'changed'")
        assert names.fetchone() == (0,)


def test_an_unreachable_database_is_a_503_with_its_reason(filled):
    dead = "postgresql://nobody@127.0.0.1:1/nothing"
    s = DashboardServer(DashboardSettings(port=0), lambda: connect(dead)).start()
    try:
        data = get_json(s, "/api/runs", status=503)
        assert data["error"].startswith("cannot connect to the database at 127.0.0.1:1/nothing")
    finally:
        s.close()


# --- access: token and Host --------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(reader_url: str) -> Iterator[DashboardServer]:
    s = DashboardServer(DashboardSettings(port=0, token=TOKEN), lambda: connect(reader_url)).start()
    try:
        yield s
    finally:
        s.close()


def test_with_a_token_every_request_needs_it(guarded, filled):
    for path in ("/api/runs", "/", f"/runs/{filled.cpu_run}", "/static/app.js"):
        assert request(guarded, path)[0] == 401
    assert request(guarded, "/api/runs", headers={"Authorization": "Bearer wrong-token"})[0] == 401
    assert request(guarded, "/api/runs", headers={"Cookie": "tunefleet_token=nope"})[0] == 401
    code, _, body = request(guarded, "/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert code == 200 and len(json.loads(body)["runs"]) == 2
    code, _, _ = request(guarded, "/api/fleet", headers={"Cookie": f"tunefleet_token={TOKEN}"})
    assert code == 200


def test_a_token_in_the_address_becomes_a_cookie_and_leaves_the_address(guarded, filled):
    code, headers, _ = request(guarded, f"/runs/{filled.cpu_run}?trial=3&token={TOKEN}")
    assert code == 303
    assert headers["location"] == f"/runs/{filled.cpu_run}?trial=3"
    assert headers["set-cookie"].startswith(f"tunefleet_token={TOKEN}; ")
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]


def test_without_a_token_only_loopback_host_names_are_answered(server):
    code, _, body = request(server, "/api/runs", headers={"Host": "attacker.example:8750"})
    assert code == 403 and "localhost" in json.loads(body)["error"]
    assert request(server, "/api/runs", headers={"Host": "localhost:8750"})[0] == 200
    assert request(server, "/api/runs", headers={"Host": "[::1]:8750"})[0] == 200


# --- the command ---------------------------------------------------------------------------


def _background_shell_child() -> None:
    # What a non-interactive shell does to a command it starts with `&`: SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_the_command_serves_with_the_reader_role_and_stops_on_a_signal(
    reader_url, filled, cli_env, stop
):
    """Ctrl-C and SIGTERM both stop it cleanly, also when it was started with SIGINT
    ignored (in the background of a script)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunefleet", "dashboard", "--db", reader_url, "--port", "0"],
        env={**cli_env, "TUNEFLEET_DASHBOARD_REFRESH_S": "5"},
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_background_shell_child,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # blocks until it listens (or exits)
        assert line.startswith("tunefleet dashboard on http://127.0.0.1:"), line
        url = urlsplit(line.split()[3])
        assert url.port is not None
        conn = http.client.HTTPConnection("127.0.0.1", url.port, timeout=30)
        conn.request("GET", "/api/runs")
        r = conn.getresponse()
        assert r.status == 200 and len(json.loads(r.read())["runs"]) == 2
        conn.request("GET", "/")
        assert b'content="5"' in conn.getresponse().read()  # from the environment
        conn.close()
        proc.send_signal(stop)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_command_refuses_a_port_in_use_in_one_line(server, reader_url, cli, cli_env):
    err = cli.fails("dashboard", "--db", reader_url, "--port", str(server.port), code=2)
    assert f"cannot listen on 127.0.0.1 port {server.port}" in err
    assert len(err.strip().splitlines()) == 1


def test_status_the_plot_and_the_dashboard_say_one_busy_share(server, filled, dash_url):
    """One definition of busy (tunefleet.busy) behind every report of one recorded run:
    status's BUSY column, the plot's lane labels and the dashboard's timeline agree."""
    from tunefleet.busy import busy_shares
    from tunefleet.cli.plot import lane_labels
    from tunefleet.queries import report
    from tunefleet.text.render import status_text

    with connect(dash_url) as conn:
        intervals = report.worker_intervals(conn, filled.cpu_run)
        status = status_text(conn, filled.cpu_run)
    shares = busy_shares(intervals)
    hosts = {str(iv["worker_id"]): iv["worker_host"] for iv in intervals}
    assert set(hosts.values()) == {"node-a", "node-b"}
    assert 0 < min(shares.values()) and max(shares.values()) <= 1
    labels = lane_labels(intervals)
    timeline = get_json(server, f"/api/runs/{filled.cpu_run}/timeline")["timeline"]
    dashboard = {w["worker_id"]: w["busy_share"] for w in timeline}
    table = status.split("\nworkers: ", 1)[1].splitlines()[1:]
    header = status.split("\nworkers: ", 1)[1].splitlines()[1]
    assert "BUSY" in header and "TIMING" in header  # the device's timing share is apart
    for worker, share in shares.items():
        pct = f"{100 * share:.0f}%"
        assert any(f"{hosts[worker]} pid" in lb and f"({pct} busy)" in lb for lb in labels)
        row = next(ln for ln in table if ln.startswith(worker[:8]))
        busy_cell = row[header.index("PREFETCH") + len("PREFETCH") : header.index("TIMING")]
        assert busy_cell.strip() == pct, (header, row)
        assert dashboard[worker] == pytest.approx(share)
