"""The dashboard in a real headless browser (Debian's Chromium over the DevTools protocol).

Each page is loaded from a dashboard connected as the reader role to a filled database; the
test waits for the page's own "drawn" mark and for the elements that carry the data, checks
them against the rows, and saves a screenshot that must not be blank. The live test changes
rows while a run's page is open and waits for the page to show them without a reload.
Skipped, with the reason, where Chromium is not installed.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.helpers.browser import CHROMIUM, Chromium, Page
from tests.helpers.roles import drop_roles, unique_prefix
from tests.helpers.runfill import CODE, Filled, add_done_trial, fill, module_database
from tunefleet.dashboard.server import DashboardServer
from tunefleet.dashboard.settings import DashboardSettings
from tunefleet.db.engine import connect
from tunefleet.db.roles import RolesSettings, setup_roles

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"{CHROMIUM} is not installed (Debian: apt-get install chromium); "
    "the dashboard's browser tests need it",
)

#: Generous: a loaded two-core machine may take seconds to start a browser or draw a page.
DEADLINE_S = 60.0
DRAWN = "document.body.dataset.ready === '1'"


@pytest.fixture(scope="module")
def filled_url(pg_admin_url: str, pg_template: str) -> Iterator[tuple[str, Filled]]:
    with module_database(pg_admin_url, pg_template, "dashboard_browser") as url:
        with psycopg.connect(url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
            filled = fill(conn)
        yield url, filled


@pytest.fixture(scope="module")
def server(
    filled_url: tuple[str, Filled], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DashboardServer]:
    url, _ = filled_url
    roles = RolesSettings(prefix=unique_prefix(), pgpass=tmp_path_factory.mktemp("roles") / "pg")
    setup_roles(url, roles)
    reader = make_conninfo(url, user=roles.role("reader"))
    # A short refresh keeps the live test quick; the page's logic is the same at any interval.
    s = DashboardServer(DashboardSettings(port=0, refresh_s=0.3), lambda: connect(reader))
    s.start()
    try:
        yield s
    finally:
        s.close()
        drop_roles(url, roles.prefix)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    base = tmp_path_factory.mktemp("chromium")
    b = Chromium(base / "profile", base / "chromium.log")
    try:
        b.send("Browser.getVersion", timeout=DEADLINE_S)  # answered once it is up
        yield b
    finally:
        b.close()


@pytest.fixture
def page(browser: Chromium) -> Iterator[Page]:
    p = browser.page()
    try:
        yield p
        assert p.exceptions() == [], "the page threw JavaScript exceptions"
    finally:
        p.close()


def base_url(server: DashboardServer) -> str:
    return f"http://localhost:{server.port}"


def open_page(page: Page, url: str) -> None:
    page.goto(url)
    page.wait_for(DRAWN, DEADLINE_S, f"{url} to be drawn")


def text(page: Page, selector: str) -> str:
    return str(page.evaluate(f"document.querySelector({json.dumps(selector)}).textContent"))


def check_screenshot(page: Page, path: Path, min_colours: int = 12) -> None:
    """Saves a full-page screenshot and checks it is a real picture: the page's size, and
    more distinct colours than a blank or one-colour page has."""
    from PIL import Image

    data = page.screenshot(path)
    image = Image.open(io.BytesIO(data)).convert("RGB")
    assert image.width >= 1280 and image.height >= 400, image.size
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) >= min_colours, f"{path}: looks blank"
    # Not one colour with specks: the commonest colour covers less than 97% of the pixels.
    assert max(c for c, _ in colours) < 0.97 * image.width * image.height, f"{path}: blank"


def test_runs_page_lists_every_run(server, filled_url, page, tmp_path):
    _, filled = filled_url
    open_page(page, base_url(server) + "/")
    rows = page.evaluate("[...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.id)")
    assert rows == [str(filled.gpu_run), str(filled.cpu_run)]
    cpu_row = f"#runs tbody tr[data-id='{filled.cpu_run}']"
    assert "running" in text(page, cpu_row) and f"{filled.best_gflops:.1f}" in text(page, cpu_row)
    check_screenshot(page, tmp_path / "runs.png")


def test_run_page_draws_counts_charts_table_and_failures(server, filled_url, page, tmp_path):
    _, filled = filled_url
    open_page(page, f"{base_url(server)}/runs/{filled.cpu_run}")
    assert text(page, "#count-invalid") == "2" and text(page, "#count-running") == "1"
    assert text(page, "#best-trial") == f"trial {filled.best_trial}"
    assert text(page, "#best-reproduce").startswith("tunefleet measure gemm")
    # Each chart drew its SVG: the step curve, the histogram's bars, the workers' rows.
    counts = page.evaluate(
        "({curve: document.querySelectorAll('#chart-time path.curve').length,"
        " bars: document.querySelectorAll('#chart-histogram rect.hbar').length,"
        " busy: document.querySelectorAll('#chart-timeline rect.busy').length,"
        " rows: document.querySelectorAll('#configurations tbody tr').length,"
        " reasons: document.querySelectorAll('#failures tbody tr').length})"
    )
    assert counts["curve"] == 1 and counts["bars"] >= 2 and counts["busy"] >= 2
    assert (counts["rows"], counts["reasons"]) == (filled.finished, 3)
    first = "#configurations tbody tr:first-child"
    assert page.evaluate(f"document.querySelector('{first}').dataset.id") == str(filled.best_trial)
    # Sorting by median time, slowest first, puts the slowest successful trial on top.
    page.evaluate("document.querySelector('#configurations th[data-sort=median_s]').click()")
    page.wait_for(
        "document.querySelector('#configurations th.sorted').dataset.sort === 'median_s'",
        DEADLINE_S,
        "the table sorted by median time",
    )
    page.evaluate("document.querySelector('#configurations th[data-sort=median_s]').click()")
    page.wait_for(
        "document.querySelector('#configurations th.sorted.desc[data-sort=median_s]')",
        DEADLINE_S,
        "the table sorted by median time, descending",
    )
    slowest = page.evaluate(f"document.querySelector('{first}').children[2].textContent")
    assert slowest == "3.50"
    check_screenshot(page, tmp_path / "run.png", min_colours=40)


def test_trial_panel_shows_the_generated_code_and_reproduce_command(
    server, filled_url, page, tmp_path
):
    _, filled = filled_url
    trial = filled.trials["done"][3]  # the fourth of the filled trials: its code is CODE % 3
    open_page(page, f"{base_url(server)}/runs/{filled.cpu_run}?trial={trial}")
    page.wait_for("document.querySelector('#trial-code')", DEADLINE_S, "the trial's code")
    assert text(page, "#trial-code") == CODE % 3
    assert text(page, "#trial-reproduce").startswith("tunefleet measure gemm --dtype float32")
    check_screenshot(page, tmp_path / "trial.png", min_colours=40)


def test_fleet_page_lists_the_workers(server, filled_url, page, tmp_path):
    _, filled = filled_url
    open_page(page, base_url(server) + "/fleet")
    rows = page.evaluate(
        "[...document.querySelectorAll('#workers tbody tr')].map(r => r.dataset.id)"
    )
    assert sorted(rows) == sorted(str(w) for w in filled.workers)
    busy = f"#workers tbody tr[data-id='{filled.workers[1]}']"
    assert "busy" in text(page, busy) and f"#{filled.cpu_run}" in text(page, busy)
    check_screenshot(page, tmp_path / "fleet.png")


def test_a_bad_run_id_is_a_404_page(server, page):
    page.goto(f"{base_url(server)}/runs/424242")
    page.wait_for("document.querySelector('main.error h1')", DEADLINE_S, "the 404 page")
    assert text(page, "main.error h1") == "404 Not Found"
    assert "run 424242 does not exist" in text(page, "main.error p")


def test_a_running_run_updates_itself_without_a_reload(server, filled_url, page, tmp_path):
    url, filled = filled_url
    open_page(page, f"{base_url(server)}/runs/{filled.cpu_run}")
    before = int(text(page, "#count-finished"))
    rows_before = page.evaluate("document.querySelectorAll('#configurations tbody tr').length")
    page.evaluate("window.stillTheSameDocument = true")
    with psycopg.connect(url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        new = add_done_trial(conn, filled, gflops=20.0, n=100 + before)
    page.wait_for(
        f"document.querySelector('#count-finished').textContent === '{before + 1}'",
        DEADLINE_S,
        "the finished count to go up by one",
    )
    page.wait_for(
        f"document.querySelector('#best-trial').textContent === 'trial {new}'"
        f" && document.querySelectorAll('#configurations tbody tr').length === {rows_before + 1}",
        DEADLINE_S,
        "the new best trial in the best box and the table",
    )
    assert text(page, "#best-gflops") == "20.0 (unconfirmed)"  # measured once so far
    assert page.evaluate("window.stillTheSameDocument === true")  # no reload happened
    check_screenshot(page, tmp_path / "live.png", min_colours=40)
