"""End to end in headless Chromium: the real app, a real SQLite database, a real profile.

One server and one browser for the module; every wait is on a selector or a condition.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlparse

import pytest
from webhelpers import (
    T0,
    TIMEOUT,
    XSS,
    expected,
    fleet_rows,
    frame,
    open_view,
    record_finding,
    record_slow_requests,
    record_stalls,
    serving,
    xpath_literal,
)

from collector.store import SampleRow, Store
from sampler.profile import shown_frame

pytestmark = pytest.mark.browser

WINDOW = f"from={T0}&to={T0 + 3600}"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """The web app on a free port over a SQLite file holding the test fleet."""

    url = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'fleetflame.db'}"
    store = Store(url)
    store.migrate()
    store.write(fleet_rows())
    store.close()
    record_finding(url, "app:render", T0 + 1800, T0 + 2100)
    # Stalls in three minutes: in the first, 10 of 60 to 150 ms and one of 2 s.
    first = [(T0 + 60 + i, 0.06 + 0.01 * i) for i in range(10)] + [(T0 + 75, 2.0)]
    record_stalls(url, [*first, (T0 + 600, 0.07), (T0 + 1500, 0.09), (T0 + 1510, 0.3)])
    # The fleet's one route: its slowest requests were mostly in json:dumps.
    slow = {
        "__main__:<module>;app:serve;app:handle;json:dumps": 9.0,
        "__main__:<module>;app:serve;app:handle;app:render": 1.0,
    }
    record_slow_requests(url, '/up"load', slow, [T0 + 60 * m for m in range(10)])
    with serving(url) as base:
        yield base


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
    # A 24-hour clock, as every time on the page: the hour after midnight is 00:mm, not 12:mm.
    ticks = page.locator("#timeline .tick text").all_text_contents()
    assert "00:30" in ticks and not any("M" in t or t.startswith("12:") for t in ticks), ticks
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


def drag_across(page, selector: str, start: float, end: float) -> None:
    """Drags the mouse across the element from ``start`` to ``end`` of its width, mid-height."""
    box = page.locator(selector).bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * start, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * end, y, steps=5)
    page.mouse.up()


def test_dragging_on_the_timeline_selects_a_window(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    before = total(page)
    drag_across(page, "#timeline .brush .overlay", 0.25, 0.5)
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


def test_the_compare_timeline_has_a_brush_per_side_and_a_drag_sets_one(server, page):
    sides = f"a_from={T0}&a_to={T0 + 600}&b_from={T0 + 1800}&b_to={T0 + 2400}"
    open_view(page, f"{server}/compare?{sides}")
    page.wait_for_selector("#timeline .brush-b .selection")
    a = page.locator("#timeline .brush-a .selection").bounding_box()
    b = page.locator("#timeline .brush-b .selection").bounding_box()
    # Each brush shows its side's 10 minutes: A before B, A above B.
    assert a["x"] + a["width"] <= b["x"] and abs(a["width"] - b["width"]) < 2
    assert a["y"] + a["height"] <= b["y"] + 1
    # A new window drawn in A's band, from half to 70% of the timeline (A's start to B's end,
    # 40 minutes), sets A only.
    drag_across(page, "#timeline .brush-a .overlay", 0.5, 0.7)
    page.wait_for_function(f"() => !location.search.includes('a_from={T0}&')")
    page.wait_for_selector("body[data-state=ready]")
    got = query(page)
    a_from, a_to = int(got["a_from"][0]), int(got["a_to"][0])
    assert abs(a_from - (T0 + 1200)) < 120 and abs(a_to - (T0 + 1680)) < 120
    assert got["b_from"] == [str(T0 + 1800)]  # B untouched


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
    summary = page.text_content("#summary")
    assert "A: 600 samples, read 2023-11-14 00:00:00 UTC → 2023-11-14 01:00:00 UTC" in summary
    rows = page.locator("#changes tbody tr")
    assert rows.count() >= 4
    assert page.input_value("#a_label") == "version:1.4.1"
    page.select_option("#layout", "sides")
    page.wait_for_selector("#chart-b g.frame[name='app:render']")
    assert page.locator("#chart-a g.frame").count() >= 5
    assert query(page)["layout"] == ["sides"]


def test_compare_says_which_changes_are_significant_and_greys_the_rest(server, page):
    open_view(
        page,
        f"{server}/compare?{WINDOW}&service=api&a_label=version:1.4.1&b_label=version:1.4.2",
    )
    page.wait_for_function(
        "() => document.getElementById('significance').textContent.includes('judged')"
    )
    summary = page.text_content("#significance")
    # render and dumps (self), handle (total: 9 in 10 in A, 10 in 11 in B).
    assert "3 significant changes among 5 judged" in summary, summary
    assert "60 A and 60 B replicates" in summary

    def row(name):
        return page.locator("#changes tbody tr").filter(
            has=page.locator(f"xpath=self::*[@title={xpath_literal(name)}]")
        )

    cells = row("app:render").locator("td")
    assert "significant" in cells.nth(3).get_attribute("class").split()
    assert cells.nth(5).inner_text() == "0e+0"  # q: the fleet's minutes do not vary at all
    # XSS's frame is in A only, 1 sample in 10: too rare to judge, so its change is greyed out.
    xss = shown_frame(XSS)
    assert row(xss).locator("td").nth(5).inner_text() == "too rare"
    assert "insignificant" in row(xss).locator("td").nth(3).get_attribute("class").split()

    def fill(name):
        return frame(page, name).locator("rect").get_attribute("fill")

    assert fill(xss) == "rgb(221,221,221)"
    assert fill("json:dumps") != "rgb(221,221,221)"
    page.uncheck("#significant-only")  # every change coloured, and the link says so
    page.wait_for_function(f"() => !{fill_js(xss)}.endsWith('221,221,221)')")
    assert query(page)["all_changes"] == ["1"]


def fill_js(name: str) -> str:
    """A JavaScript expression: the fill of the frame named ``name`` in the main chart."""
    return (
        f"[...document.querySelectorAll('#chart g.frame')].find(g => g.getAttribute('name') === "
        f"{json.dumps(name)}).querySelector('rect').getAttribute('fill')"
    )


def test_navigation_to_compare_keeps_nothing_broken(server, page):
    open_view(
        page, f"{server}/compare?a_from={T0}&a_to={T0 + 600}&b_from={T0 + 600}&b_to={T0 + 1200}"
    )
    page.wait_for_selector("#chart g.frame[name='jobs:resize']")
    assert page.locator("#changes tbody tr").count() >= 5


def test_hostile_frame_names_render_as_text(server, page):
    shown = shown_frame(XSS)  # the override written out as [U+202E]
    assert shown != XSS
    open_view(page, f"{server}/?{WINDOW}")
    page.wait_for_function(
        "shown => [...document.querySelectorAll('#chart .d3-flame-graph-label')]"
        ".some(div => div.textContent === shown)",
        arg=shown,
    )
    assert page.locator("img").count() == 0
    assert page.locator("#top td", has_text=shown).count() == 1
    frame(page, shown).locator("rect").hover()
    page.wait_for_function(
        "shown => [...document.querySelectorAll('.d3-flame-graph-tip')]"
        ".some(t => t.textContent.includes(shown))",
        arg=shown,
    )
    assert "\u202e" not in page.locator("body").inner_text()
    # A label value with a quote is offered as text too.
    page.select_option("#label-key", "route")
    assert page.locator("#label-value option", has_text='/up"load').count() == 1
    assert page.dialogs == []
    assert page.locator("img").count() == 0


def test_a_label_filter_without_a_value_is_not_added(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    page.select_option("#label-key", "route")
    page.select_option("#label-value", "")
    url = page.url
    page.click("#label-add")
    page.wait_for_function("() => document.getElementById('status').textContent.includes('value')")
    assert page.url == url and "label=" not in page.url


def test_the_export_links_download_files(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    with page.expect_download() as download:
        page.click("#export-folded")
    assert download.value.suggested_filename.endswith(".folded")


def test_an_error_replaces_the_graph_and_its_table(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    assert page.locator("#chart g.frame").count() > 0
    page.fill("#from", "nonsense")
    page.click("#apply")
    page.wait_for_selector("body[data-state=error]")
    assert page.locator("#chart g.frame").count() == 0  # nothing stale looks like an answer
    assert "nonsense" in page.locator("#chart").inner_text()
    assert page.locator("#top tbody tr").count() == 0
    assert page.locator("#summary").inner_text() == ""


def test_the_window_read_is_shown_and_its_link_is_absolute_and_aligned(server, page):
    # A window typed off the bucket edges reads whole buckets: the page says which, and its
    # link names them in ISO 8601 with the offset, so it draws the same graph whenever opened.
    open_view(page, f"{server}/?from={T0 - 30}&to={T0 + 3600 - 30}")
    summary = page.locator("#summary").inner_text()
    start = datetime.fromtimestamp(T0, timezone.utc).isoformat()
    end = datetime.fromtimestamp(T0 + 3600, timezone.utc).isoformat()
    assert f"window read {start} → {end}" in page.locator("#window-read").inner_text()
    href = page.locator("#permalink").get_attribute("href")
    query = parse_qs(urlparse(href).query)
    assert query["from"] == [start] and query["to"] == [end]
    open_view(page, f"{server}/{href}")
    assert page.locator("#summary").inner_text() == summary


def test_a_link_to_a_relative_window_opened_20_minutes_later_shows_the_same_window(
    server, page, monkeypatch
):
    # The server's clock at the fleet's minute 30, then 20 minutes later: "the last 15
    # minutes" moves with it, the page's link to the window read does not.
    import webui.api

    monkeypatch.setattr(webui.api, "_now", lambda: T0 + 1800)
    open_view(page, f"{server}/?from=-15m")
    read = page.locator("#window-read").inner_text()
    start = datetime.fromtimestamp(T0 + 900, timezone.utc).isoformat()
    assert start in read, read
    summary = page.locator("#summary").inner_text()
    href = page.locator("#permalink").get_attribute("href")
    monkeypatch.setattr(webui.api, "_now", lambda: T0 + 1800 + 1200)
    open_view(page, f"{server}/?from=-15m")
    assert page.locator("#window-read").inner_text() != read  # the relative one moved
    open_view(page, f"{server}/{href}")
    assert page.locator("#window-read").inner_text() == read
    assert page.locator("#summary").inner_text() == summary


def test_the_graph_reflows_when_the_window_is_resized(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    wide = page.locator("#chart svg").first.bounding_box()["width"]
    page.set_viewport_size({"width": 500, "height": 900})
    page.wait_for_function(
        "w => document.querySelector('#chart svg').getBoundingClientRect().width < w - 100",
        arg=wide,
    )


def test_a_selected_frame_shows_its_share_over_time(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    frame(page, "app:render").locator("rect").click()
    page.wait_for_selector("#series svg.series-chart path")
    assert "app:render" in page.locator("#series h3").inner_text()
    assert "no change point" in page.locator("#series").inner_text()


def test_left_heavy_puts_the_heaviest_child_first(server, page):
    def left(name):
        return frame(page, name).first.bounding_box()["x"]

    open_view(page, f"{server}/?{WINDOW}&service=api")
    light = shown_frame(XSS)  # 1 sample a minute, beside app:handle's 19
    page.select_option("#order", "heavy")
    page.wait_for_function("() => new URLSearchParams(location.search).get('order') === 'heavy'")
    page.wait_for_timeout(400)  # the redraw's transition
    assert left("app:handle") < left(light) and left("app:handle") < left("m:semi;colon")
    assert left("app:render") < left("json:dumps")  # 11 a minute against 8, under api


def test_one_time_zone_everywhere_utc_unless_chosen(server, browser):
    # A browser in Paris (UTC+1 in November): UTC by default everywhere, the inputs in ISO 8601
    # rather than the link's epoch seconds; once the browser's zone is chosen, every time on
    # the page (the window, the inputs) is shown in it, with its offset.
    context = browser.new_context(
        timezone_id="Europe/Paris", viewport={"width": 1280, "height": 900}
    )
    page = context.new_page()
    page.set_default_timeout(TIMEOUT)
    try:
        open_view(page, f"{server}/?{WINDOW}")
        utc = datetime.fromtimestamp(T0, timezone.utc)
        assert page.input_value("#from") == utc.isoformat()
        assert (
            page.locator("#window-text")
            .inner_text()
            .startswith(utc.strftime("%Y-%m-%d %H:%M:%S UTC"))
        )
        page.select_option("#timezone", "local")
        page.wait_for_selector("body[data-state=ready]")
        paris = utc.astimezone(timezone(timedelta(hours=1)))
        assert page.input_value("#from") == paris.isoformat()
        assert (
            page.locator("#window-text")
            .inner_text()
            .startswith(paris.strftime("%Y-%m-%d %H:%M:%S UTC+01:00"))
        )
        assert page.input_value("#timezone") == "local"
    finally:
        context.close()


def test_a_grafana_link_in_milliseconds_is_shown_and_applied_as_its_time(server, page):
    # Grafana's links give epoch milliseconds: the inputs showed the year 58880, and Apply
    # then sent that back (a 400).
    open_view(page, f"{server}/?from={T0 * 1000}&to={(T0 + 3600) * 1000}")
    assert page.input_value("#from") == datetime.fromtimestamp(T0, timezone.utc).isoformat()
    page.click("#apply")
    page.wait_for_selector("body[data-state=ready]")
    assert (
        page.locator("#window-text")
        .inner_text()
        .startswith(datetime.fromtimestamp(T0, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
    )


def test_compare_previous_version_in_one_click_colours_by_self_change(server, page):
    open_view(page, f"{server}/compare?{WINDOW}&service=api")
    page.click("#preset-version")
    page.wait_for_function(
        "() => new URLSearchParams(location.search).get('b_label') === 'version:1.4.2'"
    )
    page.wait_for_selector("body[data-state=ready]")
    assert "a_label=version%3A1.4.1" in page.url
    assert "±" in page.locator("#legend-scale").inner_text()

    # app:serve's own time did not change (it has none): it stays grey while its total moved;
    # app:render's own share grew (3/10 -> 8/11): red.
    def fill(name):
        return frame(page, name).locator("rect").get_attribute("fill")

    assert fill("app:serve") == "rgb(221,221,221)"
    red, green, blue = map(int, fill("app:render")[4:-1].split(","))
    assert red > 221 and blue < 221
    options = page.locator("#label-options option")
    assert "version:1.4.1" in [
        options.nth(i).get_attribute("value") for i in range(options.count())
    ]
    # A time preset after it compares times only: the sides' labels go.
    page.click("#compare-presets button[data-preset=previous]")
    page.wait_for_function("() => new URLSearchParams(location.search).get('a_from') === '-2h'")
    assert "a_label" not in query(page) and "b_label" not in query(page)
    assert page.input_value("#a_label") == "" and page.input_value("#b_label") == ""


def test_a_comparison_with_no_sides_set_says_both_are_the_same(server, page):
    open_view(page, f"{server}/compare?{WINDOW}")
    assert page.locator("#summary").inner_text().startswith("Both sides are the same window")
    open_view(page, f"{server}/compare?{WINDOW}&b_label=version:1.4.2")
    assert "Both sides" not in page.locator("#summary").inner_text()


def test_an_empty_side_says_so_and_lists_no_changes(server, page):
    open_view(page, f"{server}/compare?{WINDOW}&a_label=version:none&b_label=version:1.4.2")
    assert "No samples in side A" in page.locator("#chart").inner_text()
    assert page.locator("#changes tbody tr").count() == 0


def test_a_selected_frame_shows_its_sandwich(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    frame(page, "app:handle").locator("rect").click()
    page.wait_for_selector("#sandwich-callees g.frame[name='json:dumps']")
    assert page.locator("#sandwich-callers g.frame[name='app:serve']").count() == 1
    assert "Sandwich of app:handle" in page.locator("#sandwich h3").inner_text()


@pytest.mark.parametrize("width, height", [(1280, 800), (390, 844)])
def test_every_view_opens_on_the_graph_at_desktop_and_phone_sizes(
    server, browser, tmp_path, width, height
):
    # The graph (or the worst cases' first table) starts inside the first screen, without
    # scrolling; a screenshot of each is kept with the test's files.
    views = {
        "flamegraph": (f"/?{WINDOW}", "#chart svg"),
        "compare": (f"/compare?{WINDOW}&a_label=version:1.4.1&b_label=version:1.4.2", "#chart svg"),
        "worst": (f"/worst?{WINDOW}", ".table-box:has(#stalls)"),  # a wide table scrolls
    }
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT)
    try:
        for name, (path, graph) in views.items():
            open_view(page, server + path)
            if name == "compare":  # the graph is drawn again once the statistics come
                page.wait_for_function(
                    "() => document.getElementById('significance').textContent.includes('judged')"
                )
            box = page.locator(graph).first.bounding_box()
            assert box is not None and box["y"] + 40 < height, (name, box)
            assert box["x"] >= 0 and box["x"] + box["width"] <= width + 1, (name, box)
            page.screenshot(path=str(tmp_path / f"{name}-{width}x{height}.png"))
    finally:
        context.close()


def test_the_timeline_splits_by_a_label_and_a_value_filters(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    page.select_option("#split", "version")
    page.wait_for_selector("#split-legend button.split-value")
    assert page.locator("#timeline path.split-line").count() == 2
    page.locator("#split-legend button", has_text="1.4.1").click()
    page.wait_for_function("() => location.search.includes('label=version%3A1.4.1')")
    page.wait_for_selector("body[data-state=ready]")
    assert "jobs:resize" not in page.locator("#top").inner_text()  # 1.4.2 only runs jobs


def test_a_tooltip_gives_samples_seconds_and_percent(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    frame(page, "app:render").locator("rect").hover()
    # 660 samples at the fleet's 100 Hz: 6.6 s, 42.31% of the window's 1,560.
    page.wait_for_function(
        "() => [...document.querySelectorAll('.d3-flame-graph-tip')]"
        ".some(t => t.textContent.includes('660 samples = 6.6 s, 42.31% of total'))"
    )


def test_a_finding_links_to_its_function_over_time_with_its_window_marked(server, page):
    open_view(page, f"{server}/findings?{WINDOW}")
    assert "1 finding (click" in page.locator("#summary").inner_text()
    # The page's table shows all of its rows, not a box of a few to scroll.
    height = page.evaluate(
        "() => getComputedStyle(document.querySelector('#findings').closest('.table-box'))"
        ".maxHeight"
    )
    assert height == "none"
    assert "points" in page.locator("#findings th[data-key=change]").inner_text()
    row = page.locator("#findings tbody tr").first
    assert "app:render" in row.inner_text() and "+3.00 (2.50 to 3.50)" in row.inner_text()
    row.locator("a", has_text="over time").click()
    page.wait_for_selector("#series g.finding rect")
    assert query(page)["function"] == ["app:render"]
    note = page.locator("#series .findings-note").inner_text()
    assert "self share +3.00 points" in note and "version 1.4.1 -> 1.4.2" in note
    # The band spans the finding's B window, inside the chart.
    band = page.locator("#series g.finding rect").bounding_box()
    chart = page.locator("#series svg").bounding_box()
    assert band["width"] > 3 and chart["x"] < band["x"] < chart["x"] + chart["width"]


def test_a_deploy_near_the_charts_end_keeps_its_label_inside(tmp_path, page):
    # 1.4.2 deployed 58 minutes into the hour: the marker sits at the chart's right end, and
    # its label ("version 1.4.2") was drawn right of it, past the chart's edge.
    url = f"sqlite:///{tmp_path / 'deploy.db'}"
    store = Store(url)
    store.migrate()
    store.write(
        SampleRow(T0 + 60 * m, "cpu", "api", "h", "i", {"version": v}, "main;app:render", 10)
        for m in range(60)
        for v in ["1.4.1" if m < 58 else "1.4.2"]
    )
    store.close()
    with serving(url) as base:
        open_view(page, f"{base}/?from={T0}&to={T0 + 3600}&function=app:render")
        page.wait_for_selector("#series g.deploy text")
        chart = page.locator("#series svg").bounding_box()
        box = page.locator("#series g.deploy text").bounding_box()
        assert chart["x"] <= box["x"] and box["x"] + box["width"] <= chart["x"] + chart["width"]


def test_the_findings_and_worker_pages_open_without_errors(server, page):
    open_view(page, f"{server}/findings?from={T0 + 3600}&to={T0 + 7200}")
    assert "No regressions found" in page.locator("#summary").inner_text()
    page.goto(f"{server}/worker")
    page.wait_for_selector("body[data-state=ready]")
    assert page.locator("#instance option").count() == 0  # no target polled: none to record


def test_keys_and_the_search_filters_the_table(server, page):
    open_view(page, f"{server}/?{WINDOW}")
    rows = page.locator("#top tbody tr").count()
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "search"
    page.keyboard.type("json")
    page.wait_for_function("() => document.querySelectorAll('#top tbody tr').length === 1")
    assert "json:dumps" in page.locator("#top tbody").inner_text() and rows > 1
    frame(page, "app:handle").locator("rect").click()
    page.wait_for_function("() => new URLSearchParams(location.search).has('focus')")
    page.keyboard.press("Escape")
    page.wait_for_function("() => !new URLSearchParams(location.search).has('focus')")


def wide_window(tmp_path) -> str:
    """A database whose minute at T0 holds 250 leaves under app:quote, which has no self."""
    url = f"sqlite:///{tmp_path / 'wide.db'}"
    store = Store(url)
    store.migrate()
    store.write(
        SampleRow(T0, "cpu", "wide", "h", "i", {}, f"main;app:quote;lib:leaf{i}", 10)
        for i in range(250)
    )
    store.close()
    return url


def test_the_search_finds_functions_below_the_top_rows(tmp_path, page):
    # 250 leaves with self samples fill the table's 200 rows; their caller has none. The table
    # filtered the 200 rows it had, and showed nothing for a search the graph matched.
    url = wide_window(tmp_path)
    with serving(url) as base:
        open_view(page, f"{base}/?from={T0}&to={T0 + 60}&search=quote")
        page.wait_for_function("() => document.querySelectorAll('#top tbody tr').length === 1")
        assert page.locator("#top tbody tr td").first.inner_text() == "app:quote"
        page.fill("#search", "leaf24|main")  # texts separated by bars: asked of the server
        page.wait_for_function("() => document.querySelectorAll('#top tbody tr').length === 12")
        page.fill("#search", "^lib:leaf24[0-9]$")  # a regular expression: over the top rows
        page.wait_for_function("() => document.querySelectorAll('#top tbody tr').length === 10")
        page.fill("#search", "[")  # no regular expression: every row, none lost
        page.wait_for_function("() => document.querySelectorAll('#top tbody tr').length === 200")


def test_a_search_typed_while_the_table_loads_is_asked_of_the_server(tmp_path, page):
    # The table's first answer is held back while "quote" is typed: once it comes, the page
    # asks again with the search (the 200 rows it had hold no app:quote, which has no self).
    url = wide_window(tmp_path)
    held = []
    with serving(url) as base:
        page.route("**/api/top?*", lambda route: route.continue_() if held else held.append(route))
        page.goto(f"{base}/?from={T0}&to={T0 + 60}")
        while not held:
            page.wait_for_timeout(50)
        page.fill("#search", "quote")
        page.wait_for_timeout(500)  # past the refetch's 300 ms, while the page still loads
        assert page.evaluate("document.body.dataset.state") == "loading"
        held[0].continue_()
        page.wait_for_function("() => document.querySelectorAll('#top tbody tr').length === 1")
        assert page.locator("#top tbody tr td").first.inner_text() == "app:quote"


def test_a_deep_common_chain_is_one_frame_and_links_into_it_still_work(tmp_path, page):
    # A server's 14 launcher and accept-loop frames above every request: drawn as one frame,
    # so the work starts on the first screen; untick "collapse chains" to draw them all.
    launcher = ";".join(f"server:layer{i}" for i in range(14))
    url = f"sqlite:///{tmp_path / 'deep.db'}"
    store = Store(url)
    store.migrate()
    store.write(
        SampleRow(T0, "cpu", "deep", "h", "i", {}, f"{launcher};{leaf}", count)
        for leaf, count in (("app:render", 30), ("app:query", 70))
    )
    store.close()
    with serving(url) as base:
        open_view(page, f"{base}/?from={T0}&to={T0 + 60}")
        chain = frame(page, "server:layer0 … server:layer13")
        assert chain.count() == 1
        assert page.locator("#chart g.frame[name='server:layer5']").count() == 0
        # A search for a frame inside the chain finds the chain; a click on a leaf links to
        # the full path, and the link opens on it.
        page.fill("#search", "layer7")
        page.wait_for_function(
            "() => document.getElementById('search-result').textContent.startsWith('1 matching')"
        )
        # Counted by the frames that match, not by the frames drawn: layer1 and layer10-13.
        page.fill("#search", "layer1")
        page.wait_for_function(
            "() => document.getElementById('search-result').textContent.startsWith('5 matching')"
        )
        frame(page, "app:query").locator("rect").click()
        page.wait_for_function("() => new URLSearchParams(location.search).has('focus')")
        focus = query(page)["focus"][0]
        assert focus == f"{launcher};app:query"
        page.reload()
        page.wait_for_selector("body[data-state=ready]")
        # Zoomed on it (after the zoom's transition): the chart's whole width.
        page.wait_for_function(
            "() => { const g = [...document.querySelectorAll('#chart g.frame')]"
            ".find(g => g.getAttribute('name') === 'app:query');"
            " return g && g.querySelector('rect').getBoundingClientRect().width >"
            " 0.95 * document.querySelector('#chart svg').getBoundingClientRect().width }"
        )
        page.uncheck("#collapse-chains")
        page.wait_for_selector("#chart g.frame[name='server:layer5']")
        assert query(page)["chains"] == ["all"]


def test_stalls_that_hold_no_stacks_are_not_called_no_stalls(tmp_path, page):
    # The demo's GIL stalls held no sampled stacks: the page listed them and, below, said
    # "No stalls, so no stall time."
    url = f"sqlite:///{tmp_path / 'stalls.db'}"
    with Store(url) as store:
        store.migrate()
    record_stalls(url, [(T0 + 60, 0.084), (T0 + 120, 0.056)], stacks={"wall": {}, "cpu": {}})
    with serving(url) as base:
        open_view(page, f"{base}/worst?{WINDOW}")
        page.wait_for_selector("#stall-chart p.empty")
        assert page.locator("#stall-summary").inner_text().startswith("2 stalls")
        note = page.locator("#stall-chart p.empty").inner_text()
        assert "hold no sampled stacks" in note and "No stalls" not in note, note


def test_stall_durations_are_drawn_over_time_with_their_percentiles(server, page):
    open_view(page, f"{server}/worst?{WINDOW}")
    page.wait_for_selector("#stall-durations .line-max circle")
    # One point a line per minute with stalls: the minutes at 1, 10 and 25.
    assert page.locator("#stall-durations .line-max circle").count() == 3
    assert page.locator("#stall-durations .line-p50 circle").count() == 3
    tips = page.locator("#stall-durations .line-max circle title").all_text_contents()
    assert any("max 2000.0 ms of 11 stalls" in tip for tip in tips), tips
    # The 2 s stall is the highest point: max above p50 in the first minute.
    ys = {
        key: float(page.locator(f"#stall-durations .line-{key} circle").first.get_attribute("cy"))
        for key in ("p50", "max")
    }
    assert ys["max"] < ys["p50"]
    assert page.locator("#stall-buckets tbody tr").count() == 3
    # The x axis is the window's hour, not the minutes with stalls: minute 25 sits left of the
    # middle; the minutes apart are not joined (three pieces of line); four y ticks at most.
    width = page.locator("#stall-durations").bounding_box()["width"]
    third = float(page.locator("#stall-durations .line-max circle").nth(2).get_attribute("cx"))
    assert third < 0.5 * width
    path = page.locator("#stall-durations .line-max path").get_attribute("d")
    assert path.count("M") == 3, path
    assert 1 <= page.locator("#stall-durations .axis").nth(1).locator(".tick").count() <= 4


def test_a_route_shows_its_slowest_requests_against_all_of_it(server, page):
    open_view(page, f"{server}/worst?{WINDOW}")
    row = page.locator("#routes tbody tr").first
    assert '/up"load' in row.inner_text()
    row.click()
    page.wait_for_selector("#slow-diff-chart g.frame[name='json:dumps']")
    summary = page.locator("#slow-diff-summary").inner_text()
    assert "100 samples of its slowest requests" in summary, summary
    assert "json:dumps +" in summary, summary
    # json:dumps is more of the slowest requests' time than of the route's: red.
    fill = page.locator("#slow-diff-chart g.frame[name='json:dumps'] rect").first.get_attribute(
        "fill"
    )
    red, _, blue = map(int, fill[4:-1].split(","))
    assert red > blue, fill


def test_time_order_draws_a_column_per_minute_oldest_left(server, page):
    open_view(page, f"{server}/?{WINDOW}&service=api")
    before = total(page)
    page.select_option("#order", "time")
    page.wait_for_selector("#chart g.frame[name='2023-11-14 00:00:00 UTC']")
    page.wait_for_selector("body[data-state=ready]")
    assert query(page)["order"] == ["time"]
    assert page.locator("#chart g.frame[name$=' UTC']").count() == 60  # an hour, a minute each
    first = frame(page, "2023-11-14 00:00:00 UTC").locator("rect").bounding_box()
    second = frame(page, "2023-11-14 00:01:00 UTC").locator("rect").bounding_box()
    assert first["x"] < second["x"]
    assert total(page) == before  # the same samples, laid out by time
    page.select_option("#order", "name")
    page.wait_for_function(
        "() => !document.querySelector(\"#chart g.frame[name='2023-11-14 00:00:00 UTC']\")"
    )
