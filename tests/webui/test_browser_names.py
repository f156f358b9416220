"""In headless Chromium, over a store of names the collector accepts but that are awkward to
show or to ask for: spaces at their ends, tabs, 1,024 characters, a key holding ':'. Every value
a dropdown or the split legend offers is a filter that finds its own samples."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from webhelpers import T0, frame, open_view, record_finding, serving

from collector.store import SampleRow, Store

pytestmark = pytest.mark.browser

STACK = "__main__:<module>;app:serve;app:work"
# A right-to-left override: "evil\u202egnp.exe" shows as "evilexe.png" where it is obeyed.
RTL = "evil\u202egnp.exe"
# (service, host, instance, labels, samples a minute): every series a count of its own, so a
# filter that found another series, or several, shows another total.
SERIES = [
    ("api", "web-1", "i-1", {"version": "1.0"}, 1),
    ("space svc ", " host ", "i-2", {"version": " 2.0 ", "tabbed": "a\tb"}, 2),
    ("tabbed", "h-3", "i-3", {"long": "V" * 1024, "k:colon": "v:colon"}, 4),
    ("api", "web-1", "i-4", {"version": ""}, 8),
    (f"svc{RTL}", f"host{RTL}", f"inst{RTL}", {"version": f"v{RTL}"}, 16),
]
MINUTES = 30
WINDOW = f"from={T0}&to={T0 + 60 * MINUTES}"
# A finding as the collector recorded it before its links were percent-encoded.
FINDING = {
    "service": "shop&co",
    "a_label": "version:1.4.1+build.7",
    "b_label": "version:1.4.2+build.8",
    "link": "/compare?service=shop&co&a_label=version:1.4.1+build.7&b_label=version:1.4.2+build.8",
}


# A service whose every sample passes through a chain of frames (collapsed into one frame by
# default) before it splits.
CHAIN = ["__main__:<module>", *(f"server:layer{i}" for i in range(6))]
DEEP = {"app:render": 30, "app:query": 70}


def rows() -> list[SampleRow]:
    deep = [
        SampleRow(T0 + 60 * m, "cpu", "deep", "h-deep", "i-deep", {}, ";".join([*CHAIN, leaf]), n)
        for m in range(MINUTES)
        for leaf, n in DEEP.items()
    ]
    return deep + [
        SampleRow(T0 + 60 * m, "cpu", svc, host, inst, labels, STACK, count)
        for m in range(MINUTES)
        for svc, host, inst, labels, count in SERIES
    ]


def samples(**match: str) -> int:
    """The samples of the window's series whose service, host or labels are ``match``."""
    found = 0
    for svc, host, _, labels, count in SERIES:
        have = {"service": svc, "host": host, **labels}
        if all(have.get(key) == value for key, value in match.items()):
            found += count * MINUTES
    return found


def worst_cases(url: str) -> None:
    """A stall, a route's slowest request and a polled worker, named with RTL."""
    import sqlalchemy as sa

    from collector.request_rows import SKETCHES
    from collector.store import schema
    from collector.worst_rows import add_request_rows
    from sampler._sketch import Sketch

    stall = {"id": 1, "start": T0 + 60, "duration": 0.2, "service": f"svc{RTL}"}
    stall |= {"host": f"host{RTL}", "instance": f"inst{RTL}", "kind": "gil"}
    stall |= {"thread": f"thread {RTL}", "what": f"what {RTL}"}
    stall["stacks"] = json.dumps({"wall": {STACK: 1.0}, "cpu": {}})
    latency = Sketch()
    latency.add(0.5)
    sketches = {name: (latency if name == "latency" else Sketch()).document() for name in SKETCHES}
    slowest = {"start": T0 + 120, "duration": 0.5, "queue": 0.0, "status": 200}
    slowest |= {"path": f"/p{RTL}", "host": f"h{RTL}", "thread": f"t{RTL}", "stacks": {STACK: 1.0}}
    slow = {"count": 1, "stacks": {STACK: 1.0}, "slowest": [slowest]}
    request = {"bucket": T0 + 60, "instance": "i", "route": f"/r{RTL}", "service": "api"}
    request |= {"host": "h", "count": 1, "errors": 0, "sketches": json.dumps(sketches)}
    request["slow"] = json.dumps(slow)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(schema.stall_events.insert(), [stall])
        add_request_rows(conn, [request])
        target = {"target": "127.0.0.1:1", "instance": f"inst{RTL}"}
        conn.execute(schema.cursor_targets.insert(), [target])
    engine.dispose()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('names') / 'fleetflame.db'}"
    with Store(url) as store:
        store.migrate()
        store.write(rows())
    record_finding(url, "app:work", T0 + 600, T0 + 900, **FINDING)
    worst_cases(url)
    with serving(url) as base:
        yield base


