"""End to end in headless Chromium: the real app, a real SQLite database, a real profile.

One server and one browser for the module; every wait is on a selector or a condition.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

import pytest
from webhelpers import T0, XSS, expected, fleet_rows
from werkzeug.serving import make_server

from collector.store import Store

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WINDOW = f"from={T0}&to={T0 + 3600}"
TIMEOUT = 30_000  # ms: the machine is shared, so be patient rather than flaky


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """The web app on a free port over a SQLite file holding the test fleet."""
    from webui import create_app

    url = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'fleetflame.db'}"
    store = Store(url)
    store.migrate()
    store.write(fleet_rows())
    store.close()
    app = create_app({"DATABASE_URL": url})
    httpd = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        thread.join(timeout=10)
        httpd.server_close()
        app.extensions["fleetflame_db"].close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.errors, page.dialogs = errors, dialogs
    yield page
    context.close()
    assert errors == [], f"JavaScript errors: {errors}"


def open_view(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-state=ready]")


def frame(page, name: str):
    return page.locator("#chart g.frame").filter(
        has=page.locator(f"xpath=self::*[@name={xpath_literal(name)}]")
    )


def xpath_literal(text: str) -> str:
    if "'" not in text:
        return f"'{text}'"
    return "concat('" + "', \"'\", '".join(text.split("'")) + "')"


def query(page) -> dict[str, list[str]]:
    return parse_qs(urlparse(page.url).query)


def total(page) -> int:
    text = page.text_content("#summary")
    return int(re.match(r"([\d,]+) samples", text).group(1).replace(",", ""))


def test_flamegraph_frames_are_drawn(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    assert total(page) == sum(expected().values())
    page.wait_for_function(
        "() => [...document.querySelectorAll('#chart .d3-flame-graph-label')]"
        ".some(div => div.textContent === 'app:handle')"
    )
    frames = page.locator("#chart svg g.frame")
    assert frames.count() >= 10
    assert page.locator("#chart svg g.frame rect").count() == frames.count()
    assert page.locator("#top tbody tr").count() >= 5
    assert page.locator("#timeline .bar").count() == 60
    # Sorting the table by a header.
    page.click("#top th[data-key=total]")
    first = page.locator("#top tbody tr").first.locator("td").first.text_content()
    assert first in ("__main__:<module>", "all")


def test_the_graph_is_requested_once_from_the_page_head(server, page):
    requests: list[str] = []
    page.on("request", lambda request: requests.append(urlparse(request.url).path))
    open_view(page, f"{server}/?{WINDOW}&max_nodes=300")
    # One request, started by the preload link before any script ran, and taken by the
    # page's own fetch (a second request would mean the preload went unused).
    assert requests.count("/api/flamegraph") == 1 and requests.count("/api/timeline") == 1
    entries = page.evaluate(
        "performance.getEntriesByType('resource')"
        ".filter(e => e.name.includes('/api/flamegraph'))"
        ".map(e => [e.name, e.initiatorType])"
    )
    assert len(entries) == 1
    url, initiator = entries[0]
    assert initiator == "link" and "max_nodes=300" in url
    assert total(page) == sum(expected().values())


def test_an_empty_window_says_so(server, page):
    open_view(page, f"{server}/?from={T0 - 7200}&to={T0 - 3600}")
    assert "No samples" in page.text_content("#chart .empty")
    assert page.locator("#chart svg").count() == 0
    open_view(page, f"{server}/compare?{WINDOW}&a_label=version:9.9")
    assert "side A" in page.text_content("#chart .empty")


def test_search_highlights_with_share_of_total(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    page.fill("#search", "json")
    share = 480 / sum(expected().values())
    page.wait_for_function(
        "expected => document.getElementById('search-result').textContent.includes(expected)",
        arg=f"{share * 100:.2f}% of total",
    )
    highlighted = page.eval_on_selector_all(
        "#chart g.frame",
        "gs => gs.filter(g => g.querySelector('rect').getAttribute('fill') === '#E600E6').map(g => g.getAttribute('name'))",
    )
    assert highlighted == ["json:dumps"]
    assert query(page)["search"] == ["json"]
    page.fill("#search", "[unclosed")
    page.wait_for_function(
        "() => document.getElementById('search-result').textContent.startsWith('invalid regex')"
    )


def test_click_zooms_reset_and_shared_url_restores_focus(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    assert frame(page, "jobs:run").count() == 1
    frame(page, "app:handle").locator("rect").click()
    page.wait_for_function("() => !document.querySelector('#chart g.frame[name=\"jobs:run\"]')")
    assert query(page)["focus"] == ["__main__:<module>;app:serve;app:handle"]
    # A colleague opening the same URL sees the same zoom.
    shared = page.url
    open_view(page, shared)
    page.wait_for_selector("#chart g.frame[name='json:dumps']")
    assert frame(page, "jobs:run").count() == 0
    page.click("#reset-zoom")
    page.wait_for_selector("#chart g.frame[name='jobs:run']")
    assert "focus" not in query(page)
    # A row of the top-functions table focuses its function in the graph.
    page.locator("#top tbody tr", has_text="jobs:resize").click()
    page.wait_for_function("() => !document.querySelector('#chart g.frame[name=\"app:handle\"]')")
    assert query(page)["focus"] == ["__main__:<module>;jobs:run;jobs:resize"]


def test_dragging_on_the_timeline_selects_a_window(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    before = total(page)
    box = page.locator("#timeline .brush .overlay").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.25, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
    page.mouse.up()
    page.wait_for_function(f"() => !location.search.includes('from={T0}&')")
    page.wait_for_selector("body[data-state=ready]")
    page.wait_for_function(
        "before => !document.getElementById('summary').textContent.startsWith(before)",
        arg=f"{before:,}",
    )
    start, end = int(query(page)["from"][0]), int(query(page)["to"][0])
    assert T0 < start < end < T0 + 3600
    assert abs((start - T0) - 900) < 120 and abs((end - start) - 900) < 120
    assert 0 < total(page) < before


def test_compare_two_versions(server, page):
    open_view(
        page,
        f"{server}/compare?{WINDOW}&service=api&a_label=version:1.4.1&b_label=version:1.4.2",
    )
    page.wait_for_selector("#chart g.frame[name='app:render']")
    fills = page.eval_on_selector_all(
        "#chart g.frame",
        "gs => Object.fromEntries(gs.map(g => [g.getAttribute('name'), g.querySelector('rect').getAttribute('fill')]))",
    )

    def rgb(name):
        return tuple(int(v) for v in re.findall(r"\d+", fills[name]))

    render, dumps = rgb("app:render"), rgb("json:dumps")
    assert render[0] > render[2]  # red: more time in B (1.4.2)
    assert dumps[2] > dumps[0]  # blue: less
    assert "A: 600 samples" in page.text_content("#summary")
    rows = page.locator("#changes tbody tr")
    assert rows.count() >= 4
    assert page.input_value("#a_label") == "version:1.4.1"
    page.select_option("#layout", "sides")
    page.wait_for_selector("#chart-b g.frame[name='app:render']")
    assert page.locator("#chart-a g.frame").count() >= 5
    assert query(page)["layout"] == ["sides"]


def test_navigation_to_compare_keeps_nothing_broken(server, page):
    open_view(
        page, f"{server}/compare?a_from={T0}&a_to={T0 + 600}&b_from={T0 + 600}&b_to={T0 + 1200}"
    )
    page.wait_for_selector("#chart g.frame[name='jobs:resize']")
    assert page.locator("#changes tbody tr").count() >= 5


def test_hostile_frame_names_render_as_text(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    page.wait_for_function(
        "xss => [...document.querySelectorAll('#chart .d3-flame-graph-label')]"
        ".some(div => div.textContent === xss)",
        arg=XSS,
    )
    assert page.locator("img").count() == 0
    assert page.locator("#top td", has_text=XSS).count() == 1
    frame(page, XSS).locator("rect").hover()
    page.wait_for_function(
        "xss => [...document.querySelectorAll('.d3-flame-graph-tip')].some(t => t.textContent.includes(xss))",
        arg=XSS,
    )
    # A label value with a quote is offered as text too.
    page.select_option("#label-key", "route")
    assert page.locator("#label-value option", has_text='/up"load').count() == 1
    assert page.dialogs == []
    assert page.locator("img").count() == 0
