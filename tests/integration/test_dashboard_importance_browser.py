"""The run page's importance views in a real headless Chromium (as the other page tests):
the ranking (bars and table), speed per value (a box per measured value), and the top
configurations against the rest (parallel coordinates), on a run whose time depends on tile
and order only (unroll=8 invalid); then the forest and the cache-key scope, chosen on the page
and from its address. Skipped, with the reason, where Chromium is not installed."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.helpers.browser import CHROMIUM, Chromium, Page
from tests.helpers.importance_fill import insert_run, synthetic_trials
from tests.helpers.roles import drop_roles, unique_prefix
from tests.helpers.runfill import module_database
from tests.integration.test_dashboard_browser import check_screenshot
from tunefleet.dashboard.server import DashboardServer
from tunefleet.dashboard.settings import DashboardSettings
from tunefleet.db.engine import connect
from tunefleet.db.roles import RolesSettings, setup_roles

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"{CHROMIUM} is not installed (Debian: apt-get install chromium); "
    "the dashboard's browser tests need it",
)

#: Generous: a loaded two-core machine may take seconds to start a browser or fit a forest.
DEADLINE_S = 90.0
DRAWN = (
    "document.body.dataset.ready === '1' && document.querySelector('#importance').dataset.method"
)


@pytest.fixture(scope="module")
def runs(pg_admin_url: str, pg_template: str) -> Iterator[tuple[str, int, int]]:
    with module_database(pg_admin_url, pg_template, "importance_browser") as url:
        with psycopg.connect(url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
            trials = synthetic_trials(("tile", "order"), {"unroll": [8]}, seed=2)
            first = insert_run(conn, trials, name="all")
            second = insert_run(conn, trials[:40], name="again")
        yield url, first, second


@pytest.fixture(scope="module")
def server(runs, tmp_path_factory) -> Iterator[DashboardServer]:
    url = runs[0]
    roles = RolesSettings(prefix=unique_prefix(), pgpass=tmp_path_factory.mktemp("roles") / "pg")
    setup_roles(url, roles)
    reader = make_conninfo(url, user=roles.role("reader"))
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
        b.send("Browser.getVersion", timeout=DEADLINE_S)
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


def open_run(page: Page, server: DashboardServer, run: int, query: str = "") -> None:
    page.goto(f"http://localhost:{server.port}/runs/{run}{query}")
    page.wait_for(DRAWN, DEADLINE_S, f"run {run}'s importance to be drawn")


def ranking(page: Page) -> list[str]:
    return list(
        page.evaluate(
            "[...document.querySelectorAll('#importance tbody tr')].map(r => r.dataset.id)"
        )
    )


def choose(page: Page, name: str, value: str) -> None:
    page.evaluate(
        f"(() => {{ const s = document.querySelector('#importance-{name}');"
        f" s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change')); }})()"
    )


def test_the_run_page_draws_the_ranking_slices_and_parallel_coordinates(
    server, runs, page, tmp_path
):
    _, first, _ = runs
    open_run(page, server, first)
    assert page.evaluate("document.querySelector('#importance').dataset.method") == "variance"
    assert set(ranking(page)[:2]) == {"tile", "order"}
    drawn = page.evaluate(
        "({speed: document.querySelectorAll('#importance rect.imp-speed').length,"
        " validity: document.querySelectorAll('#importance rect.imp-validity').length,"
        " slices: [...document.querySelectorAll('#slices .slice')].map(s => s.dataset.param),"
        " unrollBoxes: document.querySelectorAll('#slices .slice[data-param=unroll] g.box').length,"
        " tileBoxes: document.querySelectorAll('#slices .slice[data-param=tile] g.box').length,"
        " top: document.querySelectorAll('#parallel .pc-top path').length,"
        " rest: document.querySelectorAll('#parallel .pc-rest path').length,"
        " axes: document.querySelectorAll('#parallel .pc-name').length})"
    )
    assert (drawn["speed"], drawn["validity"]) == (4, 4)
    assert drawn["slices"] == ranking(page)  # one per parameter, most important first
    # unroll=8 is never measured (invalid): seven boxes of eight values; tile has all eight.
    assert (drawn["unrollBoxes"], drawn["tileBoxes"]) == (7, 8)
    assert drawn["top"] == 10 and drawn["rest"] == 400 and drawn["axes"] == 5
    summary = page.evaluate("document.querySelector('#importance-summary').textContent")
    assert summary.startswith("512 finished configurations of this run: 448 measured, 64 invalid")
    # The failure rate of unroll=8 is under its value, in the validity colour.
    fails = page.evaluate(
        "[...document.querySelectorAll('#slices .slice[data-param=unroll] text.fail')]"
        ".map(t => t.dataset.rate)"
    )
    assert fails == ["100%"]
    check_screenshot(page, tmp_path / "importance.png", min_colours=40)


def test_the_forest_and_the_cache_key_are_chosen_on_the_page(server, runs, page, tmp_path):
    _, first, second = runs
    open_run(page, server, second)
    choose(page, "method", "forest")
    page.wait_for(
        "document.querySelector('#importance').dataset.method === 'forest'",
        DEADLINE_S,
        "the forest's ranking",
    )
    headers = page.evaluate(
        "[...document.querySelectorAll('#importance th')].map(h => h.textContent)"
    )
    assert "Speed (forest)" in headers
    assert "out-of-bag R²" in page.evaluate(
        "document.querySelector('#importance-summary').textContent"
    )
    choose(page, "scope", "key")
    page.wait_for(
        "document.querySelector('#importance-summary').textContent.includes("
        f"'runs #{first}, #{second} (every run of this cache key)')",
        DEADLINE_S,
        "the ranking of every run of the cache key",
    )
    assert set(ranking(page)[:2]) == {"tile", "order"}
    assert "scope=key" in page.evaluate("location.search")
    check_screenshot(page, tmp_path / "forest.png", min_colours=40)


def test_the_choices_come_from_the_address(server, runs, page):
    second = runs[2]
    open_run(page, server, second, "?scope=key&method=forest")
    page.wait_for(
        "document.querySelector('#importance').dataset.method === 'forest'",
        DEADLINE_S,
        "the forest's ranking",
    )
    assert page.evaluate("document.querySelector('#importance-scope').value") == "key"
    text = page.evaluate("document.querySelector('#importance-summary').textContent")
    assert text.startswith("512 finished configurations of runs")