def open_filters(page, url: str) -> None:
    open_view(page, url)
    page.wait_for_function("() => document.getElementById('filter-service').options.length > 1")


def shows_samples(page, count: int) -> None:
    """Waits for the page to have drawn a graph of ``count`` samples."""
    page.wait_for_function(
        "text => document.body.dataset.state === 'ready' && "
        "document.getElementById('summary').textContent.startsWith(text)",
        arg=f"{count:,} samples",
    )


@pytest.mark.parametrize(("column", "value"), [("service", "space svc "), ("host", " host ")])
def test_a_column_value_offered_is_filtered_exactly(server, page, column, value):
    open_filters(page, f"{server}/?{WINDOW}")
    page.select_option(f"#filter-{column}", value)
    shows_samples(page, samples(**{column: value}))


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("version", " 2.0 ", None),
        ("tabbed", "a\tb", None),
        ("long", "V" * 1024, None),
        ("k:colon", "v:colon", None),
        ("version", "", "(empty)"),
    ],
)
def test_a_label_value_offered_is_filtered_exactly(server, page, key, value, shown):
    open_filters(page, f"{server}/?{WINDOW}")
    page.select_option("#label-key", key)
    if shown is None:
        page.select_option("#label-value", value)
    else:
        page.select_option("#label-value", label=shown)
    page.click("#label-add")
    shows_samples(page, samples(**{key: value}))
    chip = page.locator("#chips .chip").inner_text()
    assert chip.startswith(f"{key} = ")


def test_a_split_legends_value_filters_to_its_own_samples(server, page):
    open_filters(page, f"{server}/?{WINDOW}&split=version")
    page.wait_for_selector("#split-legend button.split-value")
    page.locator("#split-legend button", has_text="2.0").click()
    shows_samples(page, samples(version=" 2.0 "))
    assert page.evaluate("new URLSearchParams(location.search).get('label')") == "version: 2.0 "


def test_a_label_offered_on_the_compare_page_is_compared_exactly(server, page):
    page.goto(f"{server}/compare?{WINDOW}")
    page.wait_for_selector("body[data-state=ready]")
    label = json.dumps("k:colon") + ":v:colon"
    page.wait_for_function(
        "label => [...document.querySelectorAll('#label-options option')]"
        ".some(option => option.value === label)",
        arg=label,
    )
    page.fill("#a_label", "version: 2.0 ")
    page.fill("#b_label", label)
    page.click("#compare-apply")
    page.wait_for_function(
        "text => document.getElementById('summary').textContent.includes(text)",
        arg=f"B: {samples(**{'k:colon': 'v:colon'}):,} samples",
    )
    summary = page.locator("#summary").inner_text()
    assert f"A: {samples(version=' 2.0 '):,} samples" in summary


def test_a_finding_stored_with_an_unencoded_link_opens_its_own_comparison(server, page):
    # The collector wrote links unencoded until 2026-11-29 (FINDING): the page builds its own.
    page.goto(f"{server}/findings?{WINDOW}")
    page.wait_for_selector("body[data-state=ready]")
    page.click("#findings tbody tr td.name")
    page.wait_for_url("**/compare?**")
    query = page.evaluate("[...new URLSearchParams(location.search)]")
    assert ["service", "shop&co"] in query
    assert ["a_label", "version:1.4.1+build.7"] in query
    assert ["b_label", "version:1.4.2+build.8"] in query
    assert [key for key, _ in query] == [
        "service",
        "a_from",
        "a_to",
        "b_from",
        "b_to",
        "a_label",
        "b_label",
    ]


