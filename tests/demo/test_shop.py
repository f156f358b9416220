"""The demo shop's code: its hot spots, its planted regression, and its refusals of bad input."""

from __future__ import annotations

import json
import random
import threading

import pytest

from demoshop import GOOD_VERSION, REGRESSED_VERSION, catalog, jobs, loadgen, pricing, search
from demoshop.app import create_app


class CountingSku(str):
    """A SKU that counts how often it is normalised (once per comparison in the scan)."""

    normalised = 0

    def strip(self, chars: str | None = None) -> CountingSku:
        return self

    def upper(self) -> str:
        CountingSku.normalised += 1
        return str.upper(self)


@pytest.fixture
def db_path(tmp_path):
    return str(catalog.ensure_catalog(tmp_path / "shop.db", products=80))


@pytest.fixture(params=[GOOD_VERSION, REGRESSED_VERSION])
def client(request, db_path):
    return create_app(db_path, request.param).test_client()


def test_both_versions_price_a_cart_identically() -> None:
    rng = random.Random(5)
    prices = {f"SKU-{i:06d}": rng.randint(100, 9000) for i in range(1, 60)}
    for _ in range(20):
        lines = [{"sku": rng.choice(list(prices)), "qty": rng.randint(1, 9)} for _ in range(120)]
        good = pricing.price_cart(lines, prices, GOOD_VERSION, 10)
        bad = pricing.price_cart(lines, prices, REGRESSED_VERSION, 10)
        assert good == bad
        assert good["subtotal_cents"] == sum(prices[x["sku"]] * x["qty"] for x in lines)


@pytest.mark.parametrize("n", [50, 200])
def test_the_regressed_version_is_quadratic_and_the_good_one_linear(n) -> None:
    lines = [{"sku": CountingSku(f"SKU-{i:06d}"), "qty": 1} for i in range(n)]
    CountingSku.normalised = 0
    assert len(pricing.merge_cart_lines(lines, GOOD_VERSION)) == n
    assert CountingSku.normalised == 0  # one dict lookup per line
    assert len(pricing.merge_cart_lines(lines, REGRESSED_VERSION)) == n
    # Each of the n lines normalises itself and scans every line merged before it.
    assert CountingSku.normalised == n + n * (n - 1) // 2


def test_an_unknown_version_or_sku_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown shop version"):
        pricing.merge_cart_lines([], "9.9.9")
    with pytest.raises(ValueError, match="unknown SKU"):
        pricing.price_cart([{"sku": "nope", "qty": 1}], {}, GOOD_VERSION)
    with pytest.raises(ValueError, match="DEMO_VERSION"):
        create_app("unused.db", "2.0")


def test_search_highlights_and_refuses_empty_queries() -> None:
    products = [
        {"sku": "A", "name": "Oak Lamp", "description": "a rustic oak lamp for the office"},
        {"sku": "B", "name": "Steel Mug", "description": "a compact steel mug"},
    ]
    hits = search.find_products(products, "oak lamp")
    assert [h["sku"] for h in hits] == ["A"]
    assert "**oak**" in hits[0]["snippet"]
    with pytest.raises(ValueError, match="at least one word"):
        search.parse_terms("!! ?")


def test_the_routes_answer(client) -> None:
    page = client.get("/api/products?page=2&per_page=5")
    assert page.status_code == 200 and page.headers["ETag"]
    body = page.get_json()
    assert len(body["items"]) == 5 and body["total"] == 80 and body["page"] == 2
    assert client.get("/api/search?q=oak").status_code == 200
    report = client.get("/api/report?refresh=1").get_json()
    assert report["cache_miss"] is True and report["report"]
    assert client.get("/healthz").get_json()["status"] == "ok"


@pytest.mark.parametrize(
    "path, message",
    [
        ("/api/products?page=0", "page must be an integer"),
        ("/api/products?per_page=lots", "per_page must be an integer"),
        ("/api/search?q=%21", "at least one word"),
    ],
)
def test_bad_queries_get_a_400_naming_the_problem(client, path, message) -> None:
    response = client.get(path)
    assert response.status_code == 400
    assert message in response.get_json()["error"]


@pytest.mark.parametrize(
    "body, message",
    [
        ("not json", "the body must be JSON"),
        ({"lines": []}, "1 to 1000 lines"),
        ({"lines": [{"sku": "SKU-000001", "qty": 0}]}, "line 0 needs"),
        ({"lines": [{"sku": 5, "qty": 1}]}, "line 0 needs"),
        ({"lines": [{"sku": "SKU-000001", "qty": 1}], "discount": 300}, "discount"),
        ({"lines": [{"sku": "SKU-999999", "qty": 1}]}, "unknown SKU"),
    ],
)
def test_bad_carts_are_refused_and_nothing_is_queued(client, db_path, body, message) -> None:
    data = body if isinstance(body, str) else json.dumps(body)
    response = client.post("/api/checkout", data=data, content_type="application/json")
    assert response.status_code == 400
    assert message in response.get_json()["error"]
    conn = catalog.connect(db_path)
    assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
    conn.close()


def test_checkouts_are_queued_and_the_job_worker_processes_them(client, db_path) -> None:
    rng = random.Random(2)
    for _ in range(3):
        _route, method, path, body = _next_of(rng, "checkout")
        response = client.open(path, method=method, data=body, content_type="application/json")
        assert response.status_code == 201, response.get_json()
    stop = threading.Event()
    worker = threading.Thread(target=lambda: jobs.run(db_path, stop, idle_wait=0.05))
    worker.start()
    conn = catalog.connect(db_path)
    try:
        for _ in range(200):
            if conn.execute("SELECT count(*) FROM orders WHERE processed = 0").fetchone()[0] == 0:
                break
            stop.wait(0.05)
        assert conn.execute("SELECT count(*) FROM orders WHERE processed = 1").fetchone()[0] == 3
    finally:
        stop.set()
        worker.join(10)
        conn.close()


def test_an_invoice_renders_every_line() -> None:
    order = {
        "version": "1.4.1",
        "total_cents": 1234,
        "lines": [{"sku": "SKU-1", "qty": 2, "unit_cents": 617, "total_cents": 1234}],
    }
    text = jobs.render_invoice(7, order)
    assert "SKU-1" in text and "12.34" in text and "#00000007" in text
    size, digest = jobs.process_order(7, order)
    assert size > 0 and len(digest) == 64


def _next_of(rng: random.Random, route: str):
    while True:
        request = loadgen.make_request(rng, 80)
        if request[0] == route:
            return request


def test_the_catalogue_is_built_once_and_atomically(tmp_path) -> None:
    path = catalog.ensure_catalog(tmp_path / "a" / "shop.db", products=10)
    mtime = path.stat().st_mtime_ns
    assert catalog.ensure_catalog(path, products=10).stat().st_mtime_ns == mtime
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".catalog-")] == []
    conn = catalog.connect(path)
    assert len(catalog.load_all_products(conn)) == 10
    conn.close()