def url_function(page) -> str | None:
    return page.evaluate("new URLSearchParams(location.search).get('function')")


def test_a_collapsed_chain_shows_its_last_functions_series_and_sandwich(server, page):
    # It showed 'Sandwich of __main__:<module> … server:layer5: 0 samples', a name no stack
    # holds, and wrote it into the URL.
    page.goto(f"{server}/?{WINDOW}&service=deep")
    page.wait_for_selector("body[data-state=ready]")
    chain = f"{CHAIN[0]} … {CHAIN[-1]}"
    frame(page, chain).locator("rect").click()
    every = sum(DEEP.values()) * MINUTES
    page.wait_for_function(
        "text => document.querySelector('#sandwich h3')?.textContent.startsWith(text)",
        arg=f"Sandwich of {CHAIN[-1]}: {every:,} samples",
    )
    page.wait_for_selector("#series svg.series-chart path")
    assert CHAIN[-1] in page.locator("#series h3").inner_text()
    assert url_function(page) == CHAIN[-1]


@pytest.mark.parametrize(
    ("view", "name", "says"),
    [
        ("service=deep&chains=all&max_nodes=4", "[pruned]", "[pruned] is not a function"),
        ("service=deep&order=time", "2023-11-14 00:00:00 UTC", "is a time step"),
    ],
)
def test_a_frame_the_page_made_up_says_it_is_no_function(server, page, view, name, says):
    # [pruned] and the time steps showed a flat 0% series and a sandwich of 0 samples.
    page.goto(f"{server}/?{WINDOW}&{view}&function=app:query")
    page.wait_for_selector("body[data-state=ready]")
    page.wait_for_selector("#sandwich h3")  # the function the link named, shown first
    frame(page, name).first.locator("rect").click()
    page.wait_for_function(
        "text => document.getElementById('series').textContent.includes(text)", arg=says
    )
    assert page.locator("#sandwich").inner_text() == ""
    assert url_function(page) is None


# Every text shown (text nodes, tooltips, accessible names) that holds a raw U+202E.
RAW_RTL = """() => {
  const found = []
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT)
  while (walker.nextNode()) {
    const text = walker.currentNode.textContent
    if (text.includes('\\u202e')) found.push(`${walker.currentNode.parentNode.closest('[id]')?.id}: ${text.slice(0, 60)}`)
  }
  for (const el of document.querySelectorAll('[title], [aria-label]')) {
    for (const name of ['title', 'aria-label']) {
      const text = el.getAttribute(name) || ''
      if (text.includes('\\u202e')) found.push(`${name} of ${el.closest('[id]')?.id}: ${text.slice(0, 60)}`)
    }
  }
  return found
}"""


@pytest.mark.parametrize(
    ("path", "ready"),
    [
        (f"/?{WINDOW}&split=instance&label=version:v{RTL}", "#split-legend button.split-value"),
        (f"/worst?{WINDOW}", "#slowest tbody tr"),
        ("/worker", "#instance option"),
        (f"/findings?{WINDOW}&service=svc{RTL}", "#filter-service option:checked"),
        (f"/compare?{WINDOW}", "#label-options option"),
    ],
)
def test_bidi_controls_in_names_are_written_out_everywhere(server, page, path, ready):
    # Frame names and routes showed [U+202E]; the dropdowns, the split legend, the stall and
    # slowest-request tables and the worker list showed it raw, turning the text around.
    page.goto(server + path)
    page.wait_for_selector("body[data-state=ready]")
    page.wait_for_selector(ready, state="attached")
    if "/worker" not in path:
        page.wait_for_function(
            "() => document.getElementById('filter-instance').options.length > 1"
        )
    assert page.evaluate(RAW_RTL) == []
    assert "[U+202E]" in page.evaluate("document.body.innerText")
